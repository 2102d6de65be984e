"""A GitHub-shaped issues API on loopback: create issues, list them newest first in pages, with GitHub's rate limits.

    python3 -m tests.support.standins.tracker --port 0 --state DIR [--lag S] [--token T]
        [--rate-limit N --rate-window S] [--fault JSON]...

* ``POST /repos/O/R/issues`` with a JSON body (``title``, required; ``body``;
  ``labels``, a list of names) creates an issue numbered in its repository:
  201 with the issue and a ``Location``. Without a title, 422.
* ``GET /repos/O/R/issues?state=all&per_page=N&page=K`` lists issues newest
  first (``state`` ``open``, the default, or ``all``: every issue is open;
  ``closed``: none), ``per_page`` 30 by default and at most 100, with a
  ``Link`` header (``rel="next"`` and ``"last"`` while more pages exist,
  ``"prev"`` and ``"first"`` after the first). An issue shows in listings only
  ``--lag`` seconds after it was created, as a search index lags;
  ``GET /repos/O/R/issues/N`` reads it at once.
* **Rate limits** as GitHub announces them: ``X-RateLimit-Limit``,
  ``-Remaining``, ``-Used``, ``-Reset`` (epoch seconds) and ``-Resource`` on
  every answer; once the ``--rate-limit`` requests of a ``--rate-window`` are
  spent, 403 with ``x-ratelimit-remaining: 0`` until the reset. Faults of its
  own: ``primary`` (the limit spent now, for ``seconds``, 1 by default) and
  ``secondary`` (403 with ``retry-after``, a secondary rate limit); the common
  ones (:mod:`tests.support.standins.common`) too, on the operations
  ``create``, ``list`` and ``read``: ``429`` with ``Retry-After``,
  ``502-after`` (a proxy's 502 once the issue was created), ``reset-after``,
  ``stall-after``.
* ``--token T``: every request must carry ``Authorization: Bearer T`` (or
  ``token T``), else 401 "Bad credentials".
* ``GET /_count``: issues per first line of their body (``by_first_line``)
  and the lines held more than once (``duplicates``); :func:`count_by_first_line`
  reads the same from DIR. ``POST /_faults`` also takes ``lag`` and
  ``rate`` (``{"limit": N, "window": S}``, a full bucket); lags and windows
  are measured on the stand-in's clock, which a test can hold and advance.
"""

import argparse
import re
import threading
import time
import urllib.parse
from typing import Any, Dict, List, Optional, Sequence

from tests.support.standins.common import (Request, Response, Service, State, first_line, json_response, parser,
                                           read_state, serve_http, tally)

ISSUES = re.compile(r"/repos/([A-Za-z0-9_.-]+)/([A-Za-z0-9_.-]+)/issues\Z")
ISSUE = re.compile(r"/repos/([A-Za-z0-9_.-]+)/([A-Za-z0-9_.-]+)/issues/([0-9]+)\Z")
#: The most issues one page lists, as GitHub's ``per_page``.
MAX_PER_PAGE = 100
DEFAULT_PER_PAGE = 30
DOCS = "https://docs.github.com/rest"


def issues(folder: str) -> List[Dict[str, Any]]:
    """Every issue the tracker keeping its state in ``folder`` created, oldest first, each with its ``repo``."""
    repos = read_state(folder).get("repos", {})
    found = [dict(issue, repo=name) for name, repo in sorted(repos.items()) for issue in repo["issues"]]
    return sorted(found, key=lambda issue: issue["id"])


def count_by_first_line(folder: str) -> Dict[str, int]:
    """How many issues hold each first line of a body, in every repository (read from ``folder``)."""
    return tally([first_line(issue.get("body")) for issue in issues(folder)])["by"]


class Tracker(Service):
    def __init__(self, args: argparse.Namespace) -> None:
        self.state = State(args.state, {"repos": {}, "next_id": 1})
        self.lag = float(args.lag)
        self.token: Optional[str] = args.token
        self._lock = threading.Lock()
        self._bucket(int(args.rate_limit), float(args.rate_window))

    def _bucket(self, limit: int, window: float) -> None:
        self.limit, self.window = limit, window
        self.remaining, self.reset = limit, self.now() + window

    # -- what a request does ----------------------------------------------------------------------
    def operation(self, request: Request) -> Optional[str]:
        if ISSUES.match(request.path):
            return {"POST": "create", "GET": "list"}.get(request.method)
        if ISSUE.match(request.path) and request.method == "GET":
            return "read"
        return None

    def gate(self, request: Request) -> Optional[Response]:
        if self.operation(request) is None:
            return None
        if self.token is not None:
            said = request.headers.get("authorization", "")
            if said not in (f"Bearer {self.token}", f"token {self.token}"):
                return json_response(401, {"message": "Bad credentials", "documentation_url": DOCS})
        with self._lock:
            now = self.now()
            if now >= self.reset:
                self.remaining, self.reset = self.limit, now + self.window
            if self.remaining <= 0:
                return self._spent()
            self.remaining -= 1
        return None

    def _spent(self) -> Response:
        said = ("API rate limit exceeded for user. (But here's the good news: authenticated requests get a higher "
                "rate limit.)")
        return json_response(403, {"message": said, "documentation_url": DOCS})

    def fault(self, fault: Dict[str, Any], request: Request) -> Optional[Response]:
        if fault["fault"] == "secondary":
            seconds = fault.get("retry_after", 1)
            return json_response(403, {"message": "You have exceeded a secondary rate limit. Please wait a few minutes "
                                                  "before you try again.", "documentation_url": DOCS},
                                 (("retry-after", str(int(seconds)) if seconds == int(seconds) else str(seconds)),))
        if fault["fault"] == "primary":
            with self._lock:
                self.remaining, self.reset = 0, self.now() + float(fault.get("seconds", 1))
            return self._spent()
        return None

    def decorate(self, response: Response) -> Response:
        with self._lock:
            limits = (("X-RateLimit-Limit", str(self.limit)), ("X-RateLimit-Remaining", str(self.remaining)),
                      ("X-RateLimit-Used", str(self.limit - self.remaining)),
                      ("X-RateLimit-Reset", str(int(self.reset + 0.999))), ("X-RateLimit-Resource", "core"))
        return response._replace(headers=response.headers + limits)

    def perform(self, request: Request) -> Response:
        operation = self.operation(request)
        if operation == "create":
            return self._create(request)
        if operation == "list":
            return self._list(request)
        if operation == "read":
            owner, name, number = ISSUE.match(request.path).groups()  # type: ignore[union-attr]
            repo = self.state.read(lambda s: s["repos"].get(f"{owner}/{name}"))
            found = [i for i in (repo or {}).get("issues", ()) if i["number"] == int(number)]
            if not found:
                return json_response(404, {"message": "Not Found", "documentation_url": DOCS})
            return json_response(200, self._shown(found[0], request, f"{owner}/{name}"))
        return json_response(404, {"message": "Not Found", "documentation_url": DOCS})

    def _create(self, request: Request) -> Response:
        owner, name = ISSUES.match(request.path).groups()  # type: ignore[union-attr]
        try:
            sent = request.json()
        except ValueError:
            return json_response(400, {"message": "Problems parsing JSON", "documentation_url": DOCS})
        problem = _problem(sent)
        if problem:
            return json_response(422, {"message": "Validation Failed", "errors": [problem], "documentation_url": DOCS})
        now = self.now()

        def add(state: Dict[str, Any]) -> Dict[str, Any]:
            repo = state["repos"].setdefault(f"{owner}/{name}", {"issues": []})
            issue = {"id": state["next_id"], "number": len(repo["issues"]) + 1, "title": sent["title"],
                     "body": sent.get("body"), "labels": list(sent.get("labels") or []), "created": now}
            state["next_id"] += 1
            repo["issues"].append(issue)
            return issue

        issue = self.state.change(add)
        shown = self._shown(issue, request, f"{owner}/{name}")
        return json_response(201, shown, (("Location", shown["url"]),))

    def _list(self, request: Request) -> Response:
        owner, name = ISSUES.match(request.path).groups()  # type: ignore[union-attr]
        per_page = min(MAX_PER_PAGE, max(1, _number(request.query.get("per_page"), DEFAULT_PER_PAGE)))
        page = max(1, _number(request.query.get("page"), 1))
        wanted = request.query.get("state", "open")
        if wanted not in ("open", "closed", "all"):
            errors = [{"field": "state", "code": "invalid"}]
            return json_response(422, {"message": "Validation Failed", "errors": errors})
        repo = self.state.read(lambda s: list(s["repos"].get(f"{owner}/{name}", {}).get("issues", ())))
        seen_by = self.now() - self.lag
        visible = [] if wanted == "closed" else [i for i in repo if i["created"] <= seen_by]
        visible.sort(key=lambda issue: issue["number"], reverse=True)
        last = max(1, -(-len(visible) // per_page))
        listed = visible[(page - 1) * per_page: page * per_page]
        links = []
        if page < last:
            links += [(page + 1, "next"), (last, "last")]
        if page > 1:
            links += [(1, "first"), (min(page - 1, last), "prev")]
        base = f"http://{request.headers.get('host', 'localhost')}{request.path}"
        header = ", ".join(f'<{base}?{urllib.parse.urlencode(dict(request.query, page=str(n)))}>; rel="{rel}"'
                           for n, rel in links)
        shown = [self._shown(issue, request, f"{owner}/{name}") for issue in listed]
        return json_response(200, shown, (("Link", header),) if header else ())

    @staticmethod
    def _shown(issue: Dict[str, Any], request: Request, repo: str) -> Dict[str, Any]:
        host = f"http://{request.headers.get('host', 'localhost')}"
        created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(issue["created"]))
        return {"id": issue["id"], "number": issue["number"], "title": issue["title"], "body": issue["body"],
                "labels": [{"name": label} for label in issue["labels"]], "state": "open", "created_at": created,
                "updated_at": created, "url": f"{host}/repos/{repo}/issues/{issue['number']}",
                "html_url": f"{host}/{repo}/issues/{issue['number']}"}

    # -- what a test asks --------------------------------------------------------------------------
    def count(self) -> Dict[str, Any]:
        lines = self.state.read(lambda s: [first_line(i.get("body")) for r in s["repos"].values() for i in r["issues"]])
        counted = tally(lines)
        return {"total": counted["total"], "by_first_line": counted["by"], "duplicates": counted["duplicates"]}

    def control(self, settings: Dict[str, Any]) -> Dict[str, Any]:
        settings = dict(settings)
        if "lag" in settings:
            self.lag = _seconds(settings.pop("lag"), "lag")
        if "rate" in settings:
            rate = settings.pop("rate")
            if not isinstance(rate, dict) or not isinstance(rate.get("limit"), int) or rate["limit"] < 0:
                raise ValueError("'rate' is {\"limit\": N, \"window\": SECONDS}")
            with self._lock:
                self._bucket(rate["limit"], _seconds(rate.get("window", 3600), "rate.window"))
        super().control(settings)
        with self._lock:
            rate_now = {"limit": self.limit, "remaining": self.remaining, "reset": self.reset, "window": self.window}
        return {"lag": self.lag, "rate": rate_now}


def _problem(sent: Any) -> Optional[Dict[str, str]]:
    """What makes ``sent`` no issue (GitHub's error object), or None."""
    if not isinstance(sent, dict):
        return {"resource": "Issue", "code": "invalid", "message": "the body is a JSON object"}
    if not isinstance(sent.get("title"), str) or not sent["title"].strip():
        return {"resource": "Issue", "field": "title", "code": "missing_field"}
    if sent.get("body") is not None and not isinstance(sent["body"], str):
        return {"resource": "Issue", "field": "body", "code": "invalid"}
    labels = sent.get("labels")
    if labels is not None and (not isinstance(labels, list) or not all(isinstance(x, str) for x in labels)):
        return {"resource": "Issue", "field": "labels", "code": "invalid"}
    return None


def _number(text: Optional[str], default: int) -> int:
    try:
        return int(text) if text is not None else default
    except ValueError:
        return default


def _seconds(value: Any, name: str) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name!r} is a number of seconds")
    return float(value)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parse = parser("tracker", "A GitHub-shaped issues API on loopback, for tests.")
    parse.add_argument("--lag", type=float, default=0.0, help="seconds before a new issue shows in listings")
    parse.add_argument("--token", default=None, help="the bearer token every request must carry")
    parse.add_argument("--rate-limit", type=int, default=5000, help="requests per window (the primary rate limit)")
    parse.add_argument("--rate-window", type=float, default=3600.0, help="seconds of one rate-limit window")
    args = parse.parse_args(argv)
    return serve_http(args, Tracker(args))


if __name__ == "__main__":
    raise SystemExit(main())
