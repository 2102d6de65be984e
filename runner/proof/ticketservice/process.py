"""A ticket service in a child process, for tests and demos, and the conformance factories.
"""

import contextlib
import json
import os
import selectors
import shutil
import subprocess
import sys
import tempfile
import urllib.parse
from typing import Any, Dict, List, Optional, Tuple

from .. import PACKAGE_PARENT as _PACKAGE_PARENT

from .client import MarkerTicketAdapter, TicketAdapter, _TicketClient
from .wire import Lost, NotSent


# -- a service in a child process ----------------------------------------------------------


class TicketServiceProcess:
    """Start ``python3 -m runner.proof.ticketservice`` in a child process; stop it on exit.

    ``flags``: ``idempotency`` (default True), ``retention_seconds`` (None),
    ``quiet`` (True) and any fault switch as a start-up value. The service's
    stderr goes to ``DB.log``. Usable as a context manager, or started by the
    constructor and stopped with :meth:`stop`. :meth:`start` after a stop
    or a crash brings the service back on the same ledger and port.
    """

    def __init__(self, db_path: str, *, idempotency: bool = True, retention_seconds: Optional[float] = None,
                 quiet: bool = True, startup_timeout: float = 20.0, **faults: Any) -> None:
        self.db_path = os.path.abspath(db_path)
        self.port_file = self.db_path + ".port"
        self.log_path = self.db_path + ".log"
        self.idempotency = idempotency
        self.retention_seconds = retention_seconds
        self.quiet = quiet
        self.startup_timeout = startup_timeout
        self.faults = dict(faults)
        self.process: Optional["subprocess.Popen[bytes]"] = None
        self.port = 0
        self.url = ""
        self._client = _TicketClient("http://127.0.0.1:0", timeout=10.0)
        self.start()

    def __enter__(self) -> "TicketServiceProcess":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> None:
        """Spawn the service and wait (without polling) for its ``ready`` line."""
        if self.process is not None:
            raise RuntimeError("the service is already running")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.port_file)
        # -S: the service needs the standard library only, and starts faster without site-packages.
        command = [sys.executable, "-S", "-m", "runner.proof.ticketservice", "--db", self.db_path, "--port-file",
                   self.port_file]
        if not self.idempotency:
            command.append("--no-idempotency")
        if self.retention_seconds is not None:
            command += ["--retention", repr(float(self.retention_seconds))]
        if self.faults:
            command += ["--faults", json.dumps(self.faults)]
        if self.quiet:
            command.append("--quiet")
        if self.port:
            # A restart comes back at the same address, so adapters made earlier still reach it.
            command += ["--port", str(self.port)]
        env = dict(os.environ)
        env["PYTHONPATH"] = _PACKAGE_PARENT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log,
                                            env=env)
        assert self.process.stdout is not None
        line = b""
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            if selector.select(self.startup_timeout):
                line = self.process.stdout.readline()
        if not line.startswith(b"ready "):
            self._reap()
            with open(self.log_path, "rb") as log:
                tail = log.read()[-2000:].decode("utf-8", "replace")
            raise RuntimeError(f"the ticket service did not start: {tail.strip() or 'no output'}")
        with open(self.port_file, encoding="ascii") as handle:
            port = int(handle.read())
        if port != int(line.split()[1]) or self.port not in (0, port):
            raise RuntimeError("the port file, the ready line and the requested port disagree")
        self.port = port
        self.url = f"http://127.0.0.1:{self.port}"
        self._client.url = self.url

    def _reap(self) -> None:
        proc, self.process = self.process, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it lingers. Committed tickets stay in the ledger."""
        proc = self.process
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self._reap()

    def kill(self) -> None:
        """SIGKILL: a crash of the service."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
        self._reap()

    def restart(self) -> None:
        self.stop()
        self.start()

    def wait_exit(self, timeout: float = 10.0) -> Optional[int]:
        """Wait for a service that is expected to exit (``crash_before_commit``); its exit code."""
        if self.process is None:
            return None
        code = self.process.wait(timeout=timeout)
        self._reap()
        return code

    # -- talking to it -------------------------------------------------------------------
    def request(self, method: str, path: str, body: Optional[Dict[str, Any]] = None,
                headers: Optional[Dict[str, str]] = None) -> Tuple[int, Dict[str, Any]]:
        """One request; raises ``ConnectionError`` when no answer comes back."""
        try:
            return self._client._send(method, path, body, headers)
        except (NotSent, Lost) as exc:
            raise ConnectionError(str(exc)) from None

    def set_faults(self, **faults: Any) -> Dict[str, Any]:
        status, body = self.request("POST", "/faults", faults)
        if status != 200:
            raise ValueError(f"faults refused: {body}")
        return body

    def reset_faults(self) -> Dict[str, Any]:
        return self.set_faults(reset=True)

    def stats(self) -> Dict[str, Any]:
        return self.request("GET", "/stats")[1]

    def tickets_for_key(self, key: str) -> List[Dict[str, Any]]:
        """Every ticket ever created under ``key`` (ignores retention)."""
        return self.request("GET", "/tickets?" + urllib.parse.urlencode({"key": key}))[1]["tickets"]

    def tickets_for_marker(self, marker: str) -> List[Dict[str, Any]]:
        return self.request("GET", "/tickets?" + urllib.parse.urlencode({"marker": marker}))[1]["tickets"]

    def adapter(self, **options: Any) -> TicketAdapter:
        """A :class:`TicketAdapter` declaring this service's start-up retention and refusals."""
        options.setdefault("retention_seconds", self.retention_seconds)
        # A start-up override for the next N requests only does not change what the service normally does.
        options.setdefault("refuses_conflicting_payload",
                           self.faults.get("refuse_conflicting_payload", True) is not False)
        options.setdefault("enforces_fencing", self.faults.get("reject_stale_epoch", True) is not False)
        return TicketAdapter(self.url, **options)

    def marker_adapter(self, **options: Any) -> MarkerTicketAdapter:
        options.setdefault("enforces_fencing", self.faults.get("reject_stale_epoch", True) is not False)
        return MarkerTicketAdapter(self.url, **options)


# -- conformance factories -----------------------------------------------------------------

class _ServiceControls:
    """Conformance hooks for a service started by a factory (see :mod:`runner.proof.conformance`)."""

    def __init__(self, service: TicketServiceProcess, folder: str, by: str) -> None:
        self.service = service
        self.folder = folder
        self.by = by

    def lose_next_response(self) -> None:
        self.service.set_faults(drop_after_commit=1)

    def effect_count(self, key: str, payload: Dict[str, Any]) -> int:
        if self.by == "marker":
            return len(self.service.tickets_for_marker(str(payload.get("marker"))))
        return len(self.service.tickets_for_key(key))

    def close(self) -> None:
        try:
            self.service.stop()
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)


def conformance_factory() -> Tuple[TicketAdapter, _ServiceControls]:
    """A fresh service with idempotency in a temp folder, and a :class:`TicketAdapter` for it."""
    folder = tempfile.mkdtemp(prefix="ticketservice-")
    try:
        service = TicketServiceProcess(os.path.join(folder, "tickets.db"))
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return service.adapter(run_id="conformance"), _ServiceControls(service, folder, by="key")


def marker_conformance_factory() -> Tuple[MarkerTicketAdapter, _ServiceControls]:
    """A fresh service without idempotency, and a :class:`MarkerTicketAdapter` for it."""
    folder = tempfile.mkdtemp(prefix="ticketservice-")
    try:
        service = TicketServiceProcess(os.path.join(folder, "tickets.db"), idempotency=False)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return service.marker_adapter(run_id="conformance"), _ServiceControls(service, folder, by="marker")
