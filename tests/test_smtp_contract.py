"""The contract's ``effects.smtp`` section: checked by ``contract check`` (its problems on their lines), read into a
frozen :class:`~runner.contract.spec.SmtpSpec`, and built into the SMTP adapter for each item, with a record's
fields in its addresses. A mail server cannot be read back: ``observe`` may only be ``"none"``."""

import json
import os
import unittest
from typing import Any, Dict

from runner.adapters.factory import adapter_for
from runner.adapters.smtp import SmtpAdapter
from runner.contract.spec import SmtpSpec, read_contract
from runner.contract.text import parse_contract_text
from runner.stores.file import RunStore
from tests.support.cli import RunnerCli
from tests.support.util import contract_markdown, scratch_dir, write_contract

SECTION = {"host": "127.0.0.1", "port": 2525, "security": "none", "from": "Releases <releases@example.test>",
           "to": "{field.email}", "message_id": "<{key_text}.{digest}@mail.example.test>", "not_now_seconds": 5}


def contract(**effects: Any) -> Dict[str, Any]:
    smtp = effects.pop("smtp", SECTION)
    return {
        "contract": 1, "task_id": "mail-run", "goal": "One message per row of people.csv, each exactly once.",
        "workspace": ".",
        "steps": [{"id": "mail", "items": {"csv": "people.csv"}, "key": "hello-{field.id}",
                   "payload": {"template": {"subject": "Hello {field.name}", "text": "Hello."}}, "next": "done"}],
        "effects": dict({"smtp": smtp}, **effects),
    }


def problems_of(block: Dict[str, Any]) -> list:
    _, problems = parse_contract_text(contract_markdown(json.dumps(block, indent=2)))
    return [p.message for p in problems]


class SmtpSectionTest(unittest.TestCase):
    def test_a_section_passes_and_is_read_into_a_frozen_spec_of_a_target_that_cannot_be_read_back(self) -> None:
        for block in (contract(), contract(smtp=dict(SECTION, observe="none")), contract(observe="none")):
            self.assertEqual(problems_of(block), [])
            effects = read_contract(block).effects
            self.assertFalse(effects.readable, "a mail server is never looked up")
            self.assertTrue(effects.performs_effects)
            self.assertEqual(effects.smtp, SmtpSpec(host="127.0.0.1", sender="Releases <releases@example.test>",
                                                    security="none", port=2525, to=("{field.email}",),
                                                    message_id="<{key_text}.{digest}@mail.example.test>",
                                                    not_now_seconds=5.0))
        self.assertEqual(read_contract(contract(smtp={"host": "mail.example.test", "from": "a@example.test"})).effects
                         .smtp, SmtpSpec(host="mail.example.test", sender="a@example.test", port=587))
        step = read_contract(contract()).steps[0]
        self.assertEqual((step.fields, step.reads_records), (("field.email", "field.id", "field.name"), True))

    def test_contract_check_refuses_an_observe_other_than_none_and_another_target_beside_it(self) -> None:
        for block, words in (
                (contract(smtp=dict(SECTION, observe="imap")),
                 'effects.smtp.observe: a mail server cannot be read back: leave observe out, or write "none"'),
                (contract(observe=["lookup", "{key}"]), "effects: smtp and observe exclude each other"),
                (contract(http={"invoke": {"url": "http://x.test/"}, "observe": {"url": "http://x.test/{key}"}}),
                 "effects: smtp and http exclude each other"),
                (contract(smtp=dict(SECTION, password="hunter22", username="u")),
                 "effects.smtp.password: {env:NAME} or {file:PATH}, read when the message is sent"),
                (contract(smtp=dict(SECTION, attachments=[])), "effects.smtp.attachments: not a field of the section"),
                (contract(smtp=dict(SECTION, to="{field.email}, {recipient}")),
                 "effects.smtp.to: unknown placeholder {recipient}"),
                (contract(smtp="smtp.example.test"), "effects: 'smtp' must be an object"),
                (contract(observe_first=True), "effects: observe_first looks each item up before its first call: "
                                               'a target with "observe": "none" cannot be read back')):
            with self.subTest(words=words):
                found = problems_of(block)
                self.assertTrue(any(p.startswith(words) for p in found), found)

    def test_contract_check_names_the_line_of_the_field(self) -> None:
        with scratch_dir("runner-smtp-contract-") as root:
            path = write_contract(os.path.join(root, "c.md"), contract(smtp=dict(SECTION, security="tls")))
            out = RunnerCli(self, root=root)("contract", "check", path, code=2)
            with open(path, encoding="utf-8") as handle:
                line = next(n for n, text in enumerate(handle, 1) if '"security": "tls"' in text)
            self.assertIn(f"c.md:{line}: effects.smtp.security: one of starttls, ssl, none, not 'tls'", out.err)

    def test_each_item_gets_the_adapter_with_its_record_in_the_addresses(self) -> None:
        with scratch_dir("runner-smtp-contract-") as root:
            with open(os.path.join(root, "people.csv"), "w", encoding="utf-8") as handle:
                handle.write("id,name,email\n7,Ada,ada@example.test\n")
            cli = RunnerCli(self, root=root)
            cli.init(contract())
            epoch = cli.json("lease", "acquire", "--owner", "agent")["epoch"]
            cli.writer("agent", epoch)("step", "start", "mail")
            store = RunStore.open(cli.run_dir)
            self.addCleanup(store.close)
            state = store.state
            adapter = adapter_for(state, "hello-7")
            self.assertIsInstance(adapter, SmtpAdapter)
            assert isinstance(adapter, SmtpAdapter)
            self.assertEqual((adapter.host, adapter.port, adapter.to), ("127.0.0.1", 2525, ["ada@example.test"]))
            self.assertFalse(adapter.readable)
            self.assertRegex(adapter.message_id("hello-7"), r"\A<hello-7\.[0-9a-f]{16}@mail\.example\.test>\Z")


if __name__ == "__main__":
    unittest.main()
