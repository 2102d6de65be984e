"""The loopback helpdesk (``runner/proof/helpdesk.py``) has exactly the faults it claims: each is checked over real HTTP."""

import email.utils
import http.client
import json
import os
import subprocess
import tempfile
import threading
import unittest
from typing import Any, Dict, List, Optional, Tuple

from runner.adapters.http_answers import retry_after_seconds
from runner.proof import conformance
from runner.proof.helpdesk import Faults, Helpdesk, HelpdeskServer, conformance_factory
from tests.support.util import child_env, python

TOKEN = "desk-token-5e0c41"
ISSUE = {"external_ref": "report-1", "title": "Printer", "body": "On fire."}


class Clock:
    def __init__(self, now: float = 1_790_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class _Desk(unittest.TestCase):
    def serve(self, faults: Faults = Faults(), **options: Any) -> Helpdesk:
        self.clock = Clock()
        self.slept: List[float] = []
        options.setdefault("clock", self.clock)
        options.setdefault("sleep", self.slept.append)
        desk = Helpdesk(TOKEN, faults, **options)
        self.served = HelpdeskServer(desk)
        self.addCleanup(self.served.stop)
        return desk

    def request(self, method: str, path: str, body: Optional[Dict[str, Any]] = None, token: Optional[str] = TOKEN,
                conn: Optional[http.client.HTTPConnection] = None) -> Tuple[int, Dict[str, str], Any]:
        own = conn is None
        conn = conn or http.client.HTTPConnection("127.0.0.1", self.served.port, timeout=10)
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        try:
            conn.request(method, path, body=json.dumps(body).encode() if body is not None else None, headers=headers)
            answer = conn.getresponse()
            data = answer.read()
            return answer.status, dict(answer.getheaders()), json.loads(data) if data else None
        finally:
            if own:
                conn.close()

    def post(self, **fields: str) -> Tuple[int, Dict[str, str], Any]:
        return self.request("POST", "/api/issues", dict(ISSUE, **fields))

    def listed(self, ref: str) -> List[Dict[str, Any]]:
        status, _, found = self.request("GET", f"/api/issues?external_ref={ref}")
        self.assertEqual(status, 200)
        return found


class HelpdeskTest(_Desk):
    def test_every_post_creates_an_issue_and_needs_the_token(self) -> None:
        desk = self.serve()
        first, second = self.post(), self.post()
        self.assertEqual((first[0], second[0]), (201, 201))
        self.assertEqual((first[2]["id"], second[2]["id"]), (1, 2), "no idempotency: the same issue twice is two issues")
        self.assertEqual(first[1]["Location"], "/api/issues/1")
        self.assertEqual(desk.by_ref(), {"report-1": 2})
        for token in (None, "wrong", TOKEN + "x"):
            self.assertEqual(self.request("POST", "/api/issues", ISSUE, token=token)[0], 401)
        self.assertEqual(desk.count("unauthorized"), 3)
        self.assertEqual(self.request("POST", "/api/issues", {"title": "t"})[0], 422)
        self.assertEqual(self.request("GET", "/api/issues/2")[2]["id"], 2)
        self.assertEqual(self.request("GET", "/admin/issues", token=None)[2], {"issues": 2, "by_ref": {"report-1": 2}})

    def test_the_token_comes_from_a_file_without_its_newline(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "token")
            with open(path, "w") as handle:
                handle.write(TOKEN + "\n")
            self.assertEqual(Helpdesk.from_token_file(path).token, TOKEN)

    def test_a_created_issue_is_listed_only_after_the_lag(self) -> None:
        self.serve(Faults(lag=3.0))
        self.post(external_ref="a")
        self.post(external_ref="b")
        self.assertEqual(self.listed("a"), [])
        self.clock.now += 2.999
        self.assertEqual(self.listed("a"), [])
        self.clock.now += 0.001
        self.assertEqual([i["external_ref"] for i in self.listed("a")], ["a"])

    def test_scheduled_429s_create_nothing_and_say_when_in_both_forms(self) -> None:
        for form in ("seconds", "date"):
            desk = self.serve(Faults(schedule={2: "rate-limited"}, retry_after=form, retry_after_seconds=5))
            self.assertEqual(self.post()[0], 201)
            status, headers, _ = self.post()
            self.assertEqual(status, 429)
            if form == "seconds":
                self.assertEqual(headers["Retry-After"], "5")
            else:
                self.assertEqual(email.utils.parsedate_to_datetime(headers["Retry-After"]).timestamp(), self.clock.now + 5)
            self.assertEqual(retry_after_seconds(headers["Retry-After"], self.clock.now), 5.0)
            self.assertEqual(self.post()[0], 201)
            self.assertEqual(desk.by_ref(), {"report-1": 2})
            self.served.stop()

    def test_a_dropped_answer_comes_after_the_issue_is_created(self) -> None:
        desk = self.serve(Faults(schedule={1: "dropped"}))
        with self.assertRaises(http.client.RemoteDisconnected):
            self.post()
        self.assertEqual(desk.by_ref(), {"report-1": 1})
        self.assertEqual([k for k, _ in desk.log], ["created", "dropped"])

    def test_a_held_answer_waits_for_release_with_the_issue_created(self) -> None:
        desk = self.serve()
        desk.schedule_next("held")
        answers: List[Any] = []
        thread = threading.Thread(target=lambda: answers.append(self.post()))
        thread.start()
        self.assertTrue(desk.wait_for("held", timeout=10))
        self.assertEqual((desk.by_ref(), answers), ({"report-1": 1}, []))
        desk.release()
        thread.join(10)
        self.assertEqual(answers[0][0], 201)

    def test_latency_before_every_answer(self) -> None:
        self.serve(Faults(latency=0.25))
        self.post()
        self.listed("report-1")
        self.assertEqual(self.slept, [0.25, 0.25])

    def test_a_rate_limit_answers_429_above_n_requests_per_second(self) -> None:
        desk = self.serve(Faults(rate_limit=3))
        conn = http.client.HTTPConnection("127.0.0.1", self.served.port, timeout=10)
        self.addCleanup(conn.close)
        statuses = [self.request("GET", "/api/issues", conn=conn)[0] for _ in range(5)]
        self.assertEqual(statuses, [200, 200, 200, 429, 429])
        self.clock.now += 1.0
        self.assertEqual(self.request("POST", "/api/issues", ISSUE, conn=conn)[0], 201)
        self.assertEqual(desk.count("rate-limited"), 2)

    def test_probabilities_are_seeded(self) -> None:
        outcomes = []
        for _ in range(2):
            desk = self.serve(Faults(p_rate_limited=0.3, p_dropped=0.3, seed=11))
            row = []
            for n in range(20):
                try:
                    row.append(self.post(external_ref=f"r{n}")[0])
                except http.client.RemoteDisconnected:
                    row.append("dropped")
            outcomes.append(row)
            self.served.stop()
            self.assertEqual(sum(desk.by_ref().values()), sum(1 for o in row if o != 429))
        self.assertEqual(outcomes[0], outcomes[1])
        self.assertTrue({201, 429, "dropped"} <= set(outcomes[0]), outcomes[0])

    def test_it_runs_as_a_program(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "token")
            with open(path, "w") as handle:
                handle.write(TOKEN + "\n")
            proc = subprocess.Popen(python("-m", "runner.proof.helpdesk", "--token-file", path, "--schedule", "1:dropped"),
                                    stdout=subprocess.PIPE, env=child_env(), text=True)
            try:
                line = proc.stdout.readline()  # type: ignore[union-attr]
                self.assertTrue(line.startswith("listening http://127.0.0.1:"), line)
                port = int(line.rsplit(":", 1)[1])
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                conn.request("POST", "/api/issues", json.dumps(ISSUE), {"Authorization": f"Bearer {TOKEN}"})
                with self.assertRaises(http.client.RemoteDisconnected):
                    conn.getresponse()
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                conn.request("GET", "/admin/issues")
                self.assertEqual(json.loads(conn.getresponse().read()), {"issues": 1, "by_ref": {"report-1": 1}})
                conn.close()
            finally:
                proc.terminate()
                proc.wait(10)
                proc.stdout.close()  # type: ignore[union-attr]


class ConformanceTest(unittest.TestCase):
    def test_the_http_adapter_keeps_the_adapter_promises_on_the_helpdesk(self) -> None:
        report = conformance.run_conformance(conformance_factory, "runner.proof.helpdesk:conformance_factory")
        self.assertTrue(report["passed"], conformance.format_report(report))
        passed = {c["check"] for c in report["checks"] if c["status"] == "pass"}
        self.assertEqual(passed, {"declared_facts", "never_invoked_is_absent", "invoke_is_observed", "lost_response_is_observed"},
                         conformance.format_report(report))


if __name__ == "__main__":
    unittest.main()
