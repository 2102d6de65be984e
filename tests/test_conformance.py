"""The adapter conformance kit: the bundled adapters pass it, broken ones fail it for the right reason."""

import contextlib
import io
import os
import shutil
import tempfile
import unittest
import uuid
from typing import Any, Dict, Set, Tuple

from runner.adapters import artifact
from runner.proof import conformance, ticketservice
from runner.calls.target import Observation, Rejected, StaleEpoch
from runner.base.canonical import content_digest
from runner.base.errors import InvalidInput
from runner.execution.run import Run
from runner.stores.file import RunStore
from runner.proof.ticketservice import TicketAdapter, TicketServiceProcess


def statuses(report: Dict[str, Any], status: str) -> Set[str]:
    return {r["check"] for r in report["checks"] if r["status"] == status}


def reason(report: Dict[str, Any], check: str) -> str:
    return next(r["reason"] for r in report["checks"] if r["check"] == check)


# -- adapters held in memory: a correct one and variants that break one promise each ----------

class MemoryAdapter:
    """A correct adapter over a dict: dedup by key, refusal of another payload, epoch fencing."""

    name = "memory"
    key_scope = "one MemoryAdapter instance"
    retention_seconds = None
    conflicting_payload = "refused: Rejected"
    verification = "dict lookup by key, payload digest compared"
    deduplicates = True
    enforces_fencing = True
    checks_epochs = True

    def __init__(self) -> None:
        self.effects: Dict[str, str] = {}
        self.high = 0

    def invoke(self, key: str, payload: Dict[str, Any], epoch: int) -> Any:
        if self.checks_epochs and epoch < self.high:
            raise StaleEpoch(f"{epoch} < {self.high}")
        self.high = max(self.high, epoch)
        digest = content_digest(payload)
        if self.effects.setdefault(key, digest) != digest:
            raise Rejected("known key, other payload")
        return {"key": key, "digest": digest}

    def observe(self, key: str, payload: Dict[str, Any]) -> Observation:
        found = self.effects.get(key)
        if found is None:
            return Observation("absent", {"key": key})
        return Observation("present" if found == content_digest(payload) else "unknown", {"key": key, "digest": found})


class BlindEpochAdapter(MemoryAdapter):
    """Declares that it enforces fencing, but the epoch never reaches its target."""

    checks_epochs = False


class FactlessAdapter(MemoryAdapter):
    """Leaves out a declared fact and gets another wrong."""

    deduplicates = "yes"  # type: ignore[assignment]

    def __getattribute__(self, name: str) -> Any:
        if name == "verification":
            raise AttributeError(name)
        return super().__getattribute__(name)


class ReceiptlessAdapter(MemoryAdapter):
    """Returns something that is not a receipt."""

    def invoke(self, key: str, payload: Dict[str, Any], epoch: int) -> Any:
        super().invoke(key, payload, epoch)
        return "ok"


def memory_factory() -> MemoryAdapter:
    return MemoryAdapter()


# -- adapters against a real service that break a promise -----------------------------------

class AlwaysAbsentAdapter(TicketAdapter):
    """Observation that never finds anything: an acknowledged effect could never be verified."""

    def observe(self, key: str, payload: Dict[str, Any]) -> Observation:
        return Observation("absent", {"lookup": "none"})


class KeyIgnoringAdapter(TicketAdapter):
    """Sends a fresh idempotency key on every call (an attempt-scoped key), while declaring dedup."""

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(url, **options)
        self.by_marker = ticketservice.MarkerTicketAdapter(url, run_id=self.run_id)

    def invoke(self, key: str, payload: Dict[str, Any], epoch: int) -> Dict[str, Any]:
        return self._post_ticket(f"{key}-{uuid.uuid4().hex[:8]}", payload, epoch)

    def observe(self, key: str, payload: Dict[str, Any]) -> Observation:
        return self.by_marker.observe(key, payload)


class _SharedControls:
    def __init__(self, service: TicketServiceProcess) -> None:
        self.service = service

    def lose_next_response(self) -> None:
        self.service.set_faults(drop_after_commit=1)

    def effect_count(self, key: str, payload: Dict[str, Any]) -> int:
        return len(self.service.tickets_for_marker(payload["marker"]))


class ConformanceTests(unittest.TestCase):
    service: TicketServiceProcess
    tmp = ""

    @classmethod
    def setUpClass(cls) -> None:
        cls.tmp = tempfile.mkdtemp(prefix="conformance-test-")
        cls.service = TicketServiceProcess(os.path.join(cls.tmp, "tickets.db"))

    @classmethod
    def tearDownClass(cls) -> None:
        cls.service.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def setUp(self) -> None:
        self.service.reset_faults()

    def broken_factory(self, cls: type) -> Any:
        """A factory for ``cls`` against the shared service, in a fencing scope of its own."""

        def factory() -> Tuple[Any, _SharedControls]:
            return cls(self.service.url, retention_seconds=None, run_id=uuid.uuid4().hex), _SharedControls(self.service)

        return factory

    # -- the bundled adapters ----------------------------------------------------------------
    def test_ticket_service_adapter_passes(self) -> None:
        report = conformance.run_conformance(ticketservice.conformance_factory, "runner.proof.ticketservice:conformance_factory")
        self.assertTrue(report["passed"], conformance.format_report(report))
        self.assertEqual(statuses(report, "pass"), set(conformance.CHECKS))
        self.assertIn("effect_count", reason(report, "same_key_same_payload_dedups"))
        self.assertIn("UnknownOutcome", reason(report, "lost_response_is_observed"))

    def test_marker_adapter_passes(self) -> None:
        report = conformance.run_conformance(ticketservice.marker_conformance_factory)
        self.assertTrue(report["passed"], conformance.format_report(report))
        self.assertEqual(statuses(report, "skip"), {"same_key_same_payload_dedups", "conflicting_payload_refused"})

    def test_file_artifact_adapter_passes(self) -> None:
        report = conformance.run_conformance(conformance.artifact_factory)
        self.assertTrue(report["passed"], conformance.format_report(report))
        self.assertEqual(statuses(report, "skip"), {"fencing_epoch_enforced"})
        self.assertIn("UnknownOutcome", reason(report, "lost_response_is_observed"))

    def test_memory_adapter_without_controls_passes(self) -> None:
        report = conformance.run_conformance(memory_factory)
        self.assertTrue(report["passed"], conformance.format_report(report))
        self.assertIn("simulated", reason(report, "lost_response_is_observed"))
        self.assertIn("same receipt", reason(report, "same_key_same_payload_dedups"))

    # -- broken adapters fail, each for its own reason ------------------------------------------
    def test_observe_that_always_says_absent_fails(self) -> None:
        report = conformance.run_conformance(self.broken_factory(AlwaysAbsentAdapter))
        self.assertFalse(report["passed"])
        self.assertEqual(statuses(report, "fail"), {"invoke_is_observed", "conflicting_payload_refused", "lost_response_is_observed"})
        self.assertIn("observe said absent", reason(report, "invoke_is_observed"))
        self.assertIn("never_invoked_is_absent", statuses(report, "pass"), "absent is right for a key never invoked")

    def test_adapter_that_ignores_the_key_fails(self) -> None:
        report = conformance.run_conformance(self.broken_factory(KeyIgnoringAdapter))
        self.assertFalse(report["passed"])
        self.assertEqual(statuses(report, "fail"), {"same_key_same_payload_dedups", "conflicting_payload_refused", "lost_response_is_observed"})
        self.assertIn("left 2 effects", reason(report, "same_key_same_payload_dedups"))
        self.assertIn("was accepted", reason(report, "conflicting_payload_refused"))
        self.assertIn("resending", reason(report, "lost_response_is_observed"))

    def test_epoch_that_never_reaches_the_target_fails(self) -> None:
        report = conformance.run_conformance(BlindEpochAdapter)
        self.assertEqual(statuses(report, "fail"), {"fencing_epoch_enforced"})
        self.assertIn("does not reach the target", reason(report, "fencing_epoch_enforced"))

    def test_missing_and_wrong_facts_fail(self) -> None:
        report = conformance.run_conformance(FactlessAdapter)
        self.assertIn("declared_facts", statuses(report, "fail"))
        self.assertIn("verification is not declared", reason(report, "declared_facts"))
        self.assertIn("deduplicates='yes'", reason(report, "declared_facts"))

    def test_receipt_that_is_not_an_object_fails(self) -> None:
        report = conformance.run_conformance(ReceiptlessAdapter)
        self.assertIn("invoke_is_observed", statuses(report, "fail"))
        self.assertIn("unusable receipt", reason(report, "invoke_is_observed"))

    def test_factory_that_raises_fails_the_report(self) -> None:
        def factory() -> Any:
            raise RuntimeError("no target")

        report = conformance.run_conformance(factory, "broken:factory")
        self.assertFalse(report["passed"])
        self.assertEqual(report["checks"], [{"check": "factory", "status": "fail", "reason": "the factory raised RuntimeError: no target"}])

    def test_controls_are_closed_even_when_checks_fail(self) -> None:
        closed = []

        class Controls:
            def close(self) -> None:
                closed.append(True)

        report = conformance.run_conformance(lambda: (AlwaysAbsentAdapter(self.service.url, retention_seconds=None, run_id=uuid.uuid4().hex), Controls()))
        self.assertFalse(report["passed"])
        self.assertEqual(closed, [True])

    # -- output and loading ---------------------------------------------------------------------
    def test_report_has_one_line_per_check_and_a_verdict(self) -> None:
        report = conformance.run_conformance(BlindEpochAdapter, "tests:blind")
        lines = conformance.format_report(report).splitlines()
        self.assertEqual(lines[0], "conformance of adapter 'memory' (tests:blind)")
        self.assertEqual(len(lines), len(conformance.CHECKS) + 2)
        self.assertTrue(any(line.strip().startswith("FAIL  fencing_epoch_enforced") for line in lines))
        self.assertTrue(all(line.strip().split()[0] in ("PASS", "FAIL", "SKIP") for line in lines[1:-1]))
        self.assertEqual(lines[-1], "result: FAIL (6 passed, 1 failed, 0 skipped)")

    def test_load_factory_and_main(self) -> None:
        self.assertIs(conformance.load_factory("tests.test_conformance:memory_factory"), memory_factory)
        for bad in ("tests.test_conformance", "no_such_module_x:f", "tests.test_conformance:nothing_here"):
            with self.assertRaises(InvalidInput):
                conformance.load_factory(bad)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = conformance.main(["--adapter", "tests.test_conformance:memory_factory"])
        self.assertEqual(code, 0)
        self.assertIn("result: PASS (7 passed, 0 failed, 0 skipped)", out.getvalue())
        with contextlib.redirect_stdout(io.StringIO()):
            self.assertEqual(conformance.main(["--adapter", "tests.test_conformance:BlindEpochAdapter"]), 1)
        with contextlib.redirect_stderr(io.StringIO()):
            self.assertEqual(conformance.main(["--adapter", "nope"]), 2)


class ArtifactAdapterTests(unittest.TestCase):
    """The file artifact's own promises, beyond what the kit exercises."""

    def setUp(self) -> None:
        self.root = tempfile.mkdtemp(prefix="artifact-test-")
        self.addCleanup(shutil.rmtree, self.root, True)
        self.adapter = artifact.ArtifactAdapter(self.root)

    def test_a_run_drives_an_artifact_to_verified_once(self) -> None:
        run_dir = os.path.join(self.root, "run")
        RunStore.create(run_dir, "artifact-run", {"task_id": "artifact-run", "steps": [{"id": "write"}]})
        run = Run.open(run_dir)
        run.acquire("writer", 60)
        payload = artifact.payload_for("hello\n")
        effect = run.drive_effect("report.txt", payload, self.adapter)
        self.assertEqual(effect["state"], "verified")
        self.assertEqual(effect["evidence"]["digest"], payload["digest"])
        with open(os.path.join(self.root, "report.txt"), encoding="utf-8") as handle:
            self.assertEqual(handle.read(), "hello\n")
        self.assertEqual(sorted(os.listdir(self.root)), ["report.txt", "run"], "no temp object is left behind")
        self.assertEqual(run.drive_effect("report.txt", payload, self.adapter)["attempts"], 1)

    def test_other_content_under_the_key_is_refused_and_kept(self) -> None:
        self.adapter.invoke("a.txt", artifact.payload_for("one"), 1)
        with self.assertRaises(Rejected):
            self.adapter.invoke("a.txt", artifact.payload_for("two"), 1)
        seen = self.adapter.observe("a.txt", artifact.payload_for("two"))
        self.assertEqual((seen.status, seen.evidence["exists"]), ("absent", True))
        self.assertEqual(self.adapter.observe("a.txt", artifact.payload_for("one")).status, "present")

    def test_a_digest_that_disagrees_with_the_content_is_refused_before_writing(self) -> None:
        with self.assertRaises(Rejected):
            self.adapter.invoke("b.txt", {"content": "x", "digest": artifact.payload_for("y")["digest"]}, 1)
        self.assertEqual(os.listdir(self.root), [])

    def test_a_symbolic_link_in_the_target_place_is_unknown(self) -> None:
        os.symlink(os.path.join(self.root, "elsewhere"), os.path.join(self.root, "c.txt"))
        self.assertEqual(self.adapter.observe("c.txt", artifact.payload_for("z")).status, "unknown")

    def test_keys_cannot_leave_the_folder(self) -> None:
        with self.assertRaises(InvalidInput):
            self.adapter.invoke("../escape", artifact.payload_for("z"), 1)


if __name__ == "__main__":
    unittest.main()
