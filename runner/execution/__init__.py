"""Deciding and carrying out: one effect's next move (lifecycle), the executor that carries moves out (executor), the
world its calls run in (world), the effects it carries (task), its call slots (slots) and its flow control (flow), the
recovery procedure (recovery), evidence the runner observes (evidence), the payloads an effect sends, made from its
step's template or command (payloads), re-attachable jobs (jobs), the Run a harness holds (run), drive, and the worker
pool (pool).

May import: runner.base, runner.contract, runner.ledger, runner.stores, runner.calls, runner.adapters.
"""
