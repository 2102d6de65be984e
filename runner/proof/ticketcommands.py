"""Commands that file and look up tickets on the loopback ticket service, as a contract names them.

A contract's effect section names programs, not Python objects. These are
the programs the proofs use against :mod:`runner.proof.ticketservice`:

* ``curl`` in two small POSIX shell scripts (``ticket_invoke.sh``,
  ``ticket_observe.sh``), used when the machine has ``curl``;
* a standalone Python client (``ticket_client.py``), standard library only,
  for machines without it;
* ``ticket_payload.sh``, a document's payload from its first line;
* ``kill_at.sh``, a wrapper the proofs put in front of a command to SIGKILL
  the runner process that started it at one named effect window: before the
  intent is recorded (around the payload command), after ``started``, after
  the service committed, after the response, after the acknowledgement.
  It acts only when ``RUNNER_KILL_AT`` names its window; ``RUNNER_KILL_NTH``
  and the counter file ``RUNNER_KILL_COUNT`` choose the Nth passage.

:func:`write_commands` writes them into a folder and returns the argument
lists with the runner's placeholders. Exit codes follow
:class:`runner.adapters.commands.CommandAdapter`: invoke 0 with the receipt, 2
refused for good (409), 9 a stale epoch (412), 75 nothing created (a refused
connection, 429, 503), else unknown (a timeout or a reset after sending, any
other answer); observe 0 present, 1 never seen, else unknown.
"""

import os
import shutil
import sys
from typing import Dict, List

__all__ = ["WINDOWS", "write_commands", "have_curl"]

#: The five windows of one effect, in the order an effect passes them.
WINDOWS = ("before-started", "after-started", "after-target-commit", "after-response", "after-ack")

_CLIENT = r'''"""Ticket service client: invoke URL KEY PAYLOAD EPOCH RUN_ID | observe URL KEY PAYLOAD.

HTTP/1.1 over a socket, one request per connection: urllib.request would import the email and
ssl packages, which make each call's start several times longer than its request.
"""
import hashlib, json, socket, sys, urllib.parse

def send(url, method, path, body=b"", headers=()):
    """The answer's status and body; OSError when no whole answer came back."""
    netloc = urllib.parse.urlsplit(url).netloc
    host, _, port = netloc.partition(":")
    head = ["%s %s HTTP/1.1" % (method, path), "Host: %s" % netloc, "Connection: close",
            "Content-Length: %d" % len(body)]
    head += ["%s: %s" % pair for pair in headers]
    with socket.create_connection((host, int(port or 80)), timeout=10) as conn:
        conn.sendall(("\r\n".join(head) + "\r\n\r\n").encode("utf-8") + body)
        chunks = []
        while True:
            chunk = conn.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    answer, _, raw = b"".join(chunks).partition(b"\r\n\r\n")
    lines = answer.decode("iso-8859-1").split("\r\n")
    try:
        status = int(lines[0].split()[1])
        fields = dict((name.strip().lower(), value.strip())
                      for name, _, value in (line.partition(":") for line in lines[1:]))
        length = int(fields.get("content-length", len(raw)))
    except (IndexError, ValueError):
        raise OSError("not an HTTP answer: %r" % answer[:80]) from None
    if len(raw) < length:
        raise OSError("the answer was cut after %d of %d bytes" % (len(raw), length))
    return status, raw[:length]

def digest(value):
    data = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return "sha256:" + hashlib.sha256(data).hexdigest()

def main(mode, *args):
    url, key, payload_file = args[:3]
    with open(payload_file, "rb") as handle:
        payload = json.loads(handle.read().decode("utf-8"))
    try:
        if mode == "invoke":
            epoch, run_id = args[3:5]
            body = json.dumps({"payload": payload}).encode("utf-8")
            headers = [("Content-Type", "application/json"), ("Idempotency-Key", key), ("X-Fencing-Epoch", epoch),
                       ("X-Run-Id", run_id)]
            status, raw = send(url, "POST", "/tickets", body, headers)
            if status in (200, 201):
                sys.stdout.write(raw.decode("utf-8"))
                return 0
            sys.stderr.write("answer %d: %s\n" % (status, raw[:200]))
            return {409: 2, 412: 9, 429: 75, 503: 75}.get(status, 3)
        status, raw = send(url, "GET", "/tickets/by-key/" + urllib.parse.quote(key, safe=""))
    except ConnectionRefusedError as exc:
        sys.stderr.write("refused before sending: %s\n" % exc)
        return 75 if mode == "invoke" else 3
    except OSError as exc:
        sys.stderr.write("no answer: %s\n" % exc)
        return 3
    found = json.loads(raw.decode("utf-8") or "{}")
    if status == 200 and found.get("payload_digest") == digest(payload):
        print(json.dumps({"ticket": found.get("ticket"), "payload_digest": found.get("payload_digest")},
                         sort_keys=True))
        return 0
    if status == 404 and found.get("status") == "never-seen":
        return 1
    sys.stderr.write("cannot tell: %d %s\n" % (status, raw[:200]))
    return 3

if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
'''

_INVOKE_SH = r'''#!/bin/sh
# ticket_invoke.sh URL KEY PAYLOAD_FILE EPOCH RUN_ID: POST one ticket with curl; print the receipt.
out=$(mktemp) || exit 75
body=$(mktemp) || exit 75
trap 'rm -f "$out" "$body"' EXIT
{ printf '{"payload":'; cat "$3"; printf '}'; } > "$body" || exit 75
code=$(curl -sS --noproxy '*' --max-time 10 -o "$out" -w '%{http_code}' -X POST \
  -H 'Content-Type: application/json' -H "Idempotency-Key: $2" -H "X-Fencing-Epoch: $4" -H "X-Run-Id: $5" \
  --data-binary @"$body" "$1/tickets")
sent=$?
# curl 7: the connection was refused, nothing was sent; any other failure may have sent it.
[ "$sent" -eq 7 ] && exit 75
[ "$sent" -eq 0 ] || exit 3
case "$code" in
  200|201) cat "$out"; exit 0 ;;
  409) cat "$out" >&2; exit 2 ;;
  412) cat "$out" >&2; exit 9 ;;
  429|503) echo "answer $code" >&2; exit 75 ;;
  *) echo "answer $code" >&2; exit 3 ;;
esac
'''

_OBSERVE_SH = r'''#!/bin/sh
# ticket_observe.sh URL KEY: look the ticket up by key with curl; 0 present, 1 never seen, 3 unknown.
out=$(mktemp) || exit 3
trap 'rm -f "$out"' EXIT
code=$(curl -sS --noproxy '*' --max-time 10 -o "$out" -w '%{http_code}' "$1/tickets/by-key/$2") || exit 3
case "$code" in
  200) cat "$out"; exit 0 ;;
  404) if grep -q '"never-seen"' "$out"; then exit 1; fi; exit 3 ;;
  *) exit 3 ;;
esac
'''

#: The end of a script put in front of a contract command: once its ``due WINDOW`` says so, SIGKILL the runner that
#: started the command (for an invoke, the parent of the shell that keeps the call's answer), at each effect window.
KILL_AT_WINDOW = r'''# The runner: the parent, but for an invoke it runs as a call, whose parent is the shell that keeps
# its answer.
runner=$PPID
if [ "$role" = invoke ] && [ -n "$RUNNER_CALL" ]; then
  if [ -r "/proc/$PPID/stat" ]; then
    runner=$(awk '{sub(/.*\) /, ""); print $2}' "/proc/$PPID/stat")
  else
    runner=$(ps -o ppid= -p "$PPID" | awk '{print $1}')
  fi
fi
die() { kill -KILL "$runner"; }
case "$role" in
  payload) due before-started && { die; exit 75; } ;;
  invoke) due after-started && { die; exit 75; } ;;
  observe) due after-ack && { die; exit 75; } ;;
esac
'''

_KILL_AT = r'''#!/bin/sh
# kill_at.sh ROLE -- COMMAND...: run COMMAND; at the window RUNNER_KILL_AT names, SIGKILL the runner that started it.
role=$1
shift 2
[ -n "$RUNNER_KILL_AT" ] || exec "$@"
due() {
  [ "$RUNNER_KILL_AT" = "$1" ] || return 1
  seen=$(cat "$RUNNER_KILL_COUNT" 2>/dev/null || echo 0)
  seen=$((seen + 1))
  echo "$seen" > "$RUNNER_KILL_COUNT"
  [ "$seen" -eq "${RUNNER_KILL_NTH:-1}" ]
}
''' + KILL_AT_WINDOW + r'''[ "$role" = invoke ] || exec "$@"
out=$(mktemp) || exit 75
"$@" > "$out"
code=$?
# Killed after the target committed: the command still prints what the target answered, for whoever takes over.
if [ "$code" -eq 0 ] && due after-target-commit; then die; fi
cat "$out"
rm -f "$out"
if [ "$code" -eq 0 ] && due after-response; then die; fi
exit "$code"
'''

_PAYLOAD_SH = r'''#!/bin/sh
# ticket_payload.sh ITEM KEY: the ticket's payload, from the document's first line (plain text, no quotes).
title=$(head -n 1 "$1" | tr -d '"\\')
printf '{"doc":"%s","marker":"%s","title":"%s"}\n' "${2%%:*}" "$2" "$title"
'''


def have_curl() -> bool:
    return shutil.which("curl") is not None and shutil.which("sh") is not None


def _write(folder: str, name: str, text: str) -> str:
    path = os.path.join(folder, name)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
    return path


def write_commands(folder: str, url: str, client: str = "python", killable: bool = False) -> Dict[str, List[str]]:
    """Write the client scripts into ``folder``; return ``invoke``, ``observe`` and ``payload`` argument lists.

    ``client``: ``"curl"`` or ``"python"``. ``killable`` puts ``kill_at.py``
    in front of each command, so the environment can choose a window to die at.
    """
    py = sys.executable
    script = _write(folder, "ticket_client.py", _CLIENT)
    if client == "curl":
        invoke = ["sh", _write(folder, "ticket_invoke.sh", _INVOKE_SH), url, "{key}", "{payload_file}", "{epoch}",
                  "{run_id}"]
        observe = ["sh", _write(folder, "ticket_observe.sh", _OBSERVE_SH), url, "{key}"]
    elif client == "python":
        invoke = [py, "-S", script, "invoke", url, "{key}", "{payload_file}", "{epoch}", "{run_id}"]
        observe = [py, "-S", script, "observe", url, "{key}", "{payload_file}"]
    else:
        raise ValueError(f"unknown client {client!r}")
    payload = ["sh", _write(folder, "ticket_payload.sh", _PAYLOAD_SH), "{item}", "{key}"]
    if killable:
        wrapper = _write(folder, "kill_at.sh", _KILL_AT)
        invoke = ["sh", wrapper, "invoke", "--"] + invoke
        observe = ["sh", wrapper, "observe", "--"] + observe
        payload = ["sh", wrapper, "payload", "--"] + payload
    return {"invoke": invoke, "observe": observe, "payload": payload}
