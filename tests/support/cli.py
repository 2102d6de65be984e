"""The command line on one run, as the tests call it: in this process, in a child, or left running.

Every call names the run (``--dir ROOT/.run``, or a store URL) and asserts its exit code (0
unless it says another; None asserts nothing) and, for a refusal, its reason;
what a call printed is a :class:`Result`, whose ``json`` is the one object a
``--json`` command prints. The folder is
a scratch folder removed with the test unless the test gives its own, and a
child left running is killed and reaped at the test's end.
"""

import os
import subprocess
import unittest
from typing import Any, Dict, List, Optional, Sequence

from .util import Result, child_env, in_process_cli, python, run, scratch_dir, write_contract


class RunnerCli:
    """The command line on the run in ``ROOT/.run``, the project folder ``ROOT`` being the contract's workspace.

    :param test: the test whose assertions and cleanups the calls use.
    :param contract: a contract block: written to ``ROOT/contract.md`` and the run started with ``init``.
    :param root: the project folder; by default a scratch folder removed with the test.
    :param run_dir: the run's folder, when it is not ``ROOT/.run``.
    :param store: a store's URL, named with ``--store`` (and ``task`` with ``--task``) in place of ``--dir``.
    :param env: variables set for every call (None removes one).
    """

    def __init__(self, test: unittest.TestCase, contract: Optional[Dict[str, Any]] = None, *,
                 root: Optional[str] = None, run_dir: Optional[str] = None, store: Optional[str] = None,
                 task: Optional[str] = None, env: Optional[Dict[str, Optional[str]]] = None) -> None:
        self.test = test
        if root is None:
            scratch = scratch_dir("runner-cli-")
            test.addCleanup(scratch.cleanup)
            root = scratch.name
        self.root = root
        self.run_dir = run_dir or os.path.join(root, ".run")
        self._where = ["--store", store, *(["--task", task] if task else [])] if store else ["--dir", self.run_dir]
        self.env: Dict[str, Optional[str]] = dict(env or {})
        self._writer: List[str] = []
        if contract is not None:
            self.init(contract)

    def init(self, contract: Dict[str, Any]) -> str:
        """Write ``contract`` to ``ROOT/contract.md`` and start the run; return the run's folder."""
        path = write_contract(os.path.join(self.root, "contract.md"), contract)
        self("init", "--contract", path)
        return self.run_dir

    def writer(self, owner: str, epoch: Any) -> "RunnerCli":
        """The same run, with ``--owner OWNER --epoch EPOCH`` added to every call (before a ``--``)."""
        other = RunnerCli(self.test, root=self.root, run_dir=self.run_dir, env=self.env)
        other._where, other._writer = self._where, ["--owner", owner, "--epoch", str(epoch)]
        return other

    def argv(self, args: Sequence[str]) -> List[str]:
        """The whole command line of a call: where the run is, ``args``, and the writer's options before any ``--``."""
        args = list(args)
        cut = args.index("--") if "--" in args else len(args)
        return [*self._where, *args[:cut], *self._writer, *args[cut:]]

    def __call__(self, *args: str, code: Optional[int] = 0, reason: Optional[str] = None,
                 env: Optional[Dict[str, Optional[str]]] = None) -> Result:
        """The command line's entry point in this process.

        :param code: the exit code the call must end with (None: not checked here).
        :param reason: the refusal the call must end with: one line on stderr that names it.
        """
        result = in_process_cli(self.argv(args), env={**self.env, **(env or {})})
        return self._checked(args, result, code, reason)

    def json(self, *args: str, code: Optional[int] = 0, reason: Optional[str] = None,
             env: Optional[Dict[str, Optional[str]]] = None) -> Dict[str, Any]:
        """The one JSON object ``ARGS --json`` prints, in this process; with ``reason``, it is that refusal."""
        cut = args.index("--") if "--" in args else len(args)
        body = self(*args[:cut], "--json", *args[cut:], code=code, reason=reason, env=env).json
        if reason is not None:
            self.test.assertEqual(body.get("error"), reason, body)
        return body

    def status(self) -> Dict[str, Any]:
        """``status --json`` of the run, in this process (its exit code says how the run stands: not checked)."""
        return self.json("status", code=None)

    def child(self, *args: str, code: Optional[int] = 0, reason: Optional[str] = None,
              env: Optional[Dict[str, str]] = None, timeout: float = 120) -> Result:
        """``python -m runner`` with the call's command line, in a child whose working folder is ``ROOT``."""
        variables = {k: v for k, v in {**self.env, **(env or {})}.items() if v is not None}
        removed = [k for k, v in {**self.env, **(env or {})}.items() if v is None]
        environment = child_env(**variables)
        for name in removed:
            environment.pop(name, None)
        result = run(python("-m", "runner", *self.argv(args)), cwd=self.root, env=environment, timeout=timeout)
        return self._checked(args, result, code, reason)

    def spawn(self, *args: str, env: Optional[Dict[str, str]] = None, **popen: Any) -> "subprocess.Popen[Any]":
        """``python -m runner`` with the call's command line, left running in ``ROOT``; killed and reaped at the end."""
        options: Dict[str, Any] = {"stdin": subprocess.DEVNULL, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
        options.update(popen)
        argv = python("-m", "runner", *self.argv(args))
        proc = subprocess.Popen(argv, cwd=self.root, env=child_env(**(env or {})), **options)
        self.test.addCleanup(_reap, proc)
        return proc

    def _checked(self, args: Sequence[str], result: Result, code: Optional[int], reason: Optional[str]) -> Result:
        if code is not None:
            said = f"{list(args)}: stdout {result.out[-2000:]!r} stderr {result.err[-2000:]!r}"
            self.test.assertEqual(result.code, code, said)
        if reason is not None:
            lines = result.err.splitlines()
            self.test.assertEqual(len(lines), 1, result.err)
            self.test.assertTrue(lines[0].startswith(f"runner: {reason}: "), lines[0])
        return result


def _reap(proc: "subprocess.Popen[Any]") -> None:
    """Kill a child a test left running, wait for it, and close its pipes."""
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
