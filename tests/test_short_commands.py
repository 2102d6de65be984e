"""What a short command loads, and the digests it computes without OpenSSL.

Most commands an agent runs are short (``status``, ``next``, one step of the
ledger), and their start is most of their cost: a module they never use
should not be loaded. The claims here are about what is imported, read from
``python -X importtime`` in a real child process, not about time.
"""

import hashlib
import importlib.util
import os
import unittest
from typing import Set

from runner.base.canonical import SHORT_INPUT_BYTES, sha256, sha256_hex, sha256_stream
from tests.support.batch import batch_contract
from tests.support.cli import RunnerCli
from tests.support.util import child_env, python, run, scratch_dir

#: The HTTP adapter and the modules under it: loaded only by a run whose contract declares ``effects.http``.
HTTP = {"runner.adapters.http", "runner.adapters.http_client", "runner.adapters.http_secrets", "runner.adapters.http_answers"}
#: Never loaded by a command that runs no target command: OpenSSL's hashes, shutil (with bz2 and lzma: argparse asks
#: it for the terminal's width), the HTTP and mail clients and the git adapter, what a running command is started and
#: waited with.
UNUSED = {"hashlib", "_hashlib", "shutil", "bz2", "lzma", *HTTP, "http.client", "urllib.request", "selectors", "subprocess",
          "runner.adapters.smtp", "smtplib", "runner.adapters.git"}
#: Never loaded by a command that runs a contract's target commands.
UNUSED_BY_COMMANDS = {"hashlib", "_hashlib", *HTTP, "http.client", "urllib.request", "runner.adapters.smtp", "smtplib",
                      "runner.adapters.git"}
#: Loaded by ``status``: the reading is real, the store was read.
USED_BY_STATUS = {"runner.stores.file"}
#: Loaded by a drive of commands: the executor carried the effects out and the commands ran.
USED_BY_COMMANDS = {"runner.execution.executor", "subprocess"}


class DigestTest(unittest.TestCase):
    def test_each_way_gives_the_digest_of_hashlib(self) -> None:
        for size in (0, 1, SHORT_INPUT_BYTES - 1, SHORT_INPUT_BYTES, 3 * SHORT_INPUT_BYTES + 7):
            data = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
            with self.subTest(size=size):
                expected = hashlib.sha256(data).hexdigest()
                self.assertEqual(sha256(data).hexdigest(), expected)
                self.assertEqual(sha256_hex(data), expected)
                stream = sha256_stream()
                for start in range(0, len(data), 5000):
                    stream.update(data[start:start + 5000])
                self.assertEqual(stream.hexdigest(), expected)


class NamesTest(unittest.TestCase):
    def test_every_module_named_here_is_a_module(self) -> None:
        # A name that is no module (a typo, a module moved) is never loaded, so a claim on it would hold vacuously.
        for name in sorted(UNUSED | UNUSED_BY_COMMANDS | USED_BY_STATUS | USED_BY_COMMANDS):
            with self.subTest(module=name):
                self.assertIsNotNone(importlib.util.find_spec(name), f"{name} is no module of this tree or Python")


class LoadedModulesTest(unittest.TestCase):
    def setUp(self) -> None:
        self.tmp = scratch_dir("runner-short-")
        self.addCleanup(self.tmp.cleanup)
        self.root = self.tmp.name
        os.makedirs(os.path.join(self.root, "docs"))
        for name in ("alpha", "beta"):
            with open(os.path.join(self.root, "docs", f"{name}.txt"), "w", encoding="utf-8") as handle:
                handle.write(f"{name}\n")
        invoke = ["sh", "-c", 'echo filed > "$1.filed" && echo "{}"', "invoke", "{key}"]
        observe = ["sh", "-c", 'test -e "$1.filed" && echo "{}"', "observe", "{key}"]
        RunnerCli(self, root=self.root).init(batch_contract({"invoke": invoke, "observe": observe}))

    def loaded(self, *args: str) -> Set[str]:
        """The modules ``python -m runner --dir ROOT/.run ARGS`` imports, run from the workspace; its exit code must be 0 or 10."""
        argv = python("-X", "importtime", "-m", "runner", "--dir", os.path.join(self.root, ".run"), *args)
        result = run(argv, cwd=self.root, env=child_env())
        self.assertIn(result.code, (0, 10), result.err[-2000:])
        return {line.rsplit("|", 1)[1].strip() for line in result.err.splitlines() if line.startswith("import time:") and "|" in line}

    def test_status_loads_none_of_the_unused_modules(self) -> None:
        loaded = self.loaded("status")
        self.assertEqual(USED_BY_STATUS - loaded, set())
        self.assertEqual(UNUSED & loaded, set())

    def test_a_drive_of_commands_loads_no_http_client_nor_openssl(self) -> None:
        loaded = self.loaded("drive", "--owner", "agent", "--json")
        self.assertEqual(USED_BY_COMMANDS - loaded, set())
        self.assertEqual(UNUSED_BY_COMMANDS & loaded, set())
        for key in ("alpha:ticket", "beta:ticket"):
            self.assertTrue(os.path.exists(os.path.join(self.root, f"{key}.filed")), key)


if __name__ == "__main__":
    unittest.main()
