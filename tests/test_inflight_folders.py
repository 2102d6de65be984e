"""Where a database run keeps its calls in flight (``runner.calls.inflight.registry_for``).

A SQLite run keeps them beside its database file, in a folder named from the
file's real path: every spelling of the path (relative, ``./``, ``../`` from
a subfolder, absolute, through a symbolic link) finds the same records, and a
call a killed process left there is found by a process that spelled the path
another way. A database run's folders last only while a call is in them:
nothing is left in the temp folder or beside the database once the calls
are done, and a process whose folder another removed meanwhile makes it again.
"""

import os
import signal
import subprocess
import unittest

from runner.calls import inflight
from runner.execution.run import Run
from runner.stores import create_store, open_store
from tests.support.util import child_env, contract_block, python, scratch_dir
from tests.test_conformance import MemoryAdapter

TASK = "inflight-folders"

#: A process that registers a call of ``k:1`` on the run at ARGV[1] (as spelled there, from its working folder) and waits.
_CALLER = """
import sys
from runner.calls import inflight
from runner.stores import open_store
store = open_store(sys.argv[1], sys.argv[2])
inflight.registry_for(store).register("k:1", "invoke", 1, 600.0)
print("registered", flush=True)
sys.stdin.read()
"""


class SQLiteRegistryTest(unittest.TestCase):
    def setUp(self) -> None:
        scratch = scratch_dir("runner-inflight-")
        self.addCleanup(scratch.cleanup)
        self.root = os.path.join(scratch.name, "project")
        os.makedirs(os.path.join(self.root, "sub"))
        os.symlink(self.root, os.path.join(scratch.name, "link"))
        self.link = os.path.join(scratch.name, "link")
        self.db = os.path.join(self.root, "runs.db")
        create_store("sqlite:" + self.db, TASK, contract_block(TASK)).close()
        self.here = os.getcwd()
        self.addCleanup(os.chdir, self.here)

    def folder_for(self, url: str, cwd: str) -> str:
        os.chdir(cwd)
        store = open_store(url, TASK)
        try:
            return inflight.registry_for(store).folder
        finally:
            store.close()
            os.chdir(self.here)

    def test_every_spelling_of_the_path_finds_the_same_folder_beside_the_database(self) -> None:
        spellings = [("sqlite:runs.db", self.root), ("sqlite:./runs.db", self.root), ("sqlite:" + self.db, "/"),
                     ("sqlite:../runs.db", os.path.join(self.root, "sub")), ("sqlite:" + os.path.join(self.link, "runs.db"), "/"),
                     ("sqlite:runs.db", self.link)]
        folders = {self.folder_for(url, cwd) for url, cwd in spellings}
        self.assertEqual(len(folders), 1, folders)
        self.assertEqual(os.path.dirname(folders.pop()), os.path.realpath(self.db) + ".calls")

    def test_a_call_of_a_killed_process_is_found_by_a_process_that_spelled_the_path_otherwise(self) -> None:
        caller = subprocess.Popen(python("-c", _CALLER, "sqlite:runs.db", TASK), cwd=self.root, env=child_env(),
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        try:
            self.assertEqual(caller.stdout.readline(), b"registered\n")  # type: ignore[union-attr]
            store = open_store("sqlite:" + os.path.join(self.link, "runs.db"), TASK)
            self.addCleanup(store.close)
            registry = inflight.registry_for(store)
            self.assertEqual([(call.record["caller"][0], view.alive) for call, view in registry.calls("k:1")], [(caller.pid, True)])
            caller.send_signal(signal.SIGKILL)
            caller.wait(10)
            self.assertEqual([view.alive for _, view in registry.calls("k:1")], [False], "its record outlives it")
        finally:
            if caller.poll() is None:
                caller.kill()
                caller.wait(10)
            caller.stdin.close()  # type: ignore[union-attr]
            caller.stdout.close()  # type: ignore[union-attr]

    def test_the_folders_go_with_the_last_call_and_come_back_for_the_next(self) -> None:
        store = open_store("sqlite:" + self.db, TASK)
        self.addCleanup(store.close)
        first, second = inflight.registry_for(store), inflight.registry_for(store)
        root = os.path.dirname(first.folder)
        a, b = first.register("a:1", "invoke", 1, 5.0), second.register("b:1", "invoke", 1, 5.0)
        second.finish(b)
        self.assertTrue(os.path.isdir(first.folder), "a call is still in it")
        first.finish(a)
        self.assertFalse(os.path.exists(root), "the last call took the folders with it")
        # `second` made the folder before the other removed it: its next call makes it again.
        c = second.register("c:1", "invoke", 1, 5.0)
        self.assertEqual([call.key for call, _ in first.calls("c:1")], ["c:1"])
        second.finish(c)
        self.assertFalse(os.path.exists(root))

    def test_an_effect_driven_to_verified_leaves_no_folder(self) -> None:
        run = Run(open_store("sqlite:" + self.db, TASK))
        self.addCleanup(run.store.close)
        run.acquire("worker", 60)
        run.step_start("only")
        folder = inflight.registry_for(run.store).folder
        self.assertEqual(run.drive_effect("k:1", {"n": 1}, MemoryAdapter())["state"], "verified")
        self.assertFalse(os.path.exists(folder))
        self.assertEqual([name for name in os.listdir(self.root) if not name.startswith("runs.db-")], ["runs.db", "sub"])


if __name__ == "__main__":
    unittest.main()
