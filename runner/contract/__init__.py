"""The run contract, read in one place. text finds the block of a contract file and reports every problem with its
line; http holds the checks of the ``effects.http`` section.

May import: runner.base.
"""
