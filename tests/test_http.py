"""The HTTP adapter (``effects.http``): the contract's section, what each answer means, and the connections.

Every call goes to a real server on loopback: a scripted one (``tests/support/fake_http.py``)
where a test needs an exact answer, a closed port for a target that is down, a
server speaking TLS with a certificate made by ``openssl``, and a CONNECT proxy.
"""

import email.utils
import json
import os
import shutil
import tempfile
import threading
import time
import unittest
from typing import Any, Dict, List
from unittest import mock

from runner.calls import inflight
from runner.adapters import http_client
from runner.adapters.factory import adapter_for
from runner.adapters.http import HttpAdapter, http_spec
from runner.adapters.http_answers import Pacing, retry_after_seconds
from runner.adapters.http_client import BODY_LIMIT, ConnectionPool
from runner.base.pointer import parse_pointer, resolve_pointer
from runner.contract.http import http_problems
from runner.contract.spec import contract_of
from runner.contract.text import check_contract, load_contract
from runner.ledger.envelope import new_envelope
from runner.base.errors import InvalidInput
from runner.proof.helpdesk import Helpdesk, HelpdeskServer
from runner.calls.target import NotApplied, Rejected, StaleEpoch, UnknownOutcome
from tests.support.fake_http import ConnectProxy, Reply, ScriptedServer, free_port, have_openssl, make_certificates
from tests.support.util import REPO_ROOT

SECRET = "tok-4f1c9a7e2b6d8035"
TEMPLATE = os.path.join(REPO_ROOT, "templates", "run-contract.http.example.md")
VALUES = {"item": "inbox/report 013 (customer's copy).md", "stem": "report 013 (customer's copy)", "slug": "report-013-customer-s-copy",
          "index": 7, "run_id": "helpdesk-issues"}
KEY = "report-013-customer-s-copy:issue"


def section(url: str, **extra: Any) -> Dict[str, Any]:
    spec: Dict[str, Any] = {
        "invoke": {"method": "POST", "url": url + "/api/issues", "headers": {"Authorization": "Bearer {env:DESK_TOKEN}"}},
        "observe": {"url": url + "/api/issues?external_ref={slug}", "headers": {"Authorization": "Bearer {env:DESK_TOKEN}"},
                    "pointer": "/0/id"},
    }
    for name, value in extra.items():
        if name in ("invoke", "observe"):
            spec[name] = dict(spec[name], **value)
        else:
            spec[name] = value
    return spec


class _Base(unittest.TestCase):
    def setUp(self) -> None:
        self.tmp = tempfile.mkdtemp(prefix="runner-http-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.pool = ConnectionPool()
        self.addCleanup(self.pool.clear)
        self.slept: List[float] = []

    def adapter(self, spec: Dict[str, Any], timeout: float = 5.0, **options: Any) -> HttpAdapter:
        options.setdefault("environ", {"DESK_TOKEN": SECRET})
        options.setdefault("sleep", self.slept.append)
        return HttpAdapter(http_spec(spec), values=VALUES, workspace=self.tmp, timeout=timeout, pool=self.pool,
                           **options)

    def scripted(self, *replies: Reply, default: Reply = Reply()) -> ScriptedServer:
        server = ScriptedServer(replies, default)
        self.addCleanup(server.stop)
        return server


class ContractSectionTest(unittest.TestCase):
    """``contract check`` on ``effects.http``: every problem on its own line; credentials never literal."""

    def check(self, block_text: str) -> List[str]:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "contract.md")
            with open(path, "w", encoding="utf-8") as handle:
                handle.write("# contract\n\n```json run-contract\n" + block_text + "\n```\n")
            _, problems = check_contract(path)
        return problems

    def test_the_template_passes_contract_check(self) -> None:
        block, problems = check_contract(TEMPLATE)
        self.assertEqual(problems, [])
        self.assertIn("http", block["effects"])
        self.assertNotIn("invoke", block["effects"])

    def test_every_problem_is_named_with_its_line(self) -> None:
        lines = [
            '{"contract": 1, "task_id": "t", "goal": "g", "steps": [{"id": "s"}],',
            ' "effects": {',
            '  "invoke": ["sh", "x"], "observe": ["sh", "y"],',
            '  "http": {',
            '   "invoke": {',
            '    "method": "GET",',
            '    "url": "https://{slug}.example/api",',
            '    "headers": {',
            '     "Authorization": "Bearer abc123",',
            '     "X-Desk-Token": "{env:1BAD}",',
            '     "Content-Length": "12"',
            '    },',
            '    "statuses": {"409": "present", "6xx": "receipt"}',
            '   },',
            '   "observe": {',
            '    "url": "http://desk.example/api?ref={payload_file}",',
            '    "pointer": "0/id",',
            '    "headers": {"Cookie": "session=42"}',
            '   },',
            '   "deduplicates": true,',
            '   "ca_file": "../ca.pem",',
            '   "extra": 1',
            '  }',
            ' }',
            '}',
        ]
        problems = self.check("\n".join(lines))
        first = 4  # the file line of the block's first line

        def line_of(needle: str) -> int:
            return first + next(i for i, text in enumerate(lines) if needle in text)

        expected = {
            "http and the invoke/observe commands exclude each other": line_of('"http"'),
            "effects.http.invoke.method must be one of": line_of('"method": "GET"'),
            "the scheme, host and port must be written out": line_of("{slug}.example"),
            "Authorization holds a credential": line_of("Bearer abc123"),
            "{env:1BAD} must name an environment variable": line_of("1BAD"),
            "Content-Length is written by the runner": line_of('"Content-Length"'),
            "409 maps to 'present'": line_of('"409"'),
            "'6xx' is neither a status": line_of('"409"'),
            "unknown placeholder {payload_file}": line_of("payload_file"),
            "observe.pointer must be a JSON pointer": line_of('"pointer"'),
            "Cookie holds a credential": line_of('"Cookie"'),
            "deduplicates needs an idempotency_header": line_of('"deduplicates"'),
            "ca_file must be a path relative to the workspace": line_of('"ca_file"'),
            "unknown field 'extra'": line_of('"extra"'),
        }
        for text, line in expected.items():
            found = [p for p in problems if text in p]
            self.assertEqual(len(found), 1, f"{text!r} in {problems}")
            self.assertTrue(found[0].split(":")[1] == str(line), f"{text!r} expected on line {line}: {found[0]}")
        self.assertEqual(len(problems), len(expected), problems)

    def test_a_literal_credential_is_refused_whatever_its_case(self) -> None:
        for name in ("Authorization", "proxy-authorization", "COOKIE", "X-Api-Key", "X-Helpdesk-API-KEY", "X-Auth-Token", "x-token"):
            literal = section("http://127.0.0.1:1", invoke={"headers": {name: "abc123"}})
            problems = http_problems({"http": literal})
            self.assertEqual(len(problems), 1, (name, problems))
            self.assertIn("holds a credential", problems[0])
            self.assertEqual(problems[0].path, ("http", "invoke", "headers", name))
            secret = section("http://127.0.0.1:1", invoke={"headers": {name: "Basic {file:.secrets/desk}"}})
            self.assertEqual(http_problems({"http": secret}), [], name)
        self.assertEqual(http_problems({"http": section("http://127.0.0.1:1", invoke={"headers": {"X-Request-Kind": "batch"}})}), [])

    def test_what_a_request_cannot_carry_is_refused(self) -> None:
        def header(value: str) -> List[str]:
            return http_problems({"http": section("http://127.0.0.1:1", invoke={"headers": {"X-Team": value}})})

        def url(value: str) -> List[str]:
            return http_problems({"http": section("http://127.0.0.1:1", observe={"url": value})})

        for value, what in (("Z\u00fcrich \u20ac", "a character outside Latin-1"),
                            ("team {slug} \u2014 {env:TEAM}", "a character outside Latin-1"),
                            ("a\x01b", "a control character"), ("a\x7fb", "a control character")):
            problems = header(value)
            self.assertEqual(len(problems), 1, (value, problems))
            self.assertIn(f"X-Team holds {what}", problems[0])
            self.assertEqual(problems[0].path, ("http", "invoke", "headers", "X-Team"))
        for value in ("Z\u00fcrich\tcaf\u00e9", "{slug} {env:TEAM}", "Bearer {file:.token}"):
            self.assertEqual(header(value), [], value)
        for value in ("http://127.0.0.1:1/caf\u00e9?ref={slug}", "http://b\u00fccher.example/api",
                      "http://127.0.0.1:1/a\x01b"):
            problems = url(value)
            self.assertEqual(len(problems), 1, (value, problems))
            self.assertIn("a request line is ASCII", problems[0])
        self.assertEqual(url("http://127.0.0.1:1/caf%C3%A9?r={slug}"), [])

    def test_secrets_and_credentials_stay_out_of_urls_and_receipts(self) -> None:
        cases = {
            "must name an environment variable": section("http://127.0.0.1:1", observe={"url": "http://127.0.0.1:1/a?k={env:A-B}"}),
            "must be a path relative to the workspace": section("http://127.0.0.1:1", observe={"url": "{file:../hook}?k={slug}"}),
            "credentials in the URL are refused": section("http://user:pw@127.0.0.1:1"),
            "never kept in a receipt": section("http://127.0.0.1:1", invoke={"receipt_headers": ["Location", "Set-Cookie"]}),
            "must start with http:// or https://": section("ftp://127.0.0.1:1"),
            "needs an answer body": section("http://127.0.0.1:1", observe={"method": "HEAD"}),
            "unknown placeholder {epoch}": section("http://127.0.0.1:1", observe={"url": "http://127.0.0.1:1/a?e={epoch}"}),
            "exclude each other": None,
        }
        for text, spec in cases.items():
            effects = {"http": spec} if spec is not None else {"http": section("http://127.0.0.1:1"), "invoke": ["x"], "observe": ["y"]}
            problems = http_problems(effects)
            self.assertTrue(any(text in p for p in problems), (text, problems))

    def test_an_adapter_is_refused_when_a_header_secret_cannot_be_read(self) -> None:
        spec = section("http://127.0.0.1:1", invoke={"headers": {"Authorization": "Bearer {file:.desk-token}"}})
        with tempfile.TemporaryDirectory() as tmp:
            with self.assertRaises(InvalidInput) as caught:
                HttpAdapter(http_spec(spec), workspace=tmp, environ={"DESK_TOKEN": SECRET})
            self.assertIn(".desk-token", caught.exception.message)
            with open(os.path.join(tmp, ".desk-token"), "w") as handle:
                handle.write(SECRET + "\n")
            HttpAdapter(http_spec(spec), workspace=tmp, environ={"DESK_TOKEN": SECRET})
            with self.assertRaises(InvalidInput) as caught:
                HttpAdapter(http_spec(spec), workspace=tmp, environ={})
            self.assertIn("DESK_TOKEN is not set", caught.exception.message)
            self.assertNotIn(SECRET, caught.exception.message)


class SpecTest(unittest.TestCase):
    """The adapter reads the contract's spec: a run's, read once per plan, or a section's, checked as contract check
    checks it."""

    def test_a_section_with_a_problem_makes_no_spec(self) -> None:
        bad = section("ftp://127.0.0.1:1")
        with self.assertRaises(InvalidInput) as caught:
            http_spec(bad)
        self.assertEqual(caught.exception.message, f"{http_problems({'http': bad})[0]} (run 'contract check')")

    def test_the_verification_names_the_pointer_as_the_contract_wrote_it(self) -> None:
        for pointer in ("/0/id", "/a~1b/m~0n/0", "", "/"):
            adapter = HttpAdapter(http_spec(section("http://127.0.0.1:1", observe={"pointer": pointer})),
                                  environ={"DESK_TOKEN": SECRET})
            self.assertEqual(adapter.verification,
                             f"GET http://127.0.0.1:1/api/issues?external_ref={{slug}} holding a value at {pointer}")
        spec = section("http://127.0.0.1:1")
        del spec["observe"]["pointer"]
        self.assertEqual(HttpAdapter(http_spec(spec), environ={"DESK_TOKEN": SECRET}).verification,
                         "GET http://127.0.0.1:1/api/issues?external_ref={slug}")

    def test_every_adapter_of_a_run_shares_the_spec_read_once_per_plan(self) -> None:
        block = load_contract(TEMPLATE)
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, ".helpdesk-token"), "w") as handle:
                handle.write(SECRET + "\n")
            state = dict(new_envelope(block["task_id"], block, "", "2026-01-01T00:00:00.000Z"), workspace_base=tmp)
            first, second = (adapter_for(state, key) for key in ("a:issue", "b:issue"))
        assert isinstance(first, HttpAdapter) and isinstance(second, HttpAdapter)
        self.assertIs(first.spec, contract_of(state).effects.http)
        self.assertIs(second.spec, first.spec)
        self.assertEqual(first.spec, http_spec(block["effects"]["http"]))


class PointerAndRetryAfterTest(unittest.TestCase):
    def test_json_pointers_follow_rfc_6901(self) -> None:
        doc = {"a/b": {"m~n": [10, {"id": 0}]}, "": "root-empty", "list": [], "x": None}
        self.assertEqual(resolve_pointer(doc, parse_pointer("/a~1b/m~0n/0")), 10)
        self.assertEqual(resolve_pointer(doc, parse_pointer("/a~1b/m~0n/1/id")), 0)
        self.assertEqual(resolve_pointer(doc, parse_pointer("/")), "root-empty")
        self.assertIs(resolve_pointer(doc, parse_pointer("")), doc)
        for missing in ("/a~1b/m~0n/2", "/a~1b/m~0n/01", "/a~1b/m~0n/-", "/list/0", "/nothing", "/x/y"):
            self.assertIs(resolve_pointer(doc, parse_pointer(missing)), resolve_pointer({}, ("z",)), missing)

    def test_retry_after_in_seconds_and_as_an_http_date(self) -> None:
        now = 1_790_000_000.0
        self.assertEqual(retry_after_seconds("7", now), 7.0)
        self.assertEqual(retry_after_seconds(email.utils.formatdate(now + 42, usegmt=True), now), 42.0)
        self.assertEqual(retry_after_seconds(email.utils.formatdate(now - 42, usegmt=True), now), 0.0)
        for bad in (None, "", "soon", "-3", "1.5", str(2 * 86400), "Mon, 99 Foo 2026 25:00:00 GMT"):
            self.assertIsNone(retry_after_seconds(bad, now), bad)


class InvokeAnswersTest(_Base):
    """Each status of an invoke, and each way a call can fail, meets its outcome."""

    def invoke(self, reply: Reply, **extra: Any) -> Any:
        server = self.scripted(reply)
        try:
            return self.adapter(section(server.url, **extra)).invoke(KEY, {"external_ref": "r", "title": "t", "body": "b"}, 4)
        finally:
            self.assertEqual(len(server.seen), 1)

    def test_a_2xx_json_object_is_the_receipt(self) -> None:
        for status in (200, 201, 202):
            receipt = self.invoke(Reply(status, b'{"id": 31, "url": "/api/issues/31"}'))
            self.assertEqual(receipt, {"id": 31, "url": "/api/issues/31"})

    def test_a_2xx_without_a_json_object_keeps_status_and_chosen_headers(self) -> None:
        receipt = self.invoke(Reply(201, b"", (("Location", "/api/issues/9"), ("Set-Cookie", "s=1"))))
        self.assertEqual((receipt["status"], receipt["headers"]), (201, {"Location": "/api/issues/9"}))
        self.assertEqual(receipt["request"]["headers"], ["Authorization"])
        receipt = self.invoke(Reply(200, b"[1, 2]", (("X-Issue", "9"),)), invoke={"receipt_headers": ["X-Issue"]})
        self.assertEqual(receipt["headers"], {"X-Issue": "9"})

    def test_refusals_for_good(self) -> None:
        for status in (400, 404, 409, 410, 422, 405):
            with self.assertRaises(Rejected, msg=status) as caught:
                self.invoke(Reply(status, b'{"error": "no"}'))
            self.assertIn(f"answered {status}", str(caught.exception))

    def test_not_now_with_retry_after_in_both_forms(self) -> None:
        for status in (429, 503):
            with self.assertRaises(NotApplied) as caught:
                self.invoke(Reply(status, b"", (("Retry-After", "3"),)))
            self.assertEqual(caught.exception.retry_after, 3.0)
        with self.assertRaises(NotApplied) as caught:
            self.invoke(Reply(429, b"", (("Retry-After", email.utils.formatdate(time.time() + 30, usegmt=True)),)))
        self.assertTrue(28 <= caught.exception.retry_after <= 30.5, caught.exception.retry_after)
        with self.assertRaises(NotApplied) as caught:
            self.invoke(Reply(401, b""))
        self.assertIsNone(caught.exception.retry_after)

    def test_a_stale_epoch_and_the_unknowns(self) -> None:
        with self.assertRaises(StaleEpoch):
            self.invoke(Reply(412, b'{"error": "stale epoch"}'))
        for status in (500, 502, 504, 302):
            with self.assertRaises(UnknownOutcome, msg=status):
                self.invoke(Reply(status, b""))

    def test_an_answer_that_may_follow_delivery_is_unknown_and_a_503_that_names_a_delay_is_not_now(self) -> None:
        envoy = b"upstream connect error or disconnect/reset before headers. reset reason: connection termination"
        for reply in (Reply(503, envoy, ()), Reply(503, b"", (("Retry-After", "soon"),)),
                      Reply(503, b"", (("Retry-After", "172800"),)), Reply(502, b""), Reply(504, b""), Reply(408, b"")):
            with self.subTest(status=reply.status, headers=reply.headers):
                with self.assertRaises(UnknownOutcome) as caught:
                    self.invoke(reply)
                self.assertIn(f"answered {reply.status}", str(caught.exception))
        with self.assertRaises(NotApplied) as caught:
            self.invoke(Reply(503, b"", (("Retry-After", "0"),)))
        self.assertEqual(caught.exception.retry_after, 0.0)
        # The contract's word wins: its 503 never follows delivery, or all its 5xx may.
        with self.assertRaises(NotApplied):
            self.invoke(Reply(503, envoy, ()), invoke={"statuses": {"503": "not-applied"}})
        with self.assertRaises(UnknownOutcome):
            self.invoke(Reply(503, b"", (("Retry-After", "3"),)), invoke={"statuses": {"5xx": "unknown"}})

    def test_a_request_that_cannot_be_written_sends_nothing(self) -> None:
        server = self.scripted(default=Reply(201, b'{"id": 1}'))
        headers = {"Authorization": "Bearer {env:DESK_TOKEN}", "X-Team": "{env:TEAM}"}
        spec = section(server.url, invoke={"headers": headers}, observe={"headers": headers})
        with self.assertRaises(InvalidInput) as caught:
            self.adapter(spec, environ={"DESK_TOKEN": SECRET, "TEAM": "Z\u00fcrich \u20ac"})
        self.assertEqual(caught.exception.message, "effects.http.invoke: the value of header X-Team cannot be sent: "
                                                   "it holds a character outside Latin-1")
        latin = self.adapter(spec, environ={"DESK_TOKEN": SECRET, "TEAM": "Z\u00fcrich"})
        self.assertEqual(latin.invoke(KEY, {}, 1), {"id": 1})
        self.assertEqual(server.seen[0].headers["x-team"], "Z\u00fcrich", "Latin-1 is sent as it is")
        # The last line: whatever the client cannot encode fails before a byte is sent, never as an unknown outcome.
        with mock.patch("runner.adapters.http.unsendable", return_value=None):
            adapter = self.adapter(spec, environ={"DESK_TOKEN": SECRET, "TEAM": "\u20ac"})
            with self.assertRaises(NotApplied) as refused:
                adapter.invoke(KEY, {}, 1)
            self.assertEqual(adapter.observe(KEY, {}).status, "unknown")
        self.assertIn("cannot be written (UnicodeEncodeError); nothing was sent", str(refused.exception))
        self.assertEqual(len(server.seen), 1, "nothing more reached the target")

    def test_the_contract_overrides_exact_statuses_and_classes(self) -> None:
        statuses = {"statuses": {"409": "receipt", "5xx": "not-applied", "503": "unknown"}}
        self.assertEqual(self.invoke(Reply(409, b'{"id": 3}'), invoke=statuses), {"id": 3})
        with self.assertRaises(NotApplied):
            self.invoke(Reply(500, b""), invoke=statuses)
        with self.assertRaises(UnknownOutcome):
            self.invoke(Reply(503, b""), invoke=statuses)

    def test_the_request_carries_the_payload_key_epoch_and_secret(self) -> None:
        server = self.scripted(Reply(201, b'{"id": 1}'))
        spec = section(server.url, idempotency_header="Idempotency-Key", epoch_header="X-Fencing-Epoch",
                       invoke={"url": server.url + "/api/{slug}/issues?item={item}&n={index:03d}"})
        self.adapter(spec).invoke(KEY, {"title": "é \"q\""}, 12)
        seen = server.seen[0]
        self.assertEqual(seen.method, "POST")
        self.assertEqual(seen.target, "/api/report-013-customer-s-copy/issues?item=inbox%2Freport%20013%20%28customer%27s%20copy%29.md&n=007")
        self.assertEqual(json.loads(seen.body), {"title": "é \"q\""})
        self.assertEqual((seen.headers["authorization"], seen.headers["idempotency-key"], seen.headers["x-fencing-epoch"]),
                         (f"Bearer {SECRET}", KEY, "12"))
        self.assertEqual(seen.headers["content-type"], "application/json")

    def test_a_secret_echoed_by_the_target_never_reaches_what_is_returned(self) -> None:
        echo = json.dumps({"id": 1, "you_sent": f"Bearer {SECRET}"}).encode()
        self.assertEqual(self.invoke(Reply(201, echo)), {"id": 1, "you_sent": "[secret]"})
        with self.assertRaises(Rejected) as caught:
            self.invoke(Reply(400, f"bad token {SECRET}".encode()))
        self.assertNotIn(SECRET, str(caught.exception))
        server = self.scripted(Reply(200, json.dumps([{"id": {"token": SECRET}}]).encode()))
        seen = self.adapter(section(server.url)).observe(KEY, {})
        self.assertEqual((seen.status, seen.evidence["at_pointer"]), ("present", {"token": "[secret]"}))

    def test_the_secret_file_is_read_at_each_call(self) -> None:
        server = self.scripted(Reply(201, b'{"id": 1}'), Reply(201, b'{"id": 2}'))
        spec = section(server.url, invoke={"headers": {"X-Desk-Token": "{file:.token}"}})
        path = os.path.join(self.tmp, ".token")
        with open(path, "w") as handle:
            handle.write("first-secret-value\n")
        adapter = self.adapter(spec)
        adapter.invoke(KEY, {}, 1)
        with open(path, "w") as handle:
            handle.write("second-secret-value\r\n")
        adapter.invoke(KEY, {}, 1)
        self.assertEqual([s.headers["x-desk-token"] for s in server.seen], ["first-secret-value", "second-secret-value"])
        os.unlink(path)
        with self.assertRaises(NotApplied) as caught:
            adapter.invoke(KEY, {}, 1)
        self.assertIn("header X-Desk-Token cannot be made", str(caught.exception))
        self.assertEqual(len(server.seen), 2, "nothing is sent without the secret")


class ObserveAnswersTest(_Base):
    def observe(self, *replies: Reply, **extra: Any) -> Any:
        server = self.scripted(*replies)
        return self.adapter(section(server.url, **extra)).observe(KEY, {}), server

    def test_present_absent_and_unknown(self) -> None:
        seen, _ = self.observe(Reply(200, b'[{"id": 31, "external_ref": "r"}]'))
        self.assertEqual((seen.status, seen.evidence["at_pointer"], seen.evidence["status"]), ("present", 31, 200))
        self.assertEqual(seen.evidence["request"], {"method": "GET", "url": seen.evidence["request"]["url"], "headers": ["Authorization"]})
        for body in (b"[]", b'[{"id": null}]', b'[{"id": ""}]', b'[{"other": 1}]'):
            self.assertEqual(self.observe(Reply(200, body))[0].status, "absent", body)
        self.assertEqual(self.observe(Reply(404, b""))[0].status, "absent")
        for reply in (Reply(200, b"<html>"), Reply(500, b""), Reply(401, b""), Reply(302, b"")):
            self.assertEqual(self.observe(reply)[0].status, "unknown", reply)
        self.assertEqual(self.observe(Reply(200, b"[]"), observe={"pointer": ""})[0].status, "absent")

    def test_without_a_pointer_the_status_decides(self) -> None:
        spec_observe = {"url": "", "headers": {"Authorization": "Bearer {env:DESK_TOKEN}"}}
        server = self.scripted(Reply(200, b"not json"), Reply(410, b""))
        spec = section(server.url)
        spec["observe"] = dict(spec_observe, url=server.url + "/api/issues/{slug}", statuses={"410": "absent"})
        adapter = self.adapter(spec)
        self.assertEqual(adapter.observe(KEY, {}).status, "present")
        self.assertEqual(adapter.observe(KEY, {}).status, "absent")
        self.assertEqual(server.seen[0].target, "/api/issues/report-013-customer-s-copy")

    def test_a_lookup_told_not_now_waits_as_an_invoke_does(self) -> None:
        date = email.utils.formatdate(time.time() + 2, usegmt=True)
        reset = str(int(time.time()) + 30)
        cases = [(Reply(429, b"", (("Retry-After", "1"),)), 1.0), (Reply(429, b""), None),
                 (Reply(503, b"", (("Retry-After", date),)), 2.0), (Reply(429, b"", (("Retry-After", "60"),)), 60.0),
                 (Reply(403, b'{"message": "secondary rate limit"}', (("retry-after", "7"),)), 7.0),
                 (Reply(403, b"{}", (("X-RateLimit-Remaining", "0"), ("X-RateLimit-Reset", reset))), 30.0)]
        for reply, wait in cases:
            server = self.scripted(reply, Reply(200, b'[{"id": 5}]'))
            with self.assertRaises(NotApplied, msg=reply) as caught:
                self.adapter(section(server.url), timeout=5, pacing=Pacing()).observe(KEY, {})
            self.assertEqual((len(server.seen), self.slept), (1, []), "the executor waits, not the call")
            if wait is None:
                self.assertIsNone(caught.exception.retry_after)
            else:
                self.assertAlmostEqual(caught.exception.retry_after, wait, delta=1.5)
            self.assertIn(f"answered {reply.status}", str(caught.exception))
        seen, _ = self.observe(Reply(403, b'{"message": "Resource not accessible by integration"}'))
        self.assertEqual(seen.status, "unknown", "a 403 that names no limit is no 'not now'")

    def test_a_lookup_answered_by_a_proxy_is_asked_again(self) -> None:
        seen, server = self.observe(Reply(502, b""), Reply(504, b""), Reply(503, b"upstream connect error"),
                                    Reply(200, b'[{"id": 5}]'))
        self.assertEqual((seen.status, len(server.seen), self.slept), ("present", 4, [0.5, 0.5, 0.5]))


class ConnectionTest(_Base):
    """Connections: refused, timed out, kept alive and reused only when seen open, bounded answers, the deadline."""

    def test_a_target_that_is_down_created_nothing(self) -> None:
        url = f"http://127.0.0.1:{free_port()}"
        with self.assertRaises(NotApplied) as caught:
            self.adapter(section(url)).invoke(KEY, {}, 1)
        self.assertIn("nothing was sent", str(caught.exception))
        self.assertIsNone(caught.exception.retry_after)
        # The adapter's own waits are slept (a recorded wait alone would make the retries a busy loop for the call's time).
        seen = self.adapter(section(url), timeout=0.8, sleep=lambda s: (self.slept.append(s), time.sleep(s))).observe(KEY, {})
        self.assertEqual(seen.status, "unknown")
        self.assertGreaterEqual(len(self.slept), 1, "a lookup that could not connect is tried again within its time")

    def test_a_silent_target_is_an_unknown_outcome_within_the_timeout(self) -> None:
        # The server stays silent for 30 s: a client without a time of its own would wait for the server to close.
        server = self.scripted(Reply(silent=True))
        with self.assertRaises(UnknownOutcome) as caught:
            self.adapter(section(server.url), timeout=0.5).invoke(KEY, {}, 1)
        self.assertEqual(server.wait_for_hang_up(), (0, 0), "the client hung up on the silent server, not it on us")
        self.assertIn("may have been acted on", str(caught.exception))

    def test_a_trickling_answer_is_cut_at_the_calls_time(self) -> None:
        # One byte each 0.2 s: each read is quick, the whole answer takes some 17 s, far past the call's second.
        server = self.scripted(Reply(201, b'{"id": 1}', trickle=0.2))
        with self.assertRaises(UnknownOutcome):
            self.adapter(section(server.url), timeout=1.0).invoke(KEY, {}, 1)
        sent, whole = server.wait_for_hang_up()
        self.assertLess(sent, whole, "the timeout bounds the whole answer, not each read: the client cut it short")

    def test_connections_are_kept_alive_and_reused(self) -> None:
        server = self.scripted(default=Reply(201, b'{"id": 1}'))
        adapter = self.adapter(section(server.url))
        with mock.patch("subprocess.Popen", side_effect=AssertionError("a call started a process")):
            for _ in range(5):
                adapter.invoke(KEY, {}, 1)
        self.assertEqual((server.connections, len(server.seen), self.pool.made, self.pool.reused), (1, 5, 1, 4))

    def test_a_server_that_closes_each_connection_answers_every_call(self) -> None:
        # An HTTP/1.0 server, or one that says "Connection: close": the answer's end closes the socket.
        import http.server

        class OneShot(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self._answer(201, b'{"id": 7}')

            def do_GET(self) -> None:  # noqa: N802
                self._answer(200, b'[{"id": 7}]')

            def _answer(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), OneShot)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self.addCleanup(server.server_close)
        self.addCleanup(server.shutdown)
        closing = self.scripted(default=Reply(201, b'{"id": 8}', headers=(("Content-Type", "application/json"), ("Connection", "close"))))
        for url, ticket in ((f"http://127.0.0.1:{server.server_address[1]}", 7), (closing.url, 8)):
            adapter = self.adapter(section(url))
            for _ in range(3):
                self.assertEqual(adapter.invoke(KEY, {}, 1)["id"], ticket)
            if ticket == 7:
                self.assertEqual(adapter.observe(KEY, {}).status, "present")
        self.assertEqual(self.pool.reused, 0, "a closed connection is never handed out again")

    def test_a_kept_connection_the_server_closed_never_makes_a_post_unknown(self) -> None:
        server = self.scripted(default=Reply(201, b'{"id": 1}', close=True))
        adapter = self.adapter(section(server.url))
        for n in range(3):
            self.assertEqual(adapter.invoke(KEY, {}, 1), {"id": 1})
            # The server's close has reached this side before the next call looks at the connection.
            self.assertTrue(_wait(lambda: _readable(self.pool)), n)
        self.assertEqual((server.connections, len(server.seen)), (3, 3))
        self.assertEqual(self.pool.discarded, 2)

    def test_a_long_answer_is_read_up_to_the_limit_and_its_connection_closed(self) -> None:
        server = self.scripted(Reply(200, b"x" * (BODY_LIMIT + 5000)), default=Reply(201, b'{"id": 2}'))
        adapter = self.adapter(section(server.url))
        receipt = adapter.invoke(KEY, {}, 1)
        self.assertEqual((receipt["status"], receipt["body_bytes"]), (200, BODY_LIMIT))
        adapter.invoke(KEY, {}, 1)
        self.assertEqual(server.connections, 2)

    def test_nothing_is_sent_past_the_registered_calls_deadline(self) -> None:
        server = self.scripted(default=Reply(201, b'{"id": 1}'))
        now = [1_790_000_000.0]
        registry = inflight.Registry(os.path.join(self.tmp, "calls"), clock=lambda: now[0])
        call = registry.register(KEY, "invoke", 1, timeout=5)
        adapter = self.adapter(section(server.url))
        adapter.invoke("warm-up:issue", {}, 1)  # a kept connection, ready to send on at once
        now[0] = call.record["deadline"] + 0.001  # the process was stopped, and continued after its deadline
        with inflight.calling(registry, call):
            with self.assertRaises(NotApplied) as caught:
                adapter.invoke(KEY, {}, 1)
            self.assertIn("deadline passed", str(caught.exception))
            self.assertEqual(adapter.observe(KEY, {}).status, "unknown")
        self.assertEqual(len(server.seen), 1, "only the warm-up reached the target")
        now[0] = call.record["deadline"] - 10
        with inflight.calling(registry, call):
            adapter.invoke(KEY, {}, 1)
        self.assertEqual(len(server.seen), 2)

    def test_calls_from_many_threads_share_the_pool_safely(self) -> None:
        token = os.path.join(self.tmp, "token")
        with open(token, "w") as handle:
            handle.write(SECRET + "\n")
        desk = Helpdesk.from_token_file(token)
        with HelpdeskServer(desk) as served:
            adapter = self.adapter(section(served.url))
            errors: List[BaseException] = []

            def worker(n: int) -> None:
                try:
                    for i in range(15):
                        adapter.invoke(f"k{n}-{i}:issue", {"external_ref": f"r{n}-{i}", "title": "t", "body": "b"}, 1)
                except BaseException as exc:  # reported below
                    errors.append(exc)

            threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
            self.assertEqual(errors, [])
            self.assertEqual(sum(desk.by_ref().values()), 90)
            self.assertLessEqual(self.pool.made, 6, "at most one connection per thread at a time")
            self.assertEqual(self.pool.made + self.pool.reused, 90)


class ManyTest(_Base):
    """``observe.many``: one GET looks several keys up; its list is matched back to each key."""

    def item(self, spec: Dict[str, Any], slug: str) -> HttpAdapter:
        """The adapter of the item whose slug is ``slug``."""
        return HttpAdapter(http_spec(spec), values=dict(VALUES, slug=slug), workspace=self.tmp, pool=self.pool,
                           environ={"DESK_TOKEN": SECRET})

    def many(self, url: str, **extra: Any) -> Dict[str, Any]:
        return section(url, observe={"many": dict({"url": url + "/api/issues?{each:external_ref={slug}}", "match": "/external_ref",
                                                   "value": "{slug}", "max": 20}, **extra)})

    def test_present_absent_and_how_many_match_in_one_request(self) -> None:
        token = os.path.join(self.tmp, "token")
        with open(token, "w") as handle:
            handle.write(SECRET + "\n")
        desk = Helpdesk.from_token_file(token)
        with HelpdeskServer(desk) as served:
            for spec, gone in ((self.many(served.url, page_size=100), "absent"), (self.many(served.url), "unseen")):
                adapters = {slug: self.item(spec, slug) for slug in ("a b", "c", "gone")}
                if not desk.by_ref():
                    for slug in ("a b", "c", "c"):
                        adapters[slug].invoke(f"{slug}:issue", {"external_ref": slug, "title": "t", "body": "b"}, 1)
                before = desk.count("listed")
                found = adapters["a b"].observe_many([(f"{slug}:issue", {}, adapters[slug]) for slug in adapters])
                self.assertEqual([o.status for o in found], ["present", "present", gone], "absent: page size declared")
                self.assertEqual([o.evidence["matches"] for o in found], [1, 2, 0])
                self.assertEqual(found[0].evidence["found"]["external_ref"], "a b")
                self.assertEqual(desk.count("listed") - before, 1, "one request for three keys")
                self.assertNotIn(SECRET, json.dumps([o.evidence for o in found]))
                self.assertEqual(adapters["c"].batch_key, adapters["gone"].batch_key, "one contract's go together")
                self.assertEqual(adapters["c"].observe_batch, 20)

    def test_an_answer_that_is_not_a_list_says_nothing_a_429_is_not_now_and_a_4xx_refuses(self) -> None:
        server = self.scripted(Reply(200, b'{"not": "a list"}'), Reply(500, b"[]"), Reply(206, b"[]"),
                               Reply(502, b"[]"), Reply(200, b"[]", close=True),
                               Reply(429, b"{}", (("Retry-After", "3"),)), Reply(503, b""), Reply(408, b""),
                               Reply(414, b'{"error": "URI too long"}'), Reply(400, b""), Reply(404, b"[]"))
        adapter = self.adapter(self.many(server.url, page_size=10))
        items = [(KEY, {}, adapter), ("other:issue", {}, adapter)]
        for status in (200, 500, 206, 502):
            self.assertEqual([o.status for o in adapter.observe_many(items)], ["unseen", "unseen"], status)
        self.assertEqual([o.status for o in adapter.observe_many(items)], ["absent", "absent"], "a whole answer")
        for retry_after in (3, None, None):
            with self.assertRaises(NotApplied) as caught:
                adapter.observe_many(items)
            self.assertEqual(caught.exception.retry_after, retry_after)
        for status in (414, 400, 404):
            with self.assertRaises(Rejected, msg=status) as refused:
                adapter.observe_many(items)
            self.assertIn(f"answered {status}", str(refused.exception))
        with self.assertRaises(NotApplied):  # no connection: not now
            self.adapter(self.many(f"http://127.0.0.1:{free_port()}")).observe_many(items)

    def test_an_answer_that_may_be_one_page_of_several_proves_no_absence(self) -> None:
        listed = json.dumps([{"external_ref": VALUES["slug"]}, {"external_ref": "x"}, {"external_ref": "y"}]).encode()
        link = (("Link", '<https://desk.example/a?page=2>; rel="next", <https://desk.example/a?page=5>; rel=last'),)
        second_link = (("Link", "<a>; rel=prev"), ("Link", "<b>; REL=next"))

        def wrapped(rest: bytes) -> bytes:
            return b'{"items": ' + listed + rest + b"}"

        cases = [
            ("as many entries as the page size", {"page_size": 3}, Reply(200, listed), "unseen"),
            ("fewer entries than the page size", {"page_size": 4}, Reply(200, listed), "absent"),
            ('a Link rel="next"', {"page_size": 50}, Reply(200, listed, link), "unseen"),
            ("rel=next unquoted, in a second Link", {"page_size": 50}, Reply(200, listed, second_link), "unseen"),
            ("neither page_size nor next declared", {}, Reply(200, listed), "unseen"),
            ("a cursor at next", {"list": "/items", "next": "/meta/next"},
             Reply(200, wrapped(b', "meta": {"next": "c2"}')), "unseen"),
            ("no cursor at next", {"list": "/items", "next": "/meta/next"},
             Reply(200, wrapped(b', "meta": {"next": null}')), "absent"),
            ("has_more true", {"list": "/items", "next": "/has_more"}, Reply(200, wrapped(b', "has_more": true')),
             "unseen"),
            ("has_more false", {"list": "/items", "next": "/has_more"}, Reply(200, wrapped(b', "has_more": false')),
             "absent"),
            ("no cursor, a full page", {"list": "/items", "next": "/next", "page_size": 3}, Reply(200, wrapped(b"")),
             "unseen"),
        ]
        for case, extra, reply, other in cases:
            with self.subTest(case):
                server = self.scripted(reply)
                spec = self.many(server.url, **extra)
                adapter = self.adapter(spec)
                found = adapter.observe_many([(KEY, {}, adapter), ("other:issue", {}, self.item(spec, "gone"))])
                self.assertEqual([o.status for o in found], ["present", other], "a match is a presence, paged or not")
                if other == "unseen":
                    self.assertIn("reason", found[1].evidence)

    def test_the_section_is_checked(self) -> None:
        self.assertEqual(http_problems({"http": self.many("http://127.0.0.1:9")}), [])
        self.assertEqual(http_problems({"http": self.many("http://127.0.0.1:9", page_size=100, next="/next")}), [])
        many = {"url": "http://127.0.0.1:9/x?ref={slug}", "match": "id", "value": "", "max": 1, "page_size": 0,
                "next": "next"}
        text = " ".join(http_problems({"http": section("http://127.0.0.1:9", observe={"many": many})}))
        for expected in ("{each:", "JSON pointer", "template of the key", "from 2 to", "page_size must be a whole",
                         "observe.many.next must be"):
            self.assertIn(expected, text)
        spec = self.many("http://127.0.0.1:9")
        spec["observe"]["many"]["url"] = "http://127.0.0.1:9/x?{each:r\u00e9f={slug}}"
        accented = http_problems({"http": spec})
        self.assertEqual(len(accented), 1, accented)
        self.assertIn("ASCII", accented[0])


def _readable(pool: ConnectionPool) -> bool:
    idle = [c for conns in pool._idle.values() for c in conns]
    return bool(idle) and all(http_client.dropped(c) for c in idle)


def _wait(condition: Any, timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.005)
    return False


@unittest.skipUnless(have_openssl(), "openssl is not installed: no test certificate can be made")
class TlsTest(_Base):
    """https to a local server whose certificate a test CA made with openssl signed."""

    def setUp(self) -> None:
        super().setUp()
        ca, cert, key = make_certificates(self.tmp)
        shutil.copy(ca, os.path.join(self.tmp, "private-ca.pem"))
        token = os.path.join(self.tmp, "token")
        with open(token, "w") as handle:
            handle.write(SECRET)
        self.desk = Helpdesk.from_token_file(token)
        self.served = HelpdeskServer(self.desk, tls=(cert, key))
        self.addCleanup(self.served.stop)

    def test_https_with_the_contracts_ca_file(self) -> None:
        adapter = self.adapter(section(self.served.url, ca_file="private-ca.pem"))
        receipt = adapter.invoke(KEY, {"external_ref": VALUES["slug"], "title": "t", "body": "b"}, 1)
        self.assertEqual(receipt["external_ref"], VALUES["slug"])
        self.assertEqual(adapter.observe(KEY, {}).status, "present")
        self.assertEqual(self.desk.by_ref(), {VALUES["slug"]: 1})
        self.assertEqual(self.pool.made, 1, "the lookup went over the same TLS connection")

    def test_an_unknown_certificate_fails_before_anything_is_sent(self) -> None:
        with self.assertRaises(NotApplied) as caught:
            self.adapter(section(self.served.url)).invoke(KEY, {"external_ref": "tls", "title": "t", "body": "b"}, 1)
        self.assertIn("nothing was sent", str(caught.exception))
        self.assertIn("CERTIFICATE_VERIFY_FAILED", str(caught.exception))
        self.assertEqual(self.desk.by_ref(), {})


class ProxyTest(_Base):
    """Proxies from the environment, as urllib reads them: absolute-form for http, a CONNECT tunnel for https; no_proxy."""

    def setUp(self) -> None:
        super().setUp()
        self.proxy = ConnectProxy()
        self.addCleanup(self.proxy.stop)

    def environment(self, **values: str) -> Any:
        cleared = {k: "" for k in os.environ if k.lower() in ("http_proxy", "https_proxy", "no_proxy", "all_proxy")}
        patch = mock.patch.dict(os.environ, dict(cleared, **values))
        return patch

    def test_http_through_the_proxy_and_past_it_for_no_proxy(self) -> None:
        server = self.scripted(default=Reply(201, b'{"id": 1}'))
        with self.environment(http_proxy=f"http://desk:pa%3Ass@127.0.0.1:{self.proxy.port}"):
            self.assertEqual(self.adapter(section(server.url)).invoke(KEY, {}, 1), {"id": 1})
        self.assertEqual(self.proxy.asked, [f"POST {server.url}/api/issues HTTP/1.1"])
        self.assertEqual(self.proxy.authorizations, ["Basic ZGVzazpwYTpzcw=="])  # desk:pa:ss
        with self.environment(http_proxy=self.proxy.url, no_proxy="localhost,127.0.0.1"):
            self.adapter(section(server.url)).invoke(KEY, {}, 1)
        self.assertEqual(len(self.proxy.asked), 1, "no_proxy bypasses the proxy")
        self.assertEqual(len(server.seen), 2)

    @unittest.skipUnless(have_openssl(), "openssl is not installed: no test certificate can be made")
    def test_https_through_a_connect_tunnel(self) -> None:
        ca, cert, key = make_certificates(self.tmp)
        token = os.path.join(self.tmp, "token")
        with open(token, "w") as handle:
            handle.write(SECRET)
        desk = Helpdesk.from_token_file(token)
        with HelpdeskServer(desk, tls=(cert, key)) as served:
            with self.environment(https_proxy=self.proxy.url):
                adapter = self.adapter(section(served.url, ca_file="ca.pem"))
                adapter.invoke(KEY, {"external_ref": VALUES["slug"], "title": "t", "body": "b"}, 1)
                self.assertEqual(adapter.observe(KEY, {}).status, "present")
        self.assertEqual([line.rsplit(" ", 1)[0] for line in self.proxy.asked], [f"CONNECT 127.0.0.1:{served.port}"],
                         "one tunnel, kept alive for both calls")
        self.assertEqual(desk.by_ref(), {VALUES["slug"]: 1})

    def test_a_proxy_that_refuses_the_connection_sent_nothing(self) -> None:
        server = self.scripted(default=Reply(201, b'{"id": 1}'))
        with self.environment(http_proxy=f"http://127.0.0.1:{free_port()}"):
            with self.assertRaises(NotApplied):
                self.adapter(section(server.url)).invoke(KEY, {}, 1)
        self.assertEqual(server.seen, [])


if __name__ == "__main__":
    unittest.main()
