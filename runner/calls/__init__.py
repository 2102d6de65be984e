"""One call of a target: what the runner needs of a target and what a target may answer (target), what each answer
means for the lifecycle, in one mapping (answers), the registry of calls in flight (inflight), the processes of this
machine (processes) and commands run without a shell (commands).

May import: runner.base, runner.contract, runner.ledger, runner.stores.
"""
