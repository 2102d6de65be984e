"""The run's durable state and its pure transitions: the envelope and its ops (envelope), the effect ledger
(effects), steps, cancellation and migration (steps), leases with fencing (lease), approvals, bounded retry (retry),
batch steps' frozen item lists (batch), the words of an effect's lifecycle (states) and the records other modules
read (records). A function named *_ops takes (state, ...) and returns ops or raises; nothing here calls a target or
writes a file.

May import: runner.base, runner.contract.
"""
