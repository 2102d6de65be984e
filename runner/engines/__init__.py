"""Level C on workflow engines: the effect ledger's guarantees inside Temporal activities and DBOS steps.

Neither engine is a dependency: :mod:`runner.engines.temporal` imports
``temporalio`` and :mod:`runner.engines.dbos` imports ``dbos`` only when they
are imported themselves, and :mod:`runner.engines.once` (what both share)
needs the standard library alone.

May import: runner.base, runner.contract, runner.ledger, runner.calls, runner.execution; no module of the runner
imports it.
"""
