"""The loopback stand-ins (tests/support/standins/), each started as a real process: its answers, faults and counts.

The recipes are tested against these programs, so what each promises is held
here: the tracker's pages, lag and rate limits as GitHub announces them; the
webhook's secret URL that nothing reads back; the mail server's replies and
the messages it keeps; the REST API's lookup by key; the model API's bill, which counts every
request it processed, answered or not. A fault answers before
or after the operation as its name says, and the counts a test asserts "no
duplicate" with survive the stand-in's own kill.
"""

import http.client
import json
import os
import shutil
import smtplib
import socket
import subprocess
import tempfile
import time
import unittest
from email.message import EmailMessage
from typing import Any, Dict, List, Optional, Tuple

from tests.support.standins import common, models, rest, smtpd, tracker, webhook
from tests.support.fake_http import wait_until
from tests.support.standins.harness import StandIn
from tests.support.util import REPO_ROOT, child_env, python

TOKEN = "ghp_standin_token_1"


def issue(title: str, body: str) -> Dict[str, Any]:
    return {"title": title, "body": body, "labels": ["crash"]}


def name(fault: Optional[Dict[str, Any]]) -> Optional[str]:
    return None if fault is None else fault["fault"]


class FaultQueueTests(unittest.TestCase):
    """The queue every stand-in takes its faults from, and the orders a test leaves in DIR."""

    def test_faults_are_taken_in_order_by_operation_and_counted(self) -> None:
        faults = common.Faults([{"fault": "429", "on": "create", "times": 2}, {"fault": "503"}],
                               default_on={"slow": "data"})
        self.assertEqual(name(faults.take("list")), "503", "a fault without 'on' applies to any operation")
        self.assertIsNone(faults.take("list"), "the 429s are for creating")
        self.assertEqual([name(faults.take("create")) for _ in range(2)], ["429", "429"])
        self.assertIsNone(faults.take("create"), "taken as many times as it said")
        faults.replace([{"fault": "slow"}])
        self.assertIsNone(faults.take("mail"), "a fault of the stand-in's own applies where it says")
        self.assertEqual(name(faults.take("data")), "slow")
        for bad, words in (({"on": "create"}, "a 'fault' name"), ({"fault": "429", "times": 0}, "'times'"),
                           ({"fault": "429", "retry_after": "soon"}, "'retry_after'")):
            with self.assertRaises(ValueError) as caught:
                faults.replace([bad])
            self.assertIn(words, str(caught.exception))

    def test_an_order_left_in_dir_replaces_or_adds_before_the_next_fault(self) -> None:
        folder = tempfile.mkdtemp(prefix="standin-faults-")
        self.addCleanup(shutil.rmtree, folder, True)
        faults = common.Faults([{"fault": "421"}], inbox=os.path.join(folder, common.INBOX))
        common.post_faults(folder, [{"fault": "451"}])
        common.post_faults(folder, [{"fault": "550"}], add=True)
        self.assertEqual([f["fault"] for f in faults.pending()], ["451", "550"])
        self.assertEqual(os.listdir(os.path.join(folder, common.INBOX)), [], "each order is taken once")

    def test_state_is_written_whole(self) -> None:
        folder = tempfile.mkdtemp(prefix="standin-state-")
        self.addCleanup(shutil.rmtree, folder, True)
        state = common.State(folder, {"items": []})
        state.change(lambda s: s["items"].append(1))
        self.assertEqual(common.read_state(folder), {"items": [1]})
        self.assertEqual(sorted(os.listdir(folder)), [common.STATE_FILE], "no temporary file is left")
        self.assertEqual(common.State(folder, {"items": [], "more": 0}).data, {"items": [1], "more": 0})


class ProgramTests(unittest.TestCase):
    def test_a_stand_in_started_to_exit_with_its_parent_stops_when_that_process_is_killed(self) -> None:
        folder = tempfile.mkdtemp(prefix="standin-orphan-")
        self.addCleanup(shutil.rmtree, folder, True)
        starter = ("import subprocess, sys, time\n"
                   "child = subprocess.Popen([sys.executable, '-S', '-m', 'tests.support.standins.rest',\n"
                   "                          '--port', '0', '--state', sys.argv[1], '--exit-with-parent'],\n"
                   "                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)\n"
                   "print(child.stdout.readline().decode().strip(), child.pid, flush=True)\n"
                   "time.sleep(60)\n")
        parent = subprocess.Popen(python("-c", starter, folder), cwd=REPO_ROOT, env=child_env(), stdout=subprocess.PIPE)
        assert parent.stdout is not None
        url, pid = parent.stdout.readline().decode().split()
        self.assertTrue(url.startswith("http://127.0.0.1:"), url)
        parent.kill()
        parent.communicate(timeout=10)
        self.assertTrue(wait_until(lambda: gone(int(pid)), timeout=5),
                        "the stand-in outlived the process that started it")


def gone(pid: int) -> bool:
    """Whether ``pid`` has ended (a zombie waiting for its new parent to reap it counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False


class TrackerTests(unittest.TestCase):
    """One tracker for the class; each test uses a repository of its own."""

    server: StandIn

    @classmethod
    def setUpClass(cls) -> None:
        cls.server = StandIn("tracker")

    @classmethod
    def tearDownClass(cls) -> None:
        cls.server.stop()

    def setUp(self) -> None:
        self.server.faults([], lag=0, rate={"limit": 5000, "window": 3600}, hold_clock=False)
        self.repo = f"/repos/acme/{self.id().rsplit('.', 1)[-1][:80]}/issues"

    def create(self, n: int) -> List[int]:
        numbers = []
        for i in range(n):
            sent = issue(f"crash {i}", f"group-{self.repo}-{i}\nstack")
            status, _, body = self.server.request("POST", self.repo, sent)
            self.assertEqual(status, 201, body)
            numbers.append(json.loads(body)["number"])
        return numbers

    def listed(self, query: str) -> Tuple[List[int], str]:
        status, headers, body = self.server.request("GET", f"{self.repo}?{query}")
        self.assertEqual(status, 200, body)
        return [i["number"] for i in json.loads(body)], headers.get("link", "")

    def test_issues_are_listed_newest_first_in_pages_with_a_link_to_the_next(self) -> None:
        self.assertEqual(self.create(5), [1, 2, 3, 4, 5])
        numbers, link = self.listed("state=all&per_page=2")
        self.assertEqual(numbers, [5, 4])
        self.assertIn("per_page=2&page=2>; rel=\"next\"", link)
        self.assertIn("page=3>; rel=\"last\"", link)
        numbers, link = self.listed("state=all&per_page=2&page=3")
        self.assertEqual(numbers, [1])
        self.assertNotIn('rel="next"', link)
        self.assertIn('rel="prev"', link)
        self.assertEqual(self.listed("state=all&per_page=500"), ([5, 4, 3, 2, 1], ""), "at most 100 a page")
        self.assertEqual(self.listed("state=closed")[0], [])
        status, _, body = self.server.request("GET", f"{self.repo}/3")
        self.assertEqual((status, json.loads(body)["body"]), (200, f"group-{self.repo}-2\nstack"))
        self.assertEqual(self.server.request("GET", f"{self.repo}/9")[0], 404)

    def test_a_new_issue_shows_in_listings_only_after_the_lag_but_reads_at_once(self) -> None:
        # On the tracker's held clock: the listing is asked before the lag is out however slow the machine is.
        self.server.faults([], lag=0.3, hold_clock=True)
        [number] = self.create(1)
        self.assertEqual(self.listed("state=all")[0], [], "not listed yet")
        self.assertEqual(self.server.request("GET", f"{self.repo}/{number}")[0], 200)
        self.server.faults([], advance=0.25)
        self.assertEqual(self.listed("state=all")[0], [], "not listed before the lag is out")
        self.server.faults([], advance=0.1)
        self.assertEqual(self.listed("state=all")[0], [number])

    def test_every_answer_carries_the_rate_limit_and_a_spent_limit_is_a_403_until_its_reset(self) -> None:
        # On the tracker's held clock: the three requests fall in one window however slow the machine is.
        self.server.faults([], rate={"limit": 3, "window": 0.4}, hold_clock=True)
        remaining = []
        for _ in range(3):
            status, headers, _ = self.server.request("GET", f"{self.repo}?state=all")
            remaining.append((status, headers["x-ratelimit-remaining"], headers["x-ratelimit-limit"]))
        self.assertEqual(remaining, [(200, "2", "3"), (200, "1", "3"), (200, "0", "3")])
        status, headers, body = self.server.request("POST", self.repo, issue("t", "spent"))
        self.assertEqual((status, headers["x-ratelimit-remaining"]), (403, "0"))
        self.assertIn("API rate limit exceeded", json.loads(body)["message"])
        self.assertGreater(int(headers["x-ratelimit-reset"]), self.server.faults([], add=True)["clock"], "a reset to come")
        self.assertEqual(self.server.count()["by_first_line"].get("spent"), None, "nothing created")
        self.server.faults([], advance=0.45)
        self.assertEqual(self.server.request("GET", f"{self.repo}?state=all")[0], 200, "a new window")
        self.server.faults([{"fault": "primary", "seconds": 0.2}], rate={"limit": 100, "window": 3600})
        self.assertEqual([self.server.request("GET", f"{self.repo}?state=all")[0] for _ in range(2)], [403, 403])
        self.server.faults([], advance=0.25)
        self.assertEqual(self.server.request("GET", f"{self.repo}?state=all")[0], 200)

    def test_a_secondary_limit_is_a_403_with_retry_after_and_a_429_names_its_wait_and_neither_creates(self) -> None:
        self.server.faults([{"fault": "secondary", "on": "create", "retry_after": 2},
                            {"fault": "429", "retry_after": 3}])
        status, headers, body = self.server.request("POST", self.repo, issue("t", "limited"))
        self.assertEqual((status, headers["retry-after"]), (403, "2"))
        self.assertIn("secondary rate limit", json.loads(body)["message"])
        status, headers, _ = self.server.request("POST", self.repo, issue("t", "limited"))
        self.assertEqual((status, headers["retry-after"]), (429, "3"))
        self.assertNotIn("limited", self.server.count()["by_first_line"])

    def test_a_proxys_502_and_a_reset_come_after_the_issue_was_created(self) -> None:
        self.server.faults([{"fault": "502-after", "on": "create"}, {"fault": "reset-after", "on": "create"}])
        before = self.server.requests().get("create", {})
        status, headers, body = self.server.request("POST", self.repo, issue("t", "proxied"))
        self.assertEqual((status, headers["content-type"]), (502, "text/html"))
        with self.assertRaises((ConnectionError, http.client.HTTPException)):
            self.server.request("POST", self.repo, issue("t", "proxied"))
        self.assertEqual(self.listed("state=all")[0], [2, 1])
        self.assertEqual(self.server.count()["duplicates"].get("proxied"), 2)
        self.assertEqual(tracker.count_by_first_line(self.server.state)["proxied"], 2)
        after = self.server.requests()["create"]
        grown = {k: n - before.get(k, 0) for k, n in after.items() if n != before.get(k, 0)}
        self.assertEqual(grown, {"502": 1, "0": 1})

    def test_refusals_of_bad_requests(self) -> None:
        self.assertEqual(self.server.request("POST", self.repo, {"body": "no title"})[0], 422)
        self.assertEqual(self.server.request("POST", self.repo, b"{not json")[0], 400)
        self.assertEqual(self.server.request("GET", "/repos/acme")[0], 404)
        status, _, body = self.server.request("POST", "/_faults", {"faults": [{"on": "create"}]})
        self.assertEqual(status, 400, body)


class TrackerProcessTests(unittest.TestCase):
    def test_a_token_is_required_faults_come_from_flags_and_issues_survive_the_trackers_kill(self) -> None:
        flag = json.dumps({"fault": "503", "on": "create"})
        with StandIn("tracker", ["--token", TOKEN, "--fault", flag]) as server:
            path = "/repos/acme/survive/issues"
            self.assertEqual(server.request("POST", path, issue("t", "a"))[0], 401)
            bearer = {"Authorization": f"Bearer {TOKEN}"}
            self.assertEqual(server.request("POST", path, issue("t", "a"), bearer)[0], 503)
            self.assertEqual(server.request("POST", path, issue("t", "a"), {"Authorization": f"token {TOKEN}"})[0], 201)
            server.kill()
            server.start()
            self.assertEqual(server.request("POST", path, issue("t", "a"), bearer)[0], 503,
                             "the flags' faults again, at each start")
            status, _, body = server.request("POST", path, issue("t", "a"), bearer)
            self.assertEqual((status, json.loads(body)["number"]), (201, 2), "numbers go on after a restart")
            self.assertEqual(server.count()["duplicates"], {"a": 2})
            self.assertEqual([i["number"] for i in tracker.issues(server.state)], [1, 2])


class WebhookTests(unittest.TestCase):
    server: StandIn

    @classmethod
    def setUpClass(cls) -> None:
        cls.server = StandIn("webhook")

    @classmethod
    def tearDownClass(cls) -> None:
        cls.server.stop()

    def setUp(self) -> None:
        self.server.faults([])
        self.text = f"deploy of {self.id().rsplit('.', 1)[-1]}"

    def post(self, body: Any, path: str = "", headers: Any = None) -> Tuple[int, bytes]:
        status, _, data = self.server.request("POST", path or self.server.url, body, headers)
        return status, data

    def test_a_message_posted_to_the_secret_url_is_delivered_and_nothing_reads_it_back(self) -> None:
        self.assertRegex(self.server.url, r"\Ahttp://127\.0\.0\.1:[0-9]+/hooks/T0/B0/[A-Za-z0-9]{24}\Z")
        self.assertEqual(self.post({"text": self.text}), (200, b"ok"))
        form = "payload=" + json.dumps({"text": self.text + " (form)"})
        self.assertEqual(self.post(form.encode(), headers={"Content-Type": "application/x-www-form-urlencoded"}),
                         (200, b"ok"))
        self.assertEqual(self.post({"text": self.text}, path="/hooks/T0/B0/guessed"), (404, b"no_service"))
        self.assertEqual(self.server.request("GET", self.server.url)[:3:2], (405, b"invalid_method"))
        self.assertEqual(self.post({"txt": "x"}), (400, b"no_text"))
        self.assertEqual(self.post(b"not json"), (400, b"invalid_payload"))
        delivered = [m["text"] for m in webhook.messages(self.server.state)]
        self.assertEqual(delivered[-2:], [self.text, self.text + " (form)"])
        self.assertEqual(webhook.count_by_text(self.server.state)[self.text], 1)

    def test_429_delivers_nothing_and_500_or_a_reset_after_delivering_count_as_duplicates(self) -> None:
        self.server.faults([{"fault": "429", "retry_after": 4}, {"fault": "500-after"}, {"fault": "reset-after"}])
        status, headers, _ = self.server.request("POST", self.server.url, {"text": self.text})
        self.assertEqual((status, headers["retry-after"]), (429, "4"))
        self.assertNotIn(self.text, self.server.count()["by_text"])
        self.assertEqual(self.post({"text": self.text})[0], 500)
        with self.assertRaises((ConnectionError, http.client.HTTPException)):
            self.post({"text": self.text})
        self.assertEqual(self.server.count()["duplicates"], {self.text: 2})

    def test_the_secret_url_survives_a_restart_and_can_be_given(self) -> None:
        with StandIn("webhook", ["--secret", "s3cret-path"]) as given:
            self.assertTrue(given.url.endswith("/hooks/T0/B0/s3cret-path"), given.url)
        self.assertEqual(self.post({"text": self.text})[0], 200)
        made = self.server.url.rsplit("/", 1)[1]
        self.server.kill()
        self.server.start()
        self.assertEqual(self.server.url.rsplit("/", 1)[1], made, "a secret made at the first start is kept in DIR")
        self.assertEqual(webhook.count_by_text(self.server.state)[self.text], 1)


class MailServerTests(unittest.TestCase):
    server: StandIn

    @classmethod
    def setUpClass(cls) -> None:
        cls.server = StandIn("smtpd", ["--auth", "user:pass"])

    @classmethod
    def tearDownClass(cls) -> None:
        cls.server.stop()

    def setUp(self) -> None:
        self.server.faults([])

    def client(self) -> smtplib.SMTP:
        client = smtplib.SMTP(self.server.host, self.server.port, local_hostname="tester", timeout=5)
        self.addCleanup(client.close)
        return client

    def message(self, message_id: str) -> EmailMessage:
        mail = EmailMessage()
        mail["From"], mail["To"], mail["Subject"] = "a@example.test", "b@example.test", "s"
        mail["Message-ID"] = message_id
        mail.set_content(".starts with a dot\nsecond line\n")
        return mail

    def test_a_session_keeps_each_message_with_its_envelope_and_lists_message_ids(self) -> None:
        client = self.client()
        code, said = client.ehlo()
        self.assertEqual(code, 250)
        self.assertIn(b"AUTH PLAIN", said)
        self.assertEqual([client.noop()[0], client.rset()[0], client.verify("b")[0]], [250, 250, 252])
        self.assertEqual(client.login("user", "pass")[0], 235)
        client.send_message(self.message("<session.1@test>"), to_addrs=["b@example.test", "c@example.test"])
        client.send_message(self.message("<session.1@test>"))
        self.assertEqual(client.quit()[0], 221)
        self.assertEqual(smtpd.count_by_message_id(self.server.state)["<session.1@test>"], 2)
        mail = smtpd.read_messages(self.server.state)[smtpd.message_ids(self.server.state).index("<session.1@test>")]
        self.assertEqual(mail["X-Envelope-To"], "<b@example.test>, <c@example.test>")
        self.assertEqual(mail.get_content(), ".starts with a dot\nsecond line\n")

    def test_commands_out_of_order_or_unknown_are_refused(self) -> None:
        client = self.client()
        self.assertEqual(client.docmd("MAIL FROM:<a@example.test>")[0], 503, "EHLO first")
        client.ehlo()
        self.assertEqual(client.docmd("MAIL FROM:<a@example.test>")[0], 530, "the login first")
        self.assertEqual(client.docmd("AUTH PLAIN AHVzZXIAd3Jvbmc=")[0], 535)
        self.assertEqual(client.docmd("AUTH PLAIN AHVzZXIAcGFzcw==")[0], 235)
        self.assertEqual(client.docmd("RCPT TO:<b@example.test>")[0], 503, "MAIL first")
        self.assertEqual(client.docmd("MAIL FROM:<a@example.test>")[0], 250)
        self.assertEqual(client.docmd("DATA")[0], 503, "RCPT first")
        self.assertEqual(client.docmd("FROB")[0], 500)
        self.assertEqual(client.docmd("STARTTLS")[0], 503, "no certificate: no TLS")

    def test_421_before_data_451_and_550_deliver_nothing_and_a_drop_after_the_dot_delivers(self) -> None:
        answers: List[Tuple[str, Any]] = []
        for fault, message_id in (("421", "<f.421@test>"), ("451", "<f.451@test>"), ("550", "<f.550@test>"),
                                  ("drop-after-dot", "<f.drop@test>")):
            self.server.faults([{"fault": fault}])
            client = self.client()
            client.login("user", "pass")
            try:
                client.send_message(self.message(message_id))
                answers.append((fault, "sent"))
            except smtplib.SMTPResponseException as exc:
                answers.append((fault, exc.smtp_code))
            except smtplib.SMTPRecipientsRefused as exc:
                answers.append((fault, exc.recipients["b@example.test"][0]))
            except smtplib.SMTPServerDisconnected:
                answers.append((fault, "no answer"))
        self.assertEqual(answers, [("421", 421), ("451", 451), ("550", 550), ("drop-after-dot", "no answer")])
        held = smtpd.count_by_message_id(self.server.state)
        self.assertEqual([held.get(m, 0) for m in ("<f.421@test>", "<f.451@test>", "<f.550@test>", "<f.drop@test>")],
                         [0, 0, 0, 1])

    def test_messages_survive_the_servers_kill_and_numbering_goes_on(self) -> None:
        client = self.client()
        client.login("user", "pass")
        client.send_message(self.message("<before.kill@test>"))
        client.quit()
        before = smtpd.message_paths(self.server.state)
        self.server.kill()
        self.server.start()
        client = self.client()
        client.login("user", "pass")
        client.send_message(self.message("<after.kill@test>"))
        after = smtpd.message_paths(self.server.state)
        self.assertEqual(after[:-1], before)
        self.assertEqual(int(os.path.basename(after[-1])[:6]), len(before) + 1)
        self.assertEqual(smtpd.message_ids(self.server.state)[-2:], ["<before.kill@test>", "<after.kill@test>"])


class RestTests(unittest.TestCase):
    server: StandIn

    @classmethod
    def setUpClass(cls) -> None:
        cls.server = StandIn("rest")

    @classmethod
    def tearDownClass(cls) -> None:
        cls.server.stop()

    def setUp(self) -> None:
        self.server.faults([], lag=0, hold_clock=False)
        self.key = self.id().rsplit(".", 1)[-1]

    def create(self, method: str = "POST", **fields: Any) -> Tuple[int, Dict[str, Any]]:
        status, _, body = self.server.request(method, "/items", dict(fields, external_id=self.key))
        return status, json.loads(body) if body else {}

    def found(self) -> List[int]:
        return [item["id"] for item in self.server.json("GET", f"/items?external_id={self.key}")]

    def test_items_are_made_without_idempotency_and_found_by_their_key(self) -> None:
        status, first = self.create(title="one")
        self.assertEqual(status, 201)
        self.assertEqual(self.create("PUT", title="one")[0], 201, "the same body twice: two items")
        second = self.found()[1]
        self.assertEqual(self.found(), [first["id"], second])
        self.assertEqual(self.server.count()["duplicates"][self.key], 2)
        self.assertEqual(rest.count_by_external_id(self.server.state)[self.key], 2)
        status, _, body = self.server.request("PUT", f"/items/{first['id']}", {"title": "changed"})
        changed = json.loads(body)
        self.assertEqual((status, changed["title"], changed["external_id"]), (200, "changed", self.key))
        self.assertEqual(self.server.json("GET", f"/items/{first['id']}")["title"], "changed")
        self.assertEqual(self.server.request("GET", "/items/99999")[0], 404)
        self.assertEqual(self.server.request("POST", "/items", {"title": "no key"})[0], 422)
        self.assertEqual(self.server.json("GET", "/items?external_id=nobody"), [])

    def test_a_new_item_shows_in_the_lookup_only_after_the_lag_but_reads_at_once(self) -> None:
        # On the stand-in's held clock: the lookup is asked before the lag is out however slow the machine is.
        self.server.faults([], lag=0.3, hold_clock=True)
        _, item = self.create()
        self.assertEqual(self.found(), [])
        self.assertEqual(self.server.json("GET", f"/items/{item['id']}")["external_id"], self.key)
        self.server.faults([], advance=0.25)
        self.assertEqual(self.found(), [], "not found before the lag is out")
        self.server.faults([], advance=0.1)
        self.assertEqual(self.found(), [item["id"]])

    def test_the_clock_stands_while_held_moves_only_when_advanced_and_is_the_wall_clocks_when_let_go(self) -> None:
        self.assertEqual(self.server.request("POST", "/_faults", {"advance": 1})[0], 400, "a wall clock is not moved")
        held = self.server.faults([], hold_clock=True)
        self.assertTrue(held["clock_held"])
        self.assertEqual(self.server.faults([], hold_clock=True)["clock"], held["clock"], "held, it stands")
        self.assertEqual(self.server.faults([], advance=86400)["clock"], held["clock"] + 86400)
        self.assertEqual(self.server.request("POST", "/_faults", {"advance": -1})[0], 400)
        let_go = self.server.faults([], hold_clock=False)
        self.assertFalse(let_go["clock_held"])
        self.assertLess(let_go["clock"], held["clock"] + 86400, "the wall clock again, a day behind the held time")

    def test_faults_before_create_nothing_and_after_one_item(self) -> None:
        self.server.faults([{"fault": "503", "on": "create", "retry_after": 2},
                            {"fault": "reset-before", "on": "create"}, {"fault": "500-after", "on": "create"},
                            {"fault": "stall-after", "on": "create", "seconds": 0.2}])
        status, headers, _ = self.server.request("POST", "/items", {"external_id": self.key})
        self.assertEqual((status, headers["retry-after"]), (503, "2"))
        with self.assertRaises((ConnectionError, http.client.HTTPException)):
            self.create()
        self.assertEqual(self.found(), [], "nothing made before either answer")
        self.assertEqual(self.create()[0], 500)
        began = time.monotonic()
        with self.assertRaises((ConnectionError, http.client.HTTPException, socket.timeout)):
            self.create()
        self.assertGreaterEqual(time.monotonic() - began, 0.15, "held before the connection closed")
        self.assertEqual(len(self.found()), 2, "both made, neither answered with a receipt")

    def test_a_token_is_required_when_given(self) -> None:
        with StandIn("rest", ["--token", TOKEN]) as server:
            self.assertEqual(server.request("GET", "/items")[0], 401)
            self.assertEqual(server.request("GET", "/items", headers={"Authorization": f"Bearer {TOKEN}"})[0], 200)

    def test_a_key_in_the_url_is_required_when_given(self) -> None:
        with StandIn("rest", ["--key", "k-31e9"]) as server:
            self.assertEqual(server.request("GET", "/items")[0], 401)
            self.assertEqual(server.request("POST", "/items?key=other", {"external_id": "a"})[0], 401)
            self.assertEqual(server.request("POST", "/items?key=k-31e9", {"external_id": "a"})[0], 201)
            self.assertEqual(server.request("GET", "/items?external_id=a&key=k-31e9")[0], 200)


class ModelsTests(unittest.TestCase):
    server: StandIn

    @classmethod
    def setUpClass(cls) -> None:
        cls.server = StandIn("models", ["--key", "sk-standin"])

    @classmethod
    def tearDownClass(cls) -> None:
        cls.server.stop()

    def setUp(self) -> None:
        self.server.faults([])
        self.messages = [{"role": "system", "content": "Summarise."},
                         {"role": "user", "content": f"# {self.id().rsplit('.', 1)[-1]}\n\nSome text."}]

    def complete(self, key: str = "sk-standin") -> Tuple[int, Dict[str, str], bytes]:
        return self.server.request("POST", "/v1/chat/completions", {"model": "m", "messages": self.messages},
                                   {"Authorization": f"Bearer {key}", "Content-Type": "application/json"})

    def billed(self) -> int:
        return models.billed_by_prompt(self.server.state).get(models.prompt_digest(self.messages), 0)

    def test_a_completion_answers_with_its_usage_and_is_billed_once(self) -> None:
        self.assertTrue(self.server.url.endswith("/v1"), self.server.url)
        status, _, body = self.complete()
        answer = json.loads(body)
        self.assertEqual(status, 200)
        content = answer["choices"][0]["message"]["content"]
        self.assertIn("test_a_completion_answers_with_its_usage_and_is_billed_once", content)
        usage = answer["usage"]
        self.assertEqual(usage["completion_tokens"], models.tokens(content))
        self.assertEqual(usage["total_tokens"], usage["prompt_tokens"] + usage["completion_tokens"])
        self.assertEqual(self.billed(), 1)
        entry = models.bill(self.server.state)[-1]
        self.assertEqual({k: entry[k] for k in usage}, usage, "the bill holds what the answer said")
        again = json.loads(self.complete()[2])["choices"][0]["message"]["content"]
        self.assertNotEqual(again, content, "two calls of one prompt answer apart")
        self.assertEqual(self.billed(), 2)

    def test_a_wrong_key_and_a_bad_body_are_refused_and_billed_nothing(self) -> None:
        self.assertEqual(self.complete("sk-other")[0], 401)
        status, _, body = self.server.request("POST", "/v1/chat/completions", {"model": "m"},
                                              {"Authorization": "Bearer sk-standin"})
        self.assertEqual((status, json.loads(body)["error"]["type"]), (400, "invalid_request_error"))
        self.assertEqual(self.billed(), 0)

    def test_429_and_500_bill_nothing_a_slow_answer_and_a_dropped_one_are_billed(self) -> None:
        self.server.faults([{"fault": "429", "retry_after": 3}, {"fault": "500"},
                            {"fault": "slow", "seconds": 0.3}, {"fault": "reset-after"}])
        status, headers, _ = self.complete()
        self.assertEqual((status, headers["retry-after"]), (429, "3"))
        self.assertEqual(self.complete()[0], 500)
        self.assertEqual(self.billed(), 0, "refused before the work: nothing billed")
        began = time.monotonic()
        self.assertEqual(self.complete()[0], 200)
        self.assertGreaterEqual(time.monotonic() - began, 0.25, "the slow answer came late")
        with self.assertRaises((ConnectionError, http.client.HTTPException)):
            self.complete()
        self.assertEqual(self.billed(), 2, "the answer lost after the work is billed as well")
        count = self.server.count()
        self.assertEqual(count["billed"], len(models.bill(self.server.state)))
        self.assertGreaterEqual(count["billed_again"], 1)


if __name__ == "__main__":
    unittest.main()
