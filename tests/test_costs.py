"""Named costs as pure transitions: read from the receipt and committed with the acknowledgement, reserved before a
call, given back or recorded when its outcome is, and bounded by ``limits.max_cost``."""

import unittest

from runner.ledger import costs, effects, steps
from runner.base.errors import LimitExhausted
from runner.contract.text import parse_contract_text
from runner.contract.spec import read_contract
from runner.calls.target import Observation
from runner.engines.once import perform_once

from .support.ops import DIGEST, T0, apply, fresh, plan, then

PRICED = {"money": [["/usage/prompt_tokens", 0.001], ["/usage/completion_tokens", 0.002]],
          "tokens": [["/usage/total_tokens", 1]]}
USAGE = {"id": "c-1", "usage": {"prompt_tokens": 100, "completion_tokens": 50, "total_tokens": 150}}


def drafting(**effects_section: object) -> dict:
    limits = effects_section.pop("limits", None)
    block = plan(effects=effects_section, **({"limits": limits} if limits else {}))
    return then(fresh(block), steps.start_ops, "draft")


def begun(state: dict, key: str) -> dict:
    return then(state, effects.begin_ops, key, DIGEST)


class CostReadWithTheAnswerTest(unittest.TestCase):
    def test_the_cost_is_read_from_the_receipt_and_committed_in_the_acknowledgement(self) -> None:
        state = then(begun(drafting(cost=PRICED), "doc-1"), effects.ack_ops, "doc-1", USAGE)
        self.assertEqual(state["effects"]["doc-1"]["state"], "acknowledged")
        self.assertEqual(state["effects"]["doc-1"]["cost"], {"money": 0.2, "tokens": 150})
        self.assertEqual(state["counters"]["cost"], {"money": 0.2, "tokens": 150})
        self.assertEqual(state["counters"]["cost_largest"], {"money": 0.2, "tokens": 150})
        self.assertNotIn("cost_estimated", state["effects"]["doc-1"])

    def test_a_command_receipt_names_its_cost_in_its_field_cost(self) -> None:
        state = then(begun(drafting(), "doc-1"), effects.ack_ops, "doc-1", {"id": "t-1", "cost": {"money": 0.03}})
        self.assertEqual(state["effects"]["doc-1"]["cost"], {"money": 0.03})
        self.assertEqual(state["counters"]["cost"], {"money": 0.03})

    def test_a_receipt_without_usage_stands_the_reservation_in_and_says_so(self) -> None:
        state = begun(drafting(cost=PRICED, cost_estimate={"money": 0.5, "tokens": 400}), "doc-1")
        self.assertEqual(state["effects"]["doc-1"]["reserved"], {"money": 0.5, "tokens": 400})
        state = then(state, effects.ack_ops, "doc-1", {"id": "c-1"})
        self.assertEqual(state["effects"]["doc-1"]["cost"], {"money": 0.5, "tokens": 400})
        self.assertEqual(state["effects"]["doc-1"]["cost_estimated"], ["money", "tokens"])
        self.assertEqual(state["counters"].get("cost_largest", {}), {})  # an estimate is no cost seen

    def test_a_run_without_costs_records_none(self) -> None:
        state = then(begun(drafting(), "doc-1"), effects.ack_ops, "doc-1", {"id": "t-1"})
        self.assertNotIn("cost", state["effects"]["doc-1"])
        self.assertNotIn("reserved", state["effects"]["doc-1"])
        self.assertEqual(state["counters"]["cost"], {})


class ReservationTest(unittest.TestCase):
    def test_a_call_is_reserved_its_estimate_then_the_largest_cost_seen(self) -> None:
        state = begun(drafting(cost=PRICED, cost_estimate={"money": 0.5}), "doc-1")
        self.assertEqual(state["counters"]["reserved"], {"money": 0.5})
        state = then(state, effects.ack_ops, "doc-1", USAGE)
        self.assertEqual(state["counters"].get("reserved"), {})
        self.assertNotIn("reserved", state["effects"]["doc-1"])
        state = begun(state, "doc-2")
        self.assertEqual(state["effects"]["doc-2"]["reserved"], {"money": 0.2, "tokens": 150})
        self.assertEqual(state["counters"]["reserved"], {"money": 0.2, "tokens": 150})

    def test_a_call_that_does_not_fit_beside_spent_and_reserved_is_refused_naming_them(self) -> None:
        state = begun(drafting(cost=PRICED, cost_estimate={"money": 0.4}, limits={"max_cost": 1}), "doc-1")
        state = begun(state, "doc-2")
        with self.assertRaises(LimitExhausted) as caught:
            effects.begin_ops(state, "doc-3", DIGEST, T0)
        self.assertEqual(caught.exception.context["limit"], "max_cost")
        self.assertEqual(caught.exception.message,
                         "a call of effect doc-3 would reserve money 0.4: 0 spent and 0.8 reserved of the limit 1")
        state = then(state, effects.ack_ops, "doc-1", {"usage": {"prompt_tokens": 100, "completion_tokens": 0,
                                                                 "total_tokens": 100}})
        state = begun(state, "doc-3")  # 0.1 spent, 0.4 and 0.1 reserved
        self.assertEqual(state["counters"]["reserved"], {"money": 0.5, "tokens": 100})

    def test_any_named_cost_may_be_limited(self) -> None:
        state = drafting(cost=PRICED, limits={"max_cost": {"tokens": 200}})
        state = then(begun(state, "doc-1"), effects.ack_ops, "doc-1", USAGE)
        with self.assertRaises(LimitExhausted) as caught:
            effects.begin_ops(state, "doc-2", DIGEST, T0)
        self.assertIn("would reserve tokens 150: 150 spent and 0 reserved of the limit 200", caught.exception.message)

    def test_an_unknown_outcome_keeps_its_reservation_until_settled(self) -> None:
        state = begun(drafting(cost=PRICED, cost_estimate={"money": 0.5}), "doc-1")
        state = then(state, effects.uncertain_ops, "doc-1", "timeout")
        self.assertEqual(state["counters"]["reserved"], {"money": 0.5})
        settled = then(state, effects.verify_ops, "doc-1", {"seen": True}, reconciled=True)
        self.assertEqual(settled["counters"]["reserved"], {})
        self.assertEqual(settled["counters"]["cost"], {"money": 0.5})
        self.assertEqual(settled["effects"]["doc-1"]["cost_estimated"], ["money"])
        absent = then(state, effects.absent_ops, "doc-1", {"seen": False})
        self.assertEqual(absent["counters"]["reserved"], {})
        self.assertEqual(absent["counters"]["cost"], {})

    def test_a_refusal_or_a_not_now_gives_the_reservation_back_unspent(self) -> None:
        state = begun(drafting(cost_estimate={"money": 0.5}), "doc-1")
        refusal = effects.failed_ops(state, "doc-1", "400 bad request", T0)
        later = effects.deferred_ops(state, "doc-1", {"status": 429}, T0, "2026-06-01T12:00:01.000Z")
        for name, ops in (("refused", refusal), ("not now", later)):
            with self.subTest(name):
                after = apply(state, ops)
                self.assertEqual((after["counters"]["reserved"], after["counters"]["cost"]), ({}, {}))
                self.assertNotIn("reserved", after["effects"]["doc-1"])

    def test_a_resend_of_an_unknown_outcome_adds_to_what_it_holds(self) -> None:
        state = begun(drafting(cost_estimate={"money": 0.5}), "doc-1")
        state = then(state, effects.uncertain_ops, "doc-1", "timeout")
        state = then(state, effects.begin_ops, "doc-1", DIGEST, resend=True)
        self.assertEqual(state["effects"]["doc-1"]["reserved"], {"money": 1.0})
        self.assertEqual(state["counters"]["reserved"], {"money": 1.0})
        state = then(state, effects.ack_ops, "doc-1", {"cost": {"money": 0.25}})
        self.assertEqual((state["counters"]["reserved"], state["counters"]["cost"]), ({}, {"money": 0.25}))

    def test_spend_shows_spent_reserved_and_limit_of_each_named_cost(self) -> None:
        limits = {"max_cost": {"money": 2, "tokens": 9000}}
        state = begun(drafting(cost_estimate={"money": 0.5}, limits=limits), "doc-1")
        self.assertEqual(costs.spend(state), {"money": {"spent": 0.0, "reserved": 0.5, "limit": 2.0},
                                              "tokens": {"spent": 0.0, "reserved": 0.0, "limit": 9000.0}})


class _Target:
    """A target in memory that answers its usage and shows what it holds."""

    def __init__(self) -> None:
        self.held: dict = {}

    def invoke(self, key: str, payload: dict, epoch: object = None) -> dict:
        self.held[key] = payload
        return dict(USAGE, id=key)

    def observe(self, key: str, payload: dict) -> Observation:
        return Observation("present" if key in self.held else "absent", {"key": key})


class EngineCostTest(unittest.TestCase):
    def test_an_engine_is_given_the_cost_with_the_result_it_records(self) -> None:
        target = _Target()
        spec = read_contract(plan(effects={"cost": PRICED})).effects.cost
        done = perform_once(target, "wf-1:doc-1", {"n": 1}, maybe_done=False, cost=spec)
        self.assertEqual((done["invoked"], done["cost"], done["cost_unread"]), (True, {"money": 0.2, "tokens": 150}, []))
        again = perform_once(target, "wf-1:doc-1", {"n": 1}, maybe_done=True, cost=spec)
        self.assertEqual((again["invoked"], again["cost"]), (False, {}), "a reused effect cost this attempt nothing")
        self.assertNotIn("cost", perform_once(target, "wf-1:doc-2", {"n": 2}, maybe_done=False))


class ContractTest(unittest.TestCase):
    def check(self, effects_section: dict, limits: object = 2) -> list:
        import json
        block = dict(plan(effects=effects_section), limits={"max_cost": limits})
        return [p.message for p in parse_contract_text("```json run-contract\n" + json.dumps(block) + "\n```\n")[1]]

    def test_costs_and_named_limits_are_read_into_the_specs(self) -> None:
        self.assertEqual(self.check({"cost": PRICED, "cost_estimate": {"money": 0.01}}, {"money": 2, "tokens": 9}), [])
        spec = read_contract(dict(plan(effects={"cost": PRICED}), limits={"max_cost": {"money": 2, "tokens": 9}}))
        self.assertEqual(spec.limits.cost_limits, (("money", 2.0), ("tokens", 9.0)))
        self.assertEqual(spec.limits.max_cost, 2.0)
        self.assertEqual(dict(spec.effects.cost)["money"],
                         (("/usage/prompt_tokens", 0.001), ("/usage/completion_tokens", 0.002)))
        self.assertEqual(read_contract(dict(plan(), limits={"max_cost": 5})).limits.cost_limits, (("money", 5.0),))

    def test_bad_costs_and_limits_are_named(self) -> None:
        cases = {
            "a term without a price": ({"cost": {"money": [["/usage/total_tokens"]]}}, 2),
            "a pointer that is none": ({"cost": {"money": [["usage", 1]]}}, 2),
            "a negative estimate": ({"cost_estimate": {"money": -1}}, 2),
            "a limit of nothing": ({}, {"money": 0}),
            "no limit named": ({}, {}),
        }
        for name, (section, limits) in cases.items():
            with self.subTest(name):
                self.assertTrue(self.check(section, limits), name)


if __name__ == "__main__":
    unittest.main()
