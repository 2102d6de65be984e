"""The views a fresh model or an observer reads, on runs of the minute-37 contract (``tests/support/recovery.py``).

* ``brief`` stays within its bound, whatever the bound, on a run of 10,000
  effects, and names the unresolved effects and the next action;
* ``events`` numbers every transition: an observer resumes after its last one,
  missing and repeating nothing, its death changes nothing in the run, and a
  gap left by compaction is reported;
* ``report`` counts a whole run across workers, crashes and attempts;
* ``step start``, ``status``, ``next`` and ``brief`` show one decision, the same at the same
  revision, over a batch killed and resumed, and ``report`` counts the recoveries the timeline shows.
"""

import copy
import json
import os
import re
import shutil
import signal
import tempfile
import time
import unittest
import warnings
from typing import Any, Dict, List

try:
    from .support import util as _util
    from .support.recovery import Child, DEADLINE, PATCH_KEY, STEPS, TASK_ID, World, process_gone, wait_until
    from .support.recovery_case import RecoveryCase
except ImportError:  # run from inside tests/
    from support import util as _util  # type: ignore[no-redef]
    from support.recovery import Child, DEADLINE, PATCH_KEY, STEPS, TASK_ID, World, process_gone, wait_until  # type: ignore[no-redef]
    from support.recovery_case import RecoveryCase  # type: ignore[no-redef]

from runner.contract.text import load_contract
from runner.base.times import format_time, parse_time
from runner.base.canonical import content_digest
from runner.execution.jobs import observe_job
from runner.execution.recovery import decide, recover, refresh_jobs
from runner.surfaces.views import brief as render_brief
from runner.execution.run import submit_job
from runner.stores.file import RunStore


class BriefTest(RecoveryCase):
    """``brief`` stays within its bound on a run of 10,000 effects and names the unresolved effects and the next action."""

    UNRESOLVED = {
        "patch:shard-0042": "started",
        "patch:shard-1337": "acknowledged",
        "patch:shard-2718": "acknowledged",
        "patch:shard-6021": "acknowledged",
        "patch:shard-7777": "started",
        "patch:shard-8080": "acknowledged",
        "patch:shard-9001": "started",
    }

    path = ""
    state: Dict[str, Any] = {}

    @classmethod
    def setUpClass(cls) -> None:
        root = tempfile.mkdtemp(prefix="runner-recovery-")
        cls.addClassCleanup(shutil.rmtree, root, True)
        world = World(root)
        goal = "Find why the nightly suite fails on the cache layer, patch every shard of the cache configuration, run the long suite, and deliver the patch with its evidence. "
        plan = dict(load_contract(world.contract), goal=goal * 4)
        earlier = [{"id": name, "artifact": f"work/{name}.md", "check": "file exists", "evidence": ["sha256"], "next": "analysis"} for name in ("reproduce", "bisect")]
        plan["steps"] = earlier + plan["steps"]
        store = RunStore.create(world.run, TASK_ID, plan, durability="process")
        cls.addClassCleanup(store.fs.close)  # type: ignore[attr-defined]
        cls.path = store.path
        stamp = store.now()
        record = {"attempts": 1, "started_at": stamp, "error": None, "class": None, "next_attempt_at": None, "approval": False}
        ops: List[List[Any]] = [
            ["set", ["lease"], {"owner": "worker-2", "epoch": 2, "expires_at": format_time(time.time() + 3600), "acquired_at": stamp}],
            ["set", ["steps", "reproduce"], dict(record, state="done", finished_at=stamp, evidence={"sha256": "1" * 64, "notes": "fails in 3 of 10 nightly runs " * 4})],
            ["set", ["steps", "bisect"], dict(record, state="done", finished_at=stamp, evidence={"sha256": "2" * 64, "notes": "first bad commit changes the cache ttl " * 4})],
            ["set", ["steps", "analysis"], dict(record, state="done", finished_at=stamp, evidence={"sha256": "a" * 64, "notes": "the cache entry outlives its source " * 4})],
            ["set", ["steps", "edits"], dict(record, state="running", finished_at=None, evidence=None)],
            ["set", ["completed_steps"], ["reproduce", "bisect", "analysis"]],
            ["set", ["current_step"], "edits"],
        ]
        for n in range(6):
            ops.append(["set", ["jobs", f"lint-{n}"], {
                "state": "finished", "command": ["lint", str(n)], "attempt": 1, "dir": f"jobs/lint-{n}/a1", "submitted_at": stamp, "pid": None,
                "pid_start": None, "exit_code": 0, "finished_at": stamp, "log_sha256": None, "cursor": 12, "cancel_requested_at": None, "stopped_at": None}])
        store.commit(ops)
        for batch in range(20):
            ops = []
            for i in range(batch * 500, batch * 500 + 500):
                key = f"patch:shard-{i:04d}"
                state = cls.UNRESOLVED.get(key, "verified")
                ops.append(["set", ["effects", key], {
                    "state": state, "payload_digest": content_digest({"shard": i}), "attempts": 1, "step": "edits",
                    "started_at": stamp, "updated_at": stamp,
                    "receipt": {"id": i, "queue": "cache-config-rollout", "accepted_by": "config-service eu-west-1 replica 3"} if state != "started" else None,
                    "evidence": {"seen": i} if state == "verified" else None, "reason": None, "next_attempt_at": None,
                }])
            store.commit(ops)
        assert len(store.state["effects"]) == 10000
        cls.state = copy.deepcopy(store.state)

    def brief(self, *args: str) -> Dict[str, Any]:
        result = _util.in_process_cli(["--dir", self.path, "--json", "brief", *args])
        self.assertEqual(result.code, 0, result.err)
        return _util.one_json(result)

    def test_brief_of_ten_thousand_effects(self) -> None:
        full = render_brief(self.state, decide(self.state, time.time(), "worker-2", 2, {}), 10 ** 6)
        self.assertGreater(len(full), 2000)
        default, custom = self.brief(), self.brief("--max-chars", "900")
        text = default["brief"]
        self.assertLessEqual(len(text), 2000)
        self.assertEqual(default["chars"], len(text))
        first = sorted(self.UNRESOLVED)[0]
        self.assertIn("Next action:", text)
        self.assertIn(f"Next action: reconcile `{first}`", text)
        for key, state in sorted(self.UNRESOLVED.items())[:5]:
            self.assertIn(f"UNRESOLVED `{key}`: {state}", text)
        self.assertIn("… and 2 more unresolved", text)
        self.assertIn("4 acknowledged, 3 started, 9993 verified", text)
        self.assertIn("- `edits`: running", text)
        self.assertLessEqual(len(custom["brief"]), 900)
        self.assertIn("Next action:", custom["brief"])
        self.assertIn(first, custom["brief"])

    def test_brief_is_within_any_custom_bound(self) -> None:
        full = render_brief(self.state, decide(self.state, time.time(), "worker-2", 2, {}), 10 ** 6)
        newlines = [i for i, c in enumerate(full) if c == "\n" and 400 < i < len(full) - 100]
        limits = [newlines[len(newlines) // 2] + 41, 30]
        results = [self.brief("--max-chars", str(n)) for n in limits]
        for limit, out in zip(limits, results):
            with self.subTest(max_chars=limit):
                self.assertLessEqual(len(out["brief"]), limit)


class EventsTest(RecoveryCase):
    """Every transition has a sequence number; an observer resumes after its last one, missing and repeating nothing.

    An observer that follows the run and is SIGKILLed changes nothing in it;
    compaction keeps every event (in the history folder), and after a drop by
    the run's retention ``truncated`` and ``dropped`` say so.
    """

    def test_observer_resumes_and_its_death_does_not_touch_the_run(self) -> None:
        world = self.world()
        run = self.open_run(world)
        run.acquire("worker-1", 300)
        run.step_start("analysis")
        run.step_done("analysis", {"sha256": "a" * 64})
        follower = Child(_util.python("-m", "runner", "--dir", world.run, "events", "--follow", "--after", "0", "--timeout", str(DEADLINE)))
        self.addCleanup(follower.close)
        seen: List[Dict[str, Any]] = []

        def read_until(seq: int) -> None:
            while not seen or seen[-1]["seq"] < seq:
                line = follower.line()
                self.assertIsNotNone(line, follower.stderr())
                seen.append(json.loads(line))  # type: ignore[arg-type]

        read_until(run.store.revision)
        payload = {"patch_sha256": "b" * 64}
        run.step_start("edits")
        run.effect_begin(PATCH_KEY, payload)
        read_until(run.store.revision)
        follower.kill()
        self.assertEqual(follower.proc.returncode, -signal.SIGKILL)
        last = seen[-1]["seq"]
        self.assertEqual([e["seq"] for e in seen], list(range(1, last + 1)))

        run.effect_ack(PATCH_KEY, {"change_id": "c-1"})
        run.effect_verify(PATCH_KEY, {"change_id": "c-1"})
        for step in STEPS[1:]:
            if step != "edits":
                run.step_start(step)
            run.step_done(step, {"sha256": "e" * 64, "applied": {"change_id": "c-1"}, "exit_code": 0, "log_sha256": "f" * 64})
        self.assertEqual(run.store.state["status"], "complete")
        final = run.store.revision

        middle = last // 2
        resumed, everything, tail, empty = [self.cli(world).json("events", "--after", str(after))
                                            for after in (last, 0, middle, final)]
        all_seqs = [e["seq"] for e in everything["events"]]
        self.assertEqual(all_seqs, list(range(1, final + 1)))
        self.assertFalse(everything["truncated"])
        self.assertEqual(everything["last"], final)
        self.assertEqual([e["seq"] for e in tail["events"]], list(range(middle + 1, final + 1)))
        self.assertEqual(tail["events"], everything["events"][middle:])
        self.assertEqual(empty["events"], [])
        self.assertEqual([e["seq"] for e in resumed["events"]], list(range(last + 1, final + 1)))
        self.assertEqual(seen + resumed["events"], everything["events"])

        store = RunStore.open(world.run)
        self.addCleanup(store.fs.close)  # type: ignore[attr-defined]
        self.assertEqual([f for f in store.findings if f.level != "note"], [])
        self.assertEqual((store.state["status"], store.revision), ("complete", final))
        done = _util.in_process_cli(["--dir", world.run, "events", "--follow", "--after", str(final), "--timeout", str(DEADLINE)])
        self.assertEqual((done.code, done.out), (0, ""))

    def test_compaction_keeps_every_event(self) -> None:
        world = self.world(create=False)
        store = RunStore.create(world.run, TASK_ID, load_contract(world.contract), compact_min_bytes=1 << 40, durability="process")
        self.addCleanup(store.fs.close)  # type: ignore[attr-defined]
        for rev in range(1, 14):
            store.commit([["set", ["counters", "cost"], {"tokens": rev}]])
            if rev in (5, 10):
                store.compact()
        whole, kept = self.cli(world).json("events", "--after", "0"), self.cli(world).json("events", "--after", "5")
        self.assertEqual((whole["truncated"], whole["oldest"]), (False, 1))
        self.assertEqual([e["seq"] for e in whole["events"]], list(range(1, 14)))
        self.assertEqual((kept["truncated"], [e["seq"] for e in kept["events"]]), (False, list(range(6, 14))))
        self.assertNotIn("dropped", whole)

    def test_a_drop_by_the_retention_is_reported(self) -> None:
        world = self.world(create=False)
        plan = dict(load_contract(world.contract), history={"keep_bytes": 1})
        store = RunStore.create(world.run, TASK_ID, plan, compact_min_bytes=1 << 40, durability="process")
        self.addCleanup(store.fs.close)  # type: ignore[attr-defined]
        for rev in range(1, 14):
            store.commit([["set", ["counters", "cost"], {"tokens": rev}]])
            if rev in (5, 10, 13):
                store.compact()  # the third copies records 6 to 10 into the history folder, and records 1 to 5 go
        gap, kept = self.cli(world).json("events", "--after", "0"), self.cli(world).json("events", "--after", "5")
        gap_text = _util.in_process_cli(["--dir", world.run, "events", "--after", "2"])
        self.assertEqual((gap["truncated"], gap["oldest"]), (True, 6))
        self.assertEqual([e["seq"] for e in gap["events"]], list(range(6, 15)))  # 14 records the drop
        self.assertEqual({k: gap["dropped"][k] for k in ("first", "through", "records", "policy")},
                         {"first": 1, "through": 5, "records": 5, "policy": {"keep_bytes": 1}})
        self.assertEqual((kept["truncated"], [e["seq"] for e in kept["events"]]), (False, list(range(6, 15))))
        lines = [json.loads(line) for line in gap_text.out.splitlines()]
        self.assertEqual((lines[0]["gap"], lines[0]["oldest"], lines[0]["dropped"]["through"]), (True, 6, 5))
        self.assertIn("history retention", lines[0]["hint"])
        self.assertEqual([e["seq"] for e in lines[1:]], list(range(6, 15)))


class ReportTest(RecoveryCase):
    """``report --json`` counts the whole run across workers and attempts.

    The run: a first worker (a child process on an injected clock) repeats a
    step after a transient failure, retries an effect observed absent, leaves
    an effect uncertain and a job running, adds costs and is SIGKILLed; its
    job is then killed too. A second worker (this process, on an injected
    clock) takes over at a known time, reconciles, reruns the vanished job
    and completes; a command-line process adds costs under its lease.
    """

    def test_report_across_attempts(self) -> None:
        world = self.world(rerun_vanished=True)
        t0 = float(int(time.time()) - 1000)
        first = self.child({"mode": "report-a", "t0": t0, **world.spec()})
        pid = first.expect("PAUSED")["pid"]
        first.kill()
        os.killpg(pid, signal.SIGKILL)  # the gate is shut: the job cannot have finished first
        wait_until("the first worker's job is gone", lambda: process_gone(pid))
        world.open_gate()  # for the rerun
        last_write = parse_time(world.state()["updated_at"])

        takeover_at = float(int(time.time()))
        run = self.open_run(world, clock=lambda: takeover_at)
        decision = recover(run, "worker-b", 3600)
        self.assertEqual((decision["decision"], decision["reason"], decision["check"]["key"]), ("stop", "needs-reconciliation", PATCH_KEY))
        run.effect_verify(PATCH_KEY, {"change_id": "seen-at-target"})
        decision = recover(run, "worker-b", 3600)
        self.assertEqual((decision["action"]["kind"], decision["action"]["key"]), ("rerun-job", "tests"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)  # the runner detaches the job's wrapper on purpose
            submit_job(run, "tests", decision["action"]["command"])
        wait_until("the rerun finishes", lambda: observe_job(world.run, run.state["jobs"]["tests"])["status"] == "finished")
        refresh_jobs(run)
        run.step_done("edits", {"sha256": "b" * 64, "applied": {"change_id": "seen-at-target"}})
        for step in ("tests", "deliver"):
            run.step_start(step)
            run.step_done(step, {"sha256": "c" * 64, "exit_code": 0, "log_sha256": run.state["jobs"]["tests"]["log_sha256"]})
        self.assertEqual(run.state["status"], "complete")
        epoch = str(run.epoch)

        cost = _util.run_cli("--dir", world.run, "cost", "--owner", "worker-b", "--epoch", epoch, "--add", "tokens=800", "--add", "money=0.5", timeout=DEADLINE)
        self.assertEqual(cost.code, 0, cost.err)
        report = self.cli(world).json("report")
        self.assertEqual(report["status"], "complete")
        self.assertEqual(report["recoveries"], 2, "worker-a's lease taken over, then worker-b's first holding by its second recover")
        self.assertEqual(report["recovery_wait_seconds"], round(takeover_at - last_write, 3))
        self.assertGreater(report["recovery_wait_seconds"], 0)
        self.assertEqual(report["repeated_steps"], 1)
        self.assertEqual(report["unknown_results"], 1)
        self.assertEqual(report["retries"], 1)
        self.assertEqual(report["orphaned_jobs"], 1)
        self.assertEqual(report["cost"], {"tokens": 2000, "money": 0.75})
        self.assertEqual((report["effects"], report["effects_verified"], report["unresolved_effects"]), (2, 2, 0))
        state = world.state()
        self.assertEqual(state["steps"]["analysis"]["attempts"], 2)
        self.assertEqual(state["jobs"]["tests"]["attempt"], 2)

    def test_the_readme_defines_every_figure_report_prints(self) -> None:
        with _util.scratch_dir() as root:
            run, page = os.path.join(root, "run"), os.path.join(root, "page.html")
            self.assertEqual(_util.in_process_cli(["--dir", run, "init", "--contract", _util.TEMPLATE]).code, 0)
            printed = set(_util.one_json(_util.in_process_cli(["--dir", run, "--json", "report", "--html", page]))) - {"ok"}
        with open(os.path.join(_util.REPO_ROOT, "README.md"), encoding="utf-8") as handle:
            readme = handle.read()
        table = readme.split("What `report` prints", 1)[1].split("\n\n", 2)[1]
        defined = {name for row in table.splitlines()[2:] for name in re.findall(r"`([a-z_]+)`", row.split("|")[1])}
        self.assertEqual(defined, printed)


class ViewsAgreeTest(unittest.TestCase):
    """One truth in every view: the decision at a revision, whoever prints it."""

    def test_status_next_brief_and_step_start_agree_over_a_killed_and_resumed_batch(self) -> None:
        from runner.surfaces.history import load
        from runner.surfaces.views import action_text
        from tests.test_executor import TargetCase

        case = TargetCase()
        case.setUp()
        self.addCleanup(case.doCleanups)
        case.start(["a", "b", "c", "d", "e", "f"], invoke={"send-after": 0.2},
                   before=[{"id": "notes", "checks": {"ok": ["true"]}, "next": "file-tickets"}])
        def views(owner: str, epoch: int) -> Dict[str, Any]:
            status = case.cli.status()
            nxt = case.cli("next", "--owner", owner, "--epoch", str(epoch), "--json", code=None).json
            brief = case.cli("brief", "--json", code=None).json["brief"]
            return {"status": status, "next": nxt, "brief": brief}

        first = case.cli.spawn("drive", "--owner", "w1", "--json")
        deadline = time.monotonic() + 30
        while case.lines() < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        first.kill()
        first.wait()
        case.cli("lease", "break", "--by", "supervisor", "--reason", "w1 was killed")
        taken = case.cli("recover", "--owner", "w2", "--json", code=None).json
        epoch = taken["lease"]["epoch"]
        seen = views("w2", epoch)
        decided = seen["next"]
        self.assertEqual(decided["decision"], "act")
        self.assertEqual(seen["status"]["next"]["action"], decided["action"], "status shows the decision next makes")
        self.assertIn(action_text(decided["action"]).split(":")[0], seen["brief"])
        self.assertEqual(taken["action"], decided["action"], "recover persisted the same decision")
        self.assertEqual(seen["status"]["revision"], case.cli.status()["revision"])

        done = case.finish(case.cli.spawn("drive", "--owner", "w2", "--json"))
        self.assertEqual(done["code"], 10, done["err"])
        state = case.cli.status()
        self.assertEqual(state["next"]["decision"], "stop")
        self.assertEqual(state["next"]["reason"], "complete")
        report = case.cli("report", "--json", code=None).json
        history = load(RunStore.open(os.path.join(case.root, ".run")))
        self.assertEqual(report["recoveries"], sum(1 for h in history.holdings if h.takeover), "report and the timeline agree")
        self.assertEqual(report["recoveries"], len(history.crashes))
        for key in "abcdef":
            self.assertEqual(case.lines(key + ":ticket"), 1)

    def test_step_start_prints_the_next_action_next_names(self) -> None:
        from tests.test_executor import TargetCase
        case = TargetCase()
        case.setUp()
        self.addCleanup(case.doCleanups)
        case.start(["a", "b"])
        taken = case.cli("lease", "acquire", "--owner", "w", "--json", code=None).json
        creds = ["--owner", "w", "--epoch", str(taken["epoch"])]
        started = case.cli("step", "start", "file-tickets", *creds, "--json", code=None).json
        nxt = case.cli("next", *creds, "--json", code=None).json
        self.assertEqual(started["next"]["action"], nxt["action"])
        self.assertEqual((nxt["action"]["kind"], nxt["action"]["index"]), ("effect", 0))
        status = case.cli.status()
        self.assertEqual(status["next"]["action"], nxt["action"])
        # The intent the state keeps (here finish-step, written before any item was done) is no next action.
        for view in (started, status):
            self.assertNotIn("next_action", view)
            self.assertEqual(view["recorded_intent"], {"kind": "finish-step", "step": "file-tickets"})
        printed = case.cli("step", "start", "file-tickets", *creds, code=None)
        self.assertIn("next effect", printed.out.replace("`", ""))


if __name__ == "__main__":
    unittest.main()
