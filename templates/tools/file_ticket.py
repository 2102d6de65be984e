"""file_ticket.py KEY PAYLOAD_FILE EPOCH RUN_ID: file one ticket at the ticket service; the runner's invoke command.

The service's address is $TICKET_SERVICE_URL (the runner passes its own environment on). The key
goes as the Idempotency-Key header, the epoch as X-Fencing-Epoch. Exit codes, as the runner reads
them: 0 and the service's JSON answer on stdout (the receipt); 2 refused for good (409); 9 a stale
epoch (412); 75 nothing was created, for now (the connection was refused, a 429, or a 503 that
says when to come back, with {"retry_after": SECONDS} when the service said); 3 the outcome is
unknown (a timeout or a reset after the request was sent, a 502, a 504 or a 503 without
Retry-After, which a proxy answers after passing the request on, any other answer). Standard
library only.
"""

import json
import os
import sys
import urllib.error
import urllib.request


def main(key: str, payload_file: str, epoch: str, run_id: str) -> int:
    url = os.environ.get("TICKET_SERVICE_URL")
    if not url:
        sys.stderr.write("set TICKET_SERVICE_URL to the ticket service's address\n")
        return 75  # nothing was sent
    with open(payload_file, "rb") as handle:
        payload = json.loads(handle.read().decode("utf-8"))
    body = json.dumps({"payload": payload}).encode("utf-8")
    request = urllib.request.Request(url.rstrip("/") + "/tickets", data=body, method="POST", headers={
        "Content-Type": "application/json", "Idempotency-Key": key, "X-Fencing-Epoch": epoch, "X-Run-Id": run_id})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=20) as answer:
            sys.stdout.write(answer.read().decode("utf-8"))
            return 0
    except urllib.error.HTTPError as exc:
        sys.stderr.write(f"answer {exc.code}: {exc.read()[:200]!r}\n")
        retry = exc.headers.get("Retry-After", "").strip()
        if exc.code == 429 or (exc.code == 503 and retry.isdigit()):
            if retry.isdigit():
                print(json.dumps({"retry_after": int(retry)}))
            return 75
        return {409: 2, 412: 9}.get(exc.code, 3)
    except urllib.error.URLError as exc:
        refused = isinstance(exc.reason, ConnectionRefusedError)
        sys.stderr.write(f"no answer: {exc.reason}\n")
        return 75 if refused else 3
    except OSError as exc:  # a timeout or a reset after the request went out
        sys.stderr.write(f"no answer: {exc}\n")
        return 3


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
