"""The run contract, read in one place. text finds the block of a contract file and reports every problem with its
line. spec turns a checked block into frozen specs (Contract, StepSpec, EffectsSpec, HttpSpec, GitSpec, SmtpSpec,
Limits, RetryPolicy, LeaseSpec, JobsSpec) that carry their defaults, and contract_of(state) returns the run's specs,
cached by plan digest. steps, effects, http, git, smtp and lookups hold the checks of each section. templates holds
the placeholders a contract may use. Besides the envelope that makes a run's plan and the stores that keep it, no
other module reads the plan (tools/check_layers.py holds it).

May import: runner.base.
"""
