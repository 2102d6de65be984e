"""``effects.http`` as APIs are: secrets anywhere in a URL, listings read page by page, rate limits as APIs announce
them, answers whose meaning depends on their body, and payloads sent as a form.

Every call goes to a real server on loopback: the scripted one (``tests/support/fake_http.py``) where a test
needs an exact answer, and a listing server written here that pages its entries three ways (a ``Link`` header,
page numbers, a cursor) and shows a new entry only after a lag.
"""

import json
import os
import shutil
import tempfile
import threading
import time
import unittest
import urllib.parse
from email.message import Message
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Optional, Tuple

from runner.adapters.http import HttpAdapter, http_spec
from runner.adapters.http_answers import Pacing, answer_word, rate_limit_wait, refused_for_now, text_matches
from runner.adapters.http_client import ConnectionPool, Reply as ClientReply
from runner.base.errors import InvalidInput
from runner.calls.target import NotApplied, Rejected
from runner.contract.http import http_problems, secret_origin
from runner.contract.lookups import lookups, shared_lookup
from runner.contract.spec import BodyCondition, read_http
from tests.support.fake_http import Reply, ScriptedServer, free_port

TOKEN = "tok-5be0c1d97a3f"
HOOK = "hk-9d1e4a77c0b2f6"


def plain(url: str, **extra: Any) -> Dict[str, Any]:
    """A section whose invoke posts to ``url/items`` and whose observe looks an item up by its slug."""
    spec: Dict[str, Any] = {"invoke": {"url": url + "/items"}, "observe": {"url": url + "/items?external_id={slug}",
                                                                         "pointer": "/0/id"}}
    for name, value in extra.items():
        spec[name] = dict(spec.get(name, {}), **value) if name in ("invoke", "observe") else value
    return spec


class _Headers(Message):
    def __init__(self, *pairs: Tuple[str, str]) -> None:
        super().__init__()
        for name, value in pairs:
            self[name] = value


def answer(status: int, body: bytes = b"{}", *headers: Tuple[str, str]) -> ClientReply:
    return ClientReply(status, "R", _Headers(*headers), body, True)


class _Base(unittest.TestCase):
    def setUp(self) -> None:
        self.tmp = tempfile.mkdtemp(prefix="runner-http-apis-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.pool = ConnectionPool()
        self.addCleanup(self.pool.clear)
        self.slept: List[float] = []

    def adapter(self, spec: Dict[str, Any], values: Optional[Dict[str, Any]] = None, **options: Any) -> HttpAdapter:
        options.setdefault("environ", {"TOKEN": TOKEN})
        options.setdefault("sleep", self.slept.append)
        options.setdefault("pacing", Pacing())
        options.setdefault("timeout", 5.0)
        return HttpAdapter(http_spec(spec), values=dict({"slug": "a-b", "run_id": "r"}, **(values or {})),
                           workspace=self.tmp, pool=self.pool, **options)

    def scripted(self, *replies: Reply, default: Reply = Reply()) -> ScriptedServer:
        server = ScriptedServer(replies, default)
        self.addCleanup(server.stop)
        return server

    def write(self, name: str, text: str) -> None:
        with open(os.path.join(self.tmp, name), "w", encoding="utf-8") as handle:
            handle.write(text)


class SecretUrlTest(_Base):
    """``{env:NAME}`` and ``{file:PATH}`` anywhere in a URL: read at each call, shown ``[secret]``."""

    def test_contract_check_takes_a_secret_anywhere_and_checks_what_it_can(self) -> None:
        fine = ["{file:.hook}", "{env:BASE}/items?external_id={slug}", "https://{env:HOST}/items",
                "{file:.items-url}&external_id={slug}",
                "https://api.example/bot{env:TOKEN}/send", "http://127.0.0.1:1/items?key={env:TOKEN}&ref={slug}"]
        for url in fine:
            self.assertEqual(http_problems({"http": plain("http://127.0.0.1:1", invoke={"url": url})}), [], url)
        self.assertEqual([secret_origin(u) for u in fine], [True, True, True, True, False, False])
        refused = {"{slug}{env:BASE}/x": "must start with http:// or https://",
                   "https://{slug}{env:BASE}/x": "must be written out",
                   "{env:BASE}{slug}/x": "must be written out",
                   "{env:BASE}/x#frag": "a fragment is never sent",
                   "{env:BASE}/caf\u00e9": "a request line is ASCII",
                   "{env:BASE}/a b": "white space",
                   "{file:/etc/hook}": "must be a path relative to the workspace",
                   "{env:9X}": "must name an environment variable"}
        for url, text in refused.items():
            problems = http_problems({"http": plain("http://127.0.0.1:1", invoke={"url": url})})
            self.assertTrue(problems and text in problems[0], (url, problems))
            self.assertEqual(problems[0].path, ("http", "invoke", "url"))
        spec = read_http(plain("http://127.0.0.1:1", invoke={"url": "{file:.hook}"}))
        self.assertEqual((spec.invoke.origin_secret, spec.invoke.host, spec.invoke.rest), (True, "", "{file:.hook}"))

    def test_a_whole_url_from_a_file_is_read_at_each_call_and_never_shown(self) -> None:
        server = self.scripted(Reply(201, b'{"id": 1, "echo": "/hooks/' + HOOK.encode() + b'"}'),
                               Reply(500, b"no hook at /hooks/" + HOOK.encode()),
                               Reply(200, b"[]"))
        self.write(".hook", f"{server.url}/hooks/{HOOK}\n")
        adapter = self.adapter(plain("http://x.invalid", invoke={"url": "{file:.hook}"},
                                     observe={"url": "{file:.hook}?external_id={slug}"}))
        receipt = adapter.invoke("k", {"a": 1}, 1)
        self.assertEqual(server.seen[0].target, f"/hooks/{HOOK}")
        self.assertEqual(receipt, {"id": 1, "echo": "[secret]"})
        with self.assertRaises(Exception) as caught:
            adapter.invoke("k", {"a": 1}, 1)
        self.assertIn("POST [secret] answered 500", str(caught.exception))
        seen = adapter.observe("k", {})
        self.assertEqual((seen.status, seen.evidence["request"]["url"]), ("absent", "[secret]?external_id=a-b"))
        self.assertEqual(server.seen[2].target, f"/hooks/{HOOK}?external_id=a-b")
        for text in (str(caught.exception), json.dumps(seen.evidence), json.dumps(receipt), adapter.verification):
            self.assertNotIn(HOOK, text)
            self.assertNotIn(str(server.port), text, "where a secret leads is a secret")
        self.write(".hook", f"{server.url}/rotated\n")
        adapter.invoke("k", {}, 1)
        self.assertEqual(server.seen[-1].target, "/rotated", "read at each call")

    def test_a_secret_in_the_query_or_path_of_a_written_origin(self) -> None:
        server = self.scripted(Reply(201, b"{}"), Reply(404, b""))
        adapter = self.adapter(plain(server.url, invoke={"url": server.url + "/bot{env:TOKEN}/send?x={slug}"},
                                     observe={"url": server.url + "/items?sig={env:TOKEN}&ref={slug}"}))
        adapter.invoke("k", {}, 1)
        seen = adapter.observe("k", {})
        self.assertEqual([s.target for s in server.seen], [f"/bot{TOKEN}/send?x=a-b", f"/items?sig={TOKEN}&ref=a-b"])
        self.assertEqual(seen.evidence["request"]["url"], f"{server.url}/items?sig=[secret]&ref=a-b")

    def test_a_url_secret_that_cannot_be_read_or_used_stops_the_item_naming_no_value(self) -> None:
        spec = plain("http://x.invalid", invoke={"url": "{file:.hook}"})
        with self.assertRaises(InvalidInput) as caught:
            self.adapter(spec)
        self.assertEqual(caught.exception.message, "effects.http.invoke: the URL cannot be made: cannot open .hook: "
                                                   "No such file or directory")
        self.write(".hook", f"ftp://{HOOK}.example/x\n")
        with self.assertRaises(InvalidInput) as caught:
            self.adapter(spec)
        self.assertEqual(caught.exception.message, "effects.http.invoke: the URL made from {file:.hook} cannot be "
                                                   "used: must start with http:// or https://")
        self.write(".hook", f"http://127.0.0.1:{free_port()}/{HOOK}\n")
        adapter = self.adapter(spec)
        with self.assertRaises(NotApplied) as refused:
            adapter.invoke("k", {}, 1)
        self.assertIn("POST [secret]: no connection to [secret]", str(refused.exception))
        self.assertNotIn(HOOK, str(refused.exception))

    def test_a_shared_lookup_check_sees_the_url_as_written(self) -> None:
        effects = {"http": plain("http://x", observe={"url": "{env:BASE}/items?ref={slug}"})}
        self.assertEqual(lookups(effects)[0], ("effects.http.observe", ["{env:BASE}/items?ref={slug}", ]))


class RateLimitTest(_Base):
    """Rate limits as APIs announce them: a 403 or 429 says "not now", and a spent limit holds every call."""

    def test_every_way_an_api_announces_a_spent_limit(self) -> None:
        now = 1_800_000_000.0
        cases = [
            ((("X-RateLimit-Remaining", "0"), ("X-RateLimit-Reset", str(int(now) + 40))), 40.0),
            ((("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", "12")), 12.0),
            ((("X-RateLimit-Remaining", "3"), ("X-RateLimit-Reset", str(int(now) + 40))), None),
            ((("RateLimit", '"default";r=0;t=30'),), 30.0),
            ((("RateLimit", '"burst";r=5;t=1, "daily";r=0;t=600'),), 600.0),
            ((("RateLimit", '"default";r=0'), ("RateLimit-Policy", '"default";q=100;w=60')), 60.0),
            ((("RateLimit", "limit=10, remaining=0, reset=7"),), 7.0),
            ((("RateLimit-Limit", "10"), ("RateLimit-Remaining", "0"), ("RateLimit-Reset", "9")), 9.0),
            ((("RateLimit-Remaining", "0"), ("RateLimit-Policy", "10;w=1, 50;w=60")), 60.0),
            ((("RateLimit", '"default";r=2;t=30'),), None),
            ((("X-RateLimit-Remaining", "0"), ("X-RateLimit-Reset", str(int(now) + 3 * 86400))), None),
            ((), None),
        ]
        for headers, wait in cases:
            self.assertEqual(rate_limit_wait(_Headers(*headers), now), wait, headers)

    def test_what_says_not_now(self) -> None:
        now = time.time()
        self.assertEqual(refused_for_now(answer(429), now), (True, None))
        self.assertEqual(refused_for_now(answer(403, b"{}", ("Retry-After", "5")), now), (True, 5.0))
        self.assertEqual(refused_for_now(answer(403, b"{}", ("X-RateLimit-Remaining", "0")), now), (True, None))
        self.assertEqual(refused_for_now(answer(403), now), (False, None))
        self.assertEqual(refused_for_now(answer(503), now), (False, None))
        self.assertEqual(refused_for_now(answer(503, b"", ("Retry-After", "3")), now), (True, 3.0))
        self.assertEqual(refused_for_now(answer(200, b"", ("Retry-After", "3")), now), (False, None))

    def test_an_invoke_refused_for_a_spent_limit_waits_for_its_reset(self) -> None:
        reset = str(int(time.time()) + 20)
        server = self.scripted(Reply(403, b'{"message": "API rate limit exceeded"}',
                                     (("X-RateLimit-Remaining", "0"), ("X-RateLimit-Reset", reset))),
                               Reply(403, b'{"message": "secondary"}', (("retry-after", "4"),)))
        adapter = self.adapter(plain(server.url), pacing=Pacing())
        with self.assertRaises(NotApplied) as caught:
            adapter.invoke("k", {}, 1)
        self.assertAlmostEqual(caught.exception.retry_after, 20.0, delta=1.5)
        with self.assertRaises(NotApplied) as secondary:
            self.adapter(plain(server.url)).invoke("k", {}, 1)
        self.assertEqual(secondary.exception.retry_after, 4.0)

    def test_a_spent_limit_holds_every_call_to_the_origin_before_any_refusal(self) -> None:
        pacing = Pacing()
        server = self.scripted(Reply(201, b'{"id": 1}', (("X-RateLimit-Remaining", "0"), ("X-RateLimit-Reset", "30"))))
        adapter = self.adapter(plain(server.url), pacing=pacing)
        self.assertEqual(adapter.invoke("k", {}, 1), {"id": 1})
        for call in (lambda: adapter.invoke("k2", {}, 1), lambda: adapter.observe("k2", {}),
                     lambda: self.adapter(plain(server.url), pacing=pacing).observe("k3", {})):
            with self.assertRaises(NotApplied) as caught:
                call()
            self.assertIn("nothing was sent", str(caught.exception))
            self.assertAlmostEqual(caught.exception.retry_after, 30.0, delta=1.5)
        self.assertEqual(len(server.seen), 1, "no request while the limit is spent")
        other = self.scripted(Reply(201, b'{"id": 2}'))
        self.assertEqual(self.adapter(plain(other.url), pacing=pacing).invoke("k", {}, 1), {"id": 2}, "per origin")
        clock = [0.0]
        later = Pacing(clock=lambda: clock[0])
        later.heard(("http", "h", 1), _Headers(("RateLimit", '"d";r=0;t=5')))
        self.assertEqual(later.left(("http", "h", 1)), 5.0)
        clock[0] = 5.0
        self.assertIsNone(later.left(("http", "h", 1)), "after the reset, calls go again")


class BodyConditionTest(_Base):
    """``statuses`` may make a status's word depend on the body: GraphQL's 200 with errors, an API's "ok": false."""

    def test_conditions_in_order_then_the_word(self) -> None:
        statuses = {"200": "receipt", "2xx": "receipt", "4xx": "rejected"}
        conditions = {"200": (BodyCondition(("errors",), "rejected"),
                              BodyCondition(("ok",), "not-applied", "false"))}
        self.assertEqual(answer_word(statuses, conditions, answer(200, b'{"data": {}, "errors": [{"m": 1}]}')),
                         "rejected")
        self.assertEqual(answer_word(statuses, conditions, answer(200, b'{"data": {}, "errors": []}')), "receipt")
        self.assertEqual(answer_word(statuses, conditions, answer(200, b'{"ok": false}')), "not-applied")
        self.assertEqual(answer_word(statuses, conditions, answer(200, b'{"ok": true}')), "receipt")
        self.assertEqual(answer_word(statuses, conditions, answer(200, b"<html>")), "unknown", "no condition told")
        self.assertEqual(answer_word(statuses, conditions, answer(201, b"<html>")), "receipt", "the class's own word")
        self.assertEqual(answer_word(statuses, conditions, answer(500)), "unknown")

    def test_a_slack_shaped_api_and_a_graphql_mutation(self) -> None:
        statuses = {"200": [{"pointer": "/ok", "equals": False, "then": "rejected"}, "receipt"]}
        server = self.scripted(Reply(200, b'{"ok": false, "error": "channel_not_found"}'), Reply(200, b'{"ok": true}'))
        adapter = self.adapter(plain(server.url, invoke={"statuses": statuses}))
        with self.assertRaises(Rejected) as caught:
            adapter.invoke("k", {"text": "hi"}, 1)
        self.assertIn("channel_not_found", str(caught.exception))
        self.assertEqual(adapter.invoke("k", {"text": "hi"}, 1), {"ok": True})
        graphql = {"2xx": [{"pointer": "/errors", "then": "unknown"}, "receipt"]}
        server = self.scripted(Reply(200, b'{"data": null, "errors": [{"message": "timeout"}]}'))
        with self.assertRaises(Exception) as unknown:
            self.adapter(plain(server.url, invoke={"statuses": graphql})).invoke("k", {}, 1)
        self.assertEqual(type(unknown.exception).__name__, "UnknownOutcome")
        lookup = {"200": [{"pointer": "/total_count", "equals": 0, "then": "absent"}, "present"]}
        server = self.scripted(Reply(200, b'{"total_count": 0}'), Reply(200, b'{"total_count": 2}'))
        spec = {"invoke": {"url": server.url + "/i"}, "observe": {"statuses": lookup, "url": server.url + "/s?q={slug}"}}
        adapter = self.adapter(spec)
        self.assertEqual([adapter.observe("k", {}).status for _ in range(2)], ["absent", "present"])

    def test_the_conditions_are_checked(self) -> None:
        bad = {"200": [{"pointer": "errors", "then": "rejected"}, "receipt"], "201": ["receipt"],
               "202": [{"pointer": "/e", "then": "maybe"}, "receipt"], "203": [{"pointer": "/e", "then": "receipt",
                                                                               "when": 1}, "receipt"],
               "204": [{"pointer": "/e", "then": "receipt"}, "later"],
               "205": [{"pointer": "/ip", "equals": "{field.ip}", "then": "receipt"}, "rejected"]}
        text = "\n".join(http_problems({"http": plain("http://x", invoke={"statuses": bad})}))
        for expected in ("200: a condition's pointer must be a JSON pointer", "201: a list of conditions",
                         "202: a condition gives 'maybe'", "203: unknown field 'when'", "204 ends with 'later'",
                         "205: a condition's equals is compared as written, and {field.ip} is not filled from the item"):
            self.assertIn(expected, text)


class FormTest(_Base):
    def test_a_payload_sent_as_a_form(self) -> None:
        server = self.scripted(Reply(200, b'{"ok": true}'))
        adapter = self.adapter(plain(server.url, invoke={"send_as": "form"}))
        adapter.invoke("k", {"text": "a b&c=d", "n": 3, "ok": True, "none": None, "to": ["x", "y"], "o": {"b": 1}}, 1)
        seen = server.seen[0]
        self.assertEqual(seen.headers["content-type"], "application/x-www-form-urlencoded")
        self.assertEqual(urllib.parse.parse_qsl(seen.body.decode(), keep_blank_values=True),
                         [("n", "3"), ("none", ""), ("o[b]", "1"), ("ok", "true"), ("text", "a b&c=d"), ("to", "x"),
                          ("to", "y")])

    def test_the_field_is_checked(self) -> None:
        self.assertIn("send_as must be", http_problems({"http": plain("http://x", invoke={"send_as": "xml"})})[0])
        self.assertIn("leave Content-Type out", http_problems({"http": plain("http://x", invoke={
            "send_as": "form", "headers": {"Content-Type": "application/json"}})})[0])
        self.assertEqual(http_problems({"http": plain("http://x", invoke={
            "send_as": "form", "headers": {"Content-Type": "application/x-www-form-urlencoded; charset=utf-8"}})}), [])


class Listing:
    """A listing API on loopback: ``GET /issues`` lists entries newest first, ``per_page`` at a time, paged by a
    ``Link`` header (``/issues``), page numbers (``/numbered``) or a cursor (``/cursored``); an entry shows only
    ``lag`` seconds after it was added. ``faults`` answers the next requests first."""

    def __init__(self, per_page: int = 3, lag: float = 0.0) -> None:
        self.entries: List[Dict[str, Any]] = []
        self.per_page, self.lag = per_page, lag
        self.faults: List[Tuple[int, Tuple[Tuple[str, str], ...]]] = []
        self.asked: List[str] = []
        self.foreign_next = False
        self.page_fails: Optional[Tuple[str, int]] = None  # the page (its number) answered with this status
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                outer.asked.append(self.path)
                if outer.faults:
                    status, headers = outer.faults.pop(0)
                    self._send(status, b'{"message": "fault"}', headers)
                    return
                path, _, query = self.path.partition("?")
                params = dict(urllib.parse.parse_qsl(query))
                if outer.page_fails and params.get("page") == outer.page_fails[0]:
                    self._send(outer.page_fails[1], b'{"message": "Validation Failed"}', ())
                    return
                shown = [e for e in reversed(outer.entries) if e["at"] <= time.time() - outer.lag]
                shown = [{k: v for k, v in e.items() if k != "at"} for e in shown]
                if path == "/cursored":
                    start = int(params.get("after", "0"))
                    page = shown[start:start + outer.per_page]
                    after = start + outer.per_page if start + outer.per_page < len(shown) else None
                    self._send(200, json.dumps({"items": page, "meta": {"next": after}}).encode(), ())
                    return
                number = int(params.get("page", "1"))
                page = shown[(number - 1) * outer.per_page:number * outer.per_page]
                links: Tuple[Tuple[str, str], ...] = ()
                if path == "/issues" and number * outer.per_page < len(shown):
                    params["page"] = str(number + 1)
                    host = "http://other.invalid" if outer.foreign_next else ""
                    links = (("Link", f'<{host}/issues?{urllib.parse.urlencode(params)}>; rel="next", '
                                      '</issues?page=9>; rel="last"'),)
                self._send(200, json.dumps(page).encode(), links)

            def _send(self, status: int, body: bytes, headers: Tuple[Tuple[str, str], ...]) -> None:
                self.send_response(status)
                for name, value in headers:
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def add(self, *bodies: str) -> None:
        for body in bodies:
            self.entries.append({"id": len(self.entries) + 1, "body": body, "at": time.time()})

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class ListingTest(_Base):
    """``observe.list``: one listing read to its end answers every key; an absence only from a listing read whole."""

    def serve(self, **options: Any) -> Listing:
        listing = Listing(**options)
        self.addCleanup(listing.stop)
        return listing

    def spec(self, base: str, **listing: Any) -> Dict[str, Any]:
        found = dict({"url": base + "/issues?state=all&per_page=3", "pages": "link", "match": "/body",
                      "value": "crash {slug}", "how": "first_line"}, **listing)
        return {"invoke": {"url": base + "/issues"}, "observe": {"headers": {"Authorization": "Bearer {env:TOKEN}"},
                                                                 "list": found}}

    def look(self, spec: Dict[str, Any], *slugs: str) -> List[Any]:
        adapters = [self.adapter(spec, {"slug": slug}) for slug in slugs]
        return adapters[0].observe_many([(f"{slug}:issue", {}, a) for slug, a in zip(slugs, adapters)])

    def test_one_listing_read_to_its_end_answers_every_key(self) -> None:
        listing = self.serve()
        listing.add(*(f"crash c{n}\r\n" + "stack line\n" * 30 for n in range(8)))
        listing.add("crash c3\nagain")
        found = self.look(self.spec(listing.url), "c0", "c3", "c7", "gone")
        self.assertEqual([o.status for o in found], ["present", "present", "present", "absent"])
        self.assertEqual(len(listing.asked), 3, "three pages of three, once for four keys")
        self.assertEqual(listing.asked[1], "/issues?state=all&per_page=3&page=2")
        self.assertEqual([o.evidence["matches"] for o in found], [1, 2, 1, 0])
        self.assertTrue(found[1].evidence["possible_duplicate"])
        self.assertNotIn("possible_duplicate", found[0].evidence)
        self.assertEqual((found[3].evidence["pages"], found[3].evidence["listed"], found[3].evidence["whole"]),
                         (3, 9, True))
        self.assertEqual(found[0].evidence["found"], {"id": 1}, "the body is not kept: it may be long")
        self.assertEqual((found[1].evidence["found"], found[1].evidence["also_found"]),
                         ({"id": 9, "body": "crash c3\nagain"}, [{"id": 4}]), "newest first; short text is kept")
        self.assertNotIn(TOKEN, json.dumps([o.evidence for o in found]))
        adapter = self.adapter(self.spec(listing.url), {"slug": "c5"})
        self.assertEqual((adapter.lists, adapter.observe("c5:issue", {}).status), (True, "present"), "its own lookup")

    def test_page_numbers_and_cursors(self) -> None:
        listing = self.serve()
        listing.add(*(f"crash c{n}" for n in range(7)))
        numbered = self.look(self.spec(listing.url, url=listing.url + "/numbered?per_page=3&page=1",
                                       pages={"param": "page"}), "c0", "gone")
        self.assertEqual([o.status for o in numbered], ["present", "absent"])
        self.assertEqual(listing.asked[-1], "/numbered?per_page=3&page=4", "to the first empty page")
        listing.asked.clear()
        cursored = self.look(self.spec(listing.url, url=listing.url + "/cursored", pages={"cursor": "/meta/next",
                                                                                            "param": "after"},
                                       list="/items"), "c0", "gone")
        self.assertEqual([o.status for o in cursored], ["present", "absent"])
        self.assertEqual(listing.asked, ["/cursored", "/cursored?after=3", "/cursored?after=6"])

    def test_how_entries_are_matched(self) -> None:
        self.assertTrue(text_matches("crash 7\r\nrest", " crash 7 ", "first_line"))
        self.assertFalse(text_matches("xcrash 7", "crash 7", "first_line"))
        self.assertTrue(text_matches("see crash 7 here", "crash 7", "contains"))
        self.assertFalse(text_matches("", "", "contains"))
        self.assertTrue(text_matches(42, "42", "equals"))
        self.assertFalse(text_matches(True, "True", "equals"))
        listing = self.serve()
        listing.add("a report of crash c1 and more", "crash c2")
        found = self.look(self.spec(listing.url, how="contains"), "c1", "c2", "c3")
        self.assertEqual([o.status for o in found], ["present", "present", "absent"])
        found = self.look(self.spec(listing.url, how="equals", match="/id", value="{index}"), "x")
        self.assertEqual(found[0].status, "absent", "no index given")

    def test_a_listing_cut_short_says_nothing_of_a_key_it_did_not_find(self) -> None:
        listing = self.serve()
        listing.add(*(f"crash c{n}" for n in range(7)))
        found = self.look(self.spec(listing.url, max_pages=2), "c6", "c0")
        self.assertEqual([o.status for o in found], ["present", "unknown"])
        self.assertIn("more than max_pages (2)", found[1].evidence["reason"])
        listing.faults = [(200, ()), (400, ())]  # a first page that is no list (a fault's object), then a 400
        found = self.look(self.spec(listing.url), "c6")
        self.assertEqual(found[0].status, "unknown")
        self.assertIn("holds no list at its root", found[0].evidence["reason"])
        listing.faults = [(400, ())]
        self.assertIn("answered 400", self.look(self.spec(listing.url), "c6")[0].evidence["reason"])
        listing.page_fails = ("2", 422)
        found = self.look(self.spec(listing.url), "c6", "c0")
        self.assertEqual([o.status for o in found], ["present", "unknown"])
        self.assertEqual(found[1].evidence["reason"], f"GET {listing.url}/issues?state=all&per_page=3 (page 2) "
                                                      f'answered 422 {HTTPStatus(422).phrase}: {{"message": "Validation Failed"}}')
        listing.page_fails = None
        listing.foreign_next = True
        found = self.look(self.spec(listing.url), "c6", "c0")
        self.assertEqual([o.status for o in found], ["present", "unknown"])
        self.assertIn("another origin", found[1].evidence["reason"])

    def test_a_page_that_fails_for_now_is_read_again_and_not_now_waits_for_the_whole_listing(self) -> None:
        listing = self.serve()
        listing.add(*(f"crash c{n}" for n in range(5)))
        listing.faults = [(502, ()), (500, ())]
        found = self.look(self.spec(listing.url), "c0", "gone")
        self.assertEqual([o.status for o in found], ["present", "absent"])
        self.assertEqual(self.slept, [0.5, 0.5])
        listing.faults = [(200, ()), (429, (("Retry-After", "3"),))]
        listing.faults.pop(0)
        with self.assertRaises(NotApplied) as caught:
            self.look(self.spec(listing.url), "c0")
        self.assertEqual(caught.exception.retry_after, 3.0)
        listing.faults = [(403, (("X-RateLimit-Remaining", "0"), ("X-RateLimit-Reset", "8")))]
        with self.assertRaises(NotApplied) as spent:
            self.look(self.spec(listing.url), "c0")
        self.assertEqual(spent.exception.retry_after, 8.0)
        listing.faults = [(502, ())] * 1000
        adapter = self.adapter(self.spec(listing.url), {"slug": "c0"}, timeout=0.6, sleep=time.sleep)
        found = adapter.observe_many([("c0:issue", {}, adapter)])
        self.assertEqual(found[0].status, "unknown", "within the call's time only")
        self.assertIn("are spent", found[0].evidence["reason"])

    def test_an_entry_the_listing_shows_only_after_a_lag(self) -> None:
        listing = self.serve(lag=0.3)
        listing.add("crash new")
        self.assertEqual(self.look(self.spec(listing.url), "new")[0].status, "absent",
                         "the settle time covers the lag: the lifecycle does not believe this absence")
        time.sleep(0.4)
        self.assertEqual(self.look(self.spec(listing.url), "new")[0].status, "present")

    def test_the_listing_is_checked_and_read(self) -> None:
        url = "http://127.0.0.1:1"
        self.assertEqual(http_problems({"http": self.spec(url)}), [])
        spec = read_http(self.spec(url, pages={"cursor": "/next", "param": "after"}, max_pages=4))
        listing = spec.observe.listing
        self.assertEqual((listing.pages, listing.cursor, listing.param, listing.max_pages, spec.observe.url),
                         ("cursor", ("next",), "after", 4, url + "/issues?state=all&per_page=3"))
        bad = self.spec(url, url=url + "/issues?ref={slug}", pages="numbers", how="like", max_pages=0, zz=1)
        bad["observe"]["pointer"] = "/0"
        text = "\n".join(http_problems({"http": bad}))
        for expected in ("leave observe.pointer out", "unknown field 'zz'", "unknown placeholder {slug} (allowed: "
                         "{run_id})", 'list.pages must be "link"', "how must be one of", "max_pages must be"):
            self.assertIn(expected, text)
        self.assertIn("observe.list must be", http_problems({"http": {"invoke": {"url": url},
                                                                      "observe": {"list": {"url": url}}}})[0])
        item = self.spec(url)
        item["observe"]["headers"]["X-Ref"] = "{slug}"
        self.assertEqual([p.path for p in http_problems({"http": item})], [("http", "observe", "headers", "X-Ref")])
        self.assertIn("one listing serves every item", http_problems({"http": item})[0])

    def test_items_are_told_apart_by_the_listings_value_alone(self) -> None:
        effects = {"http": self.spec("http://127.0.0.1:1")}
        self.assertEqual(lookups(effects), [("effects.http.observe.list.value", ["crash {slug}"])])
        plan = {"effects": effects}
        self.assertIsNone(shared_lookup(plan, [("s", ["a.md", "b.md"])], "r"))
        same = {"effects": {"http": self.spec("http://127.0.0.1:1", value="crash {run_id}")}}
        self.assertIn("looked up at the target by one value", shared_lookup(same, [("s", ["a.md", "b.md"])], "r") or "")


if __name__ == "__main__":
    unittest.main()
