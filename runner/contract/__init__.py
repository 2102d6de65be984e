"""The run contract, read in one place. text finds the block of a contract file and reports every problem with its
line. steps, effects, http and lookups hold the checks of each section. templates holds the placeholders a contract
may use.

May import: runner.base.
"""
