"""A Stripe-shaped API from a contract alone: listings paged by the last entry's id and ``has_more``, form bodies
with brackets, the receipt's id looked for in the listing, and the headers a listing request carries.

The listing's rules are tested against pages scripted here (``tests/support/fake_http.py``), each rule's page
exactly; the whole job runs against the refunds stand-in (``tests/support/standins/refunds.py``) as a real
process, through ``drive`` in children SIGKILLed while the stand-in holds the answer of a refund it made.
"""

import json
import os
import shutil
import signal
import tempfile
import unittest
from typing import Any, Dict, List, Optional

from runner.adapters.http import HttpAdapter, http_spec
from runner.adapters.http_answers import Pacing
from runner.adapters.http_client import ConnectionPool
from runner.contract.http import http_problems
from tests.support.cli import RunnerCli
from tests.support.fake_http import Reply, ScriptedServer
from tests.support.standins.harness import StandIn
from tests.support.standins.refunds import form_fields
from tests.test_recipes_http import stalled, wait_for

TOKEN = "sk-test-4f1c9e07a2b3d685"


def page(data: List[Dict[str, Any]], **fields: Any) -> Reply:
    """A Stripe list object as one scripted answer."""
    return Reply(200, json.dumps(dict({"object": "list", "data": data, "url": "/v1/refunds"}, **fields)).encode())


def refund(number: int, order: str) -> Dict[str, Any]:
    return {"id": f"re_{number:06d}", "object": "refund", "metadata": {"order": order}}


def section(base: str, *, limit: int = 100, **listing: Any) -> Dict[str, Any]:
    """An ``effects.http`` for the refunds API at ``base``: Stripe's paging unless ``listing`` says otherwise."""
    found = dict({"url": f"{base}/v1/refunds?limit={limit}", "list": "/data",
                  "pages": {"after_last": "/id", "param": "starting_after"}, "more": "/has_more",
                  "match": "/metadata/order", "value": "{slug}"}, **listing)
    found = {name: value for name, value in found.items() if value is not None}
    return {"invoke": {"url": f"{base}/v1/refunds", "send_as": "form",
                       "headers": {"Authorization": "Bearer {env:TOKEN}"}},
            "observe": {"headers": {"Authorization": "Bearer {env:TOKEN}"}, "list": found},
            "idempotency_header": "Idempotency-Key"}


class _Base(unittest.TestCase):
    def setUp(self) -> None:
        self.tmp = tempfile.mkdtemp(prefix="runner-refunds-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.pool = ConnectionPool()
        self.addCleanup(self.pool.clear)

    def adapter(self, spec: Dict[str, Any], slug: str = "o-1", receipt: Optional[Dict[str, Any]] = None) -> HttpAdapter:
        given = {"receipt": receipt} if receipt is not None else {}
        return HttpAdapter(http_spec(spec), values={"slug": slug, "run_id": "r"}, workspace=self.tmp, pool=self.pool,
                           environ={"TOKEN": TOKEN}, sleep=lambda _s: None, pacing=Pacing(), timeout=5.0, **given)

    def scripted(self, *replies: Reply) -> ScriptedServer:
        server = ScriptedServer(replies, Reply(500, b'{"error": "the script is over"}'))
        self.addCleanup(server.stop)
        return server

    def look(self, spec: Dict[str, Any], *slugs: str) -> List[Any]:
        adapters = [self.adapter(spec, slug) for slug in slugs]
        return adapters[0].observe_many([(f"refund-{slug}", {}, a) for slug, a in zip(slugs, adapters)])


class MorePagesTest(_Base):
    """``pages: {"after_last": ...}`` and ``more``: the listing goes on while a page says more follow."""

    def test_the_next_page_starts_after_the_last_entry_while_has_more_says_so(self) -> None:
        server = self.scripted(page([refund(5, "o-5"), refund(4, "o-4")], has_more=True),
                               page([refund(3, "o-3"), refund(2, "o-2")], has_more=True),
                               page([refund(1, "o-1")], has_more=False))
        found = self.look(section(server.url, limit=2), "o-1", "o-4", "gone")
        self.assertEqual([o.status for o in found], ["present", "present", "absent"])
        self.assertEqual([s.target for s in server.seen], ["/v1/refunds?limit=2",
                                                           "/v1/refunds?limit=2&starting_after=re_000004",
                                                           "/v1/refunds?limit=2&starting_after=re_000002"])
        self.assertEqual((found[2].evidence["pages"], found[2].evidence["listed"]), (3, 5))

    def test_has_more_false_ends_the_listing_whatever_else_the_page_holds(self) -> None:
        server = self.scripted(page([refund(2, "o-2"), refund(1, "o-1")], has_more=False, next="x"))
        found = self.look(section(server.url, limit=2, pages={"cursor": "/next", "param": "after"}), "gone")
        self.assertEqual((found[0].status, len(server.seen)), ("absent", 1))

    def test_a_page_that_says_more_but_gives_no_way_on_cuts_the_listing_short(self) -> None:
        cases = [
            ({}, page([], has_more=True), "holds no entries"),
            ({}, page([{"metadata": {"order": "o-9"}}], has_more=True), "the last entry's /id is empty"),
            ({}, page([refund(1, "o-1")], has_more="yes"), "neither true nor false at /has_more"),
            ({}, page([refund(1, "o-1")]), "neither true nor false at /has_more"),
            ({"pages": {"cursor": "/next", "param": "after"}}, page([refund(1, "o-1")], has_more=True),
             "the cursor at /next is empty"),
            ({"pages": {"param": "page"}}, page([], has_more=True), "holds no entries"),
            ({"pages": "link"}, page([refund(1, "o-1")], has_more=True), 'has no Link rel="next"'),
        ]
        for listing, answer, said in cases:
            with self.subTest(said=said, listing=listing):
                server = self.scripted(answer)
                found = self.look(section(server.url, **listing), "o-1", "gone")
                self.assertEqual(found[1].status, "unknown", "a listing cut short says nothing of a key it lacks")
                self.assertIn(said, found[1].evidence["reason"])
                self.assertEqual(found[0].status, "present" if answer.body.count(b"o-1") else "unknown")

    def test_without_more_the_last_entry_form_reads_to_the_first_empty_page(self) -> None:
        server = self.scripted(page([refund(3, "o-3"), refund(2, "o-2")]), page([refund(1, "o-1")]), page([]))
        found = self.look(section(server.url, limit=2, more=None), "o-1", "gone")
        self.assertEqual([o.status for o in found], ["present", "absent"])
        self.assertEqual(len(server.seen), 3, "a short page is not taken for the last: a page size may change")
        server = self.scripted(page([refund(2, "o-2"), {"metadata": {"order": "o-1"}}]))
        found = self.look(section(server.url, limit=2, more=None), "o-1", "gone")
        self.assertEqual([o.status for o in found], ["present", "unknown"], "a last entry with no id to go on from")
        self.assertIn("holds entries but the last entry's /id is empty", found[1].evidence["reason"])

    def test_a_cursor_read_from_inside_the_list_is_refused_at_contract_check(self) -> None:
        url = "http://127.0.0.1:1"
        inside = section(url, pages={"cursor": "/data/99/id", "param": "starting_after"}, more=None)
        problems = http_problems({"http": inside})
        self.assertEqual([p.path for p in problems], [("http", "observe", "list", "pages", "cursor")])
        self.assertIn("lies inside the list of entries", problems[0])
        self.assertIn('"after_last": "/id"', problems[0])
        root = section(url, pages={"cursor": "/2/id", "param": "after"}, list=None)
        self.assertIn("lies inside the list", http_problems({"http": root})[0])
        for fine in (section(url), section(url, pages={"cursor": "/next_page", "param": "page"}),
                     section(url, more=None), section(url, pages="link")):
            self.assertEqual(http_problems({"http": fine}), [])
        text = "\n".join(http_problems({"http": section(url, more="more", pages={"after_last": "/id", "cursor": "/c",
                                                                                  "param": "p"})}))
        self.assertIn("observe.list.more must be a JSON pointer", text)
        self.assertIn('or {"after_last": "/id", "param": "starting_after"}', text)


class FormBodyTest(_Base):
    def test_nested_objects_and_lists_are_sent_with_brackets(self) -> None:
        server = self.scripted(Reply(200, b'{"id": "re_000001"}'))
        adapter = self.adapter(section(server.url, pages="link", more=None))
        adapter.invoke("refund-o-1", {"charge": "ch_1", "amount": 500, "reverse": True, "note": None,
                                      "metadata": {"order": "o-1", "tags": ["a", "b"], "by": {"team": "ops x"}},
                                      "expand": ["charge", "balance"], "items": [{"id": "i1", "qty": 2}, ["x"]],
                                      "empty": {}}, 3)
        sent = server.seen[0]
        self.assertEqual(sent.headers["content-type"], "application/x-www-form-urlencoded")
        self.assertEqual(sent.body, b"amount=500&charge=ch_1&expand=charge&expand=balance&items%5B0%5D%5Bid%5D=i1&"
                                    b"items%5B0%5D%5Bqty%5D=2&items%5B1%5D%5B%5D=x&metadata%5Bby%5D%5Bteam%5D=ops+x&"
                                    b"metadata%5Border%5D=o-1&metadata%5Btags%5D%5B%5D=a&metadata%5Btags%5D%5B%5D=b&"
                                    b"note=&reverse=true")
        self.assertEqual(form_fields(sent.body)["metadata"], {"order": "o-1", "tags": ["a", "b"],
                                                              "by": {"team": "ops x"}}, "as Stripe reads it")


class ListingHeadersTest(_Base):
    """A listing request carries the observe request's own headers: never the key's, which names one item."""

    def test_the_idempotency_and_epoch_headers_go_on_the_invoke_alone(self) -> None:
        server = self.scripted(Reply(200, b'{"id": "re_000001", "metadata": {"order": "o-1"}}'),
                               page([refund(1, "o-1")], has_more=False))
        spec = dict(section(server.url, pages={"cursor": "/next", "param": "after"}, more=None),
                    epoch_header="X-Fencing-Epoch")
        adapter = self.adapter(spec)
        adapter.invoke("refund-o-1", {"charge": "ch_1"}, 4)
        seen = adapter.observe("refund-o-1", {})
        self.assertEqual(seen.evidence["request"], {"method": "GET", "url": f"{server.url}/v1/refunds?limit=100",
                                                    "headers": ["Authorization"]})
        invoke, listing = server.seen
        self.assertEqual((invoke.headers["idempotency-key"], invoke.headers["x-fencing-epoch"]), ("refund-o-1", "4"))
        self.assertNotIn("idempotency-key", listing.headers)
        self.assertNotIn("x-fencing-epoch", listing.headers)

    def test_an_idempotency_header_written_in_invoke_is_pointed_to_its_place(self) -> None:
        spec = section("http://127.0.0.1:1", pages="link", more=None)
        spec["invoke"]["idempotency_header"] = "Idempotency-Key"
        problems = http_problems({"http": spec})
        self.assertEqual([p.path for p in problems], [("http", "invoke", "idempotency_header")])
        self.assertIn("belongs to effects.http, beside invoke and observe", problems[0])
        del spec["invoke"]["idempotency_header"], spec["idempotency_header"]
        spec["invoke"]["headers"]["Idempotency-Key"] = "{key}"
        self.assertEqual(http_problems({"http": spec}), [], "the key in a header of the invoke's own")


class ReceiptIdTest(_Base):
    """``invoke.receipt_id`` and ``observe.list.id``: the entry with the receipt's id is the proof."""

    def spec(self, base: str) -> Dict[str, Any]:
        spec = section(base, id="/id")
        spec["invoke"]["receipt_id"] = "/id"
        return spec

    def test_the_receipts_entry_is_the_proof_and_another_a_possible_duplicate(self) -> None:
        listing = page([refund(7, "o-1"), refund(6, "o-2"), refund(3, "o-1")], has_more=False)
        server = self.scripted(listing, listing, listing, listing)
        mine = self.adapter(self.spec(server.url), receipt={"id": "re_000003", "object": "refund"})
        seen = mine.observe("refund-o-1", {})
        self.assertEqual(seen.status, "present")
        self.assertEqual(seen.evidence["found"]["id"], "re_000003", "the receipt's entry, not the newest")
        self.assertEqual((seen.evidence["receipt_id"], seen.evidence["receipt_listed"], seen.evidence["other_ids"],
                          seen.evidence["possible_duplicate"]), ("re_000003", True, ["re_000007"], True))
        alone = self.adapter(self.spec(server.url), "o-2", receipt={"id": "re_000006"}).observe("refund-o-2", {})
        self.assertEqual((alone.status, alone.evidence["receipt_listed"]), ("present", True))
        self.assertNotIn("possible_duplicate", alone.evidence)
        other = self.adapter(self.spec(server.url), "o-2", receipt={"id": "re_000009"}).observe("refund-o-2", {})
        self.assertEqual((other.status, other.evidence["receipt_listed"], other.evidence["other_ids"],
                          other.evidence["possible_duplicate"]), ("present", False, ["re_000006"], True),
                         "one entry, with another id than the receipt's: recorded and flagged")
        unknown = self.adapter(self.spec(server.url), "o-2").observe("refund-o-2", {})
        self.assertEqual(unknown.status, "present", "no receipt (an outcome unknown): any entry is the proof")
        self.assertNotIn("possible_duplicate", unknown.evidence)

    def test_an_invoke_remembers_its_own_receipts_id(self) -> None:
        server = self.scripted(Reply(200, b'{"id": "re_000002", "object": "refund"}'),
                               page([refund(2, "o-1"), refund(1, "o-1")], has_more=False))
        adapter = self.adapter(self.spec(server.url))
        adapter.invoke("refund-o-1", {"charge": "ch_1"}, 1)
        seen = adapter.observe("refund-o-1", {})
        self.assertEqual((seen.evidence["found"]["id"], seen.evidence["other_ids"]), ("re_000002", ["re_000001"]))

    def test_the_two_ids_go_together(self) -> None:
        lone = section("http://127.0.0.1:1")
        lone["invoke"]["receipt_id"] = "/id"
        self.assertEqual([p.path for p in http_problems({"http": lone})], [("http", "invoke", "receipt_id")])
        self.assertIn("go together", http_problems({"http": section("http://127.0.0.1:1", id="/id")})[0])
        self.assertEqual(http_problems({"http": self.spec("http://127.0.0.1:1")}), [])


class RefundsStandInTest(unittest.TestCase):
    """The stand-in answers as its docstring says: forms only, pages newest first that say ``has_more``."""

    def test_forms_pages_and_refusals(self) -> None:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        form = dict(auth, **{"Content-Type": "application/x-www-form-urlencoded"})
        with StandIn("refunds", ["--token", TOKEN]) as api:
            self.assertEqual(api.request("POST", "/v1/refunds", b"charge=ch_1")[0], 401)
            self.assertEqual(api.request("POST", "/v1/refunds", {"charge": "ch_1"}, auth)[0], 400, "JSON is refused")
            self.assertEqual(api.request("POST", "/v1/refunds", b"amount=1", form)[0], 400, "no charge")
            for n in range(1, 4):
                status, _, body = api.request("POST", "/v1/refunds", f"charge=ch_{n}&metadata%5Border%5D=o-{n}"
                                              .encode(), dict(form, **{"Idempotency-Key": "k"}))
                self.assertEqual((status, json.loads(body)["id"]), (200, f"re_{n:06d}"), "the key is ignored")
            first = json.loads(api.request("GET", "/v1/refunds?limit=2", None, auth)[2])
            self.assertEqual(([r["id"] for r in first["data"]], first["has_more"]), (["re_000003", "re_000002"], True))
            last = json.loads(api.request("GET", "/v1/refunds?limit=2&starting_after=re_000002", None, auth)[2])
            self.assertEqual(([r["id"] for r in last["data"]], last["has_more"]), (["re_000001"], False))
            self.assertEqual(api.request("GET", "/v1/refunds?starting_after=re_9", None, auth)[0], 400)
            self.assertEqual(api.request("GET", "/v1/refunds?limit=101", None, auth)[0], 400)
            self.assertEqual(api.request("GET", "/v1/refunds", None, dict(auth, **{"Idempotency-Key": "k"}))[0], 200)
            self.assertEqual(api.count()["by_order"], {"o-1": 1, "o-2": 1, "o-3": 1})
            self.assertEqual(api.count()["keyed_listings"], 1)


class RefundsDriveTest(unittest.TestCase):
    """One refund per order in a Stripe-shaped API, a listing longer than one page, ``drive`` killed mid-call."""

    def contract(self, base: str, limit: int) -> Dict[str, Any]:
        http = section(base, limit=limit, id="/id", value="{field.order}")
        http["invoke"]["receipt_id"] = "/id"
        http["invoke"]["headers"] = {"Authorization": "Bearer {file:.stripe-key}"}
        http["observe"]["headers"] = {"Authorization": "Bearer {file:.stripe-key}"}
        return {
            "contract": 1, "task_id": "refunds", "goal": "Refund each order of orders.jsonl once.",
            "non_goals": ["Refunding an order outside the list"], "allowed_actions": ["create refunds", "list refunds"],
            "forbidden_actions": ["refunding an order twice"], "completion_evidence": ["each order's refund listed"],
            "workspace": ".",
            "steps": [{"id": "refund", "items": {"jsonl": "orders.jsonl"}, "key": "refund-{field.order|slug}",
                       "payload": {"template": {"charge": "{field.charge}", "amount": "{field.amount}",
                                                "metadata": {"order": "{field.order}"}}},
                       "next": "done"}],
            "effects": {"key_pattern": "refund-[a-z0-9-]+", "http": http, "timeout_seconds": 4, "settle_seconds": 1.0,
                        "concurrency": 2},
            "retry": {"base_seconds": 0.2, "cap_seconds": 0.5},
        }

    def test_killed_mid_call_one_refund_per_order_and_no_later_page_taken_for_an_absence(self) -> None:
        orders = [f"o-{n}" for n in range(1, 8)]
        with StandIn("refunds", ["--token", TOKEN, "--lag", "0.3"]) as api:
            for n in range(1, 6):  # refunds made before the run, so each listing is longer than one page of 2
                status, _, _ = api.request("POST", "/v1/refunds", f"charge=ch_old{n}&metadata%5Border%5D=old-{n}"
                                           .encode(), {"Authorization": f"Bearer {TOKEN}",
                                                       "Content-Type": "application/x-www-form-urlencoded"})
                self.assertEqual(status, 200)
            cli = RunnerCli(self)
            with open(os.path.join(cli.root, "orders.jsonl"), "w", encoding="utf-8") as handle:
                for n, order in enumerate(orders, 1):
                    handle.write(json.dumps({"order": order, "charge": f"ch_{n}", "amount": 100 * n}) + "\n")
            with open(os.path.join(cli.root, ".stripe-key"), "w") as handle:
                handle.write(TOKEN + "\n")
            cli.init(self.contract(api.base, limit=2))
            api.faults([{"fault": "502-after", "on": "create"}, {"fault": "429", "on": "list", "retry_after": 1}])
            for kill in range(2):
                api.faults([{"fault": "stall-after", "on": "create", "seconds": 30}], add=True)
                before = stalled(api, "create")
                drive = cli.spawn("drive", "--owner", "agent-1")
                wait_for(f"kill {kill}: a refund held by the stand-in",
                         lambda before=before: stalled(api, "create") > before)
                drive.send_signal(signal.SIGKILL)
                drive.wait()
            done = cli.child("drive", "--owner", "agent-1", "--json", code=10, timeout=240)
            self.assertEqual(json.loads(done.out)["reason"], "complete")
            counted = api.count()
            self.assertEqual((counted["total"], counted["duplicates"]), (5 + len(orders), {}))
            self.assertEqual(counted["keyed_listings"], 0, "no listing request carried the key")
            effects = cli.json("effect", "list")["effects"]
            self.assertEqual({e["state"] for e in effects.values()}, {"verified"})
            proved = []
            for key in effects:
                shown = cli.json("effect", "show", key)
                evidence, receipt = shown["evidence"], shown.get("receipt")
                self.assertGreater(evidence["pages"], 1, "the listing is longer than one page")
                if receipt is not None:  # a call killed or answered by a proxy's 502 has none
                    self.assertEqual((evidence["found"]["id"], evidence["receipt_listed"]), (receipt["id"], True))
                    proved.append(key)
            self.assertGreaterEqual(len(proved), 1, "a refund whose answer came is proved by its receipt's entry")
            status, _, body = api.request("GET", "/v1/refunds?limit=100", headers={"Authorization": f"Bearer {TOKEN}"})
            refunds = json.loads(body)
            self.assertEqual(sorted(r["metadata"]["order"] for r in refunds["data"] if r["charge"].startswith("ch_")
                                    and not r["charge"].startswith("ch_old")), orders)
            self.assertEqual({r["amount"] for r in refunds["data"] if r["metadata"]["order"] == "o-3"}, {300})


if __name__ == "__main__":
    unittest.main()
