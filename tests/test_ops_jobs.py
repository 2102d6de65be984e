"""Jobs: the transition rules as pure functions, and the job's own files read as untrusted input.

The ``*_ops`` cases take an envelope and return operations or one exact error
class, with no process and no store. The observation cases write the files a
job folder can hold (a forged, stale, deep, huge or oversized ``exit.json``, a
FIFO, a symbolic link) and check that none is believed and none hangs or
crashes the reader; one case does the same to a real running job through the
command line.
"""

import copy
import hashlib
import json
import os
import sys
import tracemalloc
import unittest
from typing import Any, Dict, Optional
from unittest import mock

try:
    from .support import util as _util
    from .support.cli import RunnerCli
except ImportError:
    from support import util as _util
    from support.cli import RunnerCli

from runner.execution import jobs
from runner.ledger.envelope import apply_ops, new_envelope
from runner.base.times import format_time
from runner.base.canonical import canonical_json
from runner.base.errors import InvalidInput, NeedsReconciliation

NOW = _util.CLOCK_START
PLAN = {"contract": 1, "task_id": "job-ops", "goal": "g", "steps": [{"id": "a"}]}
NONCE = "n" * 32


def envelope(rerun: bool = False) -> Dict[str, Any]:
    plan = dict(copy.deepcopy(PLAN), **({"jobs": {"rerun_vanished": True}} if rerun else {}))
    return new_envelope("job-ops", plan, "0" * 64, format_time(NOW - 100))


def with_job(envelope_: Dict[str, Any], key: str = "j1", **fields: Any) -> Dict[str, Any]:
    """``envelope_`` with job ``key`` submitted (``sleep 1``), its record then changed by ``fields``."""
    _what, ops = jobs.submit_intent_ops(envelope_, "/runs/r", key, ["sleep", "1"], NOW, nonce=NONCE)
    apply_ops(envelope_, ops)
    envelope_["jobs"][key].update(fields)
    return envelope_


def after(state: Dict[str, Any], ops: Any) -> Dict[str, Any]:
    result = copy.deepcopy(state)
    apply_ops(result, ops)
    return result


class SubmitOps(unittest.TestCase):
    def test_a_new_key_commits_the_intent_with_its_nonce_before_anything_starts(self) -> None:
        what, ops = jobs.submit_intent_ops(envelope(), "/runs/r", "j1", ["make", "test"], NOW, nonce=NONCE)
        self.assertEqual(what, "start")
        record = after(envelope(), ops)["jobs"]["j1"]
        self.assertEqual((record["state"], record["attempt"], record["pid"], record["nonce"], record["cursor"]), ("submitting", 1, None, NONCE, 0))
        self.assertEqual(record["dir"], os.path.relpath(jobs.job_dir("/runs/r", "j1", 1), "/runs/r"))
        self.assertNotIn("j1", record["dir"])

    def test_without_a_nonce_given_each_intent_draws_its_own(self) -> None:
        nonces = {after(envelope(), jobs.submit_intent_ops(envelope(), "/r", "j1", ["x"], NOW)[1])["jobs"]["j1"]["nonce"] for _ in range(20)}
        self.assertEqual(len(nonces), 20)

    def test_a_recorded_job_is_reused_not_restarted(self) -> None:
        for state in ("submitting", "running", "finished"):
            with self.subTest(state=state):
                self.assertEqual(jobs.submit_intent_ops(with_job(envelope(), state=state), "/runs/r", "j1", ["sleep", "1"], NOW), ("existing", []))

    def test_refusals(self) -> None:
        cases = [
            (with_job(envelope()), "j1", ["other"], InvalidInput),
            (with_job(envelope(), state="vanished"), "j1", ["sleep", "1"], NeedsReconciliation),
            (with_job(envelope(), state="cancel-requested"), "j1", ["sleep", "1"], InvalidInput),
            (with_job(envelope(), state="stopped"), "j1", ["sleep", "1"], InvalidInput),
            (envelope(), "bad key", ["x"], InvalidInput),
            (envelope(), "j1", [], InvalidInput),
            (envelope(), "j1", ["a\0b"], InvalidInput),
            (envelope(), "j1", ["x"] * (jobs.MAX_COMMAND_ARGS + 1), InvalidInput),
        ]
        for state, key, command, error in cases:
            with self.subTest(key=key, command=command[:2], error=error.__name__), self.assertRaises(error):
                jobs.submit_intent_ops(state, "/runs/r", key, command, NOW)

    def test_a_vanished_job_reruns_as_the_next_attempt_from_its_cursor_when_the_contract_allows(self) -> None:
        state = with_job(envelope(rerun=True), state="vanished", cursor=3)
        what, ops = jobs.submit_intent_ops(state, "/runs/r", "j1", ["sleep", "1"], NOW, nonce="m" * 32)
        record = after(state, ops)["jobs"]["j1"]
        self.assertEqual((what, record["attempt"], record["cursor"], record["nonce"]), ("start", 2, 3, "m" * 32))


class ObservationOps(unittest.TestCase):
    def test_running_settles_a_submitting_record(self) -> None:
        state = with_job(envelope())
        ops = jobs.observation_ops(state, "j1", {"status": "running", "pid": 41, "pid_start": "77"}, NOW)
        self.assertEqual(ops, jobs.started_ops("j1", 41, "77"))
        self.assertEqual(jobs.observation_ops(with_job(envelope(), state="running", pid=41), "j1", {"status": "running", "pid": 41}, NOW), [])

    def test_finished_records_exit_code_log_digest_and_progress_once(self) -> None:
        state = with_job(envelope(), state="running", pid=41)
        seen = {"status": "finished", "exit_code": 3, "finished_at": format_time(NOW - 1), "log_sha256": "ab" * 32}
        new = after(state, jobs.observation_ops(state, "j1", seen, NOW))
        job = new["jobs"]["j1"]
        self.assertEqual((job["state"], job["exit_code"], job["finished_at"], job["log_sha256"]), ("finished", 3, format_time(NOW - 1), "ab" * 32))
        self.assertEqual(new["counters"]["last_progress_at"], format_time(NOW))
        self.assertEqual(jobs.observation_ops(new, "j1", seen, NOW + 5), [])

    def test_vanished_counts_an_orphan_and_a_cancelled_one_is_stopped_instead(self) -> None:
        state = with_job(envelope(), state="running", pid=41)
        new = after(state, jobs.observation_ops(state, "j1", {"status": "vanished", "pid": 41}, NOW))
        self.assertEqual((new["jobs"]["j1"]["state"], new["counters"]["jobs_orphaned"]), ("vanished", 1))
        state = with_job(envelope(), state="cancel-requested", pid=41)
        new = after(state, jobs.observation_ops(state, "j1", {"status": "vanished", "pid": 41}, NOW))
        self.assertEqual((new["jobs"]["j1"]["state"], new["jobs"]["j1"]["stopped_at"]), ("stopped", format_time(NOW)))
        self.assertNotIn("jobs_orphaned", new["counters"])

    def test_unsettled_is_exactly_the_states_an_observation_can_change(self) -> None:
        finished = {"status": "finished", "exit_code": 0, "finished_at": format_time(NOW), "log_sha256": None}
        for state in ("submitting", "running", "cancel-requested", "vanished", "finished", "stopped"):
            with self.subTest(state=state):
                changes = jobs.observation_ops(with_job(envelope(), state=state, pid=41), "j1", finished, NOW)
                self.assertEqual(bool(changes), state in jobs.UNSETTLED)

    def test_a_stopped_job_observed_later_stays_stopped(self) -> None:
        state = with_job(envelope(), state="stopped", pid=41, stopped_at=format_time(NOW - 5))
        self.assertEqual(jobs.observation_ops(state, "j1", {"status": "vanished", "pid": 41}, NOW), [])
        self.assertEqual(jobs.observation_ops(state, "j1", {"status": "finished", "exit_code": 143, "finished_at": format_time(NOW)}, NOW), [])


class CancelAndShardOps(unittest.TestCase):
    def test_cancel_is_requested_once_and_never_for_a_settled_job(self) -> None:
        state = with_job(envelope(), state="running", pid=41)
        new = after(state, jobs.cancel_ops(state, "j1", NOW))
        self.assertEqual((new["jobs"]["j1"]["state"], new["jobs"]["j1"]["cancel_requested_at"]), ("cancel-requested", format_time(NOW)))
        for settled in ("finished", "vanished", "stopped", "cancel-requested"):
            self.assertEqual(jobs.cancel_ops(with_job(envelope(), state=settled), "j1", NOW), [])
        with self.assertRaises(InvalidInput):
            jobs.cancel_ops(envelope(), "j1", NOW)

    def test_the_cursor_only_moves_forward(self) -> None:
        state = with_job(envelope(), cursor=4)
        self.assertEqual(jobs.shard_ops(state, "j1", 5), [["set", ["jobs", "j1", "cursor"], 5]])
        self.assertEqual(jobs.shard_ops(state, "j1", 4), [])
        self.assertEqual(jobs.shard_ops(state, "j1", 1), [])
        for bad in (-1, True, 1.5, "3"):
            with self.subTest(bad=bad), self.assertRaises(InvalidInput):
                jobs.shard_ops(state, "j1", bad)  # type: ignore[arg-type]
        with self.assertRaises(InvalidInput):
            jobs.shard_ops(envelope(), "j1", 1)


class JobFiles(unittest.TestCase):
    """Defect 10: a job's exit.json was trusted as written."""

    def setUp(self) -> None:
        tmp = _util.scratch_dir()
        self.addCleanup(tmp.cleanup)
        self.run_path = tmp.name
        self.job = with_job(envelope(), state="running")["jobs"]["j1"]
        self.job["dir"] = "jobs/j1/a1"
        self.folder = os.path.join(self.run_path, self.job["dir"])
        os.makedirs(self.folder)
        self.job.update(pid=2 ** 22 + 17, pid_start="12345")  # above Linux's largest pid_max: a wrapper that is gone

    def write(self, name: str, data: bytes) -> str:
        path = os.path.join(self.folder, name)
        with open(path, "wb") as handle:
            handle.write(data)
        return path

    def record(self, **changes: Any) -> Dict[str, Any]:
        """What this attempt's wrapper writes when its command ends, with ``changes``."""
        record = {"pid": self.job["pid"], "start": self.job["pid_start"], "nonce": NONCE, "exit_code": 0, "finished_at": format_time(NOW)}
        record.update(changes)
        return record

    def exit_file(self, **changes: Any) -> None:
        self.write("exit.json", canonical_json(self.record(**changes)) + b"\n")

    def test_an_exit_file_of_this_attempt_finishes_the_job(self) -> None:
        self.write("log", b"line 1\nline 2\n")
        self.exit_file(exit_code=3)
        seen = jobs.observe_job(self.run_path, self.job)
        self.assertEqual(seen, {"status": "finished", "exit_code": 3, "finished_at": format_time(NOW),
                                "log_sha256": hashlib.sha256(b"line 1\nline 2\n").hexdigest()})

    def test_forged_or_stale_exit_files_are_reported_and_not_believed(self) -> None:
        cases = {
            "the bare record a job can write": {"exit_code": 0},
            "another nonce (a stale attempt)": dict(nonce="m" * 32),
            "another pid": dict(pid=self.job["pid"] + 1),
            "another start time": dict(start="999"),
            "an exit code out of range": dict(exit_code=300),
            "a boolean exit code": dict(exit_code=True),
            "no end time": dict(finished_at=None),
        }
        for label, change in cases.items():
            with self.subTest(label):
                if label.startswith("the bare"):
                    self.write("exit.json", json.dumps(change).encode())
                else:
                    self.exit_file(**change)
                seen = jobs.observe_job(self.run_path, self.job)
                self.assertEqual(seen["status"], "vanished", seen)
                self.assertIn("exit.json", seen["damage"])

    def test_files_that_are_not_small_regular_json_objects_are_reported_without_hanging(self) -> None:
        cases = {
            "nested too deeply": lambda path: self.write("exit.json", b"[" * 4000),
            "larger than": lambda path: self.write("exit.json", b'{"exit_code": 0, "pad": "' + b"x" * 70000 + b'"}'),
            "not a JSON object": lambda path: self.write("exit.json", b"[0]"),
            "not valid JSON": lambda path: self.write("exit.json", b"\xff\xfe"),
            "not a regular file": lambda path: os.mkfifo(path),
            "cannot be opened": lambda path: os.symlink(self.write("elsewhere.json", canonical_json(self.record())), path),
        }
        for says, make in cases.items():
            with self.subTest(says):
                path = os.path.join(self.folder, "exit.json")
                if os.path.lexists(path):
                    os.unlink(path)
                make(path)
                seen = jobs.observe_job(self.run_path, self.job)  # a FIFO opened to block would hang here
                self.assertEqual(seen["status"], "vanished", seen)
                self.assertIn(says, seen["damage"])

    def test_a_pid_file_of_another_attempt_is_not_attached_to(self) -> None:
        self.job.update(pid=None, pid_start=None, state="submitting")
        self.write("pid.json", canonical_json({"pid": os.getpid(), "start": None, "nonce": "m" * 32}))
        seen = jobs.observe_job(self.run_path, self.job)
        self.assertEqual((seen["status"], seen["pid"]), ("vanished", None))
        self.assertIn("pid.json does not name this attempt's wrapper", seen["damage"])
        self.write("pid.json", canonical_json({"pid": os.getpid(), "start": jobs._proc_start(os.getpid()), "nonce": NONCE}))
        seen = jobs.observe_job(self.run_path, self.job)
        self.assertEqual((seen["status"], seen["pid"]), ("running", os.getpid()))
        self.assertNotIn("damage", seen)

    def test_a_wrapper_that_ends_while_it_is_observed_is_finished_not_vanished(self) -> None:
        # The wrapper writes its exit file, then ends, in the instant between two reads of the observation.
        def ends_now(pid: int, start: Any) -> bool:
            self.exit_file(exit_code=0)
            return False

        with mock.patch.object(jobs, "_alive", ends_now):
            seen = jobs.observe_job(self.run_path, self.job)
        self.assertEqual((seen["status"], seen.get("exit_code"), seen.get("damage")), ("finished", 0, None), seen)

    def test_a_live_wrapper_is_running_whatever_its_folder_says(self) -> None:
        self.job.update(pid=os.getpid(), pid_start=jobs._proc_start(os.getpid()))
        self.exit_file()
        self.assertEqual(jobs.observe_job(self.run_path, self.job)["status"], "running")

    def test_the_result_streams_the_log_in_bounded_memory(self) -> None:
        """Defect 19: 'job result' read the whole log into memory to print its last 4,000 bytes."""
        size = 48 * 1024 * 1024
        log = os.path.join(self.folder, "log")
        with open(log, "wb") as handle:
            handle.truncate(size - 6)
            handle.seek(0, os.SEEK_END)
            handle.write(b"\nlast\n")
        tracemalloc.start()
        try:
            result = jobs.read_result(self.run_path, self.job)
            _current, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        self.assertLess(peak, 8 * 1024 * 1024, f"peak {peak} bytes while reading a {size}-byte log")
        self.assertTrue(result["log_tail"].endswith("\nlast\n"))
        self.assertEqual(len(result["log_tail"]), 4000)
        digest = hashlib.sha256()
        with open(log, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
        self.assertEqual(result["log_sha256"], digest.hexdigest())


class LaunchTest(unittest.TestCase):
    """A job that ends before its submitter looks at it is still recognised by its own exit file."""

    def test_the_start_time_is_taken_while_the_wrapper_cannot_have_been_reaped(self) -> None:
        tmp = _util.scratch_dir()
        self.addCleanup(tmp.cleanup)
        folder = os.path.join(tmp.name, "jobs", "j1", "a1")
        os.makedirs(folder)
        launched = _util.run(_util.python("-m", "runner.execution.jobs", "--launch", folder, NONCE, "--", "true"))
        self.assertEqual(launched.code, 0, launched)
        pid_text, start = launched.out.split()
        pid = int(pid_text)
        exit_file = os.path.join(folder, "exit.json")
        _wait_until(lambda: os.path.exists(exit_file) and jobs._proc_start(pid) is None)
        # A submitter reading the start time only now (as one slowed by a loaded machine would) finds none ...
        self.assertIsNone(jobs._proc_start(pid))
        with open(exit_file, "rb") as handle:
            written = json.loads(handle.read())
        # ... but the launcher read it while the wrapper was its child, and it is the one the wrapper wrote.
        self.assertEqual((written["pid"], written["start"], written["nonce"]), (pid, start, NONCE))
        job = with_job(envelope(), state="running", pid=pid, pid_start=start)["jobs"]["j1"]
        job["dir"] = os.path.relpath(folder, tmp.name)
        seen = jobs.observe_job(tmp.name, job)
        self.assertEqual((seen["status"], seen["exit_code"], seen.get("damage")), ("finished", 0, None))

    def test_the_former_name_launches_the_same_job(self) -> None:
        # A runner of the previous release, running while its checkout is replaced, still starts -m runner.jobs.
        tmp = _util.scratch_dir()
        self.addCleanup(tmp.cleanup)
        folder = os.path.join(tmp.name, "jobs", "j1", "a1")
        os.makedirs(folder)
        launched = _util.run(_util.python("-m", "runner.jobs", "--launch", folder, NONCE, "--", "true"))
        self.assertEqual(launched.code, 0, launched)
        pid_text, start = launched.out.split()
        exit_file = os.path.join(folder, "exit.json")
        _wait_until(lambda: os.path.exists(exit_file))
        with open(exit_file, "rb") as handle:
            written = json.loads(handle.read())
        self.assertEqual((written["pid"], written["start"], written["nonce"], written["exit_code"]),
                         (int(pid_text), start, NONCE, 0))


def _wait_until(condition: Any, timeout: float = 30.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("the job did not end in time")
        time.sleep(0.01)


class RealJobTest(unittest.TestCase):
    """The forged exit file of defect 10 against a real running job, through the command line."""

    def test_a_forged_exit_file_does_not_finish_a_running_job(self) -> None:
        cli = RunnerCli(self)
        cli("init", "--contract", _util.TEMPLATE)
        cli("lease", "acquire", "--owner", "w1", "--ttl", "600")
        w1 = cli.writer("w1", 1)
        job = w1.json("job", "submit", "j1", "--", sys.executable, "-S", "-c", "import time; time.sleep(120)",
                      code=None)
        self.addCleanup(self._kill, job["pid"])
        self.assertEqual(job["state"], "running")
        folder = os.path.join(cli.run_dir, job["dir"])
        with open(os.path.join(folder, "exit.json"), "w") as handle:
            handle.write('{"exit_code": 0}')
        for result in (cli("--json", "job", "status", "j1"), w1("--json", "next")):
            self.assertIn("exit.json", result.err)
            self.assertIn("not believed", result.err)
        status = cli.json("job", "status", "j1", code=None)
        self.assertEqual((status["state"], status["observed"], status["exit_code"]), ("running", "running", None))
        self.assertEqual(w1.json("next", code=None)["action"]["kind"], "wait-job")
        # w1's lease is live: w2 may not take over
        result = cli("--json", "recover", "--owner", "w2", "--ttl", "600", code=3)
        self.assertIn("exit.json", result.err)
        self.assertEqual(cli.json("job", "status", "j1", code=None)["state"], "running")
        os.unlink(os.path.join(folder, "exit.json"))
        os.mkfifo(os.path.join(folder, "exit.json"))
        self.assertIn("not a regular file", w1.child("--json", "next", timeout=30).err)

    @staticmethod
    def _kill(pid: Optional[int]) -> None:
        import signal

        try:
            os.killpg(int(pid), signal.SIGKILL)  # type: ignore[arg-type]
        except OSError:
            pass


if __name__ == "__main__":
    unittest.main()
