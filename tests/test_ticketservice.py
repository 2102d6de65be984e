"""The ticket service: its API, every fault switch, its one-transaction commit, fencing and retention.

Most tests share one service process (faults reset before each, keys unique
per test); those that crash it or need other start-up flags start their own.
No test sleeps: slowness comes from the service's delay switch, against a
client timeout far shorter than the delay.
"""

import contextlib
import json
import os
import shutil
import socket
import sqlite3
import tempfile
import threading
import unittest
import uuid
from typing import Any, Dict, List, Optional, Tuple

from runner.calls.target import NotApplied, Rejected, StaleEpoch, UnknownOutcome
from runner.base.canonical import content_digest
from runner.proof.ticketservice import Faults, MarkerTicketAdapter, TicketAdapter, TicketServiceProcess, parse_command_line


class _ServiceCase(unittest.TestCase):
    tmp = ""

    @classmethod
    def setUpClass(cls) -> None:
        cls.tmp = tempfile.mkdtemp(prefix="ticketservice-test-")

    @classmethod
    def tearDownClass(cls) -> None:
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def setUp(self) -> None:
        self.prefix = f"{self.id().rsplit('.', 1)[-1][5:]}-{uuid.uuid4().hex[:6]}"

    def key(self, label: str) -> str:
        return f"{self.prefix}.{label}"

    def payload(self, label: str, **extra: Any) -> Dict[str, Any]:
        return {"marker": self.key(label), "title": f"ticket {label}", **extra}

    def own_service(self, **flags: Any) -> TicketServiceProcess:
        folder = tempfile.mkdtemp(dir=self.tmp)
        service = TicketServiceProcess(os.path.join(folder, "tickets.db"), **flags)
        self.addCleanup(service.stop)
        return service

    @staticmethod
    def post(service: TicketServiceProcess, key: Optional[str], payload: Dict[str, Any], epoch: Optional[int] = None, run_id: Optional[str] = None) -> Tuple[int, Dict[str, Any]]:
        headers = {}
        if key is not None:
            headers["Idempotency-Key"] = key
        if epoch is not None:
            headers["X-Fencing-Epoch"] = str(epoch)
        if run_id is not None:
            headers["X-Run-Id"] = run_id
        return service.request("POST", "/tickets", {"payload": payload}, headers)


class SharedServiceTests(_ServiceCase):
    service: TicketServiceProcess

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.service = TicketServiceProcess(os.path.join(cls.tmp, "shared.db"))

    @classmethod
    def tearDownClass(cls) -> None:
        cls.service.stop()
        super().tearDownClass()

    def setUp(self) -> None:
        super().setUp()
        self.service.reset_faults()
        self.adapter = self.service.adapter(run_id=self.prefix, timeout=2.0)

    def count(self, key: str) -> int:
        return len(self.service.tickets_for_key(key))

    def counter(self, name: str) -> int:
        return int(self.service.stats()["requests"][name])

    # -- the API ------------------------------------------------------------------------
    def test_create_replay_and_lookups(self) -> None:
        key, payload = self.key("a"), self.payload("a")
        status, body = self.post(self.service, key, payload, epoch=1, run_id=self.prefix)
        self.assertEqual(status, 201)
        self.assertRegex(body["ticket"], r"^T-\d{6}$")
        self.assertEqual(body, {"ticket": body["ticket"], "key": key, "created": True})
        again = self.post(self.service, key, payload, epoch=1, run_id=self.prefix)
        self.assertEqual(again, (200, {"ticket": body["ticket"], "key": key, "created": False}))
        self.assertEqual(self.count(key), 1)
        status, found = self.service.request("GET", f"/tickets/by-key/{key}")
        self.assertEqual(status, 200)
        self.assertEqual((found["ticket"], found["key"], found["marker"]), (body["ticket"], key, payload["marker"]))
        self.assertEqual(found["payload_digest"], content_digest(payload), "the service's digest must be the runner's")
        self.assertEqual(self.service.request("GET", f"/tickets/{body['ticket']}")[1]["payload"], payload)
        self.assertEqual([t["ticket"] for t in self.service.tickets_for_marker(payload["marker"])], [body["ticket"]])
        status, missing = self.service.request("GET", f"/tickets/by-key/{self.key('never')}")
        self.assertEqual((status, missing["status"]), (404, "never-seen"))
        self.assertEqual(self.service.tickets_for_marker(self.key("never")), [])

    def test_adapter_receipts_and_observations(self) -> None:
        key, payload = self.key("a"), self.payload("a")
        self.assertEqual(self.adapter.observe(key, payload).status, "absent")
        receipt = self.adapter.invoke(key, payload, 1)
        self.assertTrue(receipt["created"])
        self.assertFalse(self.adapter.invoke(key, payload, 1)["created"])
        seen = self.adapter.observe(key, payload)
        self.assertEqual((seen.status, seen.evidence["ticket"]), ("present", receipt["ticket"]))
        # The key's ticket holds another payload: not proof that this effect happened.
        self.assertEqual(self.adapter.observe(key, self.payload("other")).status, "unknown")
        with self.assertRaises(Rejected):
            self.adapter.invoke(key, self.payload("other"), 1)

    def test_conflicting_payload_is_refused_and_changes_nothing(self) -> None:
        key = self.key("a")
        self.post(self.service, key, self.payload("a"), epoch=3, run_id=self.prefix)
        status, body = self.post(self.service, key, self.payload("b"), epoch=9, run_id=self.prefix)
        self.assertEqual((status, body["error"]), (409, "conflicting-payload"))
        self.assertEqual(self.count(key), 1)
        # Not even the epoch mark of the refused request was kept.
        self.assertEqual(self.service.stats()["high_water"][self.prefix], 3)

    def test_refuse_conflicting_payload_switch(self) -> None:
        key = self.key("a")
        _, first = self.post(self.service, key, self.payload("a"))
        self.service.set_faults(refuse_conflicting_payload={"value": False, "times": 1})
        self.assertEqual(self.post(self.service, key, self.payload("b")), (200, {"ticket": first["ticket"], "key": key, "created": False}))
        self.assertEqual(self.post(self.service, key, self.payload("b"))[0], 409, "the override covered one request only")
        self.assertEqual(self.count(key), 1)
        lenient = self.service.adapter(run_id=self.prefix, refuses_conflicting_payload=False)
        self.assertTrue(lenient.conflicting_payload.startswith("the original"))

    def test_bad_requests_change_nothing(self) -> None:
        before = self.service.stats()["tickets"]
        key = self.key("a")
        self.assertEqual(self.service.request("POST", "/tickets", {"nope": 1}, {"Idempotency-Key": key})[0], 400)
        self.assertEqual(self.service.request("POST", "/tickets", {"payload": []}, {"Idempotency-Key": key})[0], 400)
        self.assertEqual(self.post(self.service, key, self.payload("a"), epoch=None, run_id=None)[0], 201)
        status, _ = self.service.request("POST", "/tickets", {"payload": {}}, {"Idempotency-Key": self.key("b"), "X-Fencing-Epoch": "-1"})
        self.assertEqual(status, 400)
        self.assertEqual(self.service.request("POST", "/faults", {"no_such_fault": True})[0], 400)
        self.assertEqual(self.service.request("POST", "/faults", {"drop_after_commit": "yes"})[0], 400)
        self.assertEqual(self.service.request("GET", "/nowhere")[0], 404)
        self.assertEqual(self.service.request("GET", "/tickets")[0], 400)
        self.assertEqual(self.service.stats()["tickets"], before + 1)
        with self.assertRaises(Rejected):  # a 4xx is final: the request was malformed, resending cannot help
            self.adapter.invoke(self.key("c"), self.payload("c"), -1)

    def test_concurrent_requests_with_one_key_create_one_ticket(self) -> None:
        key, payload = self.key("a"), self.payload("a")
        results: List[Tuple[int, Dict[str, Any]]] = []
        lock = threading.Lock()

        def send() -> None:
            answer = self.post(self.service, key, payload)
            with lock:
                results.append(answer)

        threads = [threading.Thread(target=send) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self.assertEqual(sorted(status for status, _ in results), [200] * 7 + [201])
        self.assertEqual(len({body["ticket"] for _, body in results}), 1)
        self.assertEqual(self.count(key), 1)

    # -- fencing -------------------------------------------------------------------------
    def test_stale_epoch_is_refused_per_run_scope(self) -> None:
        scope_a, scope_b = self.prefix + "-a", self.prefix + "-b"
        self.assertEqual(self.post(self.service, self.key("1"), self.payload("1"), epoch=5, run_id=scope_a)[0], 201)
        status, body = self.post(self.service, self.key("2"), self.payload("2"), epoch=4, run_id=scope_a)
        self.assertEqual((status, body["high_water"]), (412, 5))
        self.assertEqual(self.count(self.key("2")), 0, "a refused request creates nothing")
        # A replay is refused too: a stale writer learns nothing, not even the receipt.
        self.assertEqual(self.post(self.service, self.key("1"), self.payload("1"), epoch=4, run_id=scope_a)[0], 412)
        self.assertEqual(self.post(self.service, self.key("2"), self.payload("2"), epoch=5, run_id=scope_a)[0], 201, "the current epoch is accepted")
        self.assertEqual(self.post(self.service, self.key("3"), self.payload("3"), epoch=1, run_id=scope_b)[0], 201, "another run scope has its own mark")
        self.assertEqual(self.service.stats()["high_water"][scope_a], 5)
        with self.assertRaises(StaleEpoch):
            self.service.adapter(run_id=scope_a).invoke(self.key("4"), self.payload("4"), 3)

    def test_stale_epoch_without_run_id_uses_the_global_mark(self) -> None:
        elsewhere = self.prefix + "-elsewhere"
        self.assertEqual(self.post(self.service, self.key("1"), self.payload("1"), epoch=7)[0], 201)
        self.assertEqual(self.post(self.service, self.key("2"), self.payload("2"), epoch=6)[0], 412)
        self.assertEqual(self.post(self.service, self.key("3"), self.payload("3"), epoch=1, run_id=elsewhere)[0], 201)
        self.assertEqual(self.post(self.service, self.key("4"), self.payload("4"))[0], 201, "a request without an epoch is not fenced")
        marks = self.service.stats()["high_water"]
        self.assertEqual((marks[""], marks[elsewhere]), (7, 1))

    def test_reject_stale_epoch_switch(self) -> None:
        self.post(self.service, self.key("1"), self.payload("1"), epoch=5, run_id=self.prefix)
        self.service.set_faults(reject_stale_epoch={"value": False, "times": 1})
        self.assertEqual(self.post(self.service, self.key("2"), self.payload("2"), epoch=2, run_id=self.prefix)[0], 201)
        self.assertEqual(self.post(self.service, self.key("3"), self.payload("3"), epoch=2, run_id=self.prefix)[0], 412)
        self.assertEqual(self.service.stats()["high_water"][self.prefix], 5, "an accepted stale epoch does not lower the mark")

    # -- fault switches --------------------------------------------------------------------------
    def test_drop_after_commit_applies_to_the_next_n_requests(self) -> None:
        self.service.set_faults(drop_after_commit=2)
        for label in ("a", "b"):
            with self.assertRaises(UnknownOutcome):
                self.adapter.invoke(self.key(label), self.payload(label), 1)
            self.assertEqual(self.count(self.key(label)), 1, "the commit happened before the connection was dropped")
        # The third request is answered; resending a dropped one returns its original ticket.
        receipt = self.adapter.invoke(self.key("a"), self.payload("a"), 1)
        self.assertFalse(receipt["created"])
        self.assertEqual(self.count(self.key("a")), 1)
        self.service.set_faults(drop_after_commit=True)
        with self.assertRaises(UnknownOutcome):
            self.adapter.invoke(self.key("c"), self.payload("c"), 1)
        with self.assertRaises(UnknownOutcome):
            self.adapter.invoke(self.key("d"), self.payload("d"), 1)
        self.service.set_faults(drop_after_commit=False)
        self.assertTrue(self.adapter.invoke(self.key("e"), self.payload("e"), 1)["created"])

    def test_delay_response_beyond_the_client_timeout(self) -> None:
        impatient = self.service.adapter(run_id=self.prefix, timeout=0.2)
        self.service.set_faults(delay_response_seconds={"value": 1.0, "times": 1})
        with self.assertRaises(UnknownOutcome) as caught:
            impatient.invoke(self.key("a"), self.payload("a"), 1)
        self.assertIn("timed out", str(caught.exception))
        self.assertEqual(impatient.observe(self.key("a"), self.payload("a")).status, "present")
        self.assertTrue(impatient.invoke(self.key("b"), self.payload("b"), 1)["created"], "the delay covered one request only")
        self.assertGreaterEqual(self.counter("delayed"), 1)

    def test_unavailable_is_not_applied(self) -> None:
        self.service.set_faults(unavailable=1)
        with self.assertRaises(NotApplied):
            self.adapter.invoke(self.key("a"), self.payload("a"), 1)
        self.assertEqual(self.count(self.key("a")), 0)
        self.assertEqual(self.adapter.observe(self.key("a"), self.payload("a")).status, "absent")
        self.assertTrue(self.adapter.invoke(self.key("a"), self.payload("a"), 1)["created"])

    def test_dropped_lookup_makes_the_observation_unknown(self) -> None:
        self.adapter.invoke(self.key("a"), self.payload("a"), 1)
        self.service.set_faults(drop_lookups=1)
        seen = self.adapter.observe(self.key("a"), self.payload("a"))
        self.assertEqual(seen.status, "unknown")
        self.assertIn("error", seen.evidence)
        self.assertEqual(self.adapter.observe(self.key("a"), self.payload("a")).status, "present")

    def test_retention_forgets_keys_for_lookup(self) -> None:
        key, payload = self.key("a"), self.payload("a")
        self.adapter.invoke(key, payload, 1)
        self.service.set_faults(retention_seconds=3600)
        self.assertEqual(self.adapter.observe(key, payload).status, "present", "within retention the key is known")
        self.service.set_faults(retention_seconds=0)
        status, body = self.service.request("GET", f"/tickets/by-key/{key}")
        self.assertEqual((status, body["status"]), (404, "past-retention"))
        seen = self.adapter.observe(key, payload)
        self.assertEqual(seen.status, "unknown", "a forgotten key is not an absent effect")
        self.assertEqual(seen.evidence["status"], "past-retention")
        self.assertEqual(self.adapter.observe(self.key("never"), self.payload("never")).status, "absent")
        self.assertEqual(len(self.service.tickets_for_marker(payload["marker"])), 1, "the marker lookup has no retention")
        self.assertGreaterEqual(self.service.stats()["forgotten_keys"], 1)

    def test_forgotten_key_is_no_longer_deduplicated(self) -> None:
        key, payload = self.key("a"), self.payload("a")
        first = self.adapter.invoke(key, payload, 1)
        before = self.service.stats()
        self.service.set_faults(retention_seconds=0)
        # What a blind retry past retention does: a second ticket, which the stats flag as a duplicate.
        second = self.adapter.invoke(key, payload, 1)
        self.assertTrue(second["created"])
        self.assertNotEqual(first["ticket"], second["ticket"])
        self.assertEqual(self.count(key), 2)
        after = self.service.stats()
        self.assertEqual((after["tickets"] - before["tickets"], after["keys"] - before["keys"], after["duplicates"] - before["duplicates"]), (1, 0, 1))

    def test_fault_view_and_reset(self) -> None:
        view = self.service.set_faults(drop_after_commit=3, delay_response_seconds=0.5, retention_seconds=10)
        self.assertEqual(view["next"]["drop_after_commit"], {"value": True, "remaining": 3})
        self.assertEqual((view["plain"]["delay_response_seconds"], view["retention_seconds"]), (0.5, 10.0))
        view = self.service.reset_faults()
        self.assertEqual((view["next"], view["plain"]["delay_response_seconds"], view["retention_seconds"]), ({}, 0.0, None))


    # -- the wire (HTTP/1.0, one request per connection) ------------------------------------
    def raw(self, data: bytes) -> bytes:
        """Send ``data`` on a connection of its own and read until the service closes it."""
        with socket.create_connection(("127.0.0.1", self.service.port), timeout=5) as sock:
            sock.sendall(data)
            chunks = []
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    return b"".join(chunks)
                chunks.append(chunk)

    def test_a_malformed_request_head_is_answered_400_and_creates_nothing(self) -> None:
        before = self.service.stats()["tickets"]
        body = json.dumps({"payload": self.payload("a")}).encode()
        post = b"POST /tickets HTTP/1.1\r\nContent-Length: %d\r\n" % len(body)
        heads = {
            "no version": b"POST /tickets\r\n\r\n" + body,
            "not HTTP/1.x": b"POST /tickets HTTP/2.0\r\n\r\n" + body,
            "a header line without a colon": post + b"Idempotency-Key " + self.key("a").encode() + b"\r\n\r\n" + body,
            "101 header lines": post + b"".join(b"X-%d: 1\r\n" % n for n in range(101)) + b"\r\n" + body,
            "a request line over 64 KiB": b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n",
        }
        for label, data in heads.items():
            with self.subTest(label):
                answer = self.raw(data)
                self.assertTrue(answer.startswith(b"HTTP/1.0 400 "), answer[:200])
                self.assertIn(b'"error": "bad-request"', answer)
        answer = self.raw(b"DELETE /tickets HTTP/1.1\r\n\r\n")
        self.assertTrue(answer.startswith(b"HTTP/1.0 501 "), answer[:200])
        self.assertEqual(self.service.stats()["tickets"], before)

    def test_a_standard_http_client_talks_to_the_service(self) -> None:
        import http.client

        key, payload = self.key("a"), self.payload("a")
        conn = http.client.HTTPConnection("127.0.0.1", self.service.port, timeout=5)
        self.addCleanup(conn.close)
        conn.request("POST", "/tickets", json.dumps({"payload": payload}), {"Idempotency-Key": key, "Content-Type": "application/json"})
        response = conn.getresponse()
        created = json.loads(response.read())
        self.assertEqual((response.status, response.getheader("Content-Type"), response.will_close), (201, "application/json", True))
        conn.request("GET", "/tickets/by-key/" + key)
        response = conn.getresponse()
        self.assertEqual((response.status, json.loads(response.read())["ticket"]), (200, created["ticket"]))

    def test_an_answer_cut_short_is_unknown_and_a_refused_connection_is_not_applied(self) -> None:
        listener = socket.socket()
        self.addCleanup(listener.close)
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        port = listener.getsockname()[1]
        answers = [b"HTTP/1.0 201 Created\r\nContent-Length: 64\r\n\r\n" + b'{"ticket": "T-1"',  # 16 of 64 bytes
                   b"HTTP/1.0 201 Created\r\nContent-Le",  # the head cut short
                   b"no answer at all\r\n\r\n{}",
                   b""]  # closed without a byte

        def serve() -> None:
            for data in answers:
                conn, _ = listener.accept()
                with conn:
                    conn.recv(65536)
                    conn.sendall(data)

        server = threading.Thread(target=serve, daemon=True)
        server.start()
        adapter = TicketAdapter(f"http://127.0.0.1:{port}", retention_seconds=None, timeout=5)
        for data in answers:
            with self.subTest(data[:40]), self.assertRaises(UnknownOutcome):
                adapter.invoke(self.key("a"), self.payload("a"), 1)
        server.join(5)
        listener.close()  # nothing listens on the port now: a refusal, so nothing was sent
        with self.assertRaises(NotApplied):
            adapter.invoke(self.key("a"), self.payload("a"), 1)


class OwnServiceTests(_ServiceCase):
    def test_a_killed_parent_leaves_no_service_behind(self) -> None:
        import signal
        import subprocess
        import sys
        import time

        folder = tempfile.mkdtemp(dir=self.tmp)
        parent = subprocess.Popen(
            [sys.executable, "-c", "import sys, time\nfrom runner.proof.ticketservice import TicketServiceProcess\n"
             "service = TicketServiceProcess(sys.argv[1]); print(service.process.pid, flush=True); time.sleep(60)",
             os.path.join(folder, "tickets.db")], stdout=subprocess.PIPE, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        assert parent.stdout is not None
        self.addCleanup(parent.stdout.close)
        self.addCleanup(parent.wait)
        self.addCleanup(parent.kill)
        served = int(parent.stdout.readline())
        parent.send_signal(signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(served, 0)
            except ProcessLookupError:
                break
            with open(f"/proc/{served}/stat", "rb") as stat:
                if stat.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    break  # ended, waiting for init to reap it
            time.sleep(0.05)
        else:
            os.kill(served, signal.SIGKILL)
            self.fail("the service outlived the process that started it")

    """Tests that need a service of their own: a crash and restart, other start-up flags."""

    def test_one_transaction_crash_before_commit_leaves_neither_ticket_nor_key(self) -> None:
        service = self.own_service()
        adapter = service.adapter(run_id=self.prefix)
        kept = adapter.invoke(self.key("kept"), self.payload("kept"), 4)
        service.set_faults(crash_before_commit=1)
        with self.assertRaises(UnknownOutcome):
            adapter.invoke(self.key("lost"), self.payload("lost"), 5)
        self.assertEqual(service.wait_exit(), 75, "the service died inside its transaction")
        service.start()  # same ledger
        self.assertEqual(service.tickets_for_key(self.key("lost")), [])
        self.assertEqual(adapter.observe(self.key("lost"), self.payload("lost")).status, "absent")
        self.assertEqual(adapter.observe(self.key("kept"), self.payload("kept")).evidence["ticket"], kept["ticket"])
        # The epoch mark of the uncommitted request was lost with it; the committed one survived.
        self.assertEqual(service.stats()["high_water"], {self.prefix: 4})
        with self.assertRaises(StaleEpoch):
            adapter.invoke(self.key("late"), self.payload("late"), 3)
        resent = adapter.invoke(self.key("lost"), self.payload("lost"), 5)
        self.assertEqual(int(resent["ticket"][2:]), int(kept["ticket"][2:]) + 1, "no id was spent on the rolled-back ticket")
        service.stop()
        db = sqlite3.connect(service.db_path)
        try:
            orphans = db.execute("SELECT COUNT(*) FROM tickets t WHERE idem_key IS NOT NULL AND NOT EXISTS (SELECT 1 FROM idempotency_keys k WHERE k.seq = t.seq)").fetchone()[0]
            dangling = db.execute("SELECT COUNT(*) FROM idempotency_keys k WHERE NOT EXISTS (SELECT 1 FROM tickets t WHERE t.seq = k.seq)").fetchone()[0]
            mode = db.execute("PRAGMA journal_mode").fetchone()[0]
        finally:
            db.close()
        self.assertEqual((orphans, dangling, mode), (0, 0, "wal"))

    def test_without_idempotency_only_the_marker_lookup_works(self) -> None:
        service = self.own_service(idempotency=False)
        key, payload = self.key("a"), self.payload("a")
        self.assertEqual(self.post(service, key, payload), (201, {"ticket": "T-000001", "key": None, "created": True}))
        self.assertEqual(self.post(service, key, payload)[1]["ticket"], "T-000002", "the key header is ignored")
        status, body = service.request("GET", f"/tickets/by-key/{key}")
        self.assertEqual((status, body["status"]), (404, "keys-not-kept"))
        self.assertEqual(service.adapter().observe(key, payload).status, "unknown", "a key adapter must not read that 404 as absent")
        stats = service.stats()
        self.assertEqual((stats["tickets"], stats["keys"], stats["duplicates"], stats["idempotency"]), (2, 0, 1, False))
        marker = service.marker_adapter(run_id=self.prefix)
        self.assertIsInstance(marker, MarkerTicketAdapter)
        seen = marker.observe(key, payload)
        self.assertEqual((seen.status, seen.evidence["count"]), ("present", 2))
        other = self.payload("b")
        self.assertEqual(marker.observe(self.key("b"), other).status, "absent")
        self.assertTrue(marker.invoke(self.key("b"), other, 1)["created"])
        self.assertEqual(marker.observe(self.key("b"), other).evidence["count"], 1)
        with self.assertRaises(Rejected):
            marker.invoke(self.key("c"), {"title": "no marker"}, 1)

    def test_start_up_flags_and_port_file(self) -> None:
        service = self.own_service(drop_after_commit=1, reject_stale_epoch=False, retention_seconds=3600)
        with open(service.port_file, encoding="ascii") as handle:
            self.assertEqual(handle.read(), f"{service.port}\n")
        self.assertEqual([n for n in os.listdir(os.path.dirname(service.db_path)) if n.endswith(".tmp")], [])
        self.assertEqual(service.stats()["faults"]["retention_seconds"], 3600.0)
        adapter = service.adapter(run_id=self.prefix)
        self.assertEqual((adapter.retention_seconds, adapter.enforces_fencing), (3600, False))
        with self.assertRaises(UnknownOutcome):
            adapter.invoke(self.key("a"), self.payload("a"), 5)
        self.assertTrue(adapter.invoke(self.key("b"), self.payload("b"), 1)["created"], "stale epochs accepted, as started")
        service.stop()
        with self.assertRaises(NotApplied):  # nothing listens: the request certainly did not arrive
            adapter.invoke(self.key("c"), self.payload("c"), 6)
        self.assertEqual(adapter.observe(self.key("c"), self.payload("c")).status, "unknown")

    def test_command_line_flags(self) -> None:
        options = parse_command_line(
            ["--db", "t.db", "--port-file", "p", "--no-idempotency", "--retention", "30", "--drop-after-commit", "2",
             "--delay-response-seconds", "1.5", "--accept-stale-epoch", "--accept-conflicting-payload", "--faults", '{"drop_lookups": 1}']
        )
        self.assertEqual((options["idempotency"], options["retention_seconds"]), (False, 30.0))
        self.assertEqual(
            options["faults"],
            {"drop_after_commit": 2, "delay_response_seconds": 1.5, "reject_stale_epoch": False, "refuse_conflicting_payload": False, "drop_lookups": 1},
        )
        faults = Faults(options["faults"])
        self.assertEqual(faults.take(["drop_after_commit", "reject_stale_epoch"]), {"drop_after_commit": True, "reject_stale_epoch": False})
        faults.take(["drop_after_commit"])
        self.assertEqual(faults.take(["drop_after_commit"]), {"drop_after_commit": False}, "two uses, then the plain value")
        with open(os.devnull, "w") as quiet, contextlib.redirect_stderr(quiet):
            with self.assertRaises(SystemExit):
                parse_command_line(["--db", "t.db", "--port-file", "p", "--faults", '{"bogus": true}'])


if __name__ == "__main__":
    unittest.main()
