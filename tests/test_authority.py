"""Authority claims of the runner: leases, fencing, cancellation, scoped approval, bounded retry and budgets.

Concurrency claims are proved with several real processes. Most command lines
run in long-lived child processes that call ``runner.surfaces.cli.main`` once per
request (a "CLI server", the program in :data:`SERVER_SOURCE`), so a test can
issue many verbs cheaply and give each one an explicit clock: a request
carries ``argv``, an ``offset`` in seconds added to the wall clock (or ``at``,
a wall-clock time that stands still for the whole verb), ``env`` overrides and
``start_at``, a wall-clock time to wait for before running; the answer is the
exit code with the captured stdout and stderr. The claims that are about
separate invocations start a new ``python -m runner`` process for each of
them.
"""

import copy
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import unittest
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

try:
    from .support import util as _util
except ImportError:
    from support import util as _util

from runner.ledger import approvals, retry
from runner.contract.text import load_contract
from runner.base.times import format_time, parse_time
from runner.base.canonical import content_digest
from runner.base.errors import AlreadyRunning, Fenced, LimitExhausted, RetryLater
from runner.execution.recovery import recover
from runner.execution.run import Run
from runner.stores.file import RunStore

CONTENDERS = 8
#: Race rounds through long-lived children; RUNNER_FULL_TESTS=1 runs the long sweep.
SERVER_ROUNDS = 26 if _util.FULL_TESTS else 8
SPAWN_ROUNDS = 1
CONTROL_ENV = ("RUNNER_OWNER", "RUNNER_EPOCH", "RUNNER_DIR")

PAYLOAD = {"slug": "weekly-2026-48", "title": "Week 48 in engineering", "body": "Three things shipped."}
OTHER_PAYLOAD = {"slug": "weekly-2026-48", "title": "Week 48 in engineering", "body": "Four things shipped."}
EVIDENCE = {"draft": {"file_sha256": "0" * 64}, "review": {"exit_code": 0}, "publish": {"receipt": {"id": 7}, "url_check": "title found"}}


# -- the child ------------------------------------------------------------------------------

#: The CLI server: answers one JSON request per stdin line until stdin closes.
SERVER_SOURCE = r"""
import contextlib, io, json, os, sys, time, traceback
from runner.surfaces.cli import main

real = time.time
for name in ("RUNNER_OWNER", "RUNNER_EPOCH", "RUNNER_DIR"):
    os.environ.pop(name, None)
answer = sys.stdout
for line in sys.stdin:
    request = json.loads(line)
    start_at = request.get("start_at")
    while start_at is not None and real() < start_at:
        time.sleep(max(0.0, start_at - real()))
    offset, at = float(request.get("offset", 0.0)), request.get("at")
    saved = {name: os.environ.get(name) for name in request["env"]}
    os.environ.update(request["env"])
    time.time = (lambda: at) if at is not None else (lambda: real() + offset) if offset else real
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(request["argv"])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        code = 99
        err.write(traceback.format_exc())
    finally:
        time.time = real
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    answer.write(json.dumps({"code": code, "out": out.getvalue(), "err": err.getvalue()}) + "\n")
    answer.flush()
"""


# -- parent-side helpers ---------------------------------------------------------------------

def child_env(**extra: str) -> Dict[str, str]:
    env = _util.child_env(**extra)
    for name in CONTROL_ENV:
        if name not in extra:
            env.pop(name, None)
    return env


class CliServer:
    """A child process that runs ``runner.surfaces.cli.main`` once per request; see :data:`SERVER_SOURCE`."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            _util.python("-c", SERVER_SOURCE),
            cwd=_util.REPO_ROOT,
            env=child_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )

    def send(self, argv: Sequence[str], offset: float = 0.0, env: Optional[Dict[str, str]] = None, start_at: Optional[float] = None,
             at: Optional[float] = None) -> None:
        request: Dict[str, Any] = {"argv": list(argv), "offset": offset, "env": env or {}, "at": at}
        if start_at is not None:
            request["start_at"] = start_at
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(request) + "\n").encode("utf-8"))
        self.proc.stdin.flush()

    def receive(self) -> _util.Result:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"the CLI server exited with {self.proc.wait(timeout=10)}")
        answer = json.loads(line)
        if answer["code"] == 99:
            raise AssertionError(f"the CLI raised an unexpected exception:\n{answer['err']}")
        return _util.Result(answer["code"], answer["out"], answer["err"])

    def call(self, argv: Sequence[str], offset: float = 0.0, env: Optional[Dict[str, str]] = None, at: Optional[float] = None) -> _util.Result:
        self.send(argv, offset, env, at=at)
        return self.receive()

    def close(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=20)
        finally:
            self.proc.stdout.close()


def spawn_cli(*args: str, env: Optional[Dict[str, str]] = None) -> _util.Result:
    """A new ``python -m runner ARGS`` process, run to completion."""
    return _util.run_cli(*args, env=env if env is not None else child_env())


def spawn_many(argvs: Sequence[Sequence[str]]) -> List[_util.Result]:
    """Start one ``python -m runner`` process per argv at once; wait for all of them."""
    procs = [
        subprocess.Popen(_util.python("-m", "runner", *argv), cwd=_util.REPO_ROOT, env=child_env(),
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for argv in argvs
    ]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        results.append(_util.Result(proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")))
    return results


class Clock:
    """An injected clock: starts at the wall clock (or ``start``) and moves only when told."""

    def __init__(self, start: Optional[float] = None) -> None:
        # Whole seconds, so sums of halves stay exact through millisecond timestamps.
        self.now = float(int(time.time())) if start is None else start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


def template_plan(**sections: Dict[str, Any]) -> Dict[str, Any]:
    """The shipped contract's block, with the given top-level sections merged in."""
    block = copy.deepcopy(load_contract(_util.TEMPLATE))
    for name, values in sections.items():
        merged = dict(block.get(name, {}))
        merged.update(values)
        block[name] = merged
    return block


def make_run(folder: str, block: Optional[Dict[str, Any]] = None, clock: Optional[Callable[[], float]] = None, name: str = "run") -> str:
    path = os.path.join(folder, name)
    block = block or template_plan()
    store = RunStore.create(path, block["task_id"], block, clock=clock or time.time, durability="process")
    store.fs.close()  # type: ignore[attr-defined]
    return path


def read_state(path: str) -> Dict[str, Any]:
    store = RunStore.open(path)
    try:
        return copy.deepcopy(store.state)
    finally:
        store.fs.close()  # type: ignore[attr-defined]


def durable(path: str) -> Tuple[int, str, Dict[str, bytes]]:
    """Revision, state digest and the bytes of the state files: what 'nothing changed' compares."""
    state = read_state(path)
    return state["revision"], content_digest(state), _util.read_state_files(path)


def write_json(path: str, value: Dict[str, Any]) -> str:
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(value, handle)
    return path


def wait_until(moment: float) -> None:
    """Block until the wall clock has passed ``moment`` (a persisted time, never a fixed pause)."""
    while time.time() <= moment:
        time.sleep(max(0.0005, moment - time.time() + 0.0005))


_SHARED: List[CliServer] = []


def shared_server() -> CliServer:
    """The module's CLI server for tests that need one process apart from the test's own."""
    if not _SHARED:
        _SHARED.append(CliServer())
    return _SHARED[0]


def setUpModule() -> None:
    # The first answer also fills the children's bytecode cache before any race starts.
    shared_server().call(["--version"])


def tearDownModule() -> None:
    while _SHARED:
        _SHARED.pop().close()


class RunTestCase(unittest.TestCase):
    """Temp folder, library runs closed at the end, and the module's CLI server."""

    def setUp(self) -> None:
        self.server = shared_server()
        self.tmp = tempfile.mkdtemp(prefix="runner-authority-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.payload = write_json(os.path.join(self.tmp, "payload.json"), PAYLOAD)
        self.other_payload = write_json(os.path.join(self.tmp, "payload-2.json"), OTHER_PAYLOAD)

    def open_run(self, path: str, owner: Optional[str] = None, epoch: Optional[int] = None, clock: Optional[Callable[[], float]] = None, **options: Any) -> Run:
        run = Run.open(path, owner, epoch, clock=clock, durability="process", **options)
        self.addCleanup(run.store.fs.close)  # type: ignore[attr-defined]
        return run

    def holder(self, path: str, owner: str = "w", ttl: float = 3600, clock: Optional[Callable[[], float]] = None, **options: Any) -> Run:
        run = self.open_run(path, clock=clock, **options)
        run.acquire(owner, ttl)
        return run

    def cli(self, path: str, *args: str, offset: float = 0.0, env: Optional[Dict[str, str]] = None, at: Optional[float] = None) -> _util.Result:
        return self.server.call(["--dir", path, "--json", *args], offset, env, at)

    def assertExit(self, result: _util.Result, code: int, reason: Optional[str] = None) -> Dict[str, Any]:
        self.assertEqual(result.code, code, f"stdout {result.out!r} stderr {result.err!r}")
        body = _util.one_json(result)
        if reason is not None:
            self.assertEqual(body.get("error", body.get("reason")), reason, body)
        return body


def creds(run: Run) -> List[str]:
    return ["--owner", str(run.owner), "--epoch", str(run.epoch)]


def to_publish(run: Run) -> None:
    """Take the run through draft and review and start publish (the step that needs approval)."""
    for step in ("draft", "review"):
        run.step_start(step)
        run.step_done(step, EVIDENCE[step])
    run.step_start("publish")


# -- 1. leases -------------------------------------------------------------------------------

class LeaseRaceTest(unittest.TestCase):
    """Eight processes race for the lease, round after round: exactly one wins each round (exit 0),
    the other seven exit 3 (already-running) naming that winner, and the epoch strictly increases
    from round to round, whether the previous holder released the lease or let it expire."""

    def test_one_winner_per_round_and_epochs_increase(self) -> None:
        tmp = tempfile.mkdtemp(prefix="runner-race-")
        self.addCleanup(shutil.rmtree, tmp, True)
        path = make_run(tmp)
        servers = [CliServer() for _ in range(CONTENDERS)]
        for server in servers:
            self.addCleanup(server.close)
        rng = random.Random(48)
        previous_epoch = 0
        ended_by_expiry = False
        expected_recoveries = 0
        winners: List[str] = []
        for round_no in range(SERVER_ROUNDS + SPAWN_ROUNDS):
            if round_no < SERVER_ROUNDS:
                order = list(range(CONTENDERS))
                rng.shuffle(order)
                start_at = time.time() + 0.01
                for index in order:
                    servers[index].send(["--dir", path, "--json", "lease", "acquire", "--owner", f"w{index}", "--ttl", "30"], start_at=start_at)
                results = [server.receive() for server in servers]
                owners = [f"w{index}" for index in range(CONTENDERS)]
            else:
                owners = [f"c{index}" for index in range(CONTENDERS)]
                results = spawn_many([["lease", "acquire", "--owner", owner, "--ttl", "30", "--dir", path, "--json"] for owner in owners])
            codes = [result.code for result in results]
            self.assertEqual(sorted(codes), [0] + [3] * (CONTENDERS - 1), f"round {round_no}: exit codes {codes}")
            winner_index = codes.index(0)
            won = _util.one_json(results[winner_index])
            self.assertEqual(won["owner"], owners[winner_index])
            self.assertEqual(won["epoch"], previous_epoch + 1, f"round {round_no}: one acquire, one epoch")
            self.assertAlmostEqual(parse_time(won["expires_at"]) - parse_time(won["acquired_at"]), 30.0, places=2)
            for index, result in enumerate(results):
                if index != winner_index:
                    lost = _util.one_json(result)
                    self.assertEqual((lost["error"], lost["exit_code"]), ("already-running", 3))
                    self.assertEqual((lost["context"]["owner"], lost["context"]["epoch"]), (won["owner"], won["epoch"]))
            lease = read_state(path)["lease"]
            self.assertEqual({k: lease[k] for k in ("owner", "epoch", "expires_at")}, {k: won[k] for k in ("owner", "epoch", "expires_at")})
            if ended_by_expiry:  # taken over without a release, whoever won (a restart under the same owner too)
                expected_recoveries += 1
            winners.append(won["owner"])
            previous_epoch = won["epoch"]
            ended_by_expiry = round_no % 2 == 1
            if ended_by_expiry:
                # The holder's lease lapses: a renewal whose clock reads a minute earlier
                # leaves an expiry that is already in the past for every contender.
                lapse = Run.open(path, won["owner"], won["epoch"], clock=lambda: time.time() - 60, durability="process")
                try:
                    lapse.renew(1)
                finally:
                    lapse.store.fs.close()  # type: ignore[attr-defined]
                self.assertLess(parse_time(read_state(path)["lease"]["expires_at"]), time.time())
            else:
                released = servers[0].call(["--dir", path, "--json", "lease", "release", "--owner", won["owner"], "--epoch", str(won["epoch"])])
                self.assertEqual(released.code, 0, released.err)
                self.assertEqual(_util.one_json(released)["owner"], None)
        self.assertEqual(len(winners), SERVER_ROUNDS + SPAWN_ROUNDS)
        self.assertEqual(read_state(path)["counters"].get("recoveries", 0), expected_recoveries)


class LeaseSemanticsTest(RunTestCase):
    """Renew works only for the current, unexpired holder; release ends the lease and keeps the
    epoch; a takeover happens only after expiry and takes a higher epoch; the older holder of a
    re-acquired owner id is fenced."""

    def test_acquire_json_prints_owner_epoch_expiry(self) -> None:
        path = make_run(self.tmp)
        before = time.time()
        body = self.assertExit(self.cli(path, "lease", "acquire", "--owner", "agent-1", "--ttl", "30"), 0)
        self.assertEqual(body["owner"], "agent-1")
        self.assertEqual(body["epoch"], 1)
        self.assertGreaterEqual(parse_time(body["expires_at"]), before + 30 - 0.001)
        self.assertLessEqual(parse_time(body["expires_at"]), time.time() + 30 + 0.001)
        shown = self.assertExit(self.server.call(["lease", "show", "--dir", path, "--json"]), 0)
        self.assertEqual((shown["owner"], shown["epoch"], shown["live"]), ("agent-1", 1, True))

    def test_lease_reacquire_bumps_the_epoch(self) -> None:
        """Lease re-acquire bumps the epoch: acquiring again under the same owner id takes epoch + 1,
        and the process that held the earlier epoch under that id is fenced (exit 9) from then on."""
        path = make_run(self.tmp)
        first = self.holder(path, "w", ttl=60)
        second = self.holder(path, "w", ttl=60)
        self.assertEqual((first.epoch, second.epoch), (1, 2))
        with self.assertRaises(Fenced):
            first.step_start("draft")
        with self.assertRaises(Fenced):
            first.renew(60)
        second.step_start("draft")
        again = self.assertExit(self.cli(path, "lease", "acquire", "--owner", "w", "--ttl", "60"), 0)
        self.assertEqual(again["epoch"], 3)
        self.assertExit(self.cli(path, "step", "fail", "draft", "--class", "transient", "--error", "x", *creds(second)), 9, "fenced")
        self.assertEqual(read_state(path)["counters"].get("recoveries", 0), 2, "each re-acquire took over a lease nobody released")

    def test_renew_after_expiry_is_refused(self) -> None:
        """Renew after expiry is refused: once expires_at has passed, the holder's renewal is fenced
        even though nobody took the lease over; it must acquire again (at a higher epoch)."""
        path = make_run(self.tmp)
        clock = Clock()
        run = self.holder(path, "w", ttl=30, clock=clock)
        clock.advance(20)
        self.assertAlmostEqual(parse_time(run.renew(30)["expires_at"]), clock.now + 30, places=2)
        clock.advance(29.5)
        run.renew(30)
        clock.advance(30)  # exactly at expires_at: expired
        with self.assertRaises(Fenced):
            run.renew(30)
        with self.assertRaises(Fenced):
            run.step_start("draft")
        self.assertEqual(read_state(path)["lease"]["owner"], "w")
        self.assertEqual(run.acquire("w", 30)["epoch"], 2)

    def test_renew_needs_matching_owner_and_epoch(self) -> None:
        path = make_run(self.tmp)
        clock = Clock()
        run = self.holder(path, "w", ttl=30, clock=clock)
        before = durable(path)
        for owner, epoch in (("w", 2), ("w", 0), ("x", 1)):
            with self.assertRaises(Fenced):
                self.open_run(path, owner, epoch, clock=clock).renew(30)
        self.assertExit(self.cli(path, "lease", "renew", "--owner", "w", "--epoch", "2", "--ttl", "30"), 9, "fenced")
        self.assertExit(self.cli(path, "lease", "renew", "--owner", "x", "--epoch", "1", "--ttl", "30"), 9, "fenced")
        self.assertEqual(durable(path), before)
        renewed = self.assertExit(self.cli(path, "lease", "renew", "--ttl", "90", *creds(run)), 0)
        self.assertEqual((renewed["owner"], renewed["epoch"]), ("w", 1))

    def test_release_ends_the_lease_and_keeps_the_epoch(self) -> None:
        path = make_run(self.tmp)
        run = self.holder(path, "w", ttl=300)
        self.assertExit(self.cli(path, "lease", "release", "--owner", "w", "--epoch", "0"), 9, "fenced")
        released = self.assertExit(self.cli(path, "lease", "release", *creds(run)), 0)
        self.assertEqual((released["owner"], released["epoch"], released["expires_at"]), (None, 1, None))
        with self.assertRaises(Fenced):
            run.step_start("draft")
        with self.assertRaises(Fenced):
            run.renew(300)
        nxt = self.holder(path, "v", ttl=300)
        self.assertEqual(nxt.epoch, 2)
        self.assertEqual(read_state(path)["counters"].get("recoveries", 0), 0)

    def test_takeover_only_after_expiry_at_a_higher_epoch(self) -> None:
        path = make_run(self.tmp)
        clock = Clock()
        old = self.holder(path, "old", ttl=30, clock=clock)
        new = self.open_run(path, clock=clock)
        clock.advance(29.5)
        with self.assertRaises(AlreadyRunning) as refused:
            new.acquire("new", 30)
        self.assertEqual(refused.exception.exit_code, 3)
        self.assertExit(self.cli(path, "lease", "acquire", "--owner", "new", "--ttl", "30", offset=clock.now - time.time()), 3, "already-running")
        clock.advance(0.5)  # exactly at expires_at: expired
        self.assertEqual(new.acquire("new", 30)["epoch"], 2)
        state = read_state(path)
        self.assertEqual((state["lease"]["owner"], state["lease"]["epoch"]), ("new", 2))
        self.assertEqual(state["counters"]["recoveries"], 1)
        with self.assertRaises(Fenced):
            old.step_start("draft")
        with self.assertRaises(Fenced):
            old.renew(30)


# -- 2. fencing ------------------------------------------------------------------------------

class FencingTest(RunTestCase):
    """A writer whose epoch is stale, or who carries no epoch, is refused by the store with exit 9
    and changes nothing: every fenced verb checks the lease under the store's lock."""

    def test_late_write_of_an_expired_owner_is_rejected(self) -> None:
        path = make_run(self.tmp)
        old = self.assertExit(spawn_cli("--dir", path, "--json", "lease", "acquire", "--owner", "old", "--ttl", "30"), 0)
        self.assertEqual(old["epoch"], 1)
        expiry = parse_time(old["expires_at"])
        early = self.cli(path, "lease", "acquire", "--owner", "new", "--ttl", "600", offset=expiry - 1 - time.time())
        self.assertExit(early, 3, "already-running")
        after = expiry + 1 - time.time()
        shown = self.assertExit(self.cli(path, "lease", "show", offset=after), 0)
        self.assertFalse(shown["live"])
        new = self.assertExit(self.cli(path, "lease", "acquire", "--owner", "new", "--ttl", "600", offset=after), 0)
        self.assertEqual((new["owner"], new["epoch"]), ("new", 2))
        before = durable(path)
        late = spawn_cli("--dir", path, "--json", "step", "start", "draft", "--owner", "old", "--epoch", "1")
        body = self.assertExit(late, 9, "fenced")
        self.assertEqual((body["context"]["owner"], body["context"]["epoch"]), ("new", 2))
        late_env = spawn_cli("--dir", path, "--json", "effect", "begin", "draft:file", "--payload", self.payload,
                             env=child_env(RUNNER_OWNER="old", RUNNER_EPOCH="1"))
        self.assertExit(late_env, 9, "fenced")
        self.assertEqual(durable(path), before)
        self.assertExit(self.cli(path, "step", "start", "draft", "--owner", "new", "--epoch", "2"), 0)
        self.assertEqual(read_state(path)["counters"]["recoveries"], 1)

    def test_every_fenced_verb_refuses_a_missing_or_stale_epoch(self) -> None:
        path = make_run(self.tmp)
        contract = _util.write_contract(os.path.join(self.tmp, "changed.md"), template_plan(limits={"max_steps": 30}))
        previous = self.holder(path, "old", ttl=300)
        previous.release()
        self.holder(path, "w", ttl=300)
        run = self.holder(path, "w", ttl=3600)
        self.assertEqual(run.epoch, 3)
        run.step_start("draft")
        run.effect_begin("draft:file", {"path": "drafts/post.md"})
        verbs = {
            "effect begin": ["effect", "begin", "draft:notes", "--payload", self.payload],
            "effect ack": ["effect", "ack", "draft:file", "--receipt", '{"id": "r-1"}'],
            "effect verify": ["effect", "verify", "draft:file", "--evidence", '{"found": true}'],
            "effect absent": ["effect", "absent", "draft:file", "--evidence", '{"found": false}'],
            "effect uncertain": ["effect", "uncertain", "draft:file", "--reason", "timeout"],
            "step start": ["step", "start", "draft"],
            "step done": ["step", "done", "draft", "--evidence", json.dumps(EVIDENCE["draft"])],
            "step fail": ["step", "fail", "draft", "--class", "transient", "--error", "flaky"],
            "approval request": ["approval", "request", "publish", "--action", "effect:publish:weekly-48", "--payload", self.payload, "--ttl", "60"],
            "cost": ["cost", "--add", "money=1"],
            "migrate": ["migrate", "--contract", contract, "--reason", "more steps"],
            "job submit": ["job", "submit", "j1", "--", sys.executable, "-S", "-c", "pass"],
        }
        variants: Dict[str, Tuple[List[str], Dict[str, str]]] = {
            "no credentials": ([], {}),
            "owner without epoch": (["--owner", "w"], {}),
            "previous holder": (["--owner", "old", "--epoch", "1"], {}),
            "same owner, older epoch": (["--owner", "w", "--epoch", "2"], {}),
            "stale epoch from the environment": ([], {"RUNNER_OWNER": "w", "RUNNER_EPOCH": "2"}),
        }
        before = durable(path)
        for verb, argv in verbs.items():
            for variant, (flags, env) in variants.items():
                with self.subTest(verb=verb, credentials=variant):
                    # Credentials go right after the verb's name, before its positionals.
                    result = self.cli(path, argv[0], *flags, *argv[1:], env=env)
                    self.assertExit(result, 9, "fenced")
        self.assertEqual(durable(path), before)
        self.assertFalse(os.path.exists(os.path.join(path, "jobs")))
        self.assertExit(self.cli(path, "effect", "verify", "draft:file", "--evidence", '{"found": true}', *creds(run)), 0)
        self.assertEqual(read_state(path)["revision"], before[0] + 1)


# -- 3. cancellation -------------------------------------------------------------------------

class CancellationTest(RunTestCase):
    """A cancellation records who, why and when; it refuses every new step and effect (exit 5),
    lets an effect already in flight be reconciled, and only then makes the run ``cancelled``."""

    def test_cancel_refuses_new_work_and_waits_for_in_flight_effects(self) -> None:
        path = make_run(self.tmp)
        run = self.holder(path, "w")
        self.assertExit(self.cli(path, "step", "start", "draft", *creds(run)), 0)
        self.assertExit(self.cli(path, "effect", "begin", "draft:upload", "--payload", self.payload, *creds(run)), 0)
        before = time.time()
        cancelled = self.assertExit(self.cli(path, "cancel", "--by", "alice", "--reason", "the post is no longer needed"), 0)
        after = time.time()
        self.assertEqual(cancelled["status"], "active")
        status = self.assertExit(self.cli(path, "status"), 0)
        record = status["cancellation"]
        self.assertEqual((record["by"], record["reason"]), ("alice", "the post is no longer needed"))
        self.assertTrue(before - 0.001 <= parse_time(record["at"]) <= after + 0.001, record["at"])
        self.assertEqual(status["status"], "active")
        self.assertExit(self.cli(path, "effect", "begin", "draft:other", "--payload", self.payload, *creds(run)), 5, "cancelled")
        self.assertExit(self.cli(path, "step", "start", "draft", *creds(run)), 5, "cancelled")
        reconcile = self.assertExit(self.cli(path, "next", *creds(run)), 0)
        self.assertEqual((reconcile["action"]["kind"], reconcile["action"]["key"]), ("reconcile", "draft:upload"))
        verified = self.assertExit(self.cli(path, "effect", "verify", "draft:upload", "--evidence", '{"found": true}', *creds(run)), 0)
        self.assertEqual(verified["state"], "verified")
        status = self.assertExit(self.cli(path, "status"), 0)
        self.assertEqual(status["status"], "cancelled")
        self.assertEqual(status["cancellation"], record)
        stop = self.assertExit(self.cli(path, "next", *creds(run)), 5)
        self.assertEqual((stop["decision"], stop["reason"]), ("stop", "cancelled"))
        self.assertExit(self.cli(path, "cancel", "--by", "bob", "--reason", "again"), 0)
        self.assertEqual(read_state(path)["observations"]["cancellation"], record)

    def test_control_verbs_need_no_lease(self) -> None:
        """Control verbs need no lease: cancel, approval grant and approval deny come from a person
        or a supervisor; they succeed with no --owner/--epoch, whether the lease is held by a live
        worker, was never taken, or has expired, while every fenced verb in the same state exits 9."""
        path = make_run(self.tmp)
        run = self.holder(path, "w")
        to_publish(run)
        first = run.approval_request("publish", "effect:publish:weekly-48", PAYLOAD, 600)
        second = run.approval_request("publish", "effect:publish:weekly-49", PAYLOAD, 600)
        granted = self.assertExit(self.cli(path, "approval", "grant", first, "--by", "carol"), 0)
        self.assertEqual((granted["state"], granted["by"]), ("granted", "carol"))
        denied = self.assertExit(self.cli(path, "approval", "deny", second, "--by", "carol"), 0)
        self.assertEqual(denied["state"], "denied")
        self.assertExit(self.cli(path, "step", "fail", "publish", "--class", "transient", "--error", "x"), 9, "fenced")
        cancelled = self.assertExit(self.cli(path, "cancel", "--by", "supervisor", "--reason", "budget review"), 0)
        self.assertEqual(cancelled["status"], "cancelled")
        self.assertEqual(read_state(path)["steps"]["publish"]["state"], "cancelled")

        never = make_run(self.tmp, name="never-leased")
        self.assertEqual(read_state(never)["lease"]["owner"], None)
        self.assertEqual(self.assertExit(self.cli(never, "cancel", "--by", "ops", "--reason", "not needed"), 0)["status"], "cancelled")
        self.assertExit(self.cli(never, "step", "start", "draft", "--owner", "w", "--epoch", "0"), 9, "fenced")

        lapsed = make_run(self.tmp, name="lapsed")
        self.holder(lapsed, "w", ttl=30)
        self.assertFalse(self.assertExit(self.cli(lapsed, "lease", "show", offset=31), 0)["live"])
        self.assertExit(self.cli(lapsed, "cancel", "--by", "ops", "--reason", "worker gone", offset=31), 0)
        self.assertEqual(read_state(lapsed)["status"], "cancelled")


# -- 4. scoped approval ----------------------------------------------------------------------

class ScopedApprovalTest(RunTestCase):
    """An effect the contract gates (a key matching ``publish:*``, or any effect begun in step
    ``publish``) begins only under a granted request that matches the task, plan, step, action
    (``effect:KEY``) and payload and has not expired; anything else exits 4 and records nothing."""

    KEY = "publish:weekly-48"
    ACTION = "effect:publish:weekly-48"

    def setUp(self) -> None:
        super().setUp()
        self.path = make_run(self.tmp)
        self.run_ = self.holder(self.path, "w")
        to_publish(self.run_)
        self.w = creds(self.run_)

    def begin(self, key: str = KEY, payload: Optional[str] = None, offset: float = 0.0, *extra: str, at: Optional[float] = None) -> _util.Result:
        return self.cli(self.path, "effect", "begin", key, "--payload", payload or self.payload, *extra, *self.w, offset=offset, at=at)

    def request(self, step: str = "publish", action: str = ACTION, payload: Optional[str] = None, ttl: float = 600, offset: float = 0.0) -> str:
        body = self.assertExit(self.cli(self.path, "approval", "request", step, "--action", action, "--payload", payload or self.payload, "--ttl", str(ttl), *self.w, offset=offset), 0)
        self.assertEqual(body["state"], "pending")
        return body["request_id"]

    def grant(self, request_id: str, offset: float = 0.0) -> None:
        self.assertEqual(self.assertExit(self.cli(self.path, "approval", "grant", request_id, "--by", "carol", offset=offset), 0)["state"], "granted")

    def refused(self, result: _util.Result) -> Dict[str, Any]:
        body = self.assertExit(result, 4, "awaiting-approval")
        self.assertNotIn(self.KEY, read_state(self.path)["effects"])
        return body

    def test_request_prints_request_id_and_next_awaits_approval(self) -> None:
        before = time.time()
        body = self.assertExit(self.cli(self.path, "approval", "request", "publish", "--action", self.ACTION, "--payload", self.payload, "--ttl", "600", *self.w), 0)
        rid = body["request_id"]
        self.assertTrue(rid.startswith("apr-"), rid)
        self.assertEqual((body["state"], body["step"], body["action"]), ("pending", "publish", self.ACTION))
        self.assertEqual(body["payload_digest"], content_digest(PAYLOAD))
        self.assertEqual(body["plan_digest"], read_state(self.path)["plan_digest"])
        self.assertGreaterEqual(parse_time(body["expires_at"]), before + 600 - 0.001)
        listed = self.assertExit(self.cli(self.path, "approval", "list"), 0)["approvals"]
        self.assertEqual([(a["request_id"], a["state"]) for a in listed], [(rid, "pending")])
        stop = self.assertExit(self.cli(self.path, "next", *self.w), 4)
        self.assertEqual((stop["reason"], stop["request_id"]), ("awaiting-approval", rid))
        self.refused(self.begin())
        again = self.assertExit(self.cli(self.path, "approval", "request", "publish", "--action", self.ACTION, "--payload", self.payload, "--ttl", "600", *self.w), 0)
        self.assertEqual(again["request_id"], rid)

    def test_refused_before_a_grant_and_after_a_deny(self) -> None:
        body = self.refused(self.begin())
        self.assertEqual((body["context"]["step"], body["context"]["action"]), ("publish", self.ACTION))
        rid = self.request()
        self.refused(self.begin())
        self.assertExit(self.cli(self.path, "approval", "deny", rid, "--by", "carol"), 0)
        self.refused(self.begin())
        stop = self.assertExit(self.cli(self.path, "next", *self.w), 4)
        self.assertEqual((stop["reason"], stop["request_id"]), ("awaiting-approval", rid))
        self.assertExit(self.cli(self.path, "approval", "grant", rid, "--by", "carol"), 2, "invalid-input")
        self.refused(self.begin())

    def test_a_grant_for_another_step_payload_or_action_does_not_cover(self) -> None:
        for step, action, payload in (
            ("review", self.ACTION, self.payload),
            ("publish", self.ACTION, self.other_payload),
            ("publish", "effect:publish:weekly-49", self.payload),
        ):
            self.grant(self.request(step, action, payload))
        before = durable(self.path)
        self.refused(self.begin())
        self.refused(self.begin(self.KEY, self.payload, 0.0, "--step", "publish"))
        self.assertEqual(durable(self.path), before)
        body = self.assertExit(self.begin(self.KEY, self.other_payload), 0)
        self.assertEqual(body["payload_digest"], content_digest(OTHER_PAYLOAD))

    def test_both_gating_routes_and_an_ungated_effect(self) -> None:
        # An effect belongs to the running step (publish): '--step draft' names another and is refused, writing nothing.
        before = durable(self.path)
        for key in ("draft:notes", self.KEY):
            body = self.assertExit(self.cli(self.path, "effect", "begin", key, "--step", "draft", "--payload", self.payload, *self.w), 2, "invalid-input")
            self.assertEqual(body["context"], {"key": key, "step": "draft"})
        self.assertEqual(durable(self.path), before)
        self.refused(self.cli(self.path, "effect", "begin", self.KEY, "--step", "publish", "--payload", self.payload, *self.w))
        self.assertExit(self.cli(self.path, "effect", "begin", "draft:notes", "--step", "publish", "--payload", self.payload, *self.w), 4, "awaiting-approval")
        self.assertExit(self.cli(self.path, "effect", "begin", "cdn:purge", "--payload", self.payload, *self.w), 4, "awaiting-approval")
        self.grant(self.request("publish", "effect:cdn:purge"))
        self.assertExit(self.cli(self.path, "effect", "begin", "cdn:purge", "--payload", self.payload, *self.w), 0)

    def test_an_expired_grant_does_not_cover(self) -> None:
        rid = self.request(ttl=60)
        self.grant(rid)
        self.refused(self.begin(offset=61))
        late = self.request(ttl=10)
        self.assertExit(self.cli(self.path, "approval", "grant", late, "--by", "carol", offset=11), 2, "invalid-input")
        self.assertEqual(self.assertExit(self.begin(offset=30), 0)["state"], "started")
        self.assertEqual(read_state(self.path)["observations"]["approvals"][rid]["used_by"], self.KEY)

    def test_a_plan_migration_voids_old_grants(self) -> None:
        rid = self.request()
        self.grant(rid)
        pending = self.request(action="effect:publish:weekly-49")
        state = read_state(self.path)
        self.assertEqual(approvals.find_grant(state, "publish", self.ACTION, content_digest(PAYLOAD), time.time(), self.KEY), (rid, ""))
        changed = _util.write_contract(os.path.join(self.tmp, "changed.md"), template_plan(limits={"max_steps": 30}))
        migrated = self.assertExit(self.cli(self.path, "migrate", "--contract", changed, "--reason", "allow more steps", *self.w), 0)
        self.assertNotEqual(migrated["plan_digest"], state["plan_digest"])
        body = self.refused(self.begin())
        self.assertIn("another plan", body["message"])
        self.assertExit(self.cli(self.path, "approval", "grant", pending, "--by", "carol"), 2, "invalid-input")
        fresh = self.request()
        self.assertNotEqual(fresh, rid)
        self.grant(fresh)
        self.assertExit(self.begin(), 0)

    def test_a_grant_is_single_use_and_covers_only_the_same_key_and_payload_afterwards(self) -> None:
        """A grant is single-use and covers only the same effect key+payload afterwards: the first
        effect it lets begin consumes it (state ``used``, ``used_by`` = that key); no other effect
        can use it; a retry of that same key with the same payload, after the target was observed
        not to have it (``effect absent``), stays covered until the grant expires, and not after."""
        rid = self.request(ttl=600)
        self.grant(rid)
        self.assertEqual(self.assertExit(self.begin(), 0)["attempts"], 1)
        used = read_state(self.path)["observations"]["approvals"][rid]
        self.assertEqual((used["state"], used["used_by"]), ("used", self.KEY))
        state = read_state(self.path)
        digest = content_digest(PAYLOAD)
        self.assertEqual(approvals.find_grant(state, "publish", self.ACTION, digest, time.time(), "publish:weekly-49")[0], None)
        self.assertEqual(approvals.find_grant(state, "publish", self.ACTION, digest, time.time(), None)[0], None)
        self.assertExit(self.cli(self.path, "effect", "begin", "publish:weekly-49", "--payload", self.payload, *self.w), 4, "awaiting-approval")
        self.assertExit(self.cli(self.path, "effect", "begin", "cdn:purge", "--payload", self.payload, *self.w), 4, "awaiting-approval")
        # An observed absence schedules the contract's backoff (a random part of a second, at most 60 s after
        # more absences): the clock stands still between the two verbs, so however busy the machine, it has not passed.
        now = time.time()
        self.assertExit(self.cli(self.path, "effect", "absent", self.KEY, "--evidence", '{"found": false}', *self.w, at=now), 0)
        self.assertExit(self.begin(at=now), 11, "retry-later")
        self.assertEqual(self.assertExit(self.begin(offset=61), 0)["attempts"], 2)
        self.assertExit(self.cli(self.path, "effect", "absent", self.KEY, "--evidence", '{"found": false}', *self.w), 0)
        self.assertExit(self.begin(self.KEY, self.other_payload), 2, "invalid-input")
        self.assertExit(self.begin(offset=601), 4, "awaiting-approval")
        effect = read_state(self.path)["effects"][self.KEY]
        self.assertEqual((effect["state"], effect["attempts"]), ("absent", 2))
        second = self.request(ttl=600)
        self.assertNotEqual(second, rid)

    def test_recovery_never_creates_or_widens_a_grant(self) -> None:
        """Recovery never creates or widens a grant: ``recover`` (a new process taking the lease)
        leaves every approval record exactly as it was; a pending request stays pending, an expired
        grant stays expired, a used grant still covers only its own key and payload."""
        clock = Clock()
        run = self.open_run(self.path, "w", self.run_.epoch, clock=clock)
        pending = run.approval_request("publish", "effect:publish:weekly-50", PAYLOAD, 3000)
        used = run.approval_request("publish", self.ACTION, PAYLOAD, 3000)
        run.approval_grant(used, "carol")
        run.effect_begin(self.KEY, PAYLOAD)
        run.effect_absent(self.KEY, {"found": False})
        short = run.approval_request("publish", "effect:cdn:purge", PAYLOAD, 60)
        run.approval_grant(short, "carol")
        before = read_state(self.path)["observations"]["approvals"]
        offset = clock.now + 120 - time.time()
        decision = self.assertExit(self.cli(self.path, "recover", "--owner", "w2", "--ttl", "600", offset=offset), 3)
        self.assertEqual(decision["reason"], "already-running")
        self.run_.release()
        decision = self.assertExit(self.cli(self.path, "recover", "--owner", "w2", "--ttl", "3000", offset=offset), 4)
        self.assertEqual((decision["reason"], decision["request_id"]), ("awaiting-approval", pending))
        after = read_state(self.path)
        self.assertEqual(after["observations"]["approvals"], before)
        w2 = ["--owner", "w2", "--epoch", str(after["lease"]["epoch"])]
        self.assertExit(self.cli(self.path, "effect", "begin", "cdn:purge", "--payload", self.payload, *w2, offset=offset), 4, "awaiting-approval")
        self.assertExit(self.cli(self.path, "effect", "begin", "publish:weekly-50", "--payload", self.payload, *w2, offset=offset), 4, "awaiting-approval")
        self.assertExit(self.cli(self.path, "effect", "begin", "publish:weekly-51", "--payload", self.payload, *w2, offset=offset), 4, "awaiting-approval")
        self.assertExit(self.cli(self.path, "effect", "begin", self.KEY, "--payload", self.payload, *w2, offset=offset), 0)
        takeover = self.open_run(self.path, clock=lambda: clock.now + 3200)
        decision = recover(takeover, "w3", 600)
        self.assertEqual((decision["action"]["kind"], decision["action"]["key"]), ("reconcile", self.KEY))
        self.assertEqual(read_state(self.path)["lease"]["owner"], "w3")
        self.assertEqual(read_state(self.path)["observations"]["approvals"], before)


# -- 5. bounded retry and budgets --------------------------------------------------------------

class BoundedRetryTest(RunTestCase):
    """Attempts, waits and run-wide limits live in the run's durable state: each limit stops the
    run with exit 6 and a recorded reason, and no new process starts it again from zero."""

    def assertBlocked(self, path: str, limit: str, start: Sequence[str], epoch: int, owner: str = "w") -> Dict[str, Any]:
        """The run is recorded as blocked on ``limit``, and a fresh process refuses to go on."""
        state = read_state(path)
        self.assertEqual(state["status"], "blocked")
        self.assertEqual((state["next_action"]["reason"], state["next_action"]["limit"]), ("limit-exhausted", limit))
        who = ["--owner", owner, "--epoch", str(epoch)]
        decision = self.assertExit(self.cli(path, "next", *who), 6)
        self.assertEqual((decision["reason"], decision["limit"]), ("limit-exhausted", limit))
        self.assertExit(self.cli(path, *start, *who), 6, "limit-exhausted")
        self.assertEqual(read_state(path)["revision"], state["revision"])
        return state

    def test_step_attempts_are_bounded_across_separate_processes(self) -> None:
        path = make_run(self.tmp, template_plan(retry={"base_seconds": 0.001, "cap_seconds": 0.001}))
        run = self.holder(path, "w", ttl=600)
        w = creds(run)
        for attempt in (1, 2, 3):
            started = self.assertExit(spawn_cli("--dir", path, "--json", "step", "start", "draft", *w), 0)
            self.assertEqual((started["state"], started["attempts"]), ("running", attempt))
            failed = self.assertExit(spawn_cli("--dir", path, "--json", "step", "fail", "draft", "--class", "transient", "--error", "flaky upstream", *w), 0)
            persisted = read_state(path)["steps"]["draft"]
            self.assertEqual((persisted["state"], persisted["attempts"], persisted["class"]), ("failed", attempt, "transient"))
            if attempt < 3:
                self.assertEqual(failed["status"], "active")
                self.assertEqual(persisted["next_attempt_at"], failed["next_attempt_at"])
                status = self.assertExit(self.cli(path, "status"), 0)
                self.assertEqual(status["recorded_intent"], {"kind": "start-step", "step": "draft", "not_before": persisted["next_attempt_at"]})
                self.assertLessEqual(parse_time(persisted["next_attempt_at"]) - parse_time(persisted["finished_at"]), 0.0021)
                wait_until(parse_time(persisted["next_attempt_at"]))
            else:
                self.assertEqual(failed["status"], "blocked")
                self.assertEqual(failed["recorded_intent"]["limit"], "max_step_attempts")
        refused = self.assertExit(spawn_cli("--dir", path, "--json", "step", "start", "draft", *w), 6, "limit-exhausted")
        self.assertIn("draft", refused["message"])
        decision = self.assertExit(spawn_cli("--dir", path, "--json", "next", *w), 6)
        self.assertEqual((decision["reason"], decision["limit"]), ("limit-exhausted", "max_step_attempts"))
        self.assertBlocked(path, "max_step_attempts", ["step", "start", "draft"], run.epoch)
        report = self.assertExit(self.cli(path, "report"), 0)
        self.assertEqual((report["step_attempts"], report["repeated_steps"], report["status"]), (3, 2, "blocked"))

    def test_backoff_is_persisted_and_an_early_restart_is_refused(self) -> None:
        path = make_run(self.tmp, template_plan(retry={"base_seconds": 100, "cap_seconds": 1000}))
        clock = Clock()
        run = self.holder(path, "w", clock=clock, rand=lambda: 0.5)
        run.step_start("draft")
        record = run.step_fail("draft", "transient", "rate limited")
        self.assertEqual(record["next_attempt_at"], format_time(clock.now + 50))
        persisted = read_state(path)
        self.assertEqual(persisted["steps"]["draft"]["next_attempt_at"], format_time(clock.now + 50))
        self.assertEqual(persisted["next_action"]["not_before"], format_time(clock.now + 50))
        self.assertEqual(self.assertExit(self.cli(path, "status"), 0)["recorded_intent"]["not_before"], format_time(clock.now + 50))
        before = durable(path)
        early = self.assertExit(spawn_cli("--dir", path, "--json", "step", "start", "draft", *creds(run)), 11, "retry-later")
        self.assertEqual(early["context"]["retry_at"], format_time(clock.now + 50))
        self.assertGreater(early["context"]["wait_seconds"], 0)
        self.assertLessEqual(early["context"]["wait_seconds"], 50)
        self.assertEqual(durable(path), before)
        waiting = self.assertExit(self.cli(path, "next", *creds(run), offset=clock.now + 49 - time.time()), 0)
        self.assertEqual((waiting["action"]["kind"], waiting["action"]["until"]), ("wait", format_time(clock.now + 50)))
        with self.assertRaises(RetryLater) as caught:
            self.open_run(path, "w", run.epoch, clock=lambda: clock.now + 49.9).step_start("draft")
        self.assertEqual(caught.exception.context["retry_at"], format_time(clock.now + 50))
        self.assertAlmostEqual(caught.exception.context["wait_seconds"], 0.1, delta=0.002)
        started = self.assertExit(self.cli(path, "step", "start", "draft", *creds(run), offset=clock.now + 51 - time.time()), 0)
        self.assertEqual(started["attempts"], 2)

    def test_full_jitter_stays_within_the_capped_window(self) -> None:
        rng = random.Random(20261129)
        fractions: List[float] = []
        for base, cap in ((1.0, 60.0), (0.5, 10.0), (2.0, 1000.0), (100.0, 100.0), (0.001, 0.001)):
            for attempt in range(1, 41):
                ceiling = min(cap, base * 2 ** (attempt - 1))
                for _ in range(25):
                    delay = retry.backoff_delay(attempt, base, cap, rng.random)
                    self.assertGreaterEqual(delay, 0.0)
                    self.assertLessEqual(delay, ceiling)
                    fractions.append(delay / ceiling)
        self.assertLess(min(fractions), 0.01)
        self.assertGreater(max(fractions), 0.99)
        self.assertEqual(retry.backoff_delay(0, 1.0, 60.0, rng.random), 0.0)
        self.assertLessEqual(retry.backoff_delay(10_000, 1.0, 60.0, rng.random), 60.0)
        one, two = random.Random(7), random.Random(7)
        self.assertEqual([retry.backoff_delay(n, 1.0, 60.0, one.random) for n in range(1, 12)],
                         [min(60.0, 2.0 ** (n - 1)) * two.random() for n in range(1, 12)])
        path = make_run(self.tmp)
        clock = Clock()
        run = self.holder(path, "w", clock=clock, rand=random.Random(11).random)
        expected = random.Random(11)
        for attempt in (1, 2):
            run.step_start("draft")
            record = run.step_fail("draft", "transient", "flaky")
            self.assertEqual(record["next_attempt_at"], format_time(clock.now + min(60.0, 2.0 ** (attempt - 1)) * expected.random()))
            clock.now = parse_time(record["next_attempt_at"]) + 0.001

    def test_max_effect_attempts(self) -> None:
        path = make_run(self.tmp)
        run = self.holder(path, "w", rand=lambda: 0.0)  # no backoff: the attempts, not the waits, are under test
        run.step_start("draft")
        for _ in range(3):
            run.effect_begin("draft:upload", PAYLOAD)
            run.effect_absent("draft:upload", {"found": False})
        revision = read_state(path)["revision"]
        with self.assertRaises(LimitExhausted) as spent:
            run.effect_begin("draft:upload", PAYLOAD)
        self.assertEqual(spent.exception.exit_code, 6)
        state = self.assertBlocked(path, "max_effect_attempts", ["effect", "begin", "draft:upload", "--payload", self.payload], run.epoch)
        self.assertEqual(state["revision"], revision + 1)
        self.assertIn("draft:upload", state["next_action"]["detail"])
        self.assertEqual(state["effects"]["draft:upload"]["attempts"], 3)

    def test_max_steps(self) -> None:
        path = make_run(self.tmp, template_plan(limits={"max_steps": 2}))
        run = self.holder(path, "w")
        for step in ("draft", "review"):
            run.step_start(step)
            run.step_done(step, EVIDENCE[step])
        with self.assertRaises(LimitExhausted):
            run.step_start("publish")
        self.assertBlocked(path, "max_steps", ["step", "start", "publish"], run.epoch)
        self.assertEqual(read_state(path)["counters"]["steps_started"], 2)

    def test_max_cost_adds_up_across_processes(self) -> None:
        path = make_run(self.tmp)
        run = self.holder(path, "w")
        results = spawn_many([["--dir", path, "--json", "cost", "--add", "money=1.25", "--add", "tokens=100", *creds(run)] for _ in range(4)])
        self.assertEqual([r.code for r in results], [0] * 4, [r.err for r in results])
        report = self.assertExit(self.cli(path, "report"), 0)
        self.assertEqual(report["cost"], {"money": 5.0, "tokens": 400.0})
        self.assertExit(self.cli(path, "step", "start", "draft", *creds(run)), 6, "limit-exhausted")
        self.assertBlocked(path, "max_cost", ["step", "start", "draft"], run.epoch)
        self.assertExit(self.cli(path, "cost", "--add", "money=0.5", *creds(run)), 0)
        self.assertEqual(self.assertExit(self.cli(path, "report"), 0)["cost"], {"money": 5.5, "tokens": 400.0})

    def test_max_elapsed_seconds(self) -> None:
        clock = Clock()
        path = make_run(self.tmp, template_plan(limits={"max_elapsed_seconds": 100, "no_progress_seconds": 1000}), clock=clock)
        run = self.holder(path, "w", clock=clock)
        run.step_start("draft")
        clock.advance(60)
        run.step_done("draft", EVIDENCE["draft"])
        clock.advance(40)
        run.step_start("review")
        clock.advance(1)
        with self.assertRaises(LimitExhausted):
            run.effect_begin("review:notes", PAYLOAD)
        self.assertBlocked(path, "max_elapsed_seconds", ["effect", "begin", "review:notes", "--payload", self.payload], run.epoch)
        with self.assertRaises(LimitExhausted):
            self.open_run(path, "w", run.epoch).effect_begin("review:notes", PAYLOAD)

    def test_no_progress_seconds(self) -> None:
        clock = Clock()
        path = make_run(self.tmp, template_plan(limits={"max_elapsed_seconds": 10000, "no_progress_seconds": 50}), clock=clock)
        run = self.holder(path, "w", clock=clock)
        run.step_start("draft")
        clock.advance(40)
        run.step_done("draft", EVIDENCE["draft"])
        clock.advance(45)
        run.step_start("review")
        clock.advance(6)
        with self.assertRaises(LimitExhausted):
            run.effect_begin("review:notes", PAYLOAD)
        self.assertBlocked(path, "no_progress_seconds", ["step", "start", "review"], run.epoch)
        with self.assertRaises(LimitExhausted):
            self.open_run(path, "w", run.epoch).step_start("review")


if __name__ == "__main__":
    unittest.main()
