"""Items that are records: a ``.json`` file's object, a JSON Lines line, a CSV row, the named groups of a line.

* Each kind is listed, frozen and sent: keys, payloads, command arguments and
  lookups are filled from ``{field.PATH}``, through each filter.
* A payload template's value that is exactly one field placeholder keeps the
  field's JSON type; every other string, and every other placeholder, stays text.
* Bad input stops ``step start`` with one line on stderr and exit 2, and leaves
  the run's folder as it was; ``contract check`` refuses what the contract
  alone shows.
* Two records with one key, or one lookup, are refused at start, both named.
* A record is frozen with the list: edited after the start, and the run killed
  and resumed by another process, each item still sends the record it was frozen with.
* ``drive`` over ``.json`` records against the ticket service, which does not
  deduplicate, killed in the middle of a call and at an effect window, resumed
  each time by another process: one ticket per record.
"""

import json
import os
import signal
import unittest
from typing import Any, Dict, List, Optional
from unittest import mock

from runner.contract import spec as contract_spec
from runner.contract import templates
from runner.contract.text import parse_contract_text
from runner.ledger import batch
from runner.base.canonical import content_digest
from runner.base.errors import InvalidInput
from runner.proof.ticketservice import TicketServiceProcess
from runner.execution.run import Run
from runner.stores.file import RunStore
from tests.support.batch import batch_contract, script
from tests.support.cli import RunnerCli
from tests.support.fake_http import wait_until
from tests.support.util import child_env, contents, python, run, scratch_dir

#: invoke KEY PAYLOAD OUT ARG...: keeps the payload as OUT/KEY.json, the arguments as OUT/KEY.args, a line per call in
#: OUT/KEY.calls. observe KEY OUT ARG...: present when kept; the arguments are added to OUT/KEY.looked.
TARGET = r'''#!/bin/sh
if [ "$1" = invoke ]; then
    key=$2; payload=$3; out=$4; shift 4
    cp "$payload" "$out/$key.json" || exit 3
    printf '%s\n' "$@" > "$out/$key.args"
    echo call >> "$out/$key.calls"
    printf '{"kept": "%s"}\n' "$key"
    exit 0
fi
key=$2; out=$3; shift 3
printf '%s\n' "$@" >> "$out/$key.looked"
[ -e "$out/$key.json" ] && echo "{}"
'''

CRASHES = [
    {"id": "P-101", "title": "Crash in the parser", "labels": ["bug", "parser"], "count": 17, "fatal": True,
     "stack": "Traceback (most recent call last):\n  File \"parse.py\", line 9\nValueError: bad token\n",
     "meta": {"os": "linux", "build": {"n": 4}}, "owner": None},
    {"id": "N-7", "title": "Déjà vu in the network layer", "labels": [], "count": 2, "fatal": False,
     "stack": "Timeout\r\n  at socket.read\r\n", "meta": {"os": "mac", "build": {"n": 5}}, "owner": "ana"},
]


def _payload_of(out: str, key: str) -> Dict[str, Any]:
    with open(os.path.join(out, key + ".json"), encoding="utf-8") as handle:
        return json.load(handle)


def _lines_of(out: str, key: str, suffix: str) -> List[str]:
    path = os.path.join(out, key + suffix)
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as handle:
        return handle.read().splitlines()


class RecordsCase(unittest.TestCase):
    """A workspace ``root`` (the contract's), the commands target keeping what it was sent in ``root/out``."""

    def setUp(self) -> None:
        self.cli = RunnerCli(self)
        self.root = self.cli.root
        self.out = os.path.join(self.root, "out")
        os.mkdir(self.out)
        target = script(self.root, "target.sh", TARGET)
        self.commands = {"invoke": target + ["invoke", "{key}", "{payload_file}", self.out],
                         "observe": target + ["observe", "{key}", self.out]}

    def write(self, name: str, data: Any) -> str:
        path = os.path.join(self.root, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as handle:
            handle.write(data if isinstance(data, bytes) else data.encode("utf-8"))
        return path

    def contract(self, items: Any, key: str, payload: Optional[Dict[str, Any]] = None, invoke: List[str] = (),
                 observe: List[str] = (), **effects: Any) -> Dict[str, Any]:
        commands = {"invoke": self.commands["invoke"] + list(invoke),
                    "observe": self.commands["observe"] + list(observe)}
        block = batch_contract(commands, items=items, payload=payload or {"template": {"id": "{field.id}"}})
        block["steps"][0]["key"] = key
        block["effects"].update(effects)
        return block

    def drive(self, block: Dict[str, Any]) -> None:
        self.cli.init(block)
        self.assertEqual(self.cli.json("drive", "--owner", "agent", code=10)["reason"], "complete")

    def start(self, block: Dict[str, Any], code: int = 0) -> Any:
        """``step start`` by a lease holder; a refusal (exit 2) must leave every byte of the run's folder as it was."""
        self.cli.init(block)
        writer = self.cli.writer("agent", self.cli.json("lease", "acquire", "--owner", "agent")["epoch"])
        before = contents(self.cli.run_dir)
        result = writer("step", "start", "file-tickets", code=code, reason="invalid-input" if code == 2 else None)
        if code == 2:
            self.assertEqual(contents(self.cli.run_dir), before, "a refused start changes nothing durable")
        return result


class EachKindTest(RecordsCase):
    def _check_crashes(self, keys: List[str]) -> None:
        sent = [os.path.splitext(n)[0] for n in os.listdir(self.out) if n.endswith(".json")]
        self.assertEqual(sorted(sent), sorted(keys))
        first = _payload_of(self.out, keys[0])
        self.assertEqual(first, {"id": CRASHES[0]["id"], "title": CRASHES[0]["title"], "labels": ["bug", "parser"],
                                 "count": 17, "frames": CRASHES[0]["stack"].splitlines(), "os": "linux"})

    def test_a_glob_of_json_files_gives_each_file_s_object(self) -> None:
        for n, crash in enumerate(CRASHES):
            self.write(f"crashes/group-{n}.json", json.dumps(crash, indent=2))
        self.write("crashes/notes.md", "not an item: the glob lists .json files")
        payload = {"template": {"id": "{field.id}", "title": "{field.title}", "labels": "{field.labels}",
                                "count": "{field.count}", "frames": "{field.stack|lines}", "os": "{field.meta.os}"}}
        self.drive(self.contract({"glob": "crashes/*.json"}, "crash-{field.id|slug}:{stem}", payload))
        self._check_crashes(["crash-p-101:group-0", "crash-n-7:group-1"])
        self.assertEqual(self.cli.json("status")["steps"]["file-tickets"]["batch"]["items"],
                         ["crashes/group-0.json", "crashes/group-1.json"])

    def test_a_json_lines_file_gives_each_line_s_object_named_file_and_line(self) -> None:
        self.write("crashes.jsonl", json.dumps(CRASHES[0]) + "\n\n" + json.dumps(CRASHES[1]) + "\n")
        payload = {"template": {"id": "{field.id}", "title": "{field.title}", "labels": "{field.labels}",
                                "count": "{field.count}", "frames": "{field.stack|lines}", "os": "{field.meta.os}"}}
        self.drive(self.contract({"jsonl": "crashes.jsonl"}, "crash-{field.id}", payload))
        self._check_crashes(["crash-P-101", "crash-N-7"])
        status = self.cli.json("status")["steps"]["file-tickets"]["batch"]
        self.assertEqual(status["items"], ["crashes.jsonl:1", "crashes.jsonl:3"], "a blank line holds no record")
        self.assertNotIn("records", status, "status leaves the frozen records out")
        self.assertEqual(len(_state(self.root)["steps"]["file-tickets"]["batch"]["records"]), 2)

    def test_a_csv_file_gives_each_row_an_object_of_the_header_s_names(self) -> None:
        self.write("people.csv", '\ufeffid,name,note\r\n7,Ana,"two\r\nlines"\r\n\r\n9,Bo,"a, b"\r\n')
        payload = {"template": {"who": "{field.name}", "id": "{field.id}", "note": "{field.note|first_line}",
                                "row": "{item}"}}
        self.drive(self.contract({"csv": "people.csv"}, "person-{field.id}", payload))
        self.assertEqual(_payload_of(self.out, "person-7"),
                         {"who": "Ana", "id": "7", "note": "two", "row": "people.csv:2"})
        self.assertEqual(_payload_of(self.out, "person-9"),
                         {"who": "Bo", "id": "9", "note": "a, b", "row": "people.csv:5"},
                         "a row is named by its first line; a cell is text")

    def test_a_lines_file_gives_each_line_the_pattern_s_named_groups(self) -> None:
        self.write("changes.txt", "auth: passkeys for every account\n\nbilling: invoices in PDF\r\n")
        pattern = r"(?P<service>[a-z]+): (?P<change>.+)"
        payload = {"template": {"service": "{field.service}", "change": "{field.change}", "line": "{item}"}}
        key = "release:{field.service}:{field.change|slug}"
        self.drive(self.contract({"lines": "changes.txt", "pattern": pattern}, key, payload))
        self.assertEqual(_payload_of(self.out, "release:auth:passkeys-for-every-account"),
                         {"service": "auth", "change": "passkeys for every account", "line": "changes.txt:1"})
        self.assertEqual(_payload_of(self.out, "release:billing:invoices-in-pdf")["line"], "changes.txt:3")


class PlacesAndFiltersTest(RecordsCase):
    def test_fields_fill_the_key_the_payload_the_commands_and_the_lookup(self) -> None:
        self.write("crashes.jsonl", "".join(json.dumps(c) + "\n" for c in CRASHES))
        block = self.contract({"jsonl": "crashes.jsonl"}, "crash-{field.id|slug}",
                              {"command": ["python3", "-c", "import sys, json; print(json.dumps({'a': sys.argv[1:]}))",
                                           "{field.title|slug}", "{field.meta.build.n}", "{field.labels.0}"]},
                              invoke=["{field.title}", "{field.labels|json}", "{field.stack|first_line}"],
                              observe=["ref={field.id}"])
        block["steps"][0]["items"] = {"jsonl": "crashes.jsonl"}
        block["steps"][0]["key"] = "crash-{field.id|slug}-{field.count}"
        # The second crash has no label 0: the start refuses it, naming the item and the field.
        self.cli.init(block)
        writer = self.cli.writer("agent", self.cli.json("lease", "acquire", "--owner", "agent")["epoch"])
        refused = writer("step", "start", "file-tickets", code=2, reason="invalid-input")
        self.assertIn("item 1 ('crashes.jsonl:2') of step 'file-tickets': {field.labels.0}: 'labels' is a list of 0, "
                      "with no element '0'", refused.err)
        block["steps"][0]["payload"]["command"][-1] = "{field.meta.os}"
        os.rename(self.cli.run_dir, os.path.join(self.root, "refused-run"))
        self.drive(block)
        key = "crash-p-101-17"
        self.assertEqual(_payload_of(self.out, key), {"a": ["crash-in-the-parser", "4", "linux"]})
        self.assertEqual(_lines_of(self.out, key, ".args"),
                         ["Crash in the parser", '["bug","parser"]', "Traceback (most recent call last):"])
        self.assertEqual(set(_lines_of(self.out, key, ".looked")), {"ref=P-101"})
        self.assertEqual(_lines_of(self.out, "crash-n-7-2", ".args")[1], "[]")

    def test_each_filter(self) -> None:
        record = {"t": "Häagen Dazs: über\r\nsecond\n", "n": 3, "ok": False, "l": ["a", {"b": None}], "z": None}
        cases = {
            "field.t|lines": ["Häagen Dazs: über", "second"],
            "field.t|first_line": "Häagen Dazs: über",
            "field.t|slug": "haagen-dazs-uber-second",
            "field.t|first_line|slug": "haagen-dazs-uber",
            "field.l|json": '["a",{"b":null}]',
            "field.t|json": '"Häagen Dazs: über\\r\\nsecond\\n"',
            "field.n|json": "3",
            "field.n|slug": "3",
            "field.ok|first_line": "false",
            "field.l.1.b": None,
            "field.l.1": {"b": None},
        }
        for name, want in cases.items():
            self.assertEqual(templates.field_value(record, name, "it"), want, name)
        self.assertEqual(templates.field_values(record, ["field.l", "field.n", "field.z", "field.ok"], "it"),
                         {"field.l": '["a",{"b":null}]', "field.n": "3", "field.z": "null", "field.ok": "false"})
        for name, message in (("field.l|lines", "|lines needs text, and the value is a list"),
                              ("field.z|slug", "|slug needs text, and the value is null"),
                              ("field.q", "the record has no field 'q'"),
                              ("field.n.x", "'n' is a number, which holds no field 'x'"),
                              ("field.l.2", "'l' is a list of 2, with no element '2'"),
                              ("field.l.1.b.c", "'l.1.b' is null, which holds no field 'c'")):
            with self.assertRaises(InvalidInput) as caught:
                templates.field_value(record, name, "item 4 ('f.jsonl:5')")
            self.assertEqual(caught.exception.message, f"item 4 ('f.jsonl:5'): {{{name}}}: {message}")

    def test_a_value_that_is_one_field_placeholder_keeps_the_field_s_json_type(self) -> None:
        record = {"labels": ["bug"], "count": 17, "ratio": 0.5, "fatal": True, "owner": None, "meta": {"os": "linux"}}
        template = {"labels": "{field.labels}", "count": "{field.count}", "ratio": "{field.ratio}",
                    "fatal": "{field.fatal}", "owner": "{field.owner}", "meta": "{field.meta}",
                    "nested": ["{field.count}", {"x": "{field.labels}"}], "text": "{field.count} crashes",
                    "joined": "{field.labels}{field.count}", "json": "{field.meta|json}",
                    "index": "{index}", "item": "{item}", "{field.count}": "keys stay as written"}
        values = dict(templates.item_values("c.jsonl:1", 4, record, ["field.count", "field.labels", "field.meta|json"]))
        self.assertEqual(templates.fill(template, values, record), {
            "labels": ["bug"], "count": 17, "ratio": 0.5, "fatal": True, "owner": None, "meta": {"os": "linux"},
            "nested": [17, {"x": ["bug"]}], "text": "17 crashes", "joined": '["bug"]17', "json": '{"os":"linux"}',
            "index": "4", "item": "c.jsonl:1", "{field.count}": "keys stay as written"})
        self.assertEqual(templates.fill({"index": "{index}"}, {"index": 4}), {"index": "4"},
                         "without a record nothing changes: {index} stays text, as payloads made before records were")

    def test_a_json_glob_without_a_field_is_a_list_of_files_as_before(self) -> None:
        self.write("docs/a.json", "[1, 2]")
        self.write("docs/b.json", "not even JSON")
        payload = {"template": {"doc": "{item}", "line": "{first_line}"}}
        self.drive(self.contract({"glob": "docs/*.json"}, "{stem}", payload))
        self.assertEqual(_payload_of(self.out, "a"), {"doc": "docs/a.json", "line": "[1, 2]"})
        self.assertNotIn("records", self.cli.json("status")["steps"]["file-tickets"]["batch"])


class BadInputTest(RecordsCase):
    """Each refusal: exit 2, one line on stderr naming the file (and line) or the item and field, nothing recorded."""

    def refused(self, block: Dict[str, Any], *said: str) -> None:
        result = self.start(block, code=2)
        for text in said:
            self.assertIn(text, result.err)
        os.rename(self.cli.run_dir, self.cli.run_dir + f"-{len(os.listdir(self.root))}")

    def test_bad_records_are_refused_at_step_start(self) -> None:
        jsonl = {"jsonl": "c.jsonl"}
        self.write("c.jsonl", '{"id": 1}\n{"name": "no id"}\n')
        self.refused(self.contract(jsonl, "c-{field.id}"), "item 1 ('c.jsonl:2') of step 'file-tickets': {field.id}: "
                                                           "the record has no field 'id'")
        self.write("c.jsonl", '{"id": 1, "meta": "text"}\n')
        self.refused(self.contract(jsonl, "c-{field.id}", {"template": {"os": "{field.meta.os}"}}),
                     "item 0 ('c.jsonl:1') of step 'file-tickets': {field.meta.os}: 'meta' is text, which holds no "
                     "field 'os'")
        self.write("c.jsonl", '{"id": 1}\n[1, 2]\n')
        self.refused(self.contract(jsonl, "c-{field.id}"),
                     "the jsonl file 'c.jsonl', line 2: a list, not a JSON object")
        self.write("c.jsonl", '{"id": 1}\n{"id": 2,}\n')
        self.refused(self.contract(jsonl, "c-{field.id}"), "the jsonl file 'c.jsonl', line 2: not JSON: ")
        self.write("c.jsonl", '{"id": 1}\n{"id": "caf\xe9"}\n'.encode("latin-1"))
        self.refused(self.contract(jsonl, "c-{field.id}"), "the jsonl file 'c.jsonl', line 2: not UTF-8 (byte 21)")
        self.write("c.jsonl", '{"id": 1, "t": "\\ud800"}\n')
        self.refused(self.contract(jsonl, "c-{field.id}"), "hold a string that is not Unicode text")
        self.write("c.jsonl", '{"id": [1]}\n')
        self.refused(self.contract(jsonl, "c-{field.id}"),
                     "{field.id} in the key is a list; a key is made of text and numbers")
        self.write("c.csv", "id,name\n1,Ana\n2,Bo,extra\n")
        self.refused(self.contract({"csv": "c.csv"}, "c-{field.id}"),
                     "the csv file 'c.csv', line 3: 3 cells where the header names 2")
        self.write("c.csv", "id,id\n1,2\n")
        self.refused(self.contract({"csv": "c.csv"}, "c-{field.id}"),
                     "the csv file 'c.csv', line 1: the header names 'id' twice")
        self.write("c.txt", "auth: a\nno colon here\n")
        self.refused(self.contract({"lines": "c.txt", "pattern": "(?P<s>[a-z]+): (?P<c>.+)"}, "c-{field.s}",
                                   {"template": {"c": "{field.c}"}}),
                     "the lines file 'c.txt', line 2: 'no colon here' does not match the pattern")
        self.write("g/a.json", '{"id": 1}')
        self.write("g/b.json", '["not", "an", "object"]')
        self.refused(self.contract({"glob": "g/*.json"}, "c-{field.id}"),
                     "item 'g/b.json' holds a list, not a JSON object")
        self.write("g/b.json", b'{"id": "\xff"}')
        self.refused(self.contract({"glob": "g/*.json"}, "c-{field.id}"), "item 'g/b.json', line 1: not UTF-8 (byte 8)")
        self.write("c.jsonl", '{"id": 1, "title": "one line"}\n{"id": 2, "title": "two\\nlines"}\n')
        block = self.contract(jsonl, "c-{field.id}")
        block["effects"] = {"http": {"invoke": {"url": "http://127.0.0.1:9/t", "headers": {"X-Title": "{field.title}"}},
                                     "observe": {"url": "http://127.0.0.1:9/t?id={field.id}"}}}
        self.refused(block, "item 1 ('c.jsonl:2') of step 'file-tickets': the header X-Title would hold a control "
                            "character from the record's fields")

    def test_a_huge_file_of_records_is_refused_without_reading_it_all(self) -> None:
        self.write("c.jsonl", "".join(json.dumps({"id": n, "pad": "x" * 50}) + "\n" for n in range(40)))
        with mock.patch.object(batch, "MAX_RECORDS_BYTES", 1000):
            self.refused(self.contract({"jsonl": "c.jsonl"}, "c-{field.id}"), "is larger than 1,000 bytes")
            self.write("c.csv", "id,pad\n" + "".join(f"{n},{'y' * 30}\n" for n in range(25)))
            # Under the bound as a file, above it as frozen records: each row repeats the header's names.
            self.refused(self.contract({"csv": "c.csv"}, "c-{field.id}"),
                         "the records of step 'file-tickets' come to 1,")
            self.write("g/a.json", json.dumps({"id": 1, "pad": "z" * 600}))
            self.write("g/b.json", json.dumps({"id": 2, "pad": "z" * 600}))
            self.refused(self.contract({"glob": "g/*.json"}, "c-{field.id}"),
                         "the .json items up to 'g/b.json' hold more than 1,000")


class ContractCheckTest(unittest.TestCase):
    def problems(self, step: Dict[str, Any], effects: Optional[Dict[str, Any]] = None, steps: Any = None) -> List[str]:
        block = {"contract": 1, "task_id": "t", "goal": "g", "steps": steps or [step],
                 "effects": effects or {"invoke": ["x", "{key}"], "observe": ["y", "{key}"]}}
        return [p.message for p in parse_contract_text("```json run-contract\n" + json.dumps(block) + "\n```\n")[1]]

    def test_what_the_contract_alone_shows_is_refused(self) -> None:
        lines = {"lines": "c.txt", "pattern": "(?P<service>[a-z]+): (?P<change>.+)"}
        jsonl = {"jsonl": "c.jsonl"}
        records = ('needs items that are records: {"glob": "*.json"}, {"jsonl": FILE}, {"csv": FILE} or '
                   '{"lines": FILE, "pattern": REGEX}')
        cases = [
            ({"id": "s", "items": jsonl, "key": "k-{field.id|upper}"}, None,
             "step 's': {field.id|upper}: unknown filter |upper (filters: |lines, |json, |slug, |first_line)"),
            ({"id": "s", "items": {"lines": "c.txt", "pattern": "(?P<a>x"}, "key": "k-{index}"}, None,
             "step 's': items: pattern is not a regular expression: missing ), unterminated subpattern at position 0"),
            ({"id": "s", "items": {"lines": "c.txt", "pattern": r"(\w+): (.+)"}, "key": "k-{index}"}, None,
             "step 's': items: pattern names no group: write (?P<NAME>...) for each field a line holds"),
            ({"id": "s", "items": {"lines": "c.txt"}, "key": "k-{index}"}, None,
             "step 's': items: pattern must be a regular expression of at most 1000 characters with named groups"),
            ({"id": "s", "items": lines, "key": "k-{field.svc}"}, None,
             "step 's': {field.svc}: the pattern names no group 'svc' (groups: change, service)"),
            ({"id": "s", "items": lines, "key": "k-{field.service.name}"}, None,
             "step 's': {field.service.name}: a line's field 'service' is text, which holds no field 'name'"),
            ({"id": "s", "items": {"glob": "docs/*.md"}, "key": "k-{field.id}"}, None,
             f"step 's': {{field.id}} is filled from an item's record, and {records}"),
            ({"id": "s", "items": ["a.md"], "key": "{stem}"},
             {"invoke": ["x", "{key}", "{field.id}"], "observe": ["y", "{key}"]},
             f"step 's': {{field.id}} is filled from an item's record, and {records}"),
            ({"id": "s"}, {"invoke": ["x", "{key}"], "observe": ["y", "{field.id|x}"]},
             "effects: {field.id|x}: unknown filter |x"),
            ({"id": "s"}, {"invoke": ["x", "{key}"], "observe": ["y", "{field.id}"]},
             "effects: {field.id} is filled from an item's record, and no step has items"),
            ({"id": "s", "items": jsonl, "key": "k-{field.labels|lines}"}, None,
             "step 's': key: {field.labels|lines} makes a list, and a key is text"),
            ({"id": "s", "items": jsonl, "key": "k-{field.id}", "payload": {"template": {"t": "{heading}"}}}, None,
             "step 's': payload template: {heading} reads the item's file, and these items are records of one file"),
            ({"id": "s", "items": {"jsonl": "c.jsonl", "pattern": "(?P<a>.)"}, "key": "k-{index}"}, None,
             'step \'s\': items must be {"glob": PATTERN}, {"file": PATH}, {"jsonl": PATH}, {"csv": PATH} or '
             '{"lines": PATH, "pattern": REGEX}, relative to the workspace and without \'..\''),
            ({"id": "s", "items": {"csv": "../c.csv"}, "key": "k-{index}"}, None,
             "relative to the workspace and without '..'"),
            ({"id": "s", "items": jsonl, "key": "k-{field.id}", "checks": {"t": ["x", "{field.id}"]}}, None,
             "step 's': check 't': unknown placeholder {field.id} (allowed: {workspace}, {run_id})"),
        ]
        for step, effects, said in cases:
            found = self.problems(step, effects)
            self.assertTrue(any(said in p for p in found), f"{step} {effects}: {found}")

    def test_fields_are_accepted_wherever_item_placeholders_are(self) -> None:
        http = {"invoke": {"url": "https://t.example/api/{field.repo|slug}/issues",
                           "headers": {"X-Group": "{field.id}", "Authorization": "Bearer {env:T}"}},
                "observe": {"url": "https://t.example/api/issues?ref={field.id}", "pointer": "/0",
                            "many": {"url": "https://t.example/api/issues?{each:ref={field.id}}", "match": "/ref",
                                     "value": "{field.id}", "page_size": 100}}}
        step = {"id": "s", "items": {"glob": "crashes/*.json"}, "key": "c-{field.id|slug}",
                "payload": {"template": {"labels": "{field.labels}", "frames": "{field.stack|lines}"}}}
        self.assertEqual(self.problems(step, {"http": http}), [])
        commands = {"invoke": ["post", "{key}", "{field.title}"], "observe": ["find", "{field.id}"],
                    "observe_many": {"command": ["find-many", "{each}"], "match": "/ref", "value": "{field.id}"}}
        step = {"id": "s", "items": {"csv": "c.csv"}, "key": "c-{field.id}",
                "payload": {"command": ["mk", "{field.id}"]}}
        self.assertEqual(self.problems(step, commands), [])
        with scratch_dir("runner-records-check-") as root:
            path = os.path.join(root, "c.md")
            with open(path, "w", encoding="utf-8") as handle:
                steps = [{"id": "s", "items": {"lines": "c.txt", "pattern": "(?P<a"}, "key": "k-{field.a}"}]
                block = {"contract": 1, "task_id": "t", "goal": "g", "steps": steps}
                handle.write("```json run-contract\n" + json.dumps(block) + "\n```\n")
            checked = RunnerCli(self, root=root)("contract", "check", path, code=2)
            self.assertIn("c.md:2: step 's': items: pattern is not a regular expression", checked.out + checked.err)

    def test_the_spec_names_the_source(self) -> None:
        block = {"contract": 1, "task_id": "t", "goal": "g", "steps": [
            {"id": "a", "items": {"lines": "c.txt", "pattern": "(?P<s>.+)"}, "key": "{field.s}"},
            {"id": "b", "items": {"csv": "c.csv"}, "key": "{field.id}"},
            {"id": "c", "items": {"glob": "c/*.json"}, "key": "{field.id}"}]}
        made = contract_spec.read_contract(block)
        self.assertEqual([s.items for s in made.steps], [contract_spec.ItemsSpec(lines="c.txt", pattern="(?P<s>.+)"),
                                                         contract_spec.ItemsSpec(csv="c.csv"),
                                                         contract_spec.ItemsSpec(glob="c/*.json")])
        self.assertEqual([s.items.records_file for s in made.steps], ["c.txt", "c.csv", None])
        self.assertEqual([templates.reads_records(s, {}) for s in block["steps"]], [True, True, True])


class KeysTest(RecordsCase):
    def test_two_records_with_one_key_are_refused_at_start_both_named(self) -> None:
        self.write("c.jsonl", '{"id": "A 1"}\n{"id": "B"}\n{"id": "a-1"}\n')
        result = self.start(self.contract({"jsonl": "c.jsonl"}, "crash-{field.id|slug}"), code=2)
        self.assertIn("items 'c.jsonl:1' and 'c.jsonl:3' give the same key 'crash-a-1': the key template must tell "
                      "items apart", result.err)

    def test_two_records_with_one_lookup_are_refused_at_start_both_named(self) -> None:
        self.write("c.jsonl", '{"id": 1, "ref": "R"}\n{"id": 2, "ref": "S"}\n{"id": 3, "ref": "R"}\n')
        block = self.contract({"jsonl": "c.jsonl"}, "crash-{field.id}")
        block["effects"]["observe"] = ["find-ticket", "--ref", "{field.ref}"]  # no {key}: only the records tell
        result = self.start(block, code=2)
        self.assertIn("items 'c.jsonl:1' and 'c.jsonl:3' of step 'file-tickets' are looked up at the target by one "
                      "value", result.err)


def _state(root: str) -> Dict[str, Any]:
    return Run(RunStore.open(os.path.join(root, ".run"))).state


def _killed_at(test: unittest.TestCase, root: str, owner: str, window: str) -> None:
    """``drive`` of the run in ``root/.run`` in another process, killed by SIGKILL at the first pass of ``window``."""
    child = python("-m", "tests.support.scripts.http_drive_child", os.path.join(root, ".run"), owner, window)
    killed = run(child, cwd=root, env=child_env(), timeout=120)
    test.assertEqual(killed.code, -signal.SIGKILL, f"not killed at {window}: {killed.out} {killed.err[-800:]}")


class FrozenRecordTest(RecordsCase):
    """A record edited after the start, the run killed and resumed by another process: the frozen record is sent."""

    def test_an_edited_record_changes_no_payload_after_a_kill_and_a_resume(self) -> None:
        first = [{"id": n, "title": f"first title {n}"} for n in range(3)]
        self.write("c.jsonl", "".join(json.dumps(r) + "\n" for r in first))
        payload = {"template": {"title": "{field.title}", "n": "{field.id}"}}
        block = self.contract({"jsonl": "c.jsonl"}, "c-{field.id}", payload)
        self.cli.init(block)
        # Killed once item 0's call returned and before its answer was recorded: its effect may exist at the target.
        _killed_at(self, self.root, "first", "effect:after-call")
        self.assertEqual(_state(self.root)["effects"]["c-0"]["state"], "started")
        edited = [dict(r, title=f"edited title {r['id']}") for r in first] + [{"id": 3, "title": "added"}]
        self.write("c.jsonl", "".join(json.dumps(r) + "\n" for r in edited))
        # What `next` observes of the step once nothing is unresolved: the source changed, the frozen list is used.
        changed = batch.items_changed(_state(self.root), "file-tickets") or {}
        self.assertIn("the source now lists 4 items (1 added, 0 removed, 3 with another record) where 3 were frozen",
                      changed.get("what"))
        Run(RunStore.open(self.cli.run_dir)).break_lease("supervisor", "first was killed")
        resumed = self.cli.child("drive", "--owner", "second", "--json", code=10)
        self.assertEqual(resumed.json["reason"], "complete")
        effects = _state(self.root)["effects"]
        self.assertEqual(sorted(effects), ["c-0", "c-1", "c-2"], "the record added after the start is no item")
        for record in first:
            key = f"c-{record['id']}"
            sent = {"title": record["title"], "n": record["id"]}
            self.assertEqual(_payload_of(self.out, key), sent, "the record as frozen at the start")
            self.assertEqual(effects[key]["payload_digest"], content_digest(sent))
            self.assertEqual(_lines_of(self.out, key, ".calls"), ["call"], f"{key} sent once")


class DriveTicketServiceTest(unittest.TestCase):
    """``drive`` over ``.json`` records with ``effects.http`` against the ticket service: a ticket for every POST."""

    GROUPS = 6

    def test_killed_in_a_call_and_at_a_window_each_record_files_one_ticket(self) -> None:
        with scratch_dir("runner-records-tickets-") as root, \
                TicketServiceProcess(os.path.join(root, "tickets.db"), idempotency=False) as service:
            for n in range(self.GROUPS):
                crash = {"id": f"G-{n}", "title": f"Crash group {n}", "labels": ["crash", f"area-{n % 2}"],
                         "count": n * 3, "stack": f"Error {n}\n  at frame one\n  at frame two\n"}
                os.makedirs(os.path.join(root, "crashes"), exist_ok=True)
                with open(os.path.join(root, "crashes", f"{n:02d}.json"), "w", encoding="utf-8") as handle:
                    json.dump(crash, handle)
            payload = {"marker": "crash-{field.id}", "title": "{field.title}", "labels": "{field.labels}",
                       "count": "{field.count}", "frames": "{field.stack|lines}", "summary": "{field.stack|first_line}"}
            block = {
                "contract": 1, "task_id": "crash-tickets", "goal": "One ticket per crash group.", "workspace": ".",
                "steps": [{"id": "file", "items": {"glob": "crashes/*.json"}, "key": "crash-{field.id|slug}",
                           "payload": {"template": {"payload": payload}}, "next": "done"}],
                "effects": {"http": {"invoke": {"url": service.url + "/tickets", "headers": {"X-Crash": "{field.id}"}},
                                     "observe": {"url": service.url + "/tickets?marker=crash-{field.id}",
                                                 "pointer": "/tickets/0"}},
                            "timeout_seconds": 20, "settle_seconds": 0.2},
                "retry": {"base_seconds": 0.2, "cap_seconds": 0.4},
                "lease": {"ttl_seconds": 60},
            }
            cli = RunnerCli(self, block, root=root)
            # The service commits the first ticket and holds its answer: drive is killed while it waits for it.
            service.set_faults(delay_response_seconds={"value": 60, "times": 1})
            first = cli.spawn("drive", "--owner", "first")
            self.assertTrue(wait_until(lambda: service.stats()["requests"].get("delayed", 0) == 1, timeout=60),
                            "the service never held an answer")
            first.kill()
            first.wait(30)
            self.assertEqual([(k, e["state"]) for k, e in _state(root)["effects"].items()], [("crash-g-0", "started")])
            self.assertEqual(service.stats()["tickets"], 1)
            Run(RunStore.open(cli.run_dir)).break_lease("supervisor", "first was killed in a call")
            _killed_at(self, root, "second", "effect:after-call")
            Run(RunStore.open(cli.run_dir)).break_lease("supervisor", "second was killed at a window")
            self.assertEqual(cli.child("drive", "--owner", "third", "--json", code=10).json["reason"], "complete")
            stats = service.stats()
            self.assertEqual((stats["tickets"], stats["duplicates"]), (self.GROUPS, 0), stats)
            effects = _state(root)["effects"]
            self.assertEqual(sorted(effects), [f"crash-g-{n}" for n in range(self.GROUPS)])
            self.assertEqual({e["state"] for e in effects.values()}, {"verified"})
            for n in range(self.GROUPS):
                found = service.tickets_for_marker(f"crash-G-{n}")
                self.assertEqual(len(found), 1, f"group {n}")
                status, ticket = service.request("GET", f"/tickets/{found[0]['ticket']}")
                self.assertEqual(ticket["payload"], {"marker": f"crash-G-{n}", "title": f"Crash group {n}",
                                                     "labels": ["crash", f"area-{n % 2}"], "count": n * 3,
                                                     "frames": [f"Error {n}", "  at frame one", "  at frame two"],
                                                     "summary": f"Error {n}"})


if __name__ == "__main__":
    unittest.main()
