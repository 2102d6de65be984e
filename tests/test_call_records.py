"""Calls in flight as untrusted input (``runner.calls.inflight``, ``runner.calls.processes``), with real processes.

A call record may have come with a copied run folder, from another machine or
from another user. The runner waits for a record's processes, or kills them,
only when they are this user's, started at the recorded time and carry the
call's token; a command's call lives while any process of its group does, so
a helper its leader left behind is waited for, and its group is killed at the
deadline only once a member was verified. What cannot be a call (a FIFO, a
folder, a deadline no call has, a record without a start time where start
times are known) is moved aside without being opened in a way that blocks,
and ``doctor`` and ``brief`` report it. A calls folder another user could
change is refused before anything durable is written.
"""

import hashlib
import json
import os
import signal
import stat
import subprocess
import time
import unittest
from typing import Any, Dict, List

from runner.calls import inflight
from runner.ledger.effects import begin_ops
from runner.base.errors import InvalidInput
from runner.calls.processes import GONE, UNVERIFIED, VERIFIED, Processes, start_time
from runner.base.host import local_maker
from tests.support.batch import batch_contract
from tests.support.cli import RunnerCli
from tests.support.util import child_env, python, scratch_dir, wait_for

#: Seconds any one condition may take before a test fails.
PATIENCE = 30.0
HAS_PROC = os.path.isdir("/proc/self")
KEY = "a:ticket"
MISSING_START = "a start time is missing, which this machine knows for every process"
FAR_DEADLINE = f"its deadline is more than {inflight.MAX_CALL_SECONDS + inflight.GRACE_SECONDS:g} s after its " \
               "registration"




def record_name(key: str, pid: int) -> str:
    """A name as the registry gives a call's record."""
    return hashlib.sha256(key.encode()).hexdigest()[:20] + f".{pid}-1-abcdef.json"


def gone(pid: int) -> bool:
    return not Processes().ours(pid)


def _command_name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError:
        return ""


class Spawned:
    """Processes a test starts, killed and reaped when it ends."""

    def __init__(self, case: unittest.TestCase) -> None:
        self.procs: List["subprocess.Popen[bytes]"] = []
        self.pids: List[int] = []
        case.addCleanup(self.end)

    def start(self, argv: List[str], **options: Any) -> "subprocess.Popen[bytes]":
        proc = subprocess.Popen(argv, **options)
        self.procs.append(proc)
        return proc

    def end(self) -> None:
        for pid in self.pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()


@unittest.skipUnless(HAS_PROC, "process groups and environments are read from /proc")
class Blind(Processes):
    """A machine without /proc: no start times, groups or environments."""

    def can_find(self) -> bool:
        return False

    def me(self) -> Any:
        return os.getpid(), None

    def identity(self, pid: int) -> Any:
        return pid, None


class ProcessesTest(unittest.TestCase):
    """What :class:`runner.calls.processes.Processes` believes of real processes."""

    def setUp(self) -> None:
        self.spawned = Spawned(self)
        self.processes = Processes()
        self.marker = f"{inflight.TOKEN_VARIABLE}={os.urandom(12).hex()}"

    def group(self, helper: str) -> Dict[str, Any]:
        """A leader of its own process group that leaves ``helper`` running in its group and exits when told to."""
        env = dict(os.environ, RUNNER_CALL=self.marker.split("=", 1)[1])
        leader = self.spawned.start(["sh", "-c", f"{helper} & echo $!; read go"], env=env, start_new_session=True,
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        member = int(leader.stdout.readline())  # type: ignore[union-attr]
        self.spawned.pids.append(member)
        wait_for("the helper to be the program it runs", lambda: _command_name(member) == "sleep")
        return {"leader": leader, "start": start_time(leader.pid), "member": member}

    def test_a_command_lives_in_a_member_of_its_group_once_its_leader_is_gone_and_only_then_is_killed(self) -> None:
        found = self.group("sleep 60")
        leader = found["leader"]
        self.assertEqual(self.processes.command(leader.pid, found["start"], self.marker), VERIFIED)
        leader.stdin.close()  # the leader exits; its helper goes on
        leader.wait(PATIENCE)
        start = found["start"]
        self.assertEqual(self.processes.command(leader.pid, start, self.marker), VERIFIED, "the helper is the call")
        another = "RUNNER_CALL=" + os.urandom(12).hex()
        self.assertEqual(self.processes.command(leader.pid, start, another), GONE, "it carries another call's token")
        later = str(int(start_time(found["member"])) + 1)
        self.assertEqual(self.processes.command(leader.pid, later, self.marker), GONE,
                         "a process that started before the recorded leader is none of its group's")
        self.assertTrue(self.processes.kill_command(leader.pid, found["start"], self.marker))
        wait_for("the helper to be killed with its group", lambda: gone(found["member"]))
        self.assertEqual(self.processes.command(leader.pid, found["start"], self.marker), GONE)
        self.assertFalse(self.processes.kill_command(leader.pid, start, self.marker), "none verified, none killed")

    def test_a_member_without_the_token_keeps_no_call_alive_and_is_never_killed(self) -> None:
        found = self.group("env -u RUNNER_CALL sleep 60")
        found["leader"].stdin.close()
        found["leader"].wait(PATIENCE)
        self.assertEqual(self.processes.command(found["leader"].pid, found["start"], self.marker), GONE)
        self.assertFalse(self.processes.kill_command(found["leader"].pid, found["start"], self.marker))
        self.assertFalse(gone(found["member"]), "a process that is not the call's lives")

    def test_an_unrelated_process_at_its_start_time_is_no_call_without_the_token(self) -> None:
        victim = self.spawned.start(["sleep", "60"], start_new_session=True)
        start = start_time(victim.pid)
        self.assertEqual(self.processes.command(victim.pid, start, self.marker), GONE)
        self.assertFalse(self.processes.kill_command(victim.pid, start, self.marker))
        self.assertIsNone(victim.poll())
        self.assertEqual(self.processes.command(victim.pid, None, self.marker), GONE, "no start time, no call")

    def test_the_caller_is_believed_alive_only_at_its_known_start_time(self) -> None:
        pid, start = self.processes.me()
        self.assertTrue(self.processes.alive(pid, start))
        self.assertFalse(self.processes.alive(pid, None))
        self.assertFalse(self.processes.alive(pid, str(int(start) + 1)))

    def test_where_nothing_can_be_read_a_live_pid_counts_until_its_deadline_and_nothing_is_killed(self) -> None:
        victim = self.spawned.start(["sleep", "60"], start_new_session=True)
        blind = Blind()
        self.assertEqual(blind.command(victim.pid, None, self.marker), UNVERIFIED)
        self.assertFalse(blind.kill_command(victim.pid, None, self.marker))
        self.assertIsNone(victim.poll())
        now = [time.time()]
        with scratch_dir() as root:
            registry = inflight.Registry(os.path.join(root, "calls"), processes=blind, clock=lambda: now[0])
            call = registry.register(KEY, "invoke", 1, 5.0)
            registry.spawned(call, victim.pid)
            [(_, view)] = registry.calls(KEY)
            self.assertEqual((view.alive, view.killable), (True, False), "waited for until its deadline, never killed")
            self.assertEqual(registry.set_aside(), [], "a record without start times is what this machine writes")

    def test_where_nothing_can_be_read_a_helper_keeps_its_gone_leaders_call_alive(self) -> None:
        found = self.group("sleep 60")
        leader = found["leader"]
        leader.stdin.close()  # the leader exits; its helper goes on, in the leader's group
        leader.wait(PATIENCE)
        blind = Blind()
        self.assertEqual(blind.command(leader.pid, None, self.marker), UNVERIFIED, "its group still has a member")
        self.assertFalse(blind.kill_command(leader.pid, None, self.marker))
        self.assertFalse(gone(found["member"]))
        os.kill(found["member"], signal.SIGKILL)
        wait_for("the helper to end", lambda: gone(found["member"]))
        wait_for("the group to be gone", lambda: blind.command(leader.pid, None, self.marker) == GONE)


#: The invoke command of the killed-drive test: a helper of its process group files the ticket, once the
#: successor has started (or a second after that), while the leader reports progress on stderr; once the
#: drive that ran it is gone, the leader's next report meets a closed pipe and the leader dies of SIGPIPE.
HELPER_INVOKE = r'''
key=$1
echo "$key" >> invoked
(
  echo "$$" > helper-started
  while [ ! -e resumed ]; do sleep 0.02; done
  sleep 1
  echo "$key" >> ledger
) &
helper=$!
while kill -0 $helper 2>/dev/null; do echo "waiting for the helper" >&2; sleep 0.05; done
printf '{"ticket": "%s"}\n' "$key"
'''
OBSERVE = r'''
grep -qx "$1" ledger 2>/dev/null && { printf '{"found": "%s"}\n' "$1"; exit 0; }
exit 1
'''
SIMPLE_INVOKE = r'''
echo "$1" >> invoked
echo "$1" >> ledger
printf '{"ticket": "%s"}\n' "$1"
'''


class RunCase(unittest.TestCase):
    """A run over one item whose invoke and observe commands are shell scripts in the workspace."""

    def setUp(self) -> None:
        tmp = scratch_dir("runner-call-records-")
        self.addCleanup(tmp.cleanup)
        self.root = tmp.name
        self.cli = RunnerCli(self, root=self.root)
        self.run_dir = os.path.join(self.root, ".run")
        self.calls = os.path.join(self.run_dir, inflight.CALLS)
        self.spawned = Spawned(self)

    def start(self, invoke: str, timeout: float = 20) -> None:
        for name, text in (("invoke.sh", invoke), ("observe.sh", OBSERVE)):
            with open(os.path.join(self.root, name), "w", encoding="utf-8") as handle:
                handle.write(text)
        block = batch_contract({"invoke": ["sh", os.path.join(self.root, "invoke.sh"), "{key}"],
                                "observe": ["sh", os.path.join(self.root, "observe.sh"), "{key}"]},
                               items=["a"], payload={"template": {"item": "{item}"}}, timeout=timeout)
        block["steps"][0]["key"] = "{item}:ticket"
        block["effects"]["key_pattern"] = "[a-z0-9]+:ticket"
        self.cli.init(block)

    def drive(self, owner: str) -> "subprocess.Popen[bytes]":
        argv = python("-m", "runner", "--dir", self.run_dir, "drive", "--owner", owner, "--json")
        return self.spawned.start(argv, cwd=self.root, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def finish(self, proc: "subprocess.Popen[bytes]", timeout: float = 60) -> Dict[str, Any]:
        out, err = proc.communicate(timeout=timeout)
        result: Dict[str, Any] = {"code": proc.returncode, "err": err.decode("utf-8", "replace")}
        if out.strip():
            result.update(json.loads(out.decode().splitlines()[-1]))
        return result

    def lines(self, name: str) -> List[str]:
        try:
            with open(os.path.join(self.root, name), encoding="utf-8") as handle:
                return handle.read().split()
        except FileNotFoundError:
            return []

    def effect(self) -> Dict[str, Any]:
        shown = self.cli("effect", "show", KEY, "--json")
        return json.loads(shown.out)

    def plant(self, record: Dict[str, Any], pid: int) -> str:
        """Write ``record`` into the run's calls folder (made as the runner makes it), named for ``pid``; its name."""
        os.makedirs(self.calls, mode=0o700, exist_ok=True)
        name = record_name(KEY, pid)
        with open(os.path.join(self.calls, name), "w", encoding="utf-8") as handle:
            json.dump(record, handle)
        return name

    def doctor(self) -> Dict[str, Any]:
        done = self.cli("doctor", "--json")
        return json.loads(done.out)


@unittest.skipUnless(HAS_PROC, "process groups and environments are read from /proc")
class KilledDriveTest(RunCase):
    def test_a_killed_drives_call_lives_on_in_its_group_after_its_leader_died_and_no_one_calls_again(self) -> None:
        self.start(HELPER_INVOKE)
        first = self.drive("worker-a")
        wait_for("the invoke's helper to start", lambda: os.path.exists(os.path.join(self.root, "helper-started")))
        [record] = [r for r in self.records() if r.get("child")]
        leader = record["child"][0]
        first.kill()  # SIGKILL: the drive is gone
        first.wait()
        os.kill(leader, signal.SIGKILL)  # and the shell that keeps the command's answer: no answer is left
        wait_for("the command's leader to die", lambda: gone(leader))
        self.cli("lease", "break", "--by", "supervisor", "--reason", "worker-a was killed")
        second = self.drive("worker-b")
        with open(os.path.join(self.root, "resumed"), "w"):
            pass  # the helper files the ticket a second from now, while the successor runs
        done = self.finish(second)
        self.assertEqual(done["code"], 10, done["err"])
        self.assertEqual((self.lines("ledger"), self.lines("invoked")), ([KEY], [KEY]), "one call, one ticket")
        effect = self.effect()
        self.assertEqual((effect["state"], effect["attempts"]), ("verified", 1))

    def records(self) -> List[Dict[str, Any]]:
        out = []
        for name in sorted(os.listdir(self.calls)) if os.path.isdir(self.calls) else []:
            if name.endswith(".json"):
                try:
                    with open(os.path.join(self.calls, name), encoding="utf-8") as handle:
                        out.append(json.load(handle))
                except (OSError, ValueError):
                    continue
        return out


@unittest.skipUnless(HAS_PROC, "start times are read from /proc")
class PlantedRecordTest(RunCase):
    """A record naming a process that is not the call's: drive never waits for it or kills it."""

    def setUp(self) -> None:
        super().setUp()
        self.start(SIMPLE_INVOKE, timeout=5)
        self.victim = self.spawned.start(["sleep", "600"], start_new_session=True)  # this user's, leading its own group
        now = time.time()
        self.record = {"key": KEY, "kind": "invoke", "attempt": 1, "owner": "x", "epoch": 1,
                       "caller": [self.victim.pid, None], "child": [self.victim.pid, None],
                       "token": os.urandom(12).hex(), "registered_at": now - 100, "deadline": now - 50,
                       "ended_at": None}

    def drive_completes(self) -> None:
        done = self.finish(self.drive("worker"))
        self.assertEqual(done["code"], 10, done["err"])
        self.assertIsNone(self.victim.poll(), "the unrelated process lives")
        self.assertEqual(self.lines("ledger"), [KEY])

    def test_a_record_without_a_start_time_is_set_aside_and_its_process_lives(self) -> None:
        name = self.plant(self.record, self.victim.pid)
        self.drive_completes()
        self.assertFalse(os.path.exists(os.path.join(self.calls, name)))
        [aside] = inflight.Registry(self.calls).set_aside()
        self.assertEqual((aside.name, aside.why), (name, MISSING_START))
        report = self.doctor()
        self.assertFalse(report["healthy"])
        self.assertEqual([f["code"] for f in report["findings"] if f["level"] == "foreign"], ["call-record-set-aside"])

    def test_a_record_at_the_processs_start_time_without_its_token_names_no_call(self) -> None:
        start = start_time(self.victim.pid)
        self.plant(dict(self.record, caller=[self.victim.pid, start], child=[self.victim.pid, start]), self.victim.pid)
        self.drive_completes()
        self.assertEqual(inflight.Registry(self.calls).set_aside(), [], "a well-formed record of no call: ended, kept")


class GarbageTest(RunCase):
    """What cannot be a call in the calls folder: moved aside, never waited on or opened in a way that blocks."""

    def setUp(self) -> None:
        super().setUp()
        self.start(SIMPLE_INVOKE, timeout=5)

    def check_set_aside(self, name: str, why: str) -> None:
        before = self.doctor()
        self.assertFalse(before["healthy"], "doctor reports it before any drive")
        self.assertIn(f"{name}: {why}", "\n".join(f["message"] for f in before["findings"]))
        # A drive that waited on the record (until its deadline) or opened the FIFO would never end: finish's deadline.
        done = self.finish(self.drive("worker"), timeout=60)
        self.assertEqual(done["code"], 10, done["err"])
        self.assertEqual(self.lines("ledger"), [KEY])
        [aside] = inflight.Registry(self.calls).set_aside()
        self.assertEqual((aside.name, aside.why), (name, why))
        report = self.doctor()
        self.assertFalse(report["healthy"])
        [finding] = [f for f in report["findings"] if f["level"] == "foreign"]
        self.assertEqual(finding["code"], "call-record-set-aside")
        self.assertIn(os.path.join(self.calls, inflight.SET_ASIDE, aside.item), finding["message"])
        brief = self.cli("brief", "--json", code=None).json["brief"]
        self.assertIn("SET ASIDE: 1 item(s) in the calls folder cannot be calls of this runner", brief)
        self.assertNotIn(name, brief, "the brief names no file a stranger named")

    def test_a_record_whose_deadline_no_call_has_is_set_aside(self) -> None:
        pid, start = Processes().me()  # a live process of this user: the old registry waited for it until the deadline
        record = {"key": KEY, "kind": "invoke", "attempt": 1, "owner": "x", "epoch": 1, "caller": [pid, start],
                  "child": None, "token": os.urandom(12).hex(), "registered_at": time.time(), "deadline": 1e12,
                  "ended_at": None}
        self.check_set_aside(self.plant(record, pid), FAR_DEADLINE)

    @unittest.skipUnless(hasattr(os, "mkfifo"), "no FIFOs here")
    def test_a_fifo_named_like_a_record_is_set_aside_unopened(self) -> None:
        os.makedirs(self.calls, mode=0o700)
        name = record_name(KEY, 4242)
        os.mkfifo(os.path.join(self.calls, name))
        self.check_set_aside(name, "it is a FIFO, not a file")
        [aside] = inflight.Registry(self.calls).set_aside()
        moved = os.lstat(os.path.join(self.calls, inflight.SET_ASIDE, aside.item))
        self.assertTrue(stat.S_ISFIFO(moved.st_mode), "moved, not opened")


class FolderTest(RunCase):
    """A calls folder that another user could change is refused before anything durable is written."""

    def setUp(self) -> None:
        super().setUp()
        self.start(SIMPLE_INVOKE, timeout=5)

    def refused(self, problem: str) -> None:
        revision = self.cli.status()["revision"]
        done = self.finish(self.drive("worker"))
        self.assertEqual(done["code"], 2, done["err"])
        [line] = done["err"].splitlines()
        self.assertIn(f"refusing the calls-in-flight folder {self.calls}: {problem}", line)
        after = self.cli.status()["revision"]
        self.assertEqual(after, revision, "nothing was written")
        self.assertEqual(self.lines("invoked"), [], "nothing was called")
        report = self.doctor()
        self.assertFalse(report["healthy"])
        self.assertEqual([f["code"] for f in report["findings"] if f["level"] == "foreign"], ["calls-refused"])
        brief = self.cli("brief", "--json", code=None).json["brief"]
        self.assertIn("CALLS IN FLIGHT REFUSED", brief)

    def test_a_folder_others_may_write_is_refused(self) -> None:
        os.makedirs(self.calls)
        os.chmod(self.calls, 0o777)
        self.refused(f"it is owned by uid {os.getuid()} with mode 0777")

    def test_a_folder_that_is_a_symbolic_link_is_refused(self) -> None:
        elsewhere = os.path.join(self.root, "elsewhere")
        os.makedirs(elsewhere, mode=0o700)
        os.symlink(elsewhere, self.calls)
        self.refused("it is a symbolic link")

    @unittest.skipUnless(hasattr(os, "geteuid") and os.geteuid() == 0, "needs root to give a folder to another user")
    def test_a_folder_of_another_user_is_refused(self) -> None:
        os.makedirs(self.calls, mode=0o700)
        os.chown(self.calls, 65534, 65534)
        self.refused("it is owned by uid 65534 with mode 0700")

    def test_a_database_runs_root_is_held_to_the_same_rule(self) -> None:
        root = os.path.join(self.root, "runner-calls")
        os.makedirs(root)
        os.chmod(root, 0o777)
        registry = inflight.Registry(os.path.join(root, "run"), root=root, transient=True)
        with self.assertRaises(InvalidInput) as caught:
            registry.register(KEY, "invoke", 1, 5.0)
        self.assertIn(f"refusing the calls-in-flight folder {root}: it is owned by uid {os.getuid()} with mode 0777",
                      caught.exception.message)
        self.assertEqual(os.listdir(root), [], "nothing was written into it")


class RecordTest(unittest.TestCase):
    """Which records the registry believes, and what it sets aside, with the records written in this process."""

    def setUp(self) -> None:
        tmp = scratch_dir("runner-call-records-")
        self.addCleanup(tmp.cleanup)
        self.folder = os.path.join(tmp.name, "calls")
        self.now = [time.time()]
        self.registry = inflight.Registry(self.folder, clock=lambda: self.now[0])

    def test_what_the_runner_writes_is_believed_and_what_it_cannot_have_written_is_set_aside(self) -> None:
        own = self.registry.register(KEY, "invoke", 1, 30.0)
        self.registry.ended(own)
        good = dict(own.record)
        pid = int(own.name.split(".")[1].split("-")[0])
        cases = {
            "it carries no call token": dict(good, token=None),
            "it names no kind of call": dict(good, kind="delete"),
            "it names no process as a pid and a start time": dict(good, caller=["1", good["caller"][1]]),
            "it was registered in the future": dict(good, registered_at=self.now[0] + inflight.CLOCK_SKEW_SECONDS + 60),
            FAR_DEADLINE: dict(good, deadline=good["registered_at"] + inflight.MAX_CALL_SECONDS + 60),
            "its times are not numbers": dict(good, deadline="soon"),
            "it is not a JSON object": [good],
            "it was written on another machine ('elsewhere'), whose processes these are not": dict(good, host="elsewhere"),
        }
        if HAS_PROC:
            cases[MISSING_START] = dict(good, caller=[good["caller"][0], None])
        names = {why: record_name(KEY, pid).replace("-1-", f"-{n}-") for n, why in enumerate(sorted(cases), start=2)}
        for why, record in cases.items():
            with open(os.path.join(self.folder, names[why]), "w") as handle:
                json.dump(record, handle)
        with open(os.path.join(self.folder, record_name("another:key", pid)), "w") as handle:
            json.dump(good, handle)  # a key that is not its name's
        with open(os.path.join(self.folder, "notes.txt"), "w") as handle:
            handle.write("a name the runner never gives")
        self.assertEqual([call.name for call, _ in self.registry.calls(KEY)], [own.name], "its own record stays")
        self.registry.sweep(lambda key: True)
        found = sorted((item.name, item.why) for item in self.registry.set_aside())
        expected = sorted([(name, why) for why, name in names.items()]
                          + [(record_name("another:key", pid), "its key does not match its name"),
                             ("notes.txt", "the runner gives no file of a call such a name")])
        self.assertEqual(found, expected)
        self.assertEqual(sorted(os.listdir(self.folder)), sorted([own.name, inflight.SET_ASIDE]))

    def test_a_call_longer_than_a_day_is_refused_before_it_is_registered(self) -> None:
        for timeout in (0, -1, float("nan"), inflight.MAX_CALL_SECONDS + 1, True):
            with self.subTest(timeout=timeout):
                with self.assertRaises(InvalidInput):
                    self.registry.register(KEY, "invoke", 1, timeout)  # type: ignore[arg-type]
        self.assertFalse(os.path.exists(self.folder))

    def test_an_effect_another_local_user_began_is_refused_by_a_registry_only_this_user_can_read(self) -> None:
        effects: Dict[str, Any] = {}
        registry = inflight.Registry(self.folder, effects=lambda: effects)
        me = local_maker()
        effects[KEY] = {"state": "started", "begun_by": {"host": me["host"], "uid": me["uid"] + 1}}
        with self.assertRaises(InvalidInput) as caught:
            registry.calls(KEY)
        self.assertIn(f"was begun by uid {me['uid'] + 1} on this machine", caught.exception.message)
        with self.assertRaises(InvalidInput):
            registry.check()
        another = {"host": me["host"], "uid": me["uid"] + 1}
        elsewhere = {"host": "elsewhere", "uid": 1}
        for allowed in ({"state": "started", "begun_by": dict(me)}, {"state": "started", "begun_by": elsewhere},
                        {"state": "started"}, {"state": "acknowledged", "begun_by": another}):
            with self.subTest(effect=allowed):
                effects[KEY] = allowed
                self.assertEqual(registry.calls(KEY), [])
                registry.check()

    def test_a_begin_records_who_began_it(self) -> None:
        from tests.support.util import contract_block
        from runner.ledger.envelope import new_envelope

        block = contract_block("begun-by")
        state = new_envelope("begun-by", block, "sha256:" + "0" * 64, "2026-01-01T00:00:00.000Z")
        state["status"] = "active"
        ops = begin_ops(state, "k1", "sha256:" + "1" * 64, time.time())
        [record] = [op[2] for op in ops if op[1] == ["effects", "k1"]]
        self.assertEqual(record["begun_by"], dict(local_maker(), epoch=0))

    def test_the_postgresql_folder_is_named_by_what_the_database_says_the_run_is_not_by_the_url(self) -> None:
        class Store:
            kind, path, clock = "postgresql", "/nonexistent", time.time
            state: Dict[str, Any] = {"task_id": "t", "effects": {}}

            def __init__(self, url: str) -> None:
                self.url = url

            def identity(self) -> str:
                return "postgresql\nrunner_test\n" + "a" * 64 + "\nt"

        urls = ("postgresql://u@127.0.0.1:5432/runner_test", "postgresql://u@localhost/runner_test?sslmode=disable")
        folders = {inflight._locate(Store(url), None).folder for url in urls}  # type: ignore[union-attr]
        self.assertEqual(len(folders), 1, folders)
        self.assertEqual(os.path.dirname(folders.pop()), os.path.join("/tmp", f"runner-calls-{os.getuid()}"))


if __name__ == "__main__":
    unittest.main()
