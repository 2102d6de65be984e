"""The SMTP target (runner/adapters/smtp.py) against the mail stand-in (tests/support/standins/smtpd.py), a process.

Each answer the server can give is mapped as runner/target.py says: 250
after the final "." a receipt with the Message-ID made from the key; a 4xx,
"not now" after the contract's delay; a 5xx, refused for good; a connection
lost after the final ".", an unknown outcome; lost before it, nothing
delivered. The lookup cannot tell, ever. A sending process killed after the
final "." and resumed in another process leaves one message, and an outcome
the runner calls unknown and never settles by sending again.
"""

import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import unittest
from typing import Any, Dict, List, Optional
from unittest import mock

from runner.adapters import smtp as smtp_module
from runner.adapters.smtp import DEFAULT_MESSAGE_ID, SmtpAdapter, key_text, smtp_problems
from runner.base.errors import InvalidInput, NeedsReconciliation
from runner.calls import inflight
from runner.calls.target import NotApplied, Rejected, UnknownOutcome
from runner.execution.run import Run
from runner.stores.file import RunStore
from tests.support.fake_http import free_port, have_openssl, make_certificates, wait_until
from tests.support.scripts.smtp_worker import payload_for, spec_for
from tests.support.standins import smtpd
from tests.support.standins.harness import StandIn
from tests.support.util import REPO_ROOT, child_env, python

PASSWORD = "pw-for-the-stand-in-7"
RUN_ID = "mail-run-1"


def section(server: StandIn, **more: Any) -> Dict[str, Any]:
    spec = {"host": server.host, "port": server.port, "security": "none", "username": "releases",
            "password": "{env:STANDIN_SMTP_PASSWORD}", "from": "Releases <releases@example.test>",
            "to": ["team@example.test"], "not_now_seconds": 0.5}
    spec.update(more)
    return {k: v for k, v in spec.items() if v is not None}


MESSAGE = {"subject": "released: 2.3.0", "text": "The release is out.\n.a line that starts with a dot\n"}


class SmtpAnswerTests(unittest.TestCase):
    """One stand-in with a login required; each test sends under keys of its own."""

    server: StandIn

    @classmethod
    def setUpClass(cls) -> None:
        cls.server = StandIn("smtpd", ["--auth", f"releases:{PASSWORD}"])

    @classmethod
    def tearDownClass(cls) -> None:
        cls.server.stop()

    def setUp(self) -> None:
        self.server.faults([])
        self.tmp = tempfile.mkdtemp(prefix="smtp-adapter-")
        self.addCleanup(shutil.rmtree, self.tmp, True)

    def adapter(self, timeout: float = 5.0, environ: Optional[Dict[str, str]] = None, **more: Any) -> SmtpAdapter:
        return SmtpAdapter(section(self.server, **more), values={"run_id": RUN_ID}, workspace=self.tmp, timeout=timeout,
                           environ={"STANDIN_SMTP_PASSWORD": PASSWORD} if environ is None else environ)

    def key(self, name: str) -> str:
        return f"{self.id().rsplit('.', 1)[-1][:60]}:{name}"

    def held(self, message_id: str) -> int:
        return smtpd.count_by_message_id(self.server.state).get(message_id, 0)

    def sent_under(self, adapter: SmtpAdapter, key: str, faults: List[Dict[str, Any]]) -> BaseException:
        """What invoking ``key`` raised with ``faults`` queued (the test fails if it returned)."""
        self.server.faults(faults)
        with self.assertRaises((NotApplied, Rejected, UnknownOutcome)) as caught:
            adapter.invoke(key, MESSAGE, 1)
        return caught.exception

    # -- 250: a receipt -----------------------------------------------------------------------------
    def test_a_message_is_sent_once_with_the_message_id_of_its_key_and_a_receipt(self) -> None:
        adapter, key = self.adapter(), self.key("release@2.3.0")
        receipt = adapter.invoke(key, dict(MESSAGE, cc="Ops <ops@example.test>", bcc=["audit@example.test"]), 1)
        message_id = adapter.message_id(key)
        self.assertEqual(receipt["message_id"], message_id)
        self.assertTrue(receipt["reply"].startswith("250 2.0.0 Ok: queued as"), receipt)
        self.assertEqual(receipt["from"], "releases@example.test")
        self.assertEqual(receipt["recipients"], ["team@example.test", "ops@example.test", "audit@example.test"])
        self.assertEqual(self.held(message_id), 1)
        mail = smtpd.read_messages(self.server.state)[smtpd.message_ids(self.server.state).index(message_id)]
        self.assertEqual(mail["X-Runner-Key"], key)
        self.assertEqual((mail["From"], mail["To"], mail["Cc"], mail["Bcc"]),
                         ("Releases <releases@example.test>", "team@example.test", "Ops <ops@example.test>", None))
        self.assertEqual(mail["Subject"], MESSAGE["subject"])
        self.assertEqual(mail.get_content(), MESSAGE["text"], "a line that starts with a dot arrives as it was")
        self.assertIn("with ESMTPA;", mail["Received"], "sent after the login")
        self.assertEqual(mail["Return-Path"], "<releases@example.test>")
        self.assertEqual(mail["X-Envelope-To"], "<team@example.test>, <ops@example.test>, <audit@example.test>")
        self.assertNotIn(PASSWORD, repr(receipt))

    def test_the_message_id_is_the_same_for_a_key_and_run_in_any_adapter_and_differs_between_runs(self) -> None:
        key = "release:2.3.0@eu..west."
        first, again = self.adapter(), self.adapter()
        self.assertEqual(first.message_id(key), again.message_id(key))
        self.assertRegex(first.message_id(key), r"\A<release-2\.3\.0-eu-\.west-\.[0-9a-f]{16}@runner>\Z")
        self.assertEqual(key_text(key), "release-2.3.0-eu-.west-")
        other_run = SmtpAdapter(section(self.server), values={"run_id": "another-run"},
                                environ={"STANDIN_SMTP_PASSWORD": PASSWORD})
        self.assertNotEqual(other_run.message_id(key), first.message_id(key))
        self.assertNotEqual(first.message_id("k1"), first.message_id("k2"))
        own = self.adapter(message_id="<{key_text}.{digest}.{field.team-id|slug}@mail.example.test>")
        own.values["field.team-id|slug"] = "item-7"
        self.assertRegex(own.message_id("k1"), r"\A<k1\.[0-9a-f]{16}\.item-7@mail\.example\.test>\Z")
        self.assertEqual(DEFAULT_MESSAGE_ID, "<{key_text}.{digest}@runner>")
        for template, words in (("<fixed@runner>", "holds {digest} or {key_text}"),
                                ("{digest}@runner", "does not make <left@right>"),
                                ("<a b{digest}@runner>", "does not make <left@right>")):
            with self.assertRaises(InvalidInput) as caught:
                self.adapter(message_id=template)
            self.assertIn(words, str(caught.exception))
        with self.assertRaises(InvalidInput) as unknown:
            self.adapter(message_id="<{key_text}.{nothing}@runner>")
        self.assertIn("message_id: unknown placeholder {nothing}", str(unknown.exception))
        unfilled = self.adapter(message_id="<{key_text}.{field.team}@runner>")  # no record gave the field
        with self.assertRaises(Rejected):
            unfilled.invoke("k1", MESSAGE, 1)

    # -- 4xx: not now ----------------------------------------------------------------------------------
    def test_421_before_data_is_not_now_after_the_contracts_delay_and_nothing_is_delivered(self) -> None:
        adapter, key = self.adapter(), self.key("a")
        caught = self.sent_under(adapter, key, [{"fault": "421", "on": "mail"}])
        self.assertIsInstance(caught, NotApplied)
        self.assertEqual(caught.retry_after, 0.5)  # type: ignore[attr-defined]
        self.assertIn("MAIL FROM with '421 4.3.2 Service not available, try again later'", str(caught))
        self.assertEqual(self.held(adapter.message_id(key)), 0)
        self.assertTrue(adapter.invoke(key, MESSAGE, 1)["reply"].startswith("250"), "the same key goes once it may")
        self.assertEqual(self.held(adapter.message_id(key)), 1)

    def test_451_after_data_is_not_now_and_nothing_is_delivered(self) -> None:
        adapter, key = self.adapter(), self.key("a")
        caught = self.sent_under(adapter, key, [{"fault": "451"}])
        self.assertIsInstance(caught, NotApplied)
        self.assertIn("answered the message with '451", str(caught))
        self.assertEqual(self.held(adapter.message_id(key)), 0)

    def test_a_recipient_refused_for_now_holds_back_the_whole_message(self) -> None:
        adapter, key = self.adapter(), self.key("a")
        full = {"fault": "reply", "on": "rcpt", "code": 452, "text": "4.2.2 Mailbox full"}
        caught = self.sent_under(adapter, key, [full])
        self.assertIsInstance(caught, NotApplied)
        self.assertIn("RCPT TO:<team@example.test> with '452 4.2.2 Mailbox full'", str(caught))
        self.assertEqual(self.held(adapter.message_id(key)), 0)

    # -- 5xx: refused for good -------------------------------------------------------------------------
    def test_a_550_refusal_is_rejected_and_one_refused_recipient_refuses_the_message(self) -> None:
        adapter, key = self.adapter(), self.key("a")
        self.server.faults([{"fault": "reply", "on": "rcpt", "code": 250, "text": "2.1.5 Ok"}, {"fault": "550"}])
        with self.assertRaises(Rejected) as caught:
            adapter.invoke(key, dict(MESSAGE, to=["one@example.test", "two@example.test"]), 1)
        self.assertIn("RCPT TO:<two@example.test> with '550 5.1.1 Recipient address rejected", str(caught.exception))
        self.assertEqual(self.held(adapter.message_id(key)), 0)
        caught_after = self.sent_under(adapter, self.key("b"), [{"fault": "554"}])
        self.assertIsInstance(caught_after, Rejected)
        self.assertIn("answered the message with '554 5.7.1 Message refused'", str(caught_after))
        self.assertEqual(self.held(adapter.message_id(self.key("b"))), 0)

    def test_a_refused_login_is_not_now_after_the_backoff_and_never_shows_the_password(self) -> None:
        secret = os.path.join(self.tmp, "smtp-password")
        with open(secret, "w") as handle:
            handle.write("not-the-password-9\n")
        adapter, key = self.adapter(password="{file:smtp-password}"), self.key("a")
        with self.assertRaises(NotApplied) as caught:
            adapter.invoke(key, MESSAGE, 1)
        self.assertIsNone(caught.exception.retry_after, "the contract's backoff, not a 4xx's delay")
        self.assertIn("535 5.7.8", str(caught.exception))
        self.assertNotIn("not-the-password-9", str(caught.exception))
        with open(secret, "w") as handle:
            handle.write(PASSWORD + "\n")
        self.assertTrue(adapter.invoke(key, MESSAGE, 1)["reply"].startswith("250"), "read again at each call")
        with self.assertRaises(InvalidInput) as missing:
            self.adapter(environ={})
        self.assertEqual(str(missing.exception),
                         "effects.smtp.password: the environment variable STANDIN_SMTP_PASSWORD is not set")

    # -- connections lost -------------------------------------------------------------------------------
    def test_a_connection_lost_after_the_final_dot_is_an_unknown_outcome_and_the_message_is_there(self) -> None:
        adapter, key = self.adapter(), self.key("a")
        caught = self.sent_under(adapter, key, [{"fault": "drop-after-dot"}])
        self.assertIsInstance(caught, UnknownOutcome)
        self.assertIn("the whole message was sent", str(caught))
        self.assertEqual(self.held(adapter.message_id(key)), 1)

    def test_no_answer_within_the_calls_time_after_the_final_dot_is_unknown_and_ends_at_the_deadline(self) -> None:
        # The call's time covers the whole session: it is long enough for every command before the final "." even
        # on a loaded machine (a deadline met before it is "nothing sent", rightly), and the stall is far longer.
        adapter, key = self.adapter(timeout=2.0), self.key("a")
        began = time.monotonic()
        caught = self.sent_under(adapter, key, [{"fault": "stall-after-dot", "seconds": 30}])
        self.assertLess(time.monotonic() - began, 2.0 + 1.5)
        self.assertIsInstance(caught, UnknownOutcome)
        self.assertIn("at the call's deadline", str(caught))
        self.assertEqual(self.held(adapter.message_id(key)), 1)

    def test_the_deadline_right_after_the_final_dot_is_unknown_whenever_it_falls(self) -> None:
        # The watchdog is fired by the test once the server holds the whole message and has not answered, whatever
        # the machine's load: the window where the outcome must be unknown, never "not sent".
        made: List[smtp_module._Watchdog] = []

        class Held(smtp_module._Watchdog):
            def __init__(self, smtp: Any, end: float) -> None:
                super().__init__(smtp, end + 3600)  # the test says when the deadline falls
                made.append(self)

        adapter, key = self.adapter(timeout=60), self.key("a")
        self.server.faults([{"fault": "stall-after-dot", "seconds": 30}])
        raised: List[BaseException] = []

        def send() -> None:
            try:
                adapter.invoke(key, MESSAGE, 1)
            except BaseException as exc:  # kept for the test's thread
                raised.append(exc)

        with mock.patch.object(smtp_module, "_Watchdog", Held):
            sender = threading.Thread(target=send)
            sender.start()
            self.assertTrue(wait_until(lambda: self.held(adapter.message_id(key)) == 1, 20))
            made[0]._fire()
            sender.join(20)
        self.assertFalse(sender.is_alive())
        self.assertEqual(len(raised), 1)
        self.assertIsInstance(raised[0], UnknownOutcome)
        self.assertIn("the whole message was sent, and the connection was lost at the call's deadline", str(raised[0]))

    def test_a_reply_after_the_final_dot_that_is_no_refusal_is_unknown_never_not_sent(self) -> None:
        for code in (650, 999, 354, 199):
            adapter, key = self.adapter(), self.key(f"c{code}")
            caught = self.sent_under(adapter, key, [{"fault": "reply", "on": "dot", "code": code, "text": "odd"}])
            self.assertIsInstance(caught, UnknownOutcome, code)
            self.assertIn(f"answered the message with '{code} odd', which says neither delivered nor not", str(caught))

    def test_a_connection_lost_or_too_slow_before_the_message_delivers_nothing_and_is_not_now(self) -> None:
        adapter = self.adapter(timeout=0.4)
        for stage in ("greeting", "mail", "rcpt", "data"):
            key = self.key(stage)
            caught = self.sent_under(adapter, key, [{"fault": "drop", "on": stage}])
            self.assertIsInstance(caught, NotApplied, stage)
            self.assertEqual(self.held(adapter.message_id(key)), 0, stage)
        caught = self.sent_under(adapter, self.key("slow"), [{"fault": "slow", "on": "data", "seconds": 2}])
        self.assertIsInstance(caught, NotApplied, "the watchdog closed the connection while DATA was not answered")
        self.assertEqual(self.held(adapter.message_id(self.key("slow"))), 0)
        nobody = SmtpAdapter(dict(section(self.server), port=free_port()), values={"run_id": RUN_ID},
                             environ={"STANDIN_SMTP_PASSWORD": PASSWORD})
        with self.assertRaises(NotApplied) as refused:
            nobody.invoke(self.key("refused"), MESSAGE, 1)
        self.assertIn("no connection to", str(refused.exception))

    def test_nothing_is_sent_past_the_registered_calls_deadline(self) -> None:
        adapter, key = self.adapter(), self.key("a")
        now = [1_790_000_000.0]
        registry = inflight.Registry(os.path.join(self.tmp, "calls"), clock=lambda: now[0])
        call = registry.register(key, "invoke", 1, timeout=5)
        now[0] = call.record["deadline"] + 0.001  # the process was stopped, and continued after its deadline
        with inflight.calling(registry, call):
            with self.assertRaises(NotApplied) as caught:
                adapter.invoke(key, MESSAGE, 1)
        self.assertIn("deadline passed before connecting", str(caught.exception))
        self.assertEqual(self.held(adapter.message_id(key)), 0)

    # -- what is refused before any connection -------------------------------------------------------------
    def test_a_payload_that_is_no_message_is_rejected_before_any_connection(self) -> None:
        nowhere = SmtpAdapter(dict(section(self.server), port=free_port()), values={"run_id": RUN_ID},
                              environ={"STANDIN_SMTP_PASSWORD": PASSWORD})
        for payload, words in (({"text": "no subject"}, "'subject' is a string"),
                               (dict(MESSAGE, subject="two\nlines"), "cannot be written as a message"),
                               (dict(MESSAGE, to="not an address"), "is not a list of addresses"),
                               (dict(MESSAGE, to=[]), "has no recipient"),
                               (dict(MESSAGE, headers={"Message-ID": "<x@y>"}), "may not set 'Message-ID'"),
                               (dict(MESSAGE, attachments=[]), "holds attachments"),
                               (["not", "an", "object"], "a JSON object")):
            with self.assertRaises(Rejected, msg=words) as caught:
                nowhere.invoke("k1", payload, 1)  # type: ignore[arg-type]
            self.assertIn(words, str(caught.exception))

    def test_the_lookup_cannot_tell_and_names_the_message_id_to_look_for(self) -> None:
        adapter, key = self.adapter(), self.key("a")
        adapter.invoke(key, MESSAGE, 1)
        seen = adapter.observe(key, MESSAGE)
        self.assertEqual(seen.status, "unknown", "present or absent would be a guess")
        self.assertEqual((seen.evidence["observe"], seen.evidence["message_id"]), ("none", adapter.message_id(key)))
        self.assertEqual(adapter.observe(self.key("never-sent"), MESSAGE).status, "unknown")

    def test_the_section_is_checked(self) -> None:
        good = {"host": "smtp.example.test", "from": "a@example.test", "username": "u", "password": "{file:.smtp}"}
        self.assertEqual(smtp_problems(good), [])
        for change, words in (({"password": "hunter22"}, "password: {env:NAME} or {file:PATH}"),
                              ({"security": "none"}, "security: 'none' sends the password in clear"),
                              ({"security": "tls"}, "security: one of starttls, ssl, none"),
                              ({"username": None}, "password: given with a username, and only then"),
                              ({"to": ["a@example.test", "{env:RECIPIENT}"]},
                               "to: {env:...} and {file:...} are read in username and password only"),
                              ({"from": "Releases, Ops <ops@example.test>"},
                               "from: 'Releases, Ops <ops@example.test>' is not"),
                              ({"cc": "nobody"}, "cc: 'nobody' is not a list of addresses"),
                              ({"port": 70000}, "port: a whole number"),
                              ({"from": None}, "from: the sender's address, required"),
                              ({"not_now_seconds": -1}, "not_now_seconds"),
                              ({"attachments": []}, "attachments: not a field of the section")):
            spec = {k: v for k, v in dict(good, **change).items() if v is not None}
            problems = smtp_problems(spec)
            self.assertTrue(any(p.startswith(words) for p in problems), f"{change}: {problems}")
        self.assertEqual(smtp_problems(dict(good, host="127.0.0.1", security="none")), [], "in clear to loopback only")
        self.assertEqual(smtp_problems(dict(good, to="{field.email}", port=2525)), [],
                         "an item's address is checked when its message is made")


@unittest.skipUnless(have_openssl(), "openssl is not installed: no test certificate can be made")
class SmtpTlsTests(unittest.TestCase):
    """STARTTLS and TLS from the first byte, with a private CA the contract names; never a password in clear."""

    tmp = ""
    ca = ""
    starttls: StandIn
    implicit: StandIn

    @classmethod
    def setUpClass(cls) -> None:
        cls.tmp = tempfile.mkdtemp(prefix="smtp-tls-")
        cls.ca, cert, key = make_certificates(cls.tmp)
        tls = ["--tls-cert", cert, "--tls-key", key, "--auth", f"releases:{PASSWORD}"]
        cls.starttls = StandIn("smtpd", tls)
        cls.implicit = StandIn("smtpd", tls + ["--ssl"])

    @classmethod
    def tearDownClass(cls) -> None:
        cls.starttls.stop()
        cls.implicit.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def adapter(self, server: StandIn, **more: Any) -> SmtpAdapter:
        return SmtpAdapter(section(server, **more), values={"run_id": RUN_ID}, workspace=self.tmp,
                           environ={"STANDIN_SMTP_PASSWORD": PASSWORD})

    def test_starttls_and_ssl_send_under_tls_with_the_contracts_ca(self) -> None:
        for server, security in ((self.starttls, "starttls"), (self.implicit, "ssl")):
            adapter = self.adapter(server, security=security, ca_file="ca.pem")
            receipt = adapter.invoke(f"tls:{security}", MESSAGE, 1)
            self.assertTrue(receipt["reply"].startswith("250"), receipt)
            mail = smtpd.read_messages(server.state)[-1]
            self.assertEqual(mail["Message-ID"], adapter.message_id(f"tls:{security}"))
            self.assertIn("with ESMTPSA;", mail["Received"], f"{security}: under TLS, after the login")

    def test_an_unknown_ca_or_a_server_without_starttls_sends_nothing(self) -> None:
        untrusted = self.adapter(self.starttls, security="starttls")
        with self.assertRaises(NotApplied) as caught:
            untrusted.invoke("tls:untrusted", MESSAGE, 1)
        self.assertIn("CERTIFICATE_VERIFY_FAILED", str(caught.exception))
        with StandIn("smtpd") as plain:
            with self.assertRaises(NotApplied) as missing:
                SmtpAdapter(section(plain, security="starttls", ca_file="ca.pem"), workspace=self.tmp,
                            environ={"STANDIN_SMTP_PASSWORD": PASSWORD}).invoke("tls:plain", MESSAGE, 1)
            self.assertIn("offers no STARTTLS", str(missing.exception))
            self.assertEqual(smtpd.message_ids(plain.state), [])
        self.assertNotIn(untrusted.message_id("tls:untrusted"), smtpd.message_ids(self.starttls.state))


class SmtpKillTests(unittest.TestCase):
    """A sending process killed after the final "." and resumed in another: one message, an unknown outcome."""

    def test_a_sender_killed_after_the_final_dot_leaves_one_message_and_the_resumed_run_never_sends_again(self) -> None:
        tmp = tempfile.mkdtemp(prefix="smtp-kill-")
        self.addCleanup(shutil.rmtree, tmp, True)
        run_dir = os.path.join(tmp, "run")
        RunStore.create(run_dir, "mail-kill", {"contract": 1, "task_id": "mail-kill", "goal": "one message per key",
                                               "steps": [{"id": "mail"}], "effects": {"max_attempts": 3},
                                               "retry": {"base_seconds": 0.01, "cap_seconds": 0.02}})
        key = "release:2.3.0"
        with StandIn("smtpd") as server:
            server.faults([{"fault": "stall-after-dot", "seconds": 30}])
            worker = python("-m", "tests.support.scripts.smtp_worker", "--run", run_dir, "--host", server.host,
                            "--port", str(server.port), "--key", key)
            first = subprocess.Popen(worker, cwd=REPO_ROOT, env=child_env(), stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
            try:
                self.assertTrue(wait_until(lambda: smtpd.message_ids(server.state), timeout=20),
                                "the first sender never got its message to the server")
                time.sleep(0.05)  # the server holds its answer: the sender waits for it
            finally:
                first.send_signal(signal.SIGKILL)
                first.communicate(timeout=10)
            self.assertEqual(first.returncode, -signal.SIGKILL)
            self.assertEqual(Run.open(run_dir).state["effects"][key]["state"], "started")

            # Resumed here, in another process than the one killed, as a drive of the run would: the lease taken
            # again by its owner, the effect driven from what the ledger holds.
            run = Run.open(run_dir)
            run.acquire("worker", 60.0)
            adapter = SmtpAdapter(spec_for(server.host, server.port), values={"run_id": "mail-kill"}, timeout=5.0)
            with self.assertRaises(NeedsReconciliation) as stopped:
                run.drive_effect(key, payload_for(key), adapter)
            # It cannot be read back: never looked up, the run stops for a person and names what they run.
            self.assertIn("the target cannot be read back", str(stopped.exception))
            self.assertIn(f"effect verify {key} --by NAME --evidence JSON", str(stopped.exception))
            effect = Run.open(run_dir).state["effects"][key]
            self.assertEqual((effect["state"], effect["attempts"]), ("uncertain", 1), effect)
            message_id = adapter.message_id(key)
            self.assertEqual(smtpd.count_by_message_id(server.state), {message_id: 1})
            mail = smtpd.read_messages(server.state)[0]
            self.assertEqual(mail["Subject"], payload_for(key)["subject"])


if __name__ == "__main__":
    unittest.main()
