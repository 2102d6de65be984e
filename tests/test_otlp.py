"""The run as an OpenTelemetry trace (``events --otlp``), checked by hand and by the official protobuf package.

By hand: one line and one trace per run, hex ids of the right length, every
parent present, the same run giving the same file, crashes, refusals and
denials as ERROR status, content (receipts, evidence, reasons) only with
``--with-content``. Officially, in the real suite only (``tests/support/real.py``):
``opentelemetry-proto``, installed by this test into a virtual environment in
the real tests' cache shared by every Python that runs the suite, parses each
line into an ``ExportTraceServiceRequest``.
"""

import fcntl
import json
import os
import subprocess
import sys
import unittest
import venv
from typing import Any, Dict, List, Optional, Tuple

from tests.support import real as _real
from tests.support.timeline_runs import UNCERTAIN_KEY, crashed_run, small_run
from tests.support.util import REPO_ROOT, run_cli, scratch_dir

_PARSE = r"""
import base64, json, sys
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

spans = orphans = bad_ids = traces = 0
for line in open(sys.argv[1], encoding="utf-8"):
    data = json.loads(line)
    # OTLP JSON writes ids as hex; protobuf's own JSON mapping reads bytes as base64.
    for resource in data["resourceSpans"]:
        for scope in resource["scopeSpans"]:
            for span in scope["spans"]:
                for name in ("traceId", "spanId", "parentSpanId"):
                    if span.get(name):
                        span[name] = base64.b64encode(bytes.fromhex(span[name])).decode()
                for link in span.get("links", []):
                    link["traceId"] = base64.b64encode(bytes.fromhex(link["traceId"])).decode()
                    link["spanId"] = base64.b64encode(bytes.fromhex(link["spanId"])).decode()
    request = json_format.Parse(json.dumps(data), ExportTraceServiceRequest())
    known, parents, trace_ids = set(), [], set()
    for resource in request.resource_spans:
        for scope in resource.scope_spans:
            for span in scope.spans:
                spans += 1
                known.add(span.span_id)
                trace_ids.add(span.trace_id)
                bad_ids += len(span.trace_id) != 16 or len(span.span_id) != 8
                if span.parent_span_id:
                    parents.append(span.parent_span_id)
                parents.extend(link.span_id for link in span.links)
    traces += len(trace_ids)
    orphans += sum(1 for parent in parents if parent not in known)
print(json.dumps({"spans": spans, "orphans": orphans, "bad_ids": bad_ids, "traces": traces}))
"""


def proto_python() -> Tuple[Optional[str], str]:
    """``(python, "")`` of a virtual environment holding opentelemetry-proto, or ``(None, why not)``."""
    root = os.path.join(_real.cache_root(), "opentelemetry-proto-venv")
    python = os.path.join(root, "bin", "python")
    with open(os.path.join(_real.cache_root(), "opentelemetry-proto.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one installer at a time; the others then find it ready
        if os.path.exists(os.path.join(root, "ready")):
            return python, ""
        try:
            venv.EnvBuilder(clear=True, with_pip=True).create(root)
        except Exception as exc:  # no ensurepip in this Python, for one
            return None, f"cannot create a virtual environment: {exc}"
        env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1", PIP_RETRIES="2", PIP_TIMEOUT="30")
        env.pop("PYTHONPATH", None)
        try:
            proc = subprocess.run([python, "-m", "pip", "install", "--quiet", "opentelemetry-proto"], env=env, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
        except subprocess.TimeoutExpired:
            return None, "pip install opentelemetry-proto took more than 10 minutes"
        if proc.returncode != 0:
            last = [line for line in proc.stdout.decode("utf-8", "replace").splitlines() if line.strip()][-1:]
            return None, f"pip install opentelemetry-proto failed: {last[0] if last else proc.returncode}"
        with open(os.path.join(root, "ready"), "w") as handle:
            handle.write("opentelemetry-proto\n")
        return python, ""


def read_lines(path: str) -> List[Dict[str, Any]]:
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def spans_of(data: Dict[str, Any]) -> List[Dict[str, Any]]:
    return [span for resource in data["resourceSpans"] for scope in resource["scopeSpans"] for span in scope["spans"]]


def attribute(span: Dict[str, Any], key: str) -> Any:
    for item in span["attributes"]:
        if item["key"] == key:
            value = item["value"]
            return next(iter(value.values()))
    return None


class OtlpTrace(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.scratch = scratch_dir("runner-otlp-")
        cls.small = os.path.join(cls.scratch.name, "small")
        small_run(cls.small)
        cls.crashed = os.path.join(cls.scratch.name, "crashed")
        crashed_run(cls.crashed, REPO_ROOT)
        cls.files = {}
        for name, path in (("small", cls.small), ("crashed", cls.crashed)):
            for content in (False, True):
                out = os.path.join(cls.scratch.name, f"{name}-{content}.jsonl")
                result = run_cli("--dir", path, "--json", "events", "--otlp", out, *(["--with-content"] if content else []))
                if result.code != 0:
                    raise AssertionError(result.err)
                cls.files[name, content] = out

    @classmethod
    def tearDownClass(cls) -> None:
        cls.scratch.cleanup()

    def test_one_trace_per_run_and_every_parent_exists(self) -> None:
        for key, path in self.files.items():
            lines = read_lines(path)
            self.assertEqual(len(lines), 1, key)
            spans = spans_of(lines[0])
            self.assertEqual(len({s["traceId"] for s in spans}), 1)
            ids = {s["spanId"] for s in spans}
            self.assertEqual(len(ids), len(spans), "span ids are unique")
            for span in spans:
                self.assertRegex(span["traceId"], r"\A[0-9a-f]{32}\Z")
                self.assertRegex(span["spanId"], r"\A[0-9a-f]{16}\Z")
                if "parentSpanId" in span:
                    self.assertIn(span["parentSpanId"], ids, span["name"])
            self.assertEqual(sum(1 for s in spans if "parentSpanId" not in s), 1, "one root")

    def test_the_same_run_gives_the_same_file(self) -> None:
        again = os.path.join(self.scratch.name, "again.jsonl")
        self.assertEqual(run_cli("--dir", self.small, "events", "--otlp", again).code, 0)
        with open(again, "rb") as a, open(self.files["small", False], "rb") as b:
            self.assertEqual(a.read(), b.read())

    def test_spans_carry_gen_ai_and_messaging_attributes_and_error_status(self) -> None:
        spans = spans_of(read_lines(self.files["small", False])[0])
        by_name: Dict[str, List[Dict[str, Any]]] = {}
        for span in spans:
            by_name.setdefault(span["name"].split(" ")[0], []).append(span)
        root = by_name["invoke_agent"][0]
        self.assertEqual(attribute(root, "gen_ai.operation.name"), "invoke_agent")
        tools = {attribute(s, "gen_ai.tool.call.id"): s for s in by_name["execute_tool"]}
        self.assertEqual(len(tools), 7)
        self.assertEqual(tools["doc:5:ticket"]["status"]["code"], 2)  # refused for good
        self.assertTrue(attribute(tools[UNCERTAIN_KEY], "runner.effect.reconciled"))
        self.assertIn("runner.effect.uncertain", [e["name"] for e in tools[UNCERTAIN_KEY]["events"]])
        # The target's "not now" is a deferral, apart from an absence, and the wait it asked for goes with it.
        deferred = [e["name"] for e in tools["doc:4:ticket"]["events"]]
        kept = ("runner.effect.deferred", "runner.effect.absent", "runner.retry.not_now")
        self.assertEqual([n for n in deferred if n in kept], ["runner.effect.deferred", "runner.retry.not_now"])
        self.assertEqual(tools["doc:1:ticket"]["kind"], 3)
        approvals = by_name["send"]
        self.assertEqual(len(approvals), 3)
        self.assertEqual({attribute(s, "messaging.operation.type") for s in approvals}, {"send"})
        self.assertEqual(sorted(s.get("status", {}).get("code", 0) for s in approvals), [0, 0, 2])  # one denial
        steps = [s for s in by_name["step"] if s.get("status", {}).get("code") == 2]
        self.assertEqual([attribute(s, "runner.step.id") for s in steps], ["fetch"])
        self.assertIn("runner.cancel", [e["name"] for e in root["events"]])

        crashed = spans_of(read_lines(self.files["crashed", False])[0])
        attempts = {attribute(s, "runner.lease.epoch"): s for s in crashed if s["name"].startswith("attempt ")}
        self.assertEqual(attempts["1"]["status"]["code"], 2)
        self.assertIn("runner.crash", [e["name"] for e in attempts["1"]["events"]])
        self.assertNotIn("status", attempts["2"])

    def test_content_only_with_content(self) -> None:
        for name, marker in (("small", "t-doc:1:ticket"), ("crashed", "after the crash")):
            with open(self.files[name, False], encoding="utf-8") as handle:
                self.assertNotIn(marker, handle.read())
            with open(self.files[name, True], encoding="utf-8") as handle:
                self.assertIn(marker, handle.read())

    def test_with_content_needs_otlp_and_otlp_a_writable_file(self) -> None:
        result = run_cli("--dir", self.small, "events", "--with-content")
        self.assertEqual(result.code, 2)
        self.assertIn("--otlp", result.err)
        for bad in (self.scratch.name, os.path.join(self.scratch.name, "no-such-folder", "trace.jsonl")):
            result = run_cli("--dir", self.small, "events", "--otlp", bad)
            self.assertEqual((result.code, len(result.err.splitlines())), (2, 1), result.err)
        self.assertFalse(os.path.exists(os.path.join(self.scratch.name, "no-such-folder")))
        result = run_cli("--dir", self.small, "events", "--otlp", os.path.join(self.scratch.name, "t.jsonl"), "--follow")
        self.assertEqual(result.code, 2, result.err)
        self.assertFalse(os.path.exists(os.path.join(self.scratch.name, "t.jsonl")))

    @_real.needs("OpenTelemetry's opentelemetry-proto package")
    def test_official_protobuf_parses_every_line(self) -> None:
        python, why = proto_python()
        if python is None:
            _real.missing(f"opentelemetry-proto is not available: {why}")
        totals = {"spans": 0, "orphans": 0}
        for key, path in sorted(self.files.items()):
            proc = subprocess.run([python, "-c", _PARSE, path], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
            self.assertEqual(proc.returncode, 0, proc.stderr.decode("utf-8", "replace")[-2000:])
            result = json.loads(proc.stdout)
            self.assertEqual((result["traces"], result["bad_ids"], result["orphans"]), (1, 0, 0), (key, result))
            self.assertEqual(result["spans"], len(spans_of(read_lines(path)[0])))
            totals["spans"] += result["spans"]
            totals["orphans"] += result["orphans"]
        # The check can fail: a span whose parent is not in the file is counted.
        broken = os.path.join(self.scratch.name, "broken.jsonl")
        data = read_lines(self.files["small", False])[0]
        spans_of(data)[-1]["parentSpanId"] = "0123456789abcdef"
        with open(broken, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(data) + "\n")
        proc = subprocess.run([python, "-c", _PARSE, broken], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
        self.assertEqual(json.loads(proc.stdout)["orphans"], 1, proc.stderr)
        # On the test runner's own stream, on a line of its own, so that CI's log shows it whole.
        sys.stderr.write(f"\notlp-check: spans={totals['spans']} orphans={totals['orphans']}\n")
        sys.stderr.flush()


if __name__ == "__main__":
    unittest.main()
