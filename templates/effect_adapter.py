"""An effect adapter for your target: fill in the four facts and the two calls.

Check it with: python3 -m runner conformance --adapter your_module:make_adapter

The runner calls ``invoke`` only after it has durably recorded ``started``,
and calls ``observe`` after any crash, timeout or doubt, before anything is
retried. Map every outcome to one of the exceptions below: a timeout or a
dropped connection is UnknownOutcome (the call may have happened), never a
plain failure.
"""

from typing import Any, Dict, Optional

from runner.calls.target import NotApplied, Observation, Rejected, StaleEpoch, UnknownOutcome


class MyTargetAdapter:
    name = "my-target"
    key_scope = "per account of my-target"  # where keys are unique
    retention_seconds: Optional[float] = 24 * 3600  # how long the target remembers a key; None: forever
    conflicting_payload = "refused with 409"  # what it does with a known key and another payload
    verification = "GET /things/by-key/KEY"  # how observe establishes presence
    deduplicates = True  # same key and payload within retention: original result, no second effect
    enforces_fencing = False  # True if the target refuses an epoch older than one it has seen

    def invoke(self, key: str, payload: Dict[str, Any], epoch: int) -> Dict[str, Any]:
        """Perform the effect once under ``key``; return the target's receipt."""
        try:
            response = self._post(key, payload, epoch)  # send key as the idempotency key, and the epoch
        except TimeoutError as exc:
            raise UnknownOutcome(f"no answer: {exc}") from None
        if response["status"] == 409:
            raise Rejected("known key with another payload")
        if response["status"] == 412:
            raise StaleEpoch(f"epoch {epoch} is older than one the target has seen")
        if response["status"] == 503:
            raise NotApplied("refused before processing; try later")
        return {"id": response["body"]["id"]}

    def observe(self, key: str, payload: Dict[str, Any]) -> Observation:
        """Look the effect up without performing it: present, absent or unknown, with evidence."""
        try:
            response = self._get(key)
        except TimeoutError as exc:
            return Observation("unknown", {"error": str(exc)})
        if response["status"] == 200:
            return Observation("present", {"id": response["body"]["id"]})
        if response["status"] == 404:
            return Observation("absent", {"lookup": "404 by key"})
        return Observation("unknown", {"status": response["status"]})

    def _post(self, key: str, payload: Dict[str, Any], epoch: int) -> Dict[str, Any]:
        raise NotImplementedError("call your target here")

    def _get(self, key: str) -> Dict[str, Any]:
        raise NotImplementedError("look the effect up here")


def make_adapter() -> MyTargetAdapter:
    return MyTargetAdapter()
