"""The timeline page (``report --html``): what it shows, what it never holds, how big it gets, and a real browser.

* Structure: every effect of a small run appears; the effect that went
  uncertain and was verified by observation is marked as reconciled; a lane
  whose holder was SIGKILLed (a real child process, taken over by other
  processes) ends in a crash and a broken lease, never a release; the
  cancellation names the effect that was in flight.
* Nothing external: no script, no ``src=``, no ``http:``/``https:``, no
  ``//`` anywhere in the file, even when the journal's free text holds them.
* Size: a run of 10,000 effects gives a page of bounded size, with its
  exceptional effects still drawn one by one.
* Browser: headless Chromium (the distribution's package) opens the page
  from disk, on screen and laid out for print; the screenshots are not blank
  and the page raised no error. The same check on a control page that does
  raise errors must see them.
"""

import copy
import html
import os
import re
import sys
import unittest
from unittest import mock
from typing import Any, Dict, List, Tuple

from tests.support import real as _real
from tests.support.browser import TEXT_BOXES, blankness, evaluate_pages, find_chromium, load_pages, overlapping
from tests.support.page import assert_inert, parse
from tests.support.timeline_runs import SMALL_KEYS, UNCERTAIN_KEY, crashed_run, small_contract, small_run
from tests.support.util import CLOCK_START, REPO_ROOT, in_process_cli, one_json, run_cli, scratch_dir

from runner.surfaces import history, timeline
from runner.ledger.envelope import apply_ops, new_envelope
from runner.base.times import format_time
from runner.base.canonical import content_digest
from runner.execution.recovery import recover
from runner.execution.run import Run
from runner.stores.file import RunStore

def synthetic_run(effects: int, exceptional_every: int, task: str = "timeline-large") -> Tuple[List[Dict[str, Any]], Dict[str, Any]]:
    """Journal records of one holder filing ``effects`` effects, with the operations the effect ledger writes.

    Every ``exceptional_every``-th effect goes uncertain and is verified by
    observation. Built without a store: the page is under test, not the store.
    """
    plan = {"contract": 1, "task_id": task, "goal": "Many effects.",
            "steps": [{"id": "ingest", "artifact": "tickets", "check": "found", "next": "done"}]}
    state = new_envelope(task, plan, "0" * 64, format_time(CLOCK_START))
    records: List[Dict[str, Any]] = []
    clock = [CLOCK_START]

    def commit(ops: List[List[Any]]) -> None:
        clock[0] += 0.004
        apply_ops(state, copy.deepcopy(ops))  # a journal's records are text: the state never shares their values
        state["revision"] += 1
        state["updated_at"] = format_time(clock[0])
        records.append({"rev": state["revision"], "at": state["updated_at"], "epoch": 1, "ops": ops})

    commit([["set", ["lease"], {"owner": "worker-1", "epoch": 1, "expires_at": format_time(CLOCK_START + 3600), "acquired_at": format_time(CLOCK_START)}]])
    commit([["set", ["steps", "ingest"], {"state": "running", "attempts": 1, "started_at": state["updated_at"]}], ["set", ["current_step"], "ingest"]])
    for n in range(effects):
        key = f"doc-{n:05d}:ticket"
        stamp = format_time(clock[0])
        commit([["set", ["effects", key], {"state": "started", "payload_digest": content_digest({"n": n}), "attempts": 1, "step": "ingest",
                                            "started_at": stamp, "updated_at": stamp, "receipt": None, "evidence": None, "reason": None,
                                            "next_attempt_at": None}]])
        if exceptional_every and n % exceptional_every == 0:
            commit([["set", ["effects", key, "state"], "uncertain"], ["set", ["effects", key, "reason"], "timeout"],
                    ["set", ["counters", "uncertain_effects"], int(state["counters"].get("uncertain_effects", 0)) + 1]])
            commit([["set", ["effects", key, "state"], "verified"], ["set", ["effects", key, "evidence"], {"ticket": n}],
                    ["set", ["counters", "reconciled_effects"], int(state["counters"].get("reconciled_effects", 0)) + 1]])
        else:
            commit([["set", ["effects", key, "state"], "acknowledged"], ["set", ["effects", key, "receipt"], {"ticket": n}]])
            commit([["set", ["effects", key, "state"], "verified"], ["set", ["effects", key, "evidence"], {"ticket": n}]])
    commit([["set", ["steps", "ingest", "state"], "done"], ["set", ["current_step"], None], ["set", ["status"], "complete"]])
    return records, state


class TimelineStructure(unittest.TestCase):
    """What the page of a small run, and of a crashed one, shows."""

    @classmethod
    def setUpClass(cls) -> None:
        cls.scratch = scratch_dir("runner-timeline-")
        cls.small = os.path.join(cls.scratch.name, "small")
        small_run(cls.small)
        cls.page_path = os.path.join(cls.scratch.name, "small.html")
        cls.result = in_process_cli(["--dir", cls.small, "--json", "report", "--html", cls.page_path])
        with open(cls.page_path, encoding="utf-8") as handle:
            cls.page = handle.read()
        cls.elements = parse(cls.page)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.scratch.cleanup()

    def test_report_writes_the_page_and_keeps_its_figures(self) -> None:
        body = one_json(self.result)
        self.assertEqual(self.result.code, 0, self.result.err)
        self.assertEqual(body["html_bytes"], os.path.getsize(self.page_path))
        self.assertEqual((body["reconciled_effects"], body["effects"]), (1, len(SMALL_KEYS)))
        self.assertIn("reconciled effects", self.page)  # the summary table on top

    def test_an_output_file_outside_an_existing_folder_is_refused(self) -> None:
        missing = os.path.join(self.scratch.name, "no-such-folder", "page.html")
        result = in_process_cli(["--dir", self.small, "report", "--html", missing])
        self.assertEqual((result.code, len(result.err.splitlines())), (2, 1), result.err)
        self.assertIn("not a file in an existing folder", result.err)
        self.assertFalse(os.path.exists(os.path.dirname(missing)))

    def test_every_effect_of_a_small_run_appears(self) -> None:
        drawn = {a.get("data-key") for a in self.elements.having("effect")} | {a.get("data-key") for a in self.elements.having("reconciled")}
        for key in SMALL_KEYS:
            self.assertIn(key, drawn, f"effect {key} is not drawn")

    def test_uncertain_then_verified_effect_is_marked_as_reconciled(self) -> None:
        reconciled = [a.get("data-key") for a in self.elements.having("reconciled")]
        self.assertEqual(reconciled, [UNCERTAIN_KEY])
        self.assertIn(UNCERTAIN_KEY, [a.get("data-key") for a in self.elements.having("uncertain")])
        self.assertEqual([a.get("data-key") for a in self.elements.having("effect-failed")], ["doc:5:ticket"])

    def test_a_deferral_is_drawn_apart_from_an_absence(self) -> None:
        # doc:4 was answered "not now" (the target created nothing and named a time): its own row and wait, no absence.
        self.assertEqual([a.get("data-key") for a in self.elements.having("deferred")], ["doc:4:ticket"])
        self.assertEqual(self.elements.having("effect-absent"), [])
        self.assertEqual(len(self.elements.having("not-now")), 1)
        self.assertIn(">deferred (not now)</text>", self.page)
        self.assertNotIn("doc&#58;4&#58;ticket</td>", self.page)  # not among the effects that went wrong

    def test_the_legend_draws_each_mark_and_says_what_it_is(self) -> None:
        legend = self.page.split('<p class="legend">', 1)[1].split("</p>", 1)[0]
        for words in ("lease held", "crash: the holder's last durable write", "lease broken by a supervisor",
                      "the target's 'not now' and the wait it asked for (not an absence)",
                      "settled by observation after an unknown outcome", "cancellation"):
            self.assertIn(words, html.unescape(legend))
        self.assertEqual(legend.count("<svg "), legend.count("<span>"))  # every item a picture of its mark

    def test_the_headline_says_the_run_in_one_sentence(self) -> None:
        headline = html.unescape(self.page.split('<p class="headline">', 1)[1].split("</p>", 1)[0])
        self.assertTrue(headline.startswith("Cancelled: 6 of 7 effects verified; 1 lease holder, 0 of them"), headline)
        self.assertIn("1 effect settled by observation", headline)

    def test_steps_attempts_backoff_approvals_and_cancellation_are_drawn(self) -> None:
        self.assertEqual(len(self.elements.having("step")), 4)  # fetch twice, publish, archive
        self.assertEqual([a["class"] for a in self.elements.having("step")], ["step failed", "step done", "step done", "step cancelled"])
        self.assertGreaterEqual(len(self.elements.having("wait")), 2)  # the step's backoff and the absent effect's
        self.assertEqual(len(self.elements.having("approval-request")), 3)
        self.assertEqual(len(self.elements.having("approval-denied")), 1)
        self.assertEqual(len(self.elements.having("approval-granted")), 1)
        self.assertEqual(len(self.elements.having("approval-superseded")), 1)
        self.assertEqual(len(self.elements.having("cancellation")), 1)
        self.assertIn("In flight then (1): archive&#58;1", self.page)

    def test_no_external_reference_even_from_hostile_text(self) -> None:
        assert_inert(self, self.page)
        self.assertNotIn("<img", self.page)
        # The hostile cancellation reason is shown, as text.
        self.assertIn("example.invalid", self.page)

    def test_crash_lane_ends_without_a_release(self) -> None:
        path = os.path.join(self.scratch.name, "crashed")
        outputs = crashed_run(path, REPO_ROOT)
        page_path = os.path.join(self.scratch.name, "crashed.html")
        result = in_process_cli(["--dir", path, "report", "--html", page_path])
        self.assertEqual(result.code, 0, result.err + "\n".join(outputs))
        with open(page_path, encoding="utf-8") as handle:
            page = handle.read()
        assert_inert(self, page)
        elements = parse(page)
        lanes = {a["data-epoch"]: a for a in elements.having("lane")}
        self.assertEqual(sorted(lanes), ["1", "2"], outputs)
        self.assertEqual((lanes["1"]["data-owner"], lanes["1"]["data-ended"]), ("worker-doomed", "broken"))
        self.assertEqual(lanes["2"]["data-ended"], "released")

        def inside(cls: str, epoch: str) -> int:
            return sum(1 for _, a, around in elements.elements
                       if cls in (a.get("class") or "").split() and any(g.get("data-epoch") == epoch and "lane" in (g.get("class") or "") for g in around))

        self.assertEqual((inside("crash", "1"), inside("break", "1"), inside("release", "1")), (1, 1, 0))
        self.assertEqual((inside("crash", "2"), inside("release", "2"), inside("takeover", "2")), (0, 1, 1))
        crash = [a for _, a, _ in elements.elements if "crash" in (a.get("class") or "").split()]
        self.assertEqual(crash[0].get("data-epoch"), "1")
        # The effect the dead worker left started was settled by the next holder.
        self.assertIn("doc&#58;1&#58;ticket", page)


class TimelineRecoveryMarks(unittest.TestCase):
    """Each recover mark says what recovery decided and what it chose or why it stopped, never a bare None."""

    def test_a_recover_mark_names_the_action_or_the_reason(self) -> None:
        with scratch_dir("runner-timeline-recover-") as scratch:
            path = os.path.join(scratch, "run")
            RunStore.create(path, "timeline-recover", small_contract("timeline-recover"))
            first = Run(RunStore.open(path))
            recover(first, "worker-1", 600)
            first.step_start("fetch")
            Run(RunStore.open(path)).break_lease("supervisor", "worker-1 was killed")
            recover(Run(RunStore.open(path)), "worker-2", 600)
            Run(RunStore.open(path)).cancel("operator", "no longer needed")
            Run(RunStore.open(path)).break_lease("supervisor", "worker-2 was killed")
            recover(Run(RunStore.open(path)), "worker-3", 600)
            page = timeline.render([history.load(RunStore.open(path))])
        titles = [html.unescape(title).split(" at ")[0] for title in re.findall(r'class="recover"><title>([^<]*)</title>', page)]
        self.assertEqual(titles, ["recover by worker-1: act (start-step fetch)", "recover by worker-2: act (resume-step fetch)",
                                  "recover by worker-3: stop (cancelled)"])

    def test_a_recover_mark_whose_action_is_unknown_names_the_decision_alone(self) -> None:
        # The records that set the action were compacted away: only the decision is known.
        plan = small_contract("timeline-recover-gap")
        state = new_envelope(plan["task_id"], plan, "0" * 64, format_time(CLOCK_START))
        lease = {"owner": "worker-1", "epoch": 1, "expires_at": format_time(CLOCK_START + 600), "acquired_at": format_time(CLOCK_START)}
        records = [{"rev": 7, "at": format_time(CLOCK_START), "epoch": 1, "ops": [["set", ["lease"], lease]]},
                   {"rev": 8, "at": format_time(CLOCK_START + 1), "epoch": 1, "ops": [["set", ["observations", "authorization", "r8"],
                                                                                      {"source": "recover", "epoch": 1, "decision": "act", "reason": None}]]}]
        page = timeline.render([history.build(records, state)])
        titles = [html.unescape(title) for title in re.findall(r'class="recover"><title>([^<]*)</title>', page)]
        self.assertEqual([title.split(" at ")[0] for title in titles], ["recover by worker-1: act"], titles)


class TimelineOfCompactedRuns(unittest.TestCase):
    """Compaction keeps every record in the history folder: the page draws the whole run, and says where it breaks."""

    def drive(self, path: str, after_each: Any = None) -> None:
        RunStore.create(path, "timeline-compacted", small_contract("timeline-compacted"))
        run = Run(RunStore.open(path, compact_min_bytes=2048))
        run.acquire("worker-a", 600)
        run.step_start("fetch")
        for n in range(40):
            run.effect_begin(f"doc:{n}:ticket", {"doc": n}, step="fetch")
            run.effect_verify(f"doc:{n}:ticket", {"seen": n})
            if after_each:
                after_each()

    def test_compacted_records_are_read_from_the_history_folder(self) -> None:
        with scratch_dir("runner-timeline-compacted-") as scratch:
            path = os.path.join(scratch, "run")
            self.drive(path)
            self.assertGreater(len(os.listdir(os.path.join(path, "history"))), 5)
            seen = history.load(RunStore.open(path))
        self.assertEqual((seen.gaps, seen.first_rev, seen.damage), ([], 1, []))
        self.assertEqual([len(p.transitions) for p in seen.effects.values()], [2] * 40)
        self.assertEqual(seen.summary["history_records"], seen.state["revision"])
        self.assertNotIn("compacted away", timeline.render([seen]))

    def test_a_missing_or_altered_segment_is_damage_on_every_view(self) -> None:
        import gzip

        with scratch_dir("runner-timeline-damaged-") as scratch:
            path = os.path.join(scratch, "run")
            self.drive(path)
            folder = os.path.join(path, "history")
            names = sorted(os.listdir(folder))
            os.unlink(os.path.join(folder, names[2]))
            with gzip.open(os.path.join(folder, names[4]), "rb") as handle:
                lines = handle.read().split(b"\n")
            lines[0] = lines[0].replace(b'"epoch":1', b'"epoch":7')  # the record's hash no longer matches it
            with gzip.open(os.path.join(folder, names[4]), "wb") as handle:
                handle.write(b"\n".join(lines))
            seen = history.load(RunStore.open(path))
            report = one_json(in_process_cli(["--dir", path, "--json", "report"]))
            doctor = one_json(in_process_cli(["--dir", path, "--json", "doctor"]))
            events = one_json(in_process_cli(["--dir", path, "--json", "events"]))
        first, last = (int(part) for part in names[2][:-len(".jsonl.gz")].split("-"))
        altered_first, altered_last = (int(part) for part in names[4][:-len(".jsonl.gz")].split("-"))
        # The altered segment cannot be read: its records are missing too, besides the damage it is.
        self.assertEqual([g for g in seen.gaps], [(first - 1, last + 1), (altered_first - 1, altered_last + 1)])
        self.assertEqual(len(seen.damage), 3, seen.damage)
        page = timeline.render([seen])
        self.assertEqual(page.count('class="warn damage"'), 3)
        self.assertIn(f"Journal records {first} to {last} are missing from the run", html.unescape(page))
        self.assertEqual(report["history_missing"], last - first + 1 + altered_last - altered_first + 1)
        self.assertEqual(report["history_damage"], seen.damage)
        self.assertEqual(sorted(f["code"] for f in doctor["findings"]),
                         ["history-altered", "history-missing", "history-missing"])
        self.assertFalse(doctor["healthy"])
        self.assertEqual(events["damage"], seen.damage)
        self.assertTrue(events["events"][0]["seq"] == 1 and len(events["events"]) < seen.state["revision"])

    def test_a_run_compacted_before_it_kept_a_history_folder(self) -> None:
        from tests.test_provenance import _older_identity

        with scratch_dir("runner-timeline-older-") as scratch:
            path = os.path.join(scratch, "run")
            with mock.patch("runner.stores.file_writer.new_identity", _older_identity):
                self.drive(path)
            for name in sorted(os.listdir(os.path.join(path, "history")))[:3]:  # what such a run never kept
                os.unlink(os.path.join(path, "history", name))
            seen = history.load(RunStore.open(path))
            doctor = one_json(in_process_cli(["--dir", path, "--json", "doctor"]))
        self.assertEqual((seen.damage, len(seen.notes), seen.gaps[0][0]), ([], 1, 0))
        self.assertIn("were compacted away before the run kept a history folder", timeline.render([seen]))
        self.assertTrue(doctor["healthy"], doctor)
        self.assertEqual([f["code"] for f in doctor["findings"]], ["history-before"])

    def test_a_recorder_keeps_every_record(self) -> None:
        with scratch_dir("runner-timeline-recorded-") as scratch:
            path = os.path.join(scratch, "run")
            recorder = history.Recorder(lambda: RunStore.open(path))
            self.drive(path, recorder.poll)
            seen = recorder.history()
            whole = history.load(RunStore.open(path))
        self.assertEqual(whole.summary, seen.summary)  # the store itself holds them all too
        self.assertEqual((seen.gaps, seen.first_rev), ([], 1))
        self.assertEqual(sorted({p.state for p in seen.effects.values()}), ["verified"])
        self.assertEqual(len(seen.effects), 40)
        self.assertEqual([len(p.transitions) for p in seen.effects.values()], [2] * 40)


class HistoryReplayTest(unittest.TestCase):
    """What a replay of journal records gives, whatever order they come in and whichever are missing."""

    def lanes(self, seen: history.History) -> List[Any]:
        return [[(h.owner, h.epoch, h.start, h.end, h.ended, h.writes) for h in seen.holdings],
                {k: p.transitions for k, p in seen.effects.items()}, seen.gaps, seen.first_rev, seen.last_rev,
                seen.records]

    def test_records_in_any_order_or_repeated_give_one_history_and_leave_the_state_as_it_was(self) -> None:
        records, state = synthetic_run(20, exceptional_every=5)
        before, given = copy.deepcopy(state), copy.deepcopy(records)
        ordered = history.build(records, state)
        shuffled = history.build(records[::-1] + records[:3], state)
        self.assertEqual(records, given, "a replay changes none of the records it is given")
        self.assertEqual(self.lanes(history.build(records, state)), self.lanes(ordered))
        self.assertEqual(self.lanes(shuffled), self.lanes(ordered))
        self.assertEqual((ordered.records, ordered.gaps, ordered.first_rev), (len(records), [], 1))
        self.assertEqual([len(p.transitions) for p in ordered.effects.values()], [3] * 20)
        self.assertEqual(sorted(k for k, p in ordered.effects.items() if p.reconciled),
                         [f"doc-{n:05d}:ticket" for n in range(0, 20, 5)])
        self.assertEqual(state, before)

    def test_missing_records_are_gaps_before_between_and_after(self) -> None:
        records, state = synthetic_run(10, exceptional_every=0)
        last = records[-1]["rev"]
        kept = [r for r in copy.deepcopy(records) if 3 <= r["rev"] <= last - 2 and r["rev"] not in (7, 8)]
        seen = history.build(kept, state, gaps=[(100, 200)])
        self.assertEqual(seen.gaps, [(0, 3), (6, 9), (last - 2, last + 1), (100, 200)])
        self.assertEqual((seen.first_rev, seen.last_rev, seen.records), (3, last - 2, len(kept)))


class TimelineMarksAndCosts(unittest.TestCase):
    """Labels of marks never overlap, whatever their number; each named cost has a row, with its limit if it has one."""

    def test_marks_at_one_moment_are_stacked_and_the_rest_listed(self) -> None:
        records, state = synthetic_run(50, exceptional_every=0)
        seen = history.build(records, state)
        at = seen.start + (seen.end - seen.start) / 2
        reason = "a plan whose reason is long enough to be cut"
        seen.marks += [(at, "migrate", f"plan changed: revision {n} of {reason}") for n in range(6)]
        seen.marks.append((at, "status", "run blocked"))  # and the run's own "run complete" at its end
        page = timeline.render([seen])
        marks = timeline._marks(seen, timeline._Axis(seen.start, seen.end))
        placed = [m for m in marks if m.row is not None]
        self.assertEqual(len(placed), timeline.MARK_ROWS + 1)  # three rows at the one moment, and the last one apart
        for row in range(timeline.MARK_ROWS):
            spans = sorted((m.x - timeline._width(m.text, "small") if m.anchor == "end" else m.x,
                            m.x if m.anchor == "end" else m.x + timeline._width(m.text, "small"))
                           for m in placed if m.row == row)
            self.assertTrue(all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), spans)
        self.assertIn("Marks (8): more than the drawing has room to name", page)
        self.assertEqual(page.count('class="small mark"'), len(placed))
        self.assertTrue(all(len(m.text) <= timeline.MARK_CHARS for m in placed))

    def test_each_cost_is_spent_against_its_limit(self) -> None:
        records, state = synthetic_run(3, exceptional_every=0)
        state["plan"] = dict(state["plan"], limits={"max_cost": {"money": 2.0, "calls": 10}})
        state["plan_digest"] = content_digest(state["plan"])
        state["counters"]["cost"] = {"money": 1.25, "tokens": 900}
        state["counters"]["reserved"] = {"money": 0.5}
        page = timeline.render([history.build(records, state)])
        table = page.split('<table class="costs">', 1)[1].split("</table>", 1)[0]
        self.assertIn("<th>spent</th><th>reserved</th><th>limit</th>", table)
        self.assertIn('<th>money</th><td class="n">1.25</td><td class="n">0.5</td><td class="n">2.0</td>', table)
        self.assertIn('<th>tokens</th><td class="n">900</td><td class="n">0</td><td class="none">none</td>', table)
        self.assertIn('<th>calls</th><td class="n">0</td><td class="n">0</td><td class="n">10.0</td>', table)
        costless = history.build(*synthetic_run(3, exceptional_every=0))
        self.assertNotIn('<table class="costs">', timeline.render([costless]))


class TimelineSize(unittest.TestCase):
    def test_ten_thousand_effects_give_a_bounded_page(self) -> None:
        sizes = {}
        for effects, every in ((2000, 0), (10000, 0), (10000, 100)):
            records, state = synthetic_run(effects, exceptional_every=every)
            page = timeline.render([history.build(records, state)])
            sizes[effects, every] = len(page.encode("utf-8"))
            assert_inert(self, page)
            elements = parse(page)
            reconciled = {a.get("data-key") for a in elements.having("reconciled")}
            self.assertEqual(reconciled, {f"doc-{n:05d}:ticket" for n in range(0, effects, every)} if every else set())
            self.assertNotIn('data-key="doc-00001:ticket"', page)  # ordinary effects are counted per bucket
            self.assertTrue(elements.having("bucket"))
        # Five times the ordinary effects, not five times the page; the exceptional ones add their own marks only.
        self.assertLess(sizes[10000, 0], 1.3 * sizes[2000, 0], sizes)
        self.assertLess(sizes[10000, 100], 1_000_000, sizes)

    def test_a_page_of_many_runs_draws_the_most_eventful_and_lists_all(self) -> None:
        histories = []
        for n in range(timeline.MAX_SECTIONS + 5):
            records, state = synthetic_run(3, exceptional_every=1 if n % 9 == 0 else 0, task=f"run-{n:02d}")
            histories.append(history.build(records, state))
        page = timeline.render(histories)
        drawn = sorted(a["data-task"] for a in parse(page).having("run"))
        self.assertEqual(len(drawn), timeline.MAX_SECTIONS)
        self.assertTrue({f"run-{n:02d}" for n in range(0, timeline.MAX_SECTIONS + 5, 9)} <= set(drawn))  # those with exceptional effects
        self.assertEqual(page.count("<td>index only</td>"), 5)

    def test_small_runs_draw_every_transition(self) -> None:
        records, state = synthetic_run(50, exceptional_every=0)
        elements = parse(timeline.render([history.build(records, state)]))
        self.assertEqual(len(elements.having("effect")), 150)
        self.assertFalse(elements.having("bucket"))


CHROMIUM = find_chromium()


def crowded_run() -> history.History:
    """A run that crowds every label: many holders with long owner ids, a step with a long id, marks at one moment."""
    records, state = synthetic_run(2000, exceptional_every=100)
    seen = history.build(records, state)
    span = seen.end - seen.start
    for n in range(40):
        holding = history.Holding("worker-" + "x" * (n % 7) * 9 + f"-{n}", n + 2, seen.start + span * n / 40)
        holding.end, holding.ended = seen.start + span * (n + 0.7) / 40, "broken"
        holding.last_write = seen.start + span * (n + 0.5) / 40
        seen.holdings.append(holding)
    for n in range(12):
        at = seen.start + span * (0.5 + (n % 3) * 0.001)
        seen.marks.append((at, "migrate", f"plan changed: the {n}th change of plan"))
    seen.marks += [(seen.start + span / 2, "status", "run blocked"), (seen.end, "status", "run complete")]
    long_id = "a-step-whose-id-is-far-longer-than-the-column-of-labels-holds"
    seen.steps.append(history.StepAttempt(long_id, 1, seen.start, 1))
    seen.cancellation = {"at": seen.start + span * 0.9, "by": "operator", "reason": "no longer needed", "in_flight": [],
                         "step": None}
    return seen


@_real.needs("headless Chromium", why_not=lambda: None if CHROMIUM else "not installed (the Debian package chromium; .ci/chromium.sh installs it)")
class TimelineInBrowser(unittest.TestCase):
    def test_no_label_overlaps_another_at_any_size(self) -> None:
        """The boxes the browser drew for the labels: none overlaps another, none leaves its drawing."""
        assert CHROMIUM is not None
        with scratch_dir("runner-timeline-labels-") as scratch:
            small = os.path.join(scratch, "run")
            small_run(small)
            names = ("small.html", "crowded.html", "many.html", "holders.html")
            pages = [os.path.join(scratch, name) for name in names]
            self.assertEqual(run_cli("--dir", small, "report", "--html", pages[0]).code, 0)
            timeline.write(pages[1], [crowded_run()])
            many = [history.build(*synthetic_run(30, exceptional_every=7, task=f"run-{n:02d}")) for n in range(6)]
            timeline.write(pages[2], many)
            holders = crowded_run()
            holders.holdings *= 3  # more than sixty: the lanes get thin and go without labels
            timeline.write(pages[3], [holders])
            boxes, version = evaluate_pages(CHROMIUM, pages, TEXT_BOXES, width=1400)
        for page, drawn in zip(pages, boxes):
            with self.subTest(page=os.path.basename(page)):
                self.assertGreater(len(drawn), 20)
                self.assertEqual(overlapping(drawn), [])
                self.assertEqual([b["text"] for b in drawn if not b["inside"]], [])
        sys.stderr.write(f"\ntimeline-labels: browser={version} labels={sum(len(d) for d in boxes)} overlapping=0\n")


    def test_chromium_renders_the_page_without_errors(self) -> None:
        assert CHROMIUM is not None
        with scratch_dir("runner-timeline-browser-") as scratch:
            run_path = os.path.join(scratch, "run")
            small_run(run_path)
            page = os.path.join(scratch, "page.html")
            self.assertEqual(run_cli("--dir", run_path, "report", "--html", page).code, 0)
            control = os.path.join(scratch, "control.html")
            with open(control, "w", encoding="utf-8") as handle:
                handle.write('<!DOCTYPE html><p>control</p><img src="missing.png"><script>console.error("control")</script>')
            [(_png, control_errors), (png, errors), (printed, print_errors)], version = load_pages(
                CHROMIUM, [(control, "screen"), (page, "screen"), (page, "print")])
            # The check can fail: the control page's two errors (a missing file, a console error) are seen.
            self.assertEqual(len(control_errors), 2, control_errors)
            colours, share = blankness(png)
            blank = colours < 2 or share < 0.02
            print_colours, print_share = blankness(printed)
            size = os.path.getsize(page)
        # On the test runner's own stream, on a line of its own, so that CI's log shows it whole.
        sys.stderr.write(f"\ntimeline-check: browser={version} bytes={size} console_errors={len(errors)} blank={'yes' if blank else 'no'}\n")
        sys.stderr.flush()
        self.assertEqual(errors, [])
        self.assertFalse(blank, (colours, share))
        self.assertEqual(print_errors, [])
        self.assertTrue(print_colours > 1 and print_share > 0.02, (print_colours, print_share))  # laid out for print, still drawn


if __name__ == "__main__":
    unittest.main()
