"""What a lookup proves over ``effects.http``: an absence only from an answer that could have shown the key; an answer
that may follow delivery is looked up before anything is sent again; a header that cannot be sent begins nothing.

Real ``drive`` processes work against a helpdesk stand-in on loopback that never deduplicates: every POST it
lets through creates an issue. Its answers are scripted per report: an answer dropped after the issue was created
(an unknown outcome), a proxy's 503, 502, 504 or 408 after the service committed (as Envoy answers when the service's
connection breaks, or stays silent, before its answer), a 503 with ``Retry-After`` that created nothing. Its list
endpoint can cut its answer into pages (with or without ``Link: rel="next"``), refuse a lookup of several references
(414 or 400), or fail. Where a test needs every report's lookup to be ready at once, a first ``drive`` leaves every
report unresolved (its lookups fail) and a second one settles them: the second's lookups are then made together.
"""

import json
import os
import re
import socket
import threading
import unittest
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Optional, Tuple

from runner.adapters.http_client import POOL
from tests.support.cli import RunnerCli
from tests.support.util import in_process_cli, scratch_dir, write_contract

#: What the stand-in's proxy says when the service's connection broke after it received the request (Envoy's words).
ENVOY_503 = b"upstream connect error or disconnect/reset before headers. reset reason: connection termination"


class Helpdesk:
    """The stand-in: issues by ``external_ref``, a log of every request, and what it answers, set by the test.

    ``post``: per reference, the ways its POSTs go, one per POST ("ok" past the list's end): ``ok`` (created, 201),
    ``drop`` (created, then the connection closes without an answer), ``lost-before`` (closes without creating),
    ``503``/``502``/``504``/``408`` (created, then that status from the proxy), ``503-retry-after`` (not created:
    503 with ``Retry-After: 0``). ``gets``: per reference, statuses its lookups of one key answer first.
    ``lists``: ``ok``; ``fail`` (500 to every lookup); ``refuse-414``/``refuse-400`` (a lookup of several
    references refused). ``page``: the most issues one list answer holds; ``link``: a cut answer says
    ``Link: rel="next"``.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.issues: List[str] = []
        self.log: List[Tuple[str, Tuple[str, ...], int]] = []  # (method, references, status answered; 0: none)
        self.post: Dict[str, List[str]] = {}
        self.gets: Dict[str, List[int]] = {}
        self.lists = "ok"
        self.page: Optional[int] = None
        self.link = False
        desk = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                ref = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["external_ref"]
                with desk.lock:
                    ways = desk.post.get(ref, [])
                    way = ways.pop(0) if ways else "ok"
                    if way not in ("lost-before", "503-retry-after"):
                        desk.issues.append(ref)
                    number = len(desk.issues)
                if way in ("drop", "lost-before"):
                    desk.note("POST", (ref,), 0)
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                elif way == "503-retry-after":
                    self.answer("POST", (ref,), 503, b'{"error": "busy"}', (("Retry-After", "0"),))
                elif way in ("503", "502", "504", "408"):
                    self.answer("POST", (ref,), int(way), ENVOY_503 if way == "503" else b"upstream request timeout")
                else:
                    self.answer("POST", (ref,), 201, json.dumps({"id": number, "external_ref": ref}).encode())

            def do_GET(self) -> None:  # noqa: N802
                refs = tuple(urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query).get("external_ref", []))
                with desk.lock:
                    early = desk.gets.get(refs[0], []) if len(refs) == 1 else []
                    status = early.pop(0) if early else 200
                    found = [{"id": n, "external_ref": ref} for n, ref in enumerate(desk.issues, 1) if ref in refs]
                if status != 200:
                    self.answer("GET", refs, status, b"upstream request timeout")
                elif desk.lists == "fail":
                    self.answer("GET", refs, 500, b'{"error": "index unavailable"}')
                elif desk.lists.startswith("refuse-") and len(refs) > 1:
                    refused = int(desk.lists[len("refuse-"):])
                    self.answer("GET", refs, refused, b'{"error": "one external_ref per request"}')
                else:
                    headers: Tuple[Tuple[str, str], ...] = ()
                    if desk.page is not None and len(found) > desk.page:
                        found = found[:desk.page]
                        if desk.link:
                            pages = f'<{self.path}&page=2>; rel="next", <{self.path}&page=9>; rel="last"'
                            headers = (("Link", pages),)
                    self.answer("GET", refs, 200, json.dumps(found).encode(), headers)

            def answer(self, method: str, refs: Tuple[str, ...], status: int, body: bytes,
                       headers: Tuple[Tuple[str, str], ...] = ()) -> None:
                desk.note(method, refs, status)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                for name, value in headers:
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def note(self, method: str, refs: Tuple[str, ...], status: int) -> None:
        with self.lock:
            self.log.append((method, refs, status))

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def by_ref(self) -> Dict[str, int]:
        with self.lock:
            return {ref: self.issues.count(ref) for ref in set(self.issues)}

    def requests(self, method: str, several: Optional[bool] = None, since: int = 0) -> List[Tuple[str, ...]]:
        """The references of each request of ``method`` from the ``since``-th on (only those naming several, or one,
        with ``several``)."""
        with self.lock:
            return [refs for m, refs, _ in self.log[since:]
                    if m == method and (several is None or (len(refs) > 1) == several)]


class LookupCase(unittest.TestCase):
    """A workspace of reports, the stand-in, and a batch contract aimed at it."""

    def setUp(self) -> None:
        folder = scratch_dir("runner-lookups-")
        self.addCleanup(folder.cleanup)
        self.root = folder.name
        self.cli = RunnerCli(self, root=self.root)
        self.desk = Helpdesk()
        self.addCleanup(self.desk.stop)

    def contract(self, many: Optional[Dict[str, Any]] = None, headers: Optional[Dict[str, str]] = None,
                 concurrency: int = 4, settle: float = 0.2) -> Dict[str, Any]:
        """The batch contract: one issue per report in ``inbox/``, its requests aimed at the stand-in."""
        url = self.desk.url + "/api/issues"
        observe: Dict[str, Any] = {"url": url + "?external_ref={slug}", "pointer": "/0/id"}
        if many is not None:
            observe["many"] = dict({"url": url + "?{each:external_ref={slug}}", "match": "/external_ref",
                                    "value": "{slug}"}, **many)
        invoke: Dict[str, Any] = {"url": url}
        if headers:
            invoke["headers"] = observe["headers"] = headers
        return {"contract": 1, "task_id": "lookups", "goal": "File one issue per report, each exactly once.",
                "workspace": ".",
                "steps": [{"id": "file", "items": {"glob": "inbox/*.md"}, "key": "{slug}:issue",
                           "payload": {"template": {"external_ref": "{slug}", "title": "{heading}"}}, "next": "done"}],
                "effects": {"http": {"invoke": invoke, "observe": observe}, "timeout_seconds": 5,
                            "settle_seconds": settle, "concurrency": concurrency},
                "retry": {"base_seconds": 0.05, "cap_seconds": 0.1},
                "limits": {"max_effect_attempts": 3}, "lease": {"ttl_seconds": 30}}

    def start(self, reports: int, many: Optional[Dict[str, Any]] = None, headers: Optional[Dict[str, str]] = None,
              concurrency: int = 4, settle: float = 0.2) -> List[str]:
        """``reports`` reports in ``inbox/`` and a run of the contract over them; return their slugs (references)."""
        os.makedirs(os.path.join(self.root, "inbox"))
        slugs = [f"r{n:02d}" for n in range(reports)]
        for name in slugs:
            with open(os.path.join(self.root, "inbox", f"{name}.md"), "w", encoding="utf-8") as handle:
                handle.write(f"# Report {name}\n\nbody\n")
        block = self.contract(many, headers, concurrency, settle)
        contract = write_contract(os.path.join(self.root, "contract.md"), block)
        self.cli("init", "--contract", contract)
        return slugs

    def drive(self, expect: int) -> None:
        """``drive`` in a child process, which exits ``expect``."""
        done = self.cli.child("drive", "--owner", "w", "--json", timeout=60, code=None)
        self.assertEqual(done.code, expect, done.out[-1500:] + done.err[-1500:])

    def leave_unresolved(self, slugs: List[str]) -> int:
        """A first ``drive`` whose every lookup fails: each report is filed (its answer dropped) and left uncertain.

        Returns where the stand-in's log stands then.
        """
        self.desk.lists = "fail"
        for name in slugs:
            self.desk.post.setdefault(name, ["drop"])
        # In this process (the pass under test is a child's): every report is sent before the first stop.
        self.addCleanup(POOL.clear)
        self.cli("drive", "--owner", "w", "--json", "--parallel", str(len(slugs)), code=8)
        effects = self.effects()
        self.assertEqual(({e["state"] for e in effects.values()}, len(effects)), ({"uncertain"}, len(slugs)))
        self.desk.lists = "ok"
        return len(self.desk.log)

    def effects(self) -> Dict[str, Dict[str, Any]]:
        listed = self.cli("effect", "list", "--limit", "100", "--json")
        return json.loads(listed.out)["effects"]

    def assert_one_issue_each_verified(self, slugs: List[str]) -> None:
        self.assertEqual(self.desk.by_ref(), {name: 1 for name in slugs}, "one issue per report, none twice")
        self.assertEqual({e["state"] for e in self.effects().values()}, {"verified"})


class PagesTest(LookupCase):
    def test_keys_left_off_a_page_are_looked_up_alone_and_never_filed_again(self) -> None:
        cases = {
            'Link rel="next", a page size declared larger than the page': ({"max": 6, "page_size": 50}, True),
            "a page as full as the declared page size, no Link": ({"max": 6, "page_size": 3}, False),
            "no page size declared": ({"max": 6}, False),
        }
        for case, (many, link) in cases.items():
            with self.subTest(case):
                self.setUp()
                slugs = self.start(12, many)
                since = self.leave_unresolved(slugs)
                self.desk.page, self.desk.link = 3, link
                self.drive(10)
                self.assert_one_issue_each_verified(slugs)
                several = self.desk.requests("GET", several=True, since=since)
                self.assertTrue(several and max(len(refs) for refs in several) > 3,
                                f"no lookup asked for more than a page: {several}")
                alone = [refs[0] for refs in self.desk.requests("GET", several=False, since=since)]
                self.assertEqual(len(alone), len(set(alone)), "each key left off a page was looked up once alone")
                self.assertGreaterEqual(len(alone), len(slugs) - 2 * 3, f"keys left off a page, looked up: {alone}")

    def test_a_short_answer_under_the_declared_page_size_is_whole(self) -> None:
        # No settle time: an absence seen soon after the first drive is believed at once, not looked at again.
        slugs = self.start(8, {"max": 4, "page_size": 5}, settle=0)
        lost = slugs[::2]  # sent, but nothing created: absent, and filed again on the second drive
        for name in lost:
            self.desk.post[name] = ["lost-before"]
        before = self.leave_unresolved(slugs)
        self.drive(10)
        self.assert_one_issue_each_verified(slugs)
        second = self.desk.log[before:]
        for name in lost:
            refiled = next(n for n, (method, refs, _) in enumerate(second) if method == "POST" and refs == (name,))
            looked = [refs for method, refs, _ in second[:refiled] if method == "GET" and name in refs]
            self.assertTrue(looked and all(len(refs) > 1 for refs in looked),
                            f"{name}: filed again on a lookup of many keys, with no lookup of its own: {looked}")
        alone = [refs for refs in self.desk.requests("GET", several=False, since=before) if refs[0] not in lost]
        self.assertEqual(alone, [], "a key present in a whole answer is never looked up alone")


class RefusedTest(LookupCase):
    def test_a_refused_lookup_of_many_keys_falls_back_to_each_keys_own_lookup(self) -> None:
        for status in ("414", "400"):
            with self.subTest(status=status):
                self.setUp()
                slugs = self.start(8, {"max": 2})
                since = self.leave_unresolved(slugs)
                self.desk.lists = f"refuse-{status}"
                self.drive(10)
                self.assert_one_issue_each_verified(slugs)
                refused = self.desk.requests("GET", several=True, since=since)
                self.assertEqual(len(refused), 1, f"asked once in the pass, not once per chunk of 2: {refused}")
                alone = self.desk.requests("GET", several=False, since=since)
                self.assertEqual(sorted(refs[0] for refs in alone), slugs, "each key looked up by its own URL, once")


class AfterDeliveryTest(LookupCase):
    def test_an_answer_that_may_follow_delivery_is_looked_up_before_anything_is_sent_again(self) -> None:
        slugs = self.start(5, concurrency=5)
        proxied = dict(zip(slugs, ("503", "502", "504", "408")))
        for n, (name, way) in enumerate(proxied.items()):
            self.desk.post[name] = [way]
            self.desk.gets[name] = [(502, 504)[n % 2]]  # the lookup meets the proxy too: asked again within its time
        busy = slugs[4]
        self.desk.post[busy] = ["503-retry-after"]
        self.drive(10)
        self.assert_one_issue_each_verified(slugs)
        effects = self.effects()
        for name in proxied:
            effect = effects[f"{name}:issue"]
            self.assertEqual((effect["attempts"], effect.get("deferred", 0)), (1, 0), f"{name} was never sent again")
        self.assertEqual(effects[f"{busy}:issue"].get("deferred"), 1, "a 503 naming a delay made nothing: sent again")
        posts = [n for n, (method, refs, _) in enumerate(self.desk.log) if method == "POST" and refs == (busy,)]
        self.assertEqual(len(posts), 2)
        between = [refs for method, refs, _ in self.desk.log[posts[0]:posts[1]] if method == "GET" and busy in refs]
        self.assertEqual(between, [], "called again after the delay, without a lookup")
        report = self.cli("report", "--json", code=None).json
        self.assertEqual((report["possible_duplicates"], report["reconciled_effects"]), (0, 4))


class UnsendableHeaderTest(LookupCase):
    def test_a_secret_outside_latin_1_stops_drive_before_the_effect_begins(self) -> None:
        self.start(2, headers={"Authorization": "Bearer {env:DESK_TOKEN}"})
        done = self.cli.child("drive", "--owner", "w", env={"DESK_TOKEN": "s3cret\u20actoken"}, timeout=60, code=2)
        self.assertIn("header Authorization cannot be sent: it holds a character outside Latin-1", done.err)
        self.assertNotIn("s3cret", done.err)
        self.assertEqual((self.effects(), self.desk.log), ({}, []))
        with open(os.path.join(self.root, ".run", "journal.jsonl"), encoding="utf-8") as handle:
            paths = [op[1] for line in handle for op in json.loads(line)["r"]["ops"]]
        self.assertEqual([path for path in paths if path[0] == "effects"], [], "no effect begun: no intent, no started")

    def test_contract_check_refuses_what_a_request_cannot_carry(self) -> None:
        accented = self.contract()
        accented["effects"]["http"]["observe"]["url"] = self.desk.url + "/api/issues?r\u00e9f=1&external_ref={slug}"
        cases = [
            (self.contract(headers={"X-Team": "Z\u00fcrich \u20ac {slug}"}), "X-Team holds a character outside Latin"),
            (accented, "a request line is ASCII"),
            (self.contract(headers={"X-Team": "Z\u00fcrich {slug}"}), None),
        ]
        for block, reason in cases:
            with self.subTest(reason):
                path = write_contract(os.path.join(self.root, "contract.md"), block)
                checked = in_process_cli(["contract", "check", path])
                if reason is None:
                    self.assertEqual(checked.code, 0, f"Latin-1 is sent as it is: {checked.err}")
                    continue
                self.assertEqual(checked.code, 2, checked.err)
                for line in checked.err.splitlines():  # one per request that holds it, each naming its line
                    self.assertIn(reason, line)
                    self.assertRegex(line, r"^" + re.escape(path) + r":[0-9]+: effects\.http\.")


if __name__ == "__main__":
    unittest.main()
