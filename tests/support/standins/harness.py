"""A stand-in started as a real process for a test: its URL, its faults, its counts, a kill and a start again on DIR.

    with StandIn("tracker", ["--lag", "0.5"]) as tracker:
        tracker.faults([{"fault": "429", "on": "create"}])
        status, headers, body = tracker.request("POST", "/repos/o/r/issues", {"title": "t"})
        tracker.count()["duplicates"]

The process is ``python3 -S -m tests.support.standins.NAME --port 0 --state DIR --exit-with-parent``
(it stops with a test process killed before it could stop it) from the repository, its bytecode in the folder
the suite's children share (``tests/__init__.py``), never beside the sources.
"""

import http.client
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.parse
from typing import Any, Dict, List, Optional, Sequence, Tuple

from tests.support.standins.common import post_faults
from tests.support.util import REPO_ROOT, python

#: Seconds a stand-in may take to print its URL: it compiles its modules (no bytecode is written beside them) on a
#: machine the suite's children may load far past its cores, where that has taken more than 10 s.
START_SECONDS = 30.0


class StandIn:
    """One stand-in process. ``state``: its DIR (a temporary folder, removed at :meth:`stop`, when not given)."""

    def __init__(self, name: str, args: Sequence[str] = (), state: Optional[str] = None) -> None:
        self.name = name
        self.args = list(args)
        self._owned = state is None
        self.state = state if state is not None else tempfile.mkdtemp(prefix=f"standin-{name}-")
        self.proc: Optional["subprocess.Popen[bytes]"] = None
        self.url = ""
        self.start()

    # -- the process -------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the stand-in on :attr:`state` (after :meth:`kill`: a new port, the same DIR); wait for its URL."""
        errors = open(os.path.join(self.state, f".{self.name}.stderr"), "ab")
        try:
            self.proc = subprocess.Popen(
                python("-m", f"tests.support.standins.{self.name}", "--port", "0", "--state", self.state,
                       "--exit-with-parent", *self.args),
                cwd=REPO_ROOT, env=_environment(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=errors)
        finally:
            errors.close()
        assert self.proc.stdout is not None
        end = time.monotonic() + START_SECONDS
        line = b""
        while not line.endswith(b"\n") and time.monotonic() < end:
            ready, _, _ = select.select([self.proc.stdout], [], [], max(0.0, end - time.monotonic()))
            chunk = os.read(self.proc.stdout.fileno(), 4096) if ready else b""
            if ready and not chunk:
                break
            line += chunk
        if not line.endswith(b"\n"):
            self.kill()
            raise RuntimeError(f"the {self.name} stand-in printed no URL: {self.stderr()[-2000:]}")
        self.url = line.decode().splitlines()[0].strip()

    def stop(self) -> None:
        """End the process (SIGTERM, then SIGKILL) and remove DIR if this object made it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.kill()
        self._close()
        if self._owned:
            shutil.rmtree(self.state, ignore_errors=True)

    def kill(self) -> None:
        """SIGKILL the process and wait for it; DIR stays."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(5)
        self._close()

    def _close(self) -> None:
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()

    def stderr(self) -> str:
        try:
            with open(os.path.join(self.state, f".{self.name}.stderr"), encoding="utf-8", errors="replace") as handle:
                return handle.read()
        except OSError:
            return ""

    def __enter__(self) -> "StandIn":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- where it listens ------------------------------------------------------------------------------
    @property
    def host(self) -> str:
        return urllib.parse.urlsplit(self.url).hostname or "127.0.0.1"

    @property
    def port(self) -> int:
        return int(urllib.parse.urlsplit(self.url).port or 0)

    @property
    def base(self) -> str:
        """``http://HOST:PORT``, where the control routes are (the webhook's URL holds a secret path besides)."""
        split = urllib.parse.urlsplit(self.url)
        return f"{split.scheme}://{split.netloc}"

    # -- asking it ---------------------------------------------------------------------------------------
    def request(self, method: str, path: str, body: Any = None, headers: Optional[Dict[str, str]] = None,
                timeout: float = 5.0) -> Tuple[int, Dict[str, str], bytes]:
        """One HTTP request on a new connection: ``(status, headers with lower-case names, body)``.

        ``body``: bytes as they are, anything else as JSON. A path that is a whole URL is asked as it is.
        """
        split = urllib.parse.urlsplit(path if "://" in path else self.base + path)
        sent = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        connection = http.client.HTTPConnection(split.hostname or "127.0.0.1", split.port, timeout=timeout)
        try:
            target = split.path + (f"?{split.query}" if split.query else "")
            connection.request(method, target, body=sent, headers=dict(headers or {}))
            reply = connection.getresponse()
            return reply.status, {k.lower(): v for k, v in reply.getheaders()}, reply.read()
        finally:
            connection.close()

    def json(self, method: str, path: str, body: Any = None) -> Any:
        status, _, data = self.request(method, path, body)
        if status != 200:
            raise AssertionError(f"{method} {path}: {status} {data[:500]!r}")
        return json.loads(data)

    def faults(self, faults: List[Dict[str, Any]], add: bool = False, **settings: Any) -> Dict[str, Any]:
        """Queue ``faults`` (instead of those pending, or after them with ``add``) and settings; the current ones."""
        if self.url.startswith("smtp"):
            if settings:
                raise ValueError("the mail server takes faults only")
            post_faults(self.state, faults, add)  # it has no control route: an order it takes before its next fault
            return {}
        return dict(self.json("POST", "/_faults", dict(settings, **{"add" if add else "faults": faults})))

    def count(self) -> Dict[str, Any]:
        return dict(self.json("GET", "/_count"))

    def requests(self) -> Dict[str, Dict[str, int]]:
        """The requests it answered, per operation and status (``"0"``: no answer)."""
        return dict(self.json("GET", "/_requests"))



def _environment() -> Dict[str, str]:
    """The stand-in's environment: the repository importable, bytecode in the suite's shared folder or nowhere."""
    env = dict(os.environ)
    env.pop("RUNNER_DIR", None)
    env["PYTHONPATH"] = REPO_ROOT
    if not env.get("PYTHONPYCACHEPREFIX"):
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env
