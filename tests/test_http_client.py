"""The parts under the HTTP adapter, each alone: the client (which knows nothing of effects), the secrets of the
headers, and what an answer's status means."""

import os
import sys
import time
import unittest
from email.message import Message
from typing import Optional, Tuple

from runner.adapters.http_answers import invoke_outcome, outcome_of, partial
from runner.adapters.http_client import ConnectionPool, HttpClient, Lost, NotSent, Reply, origin_of
from runner.adapters.http_secrets import fill_secrets, scrub
from runner.base.pointer import parse_pointer
from runner.contract.http import INVOKE_DEFAULTS
from tests.support.fake_http import Reply as Scripted
from tests.support.fake_http import ScriptedServer, free_port
from tests.support.util import REPO_ROOT

sys.path.insert(0, os.path.join(REPO_ROOT, "tools"))

import check_layers  # noqa: E402


class ClientImportsTest(unittest.TestCase):
    def test_the_client_imports_nothing_of_the_runner_but_its_base(self) -> None:
        # No target, registry of calls, contract or ledger: what a request means for an effect is the adapter's.
        path = os.path.join(REPO_ROOT, "runner", "adapters", "http_client.py")
        named = {target for _, target in check_layers.imported(path, "runner.adapters.http_client")}
        of_the_runner = {target for target in named if target == "runner" or target.startswith("runner.")}
        self.assertIn("runner.base.errors", of_the_runner, "the reader sees the client's imports")
        self.assertEqual({t for t in of_the_runner if not t.startswith("runner.base.")}, set())

    def test_the_adapter_is_where_the_registry_of_calls_enters(self) -> None:
        path = os.path.join(REPO_ROOT, "runner", "adapters", "http.py")
        named = {target for _, target in check_layers.imported(path, "runner.adapters.http")}
        self.assertIn("runner.calls.inflight", named)


class ClientTest(unittest.TestCase):
    def setUp(self) -> None:
        self.pool = ConnectionPool()
        self.addCleanup(self.pool.clear)

    def scripted(self, *replies: Scripted, default: Scripted = Scripted()) -> ScriptedServer:
        server = ScriptedServer(replies, default)
        self.addCleanup(server.stop)
        return server

    def send(self, client: HttpClient, url: str, idempotent: bool = False) -> Reply:
        port = int(url.rsplit(":", 1)[1])
        origin = origin_of("http", "127.0.0.1", port)
        return client.exchange(origin, "POST", "/x", {}, b"{}", time.monotonic() + 5, idempotent=idempotent)

    def test_an_objection_before_sending_sends_nothing_and_keeps_the_connection(self) -> None:
        server = self.scripted(default=Scripted(201, b'{"id": 1}'))
        objection: Optional[str] = None
        client = HttpClient(5.0, self.pool, before_send=lambda: objection)
        self.assertEqual(self.send(client, server.url).status, 201)
        objection = "held up; nothing was sent"
        with self.assertRaises(NotSent) as caught:
            self.send(client, server.url)
        self.assertEqual((str(caught.exception), caught.exception.final), ("held up; nothing was sent", True))
        self.assertEqual(len(server.seen), 1, "nothing of the second request reached the server")
        objection = None
        self.assertEqual(self.send(client, server.url).status, 201)
        self.assertEqual((server.connections, self.pool.made, self.pool.reused), (1, 1, 2))

    def test_no_connection_is_not_sent_and_silence_is_lost(self) -> None:
        client = HttpClient(0.5, self.pool)
        with self.assertRaises(NotSent) as refused:
            self.send(client, f"http://127.0.0.1:{free_port()}")
        self.assertFalse(refused.exception.final, "a connection may be made on a later try")
        server = self.scripted(Scripted(silent=True))
        port = int(server.url.rsplit(":", 1)[1])
        with self.assertRaises(Lost) as lost:
            client.exchange(origin_of("http", "127.0.0.1", port), "POST", "/x", {}, b"{}", time.monotonic() + 0.5)
        self.assertIn("no whole answer within the call's 0.5s", str(lost.exception))

    def test_a_deadline_already_past_sends_nothing(self) -> None:
        server = self.scripted()
        port = int(server.url.rsplit(":", 1)[1])
        with self.assertRaises(NotSent) as caught:
            HttpClient(2.0, self.pool).exchange(origin_of("http", "127.0.0.1", port), "GET", "/", {}, None,
                                                time.monotonic() - 1)
        self.assertEqual(str(caught.exception),
                         "the call's 2s were spent before a connection was made; nothing was sent")
        self.assertTrue(caught.exception.final)
        self.assertEqual(server.connections, 0)


class SecretsTest(unittest.TestCase):
    def test_each_secret_is_read_collected_and_scrubbed_keys_included(self) -> None:
        secrets = []
        filled = fill_secrets("Authorization", "Bearer {env:TOKEN}", "/nowhere", {"TOKEN": "tok-123456"}, secrets)
        self.assertEqual((filled, secrets), ("Bearer tok-123456", ["tok-123456"]))
        answer = {"echo tok-123456": ["said tok-123456", 3], "short": "abc"}
        self.assertEqual(scrub(answer, secrets + ["abc"]), {"echo [secret]": ["said [secret]", 3], "short": "abc"})

    def test_a_secret_that_cannot_be_read_names_the_header_never_a_value(self) -> None:
        with self.assertRaises(ValueError) as caught:
            fill_secrets("X-Key", "{env:MISSING}", "/nowhere", {}, [])
        self.assertEqual(str(caught.exception),
                         "the value of header X-Key cannot be made: the environment variable MISSING is not set")


class _Headers(Message):
    def __init__(self, *pairs: Tuple[str, str]) -> None:
        super().__init__()
        for name, value in pairs:
            self[name] = value


class AnswersTest(unittest.TestCase):
    def test_an_exact_status_wins_over_its_class_and_a_503_names_a_delay(self) -> None:
        statuses = dict(INVOKE_DEFAULTS, **{"409": "receipt"})
        self.assertEqual([outcome_of(statuses, s) for s in (201, 409, 410, 412, 500)],
                         ["receipt", "receipt", "rejected", "stale-epoch", "unknown"])
        self.assertEqual((invoke_outcome(statuses, 503, None), invoke_outcome(statuses, 503, 2.0)),
                         ("unknown", "not-applied"))

    def test_an_answer_is_whole_only_when_it_bears_no_mark_of_a_page(self) -> None:
        def reply(*links: str) -> Reply:
            return Reply(200, "OK", _Headers(*(("Link", link) for link in links)), b"", True)

        listed = [1, 2]
        self.assertIsNone(partial(reply(), {}, listed, 3, None))
        self.assertIn("as many as a page", partial(reply(), {}, listed, 2, None) or "")
        self.assertIn("neither page_size nor next", partial(reply(), {}, listed, None, None) or "")
        self.assertIn('rel="next"', partial(reply('<b>; rel="next"'), {}, listed, 3, None) or "")
        self.assertIn("names a next page", partial(reply(), {"more": "c2"}, listed, None, parse_pointer("/more")) or "")
        self.assertIsNone(partial(reply(), {"more": False}, listed, None, parse_pointer("/more")))


if __name__ == "__main__":
    unittest.main()
