"""find_ticket.py KEY: look one ticket up by its key; the runner's observe command.

Exit codes, as the runner reads them: 0 and the ticket as JSON on stdout (present); 1 the service
says it never saw the key (absent); 3 anything else (unknown: a failed lookup is not an absence).
The service's address is $TICKET_SERVICE_URL. Standard library only.
"""

import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request


def main(key: str) -> int:
    url = os.environ.get("TICKET_SERVICE_URL")
    if not url:
        sys.stderr.write("set TICKET_SERVICE_URL to the ticket service's address\n")
        return 3
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url.rstrip("/") + "/tickets/by-key/" + urllib.parse.quote(key, safe=""), timeout=20) as answer:
            found = json.loads(answer.read().decode("utf-8"))
    except urllib.error.HTTPError as exc:
        body = exc.read().decode("utf-8", "replace")
        if exc.code == 404 and '"never-seen"' in body:
            return 1
        sys.stderr.write(f"cannot tell: {exc.code} {body[:200]}\n")
        return 3
    except OSError as exc:
        sys.stderr.write(f"cannot tell: {exc}\n")
        return 3
    print(json.dumps({"ticket": found.get("ticket"), "payload_digest": found.get("payload_digest")}, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
