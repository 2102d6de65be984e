"""Targets the runner calls, which users may reuse: the HTTP requests a contract declares (http, whose section
runner.contract.http checks) and a file artifact written once under its key (artifact).

May import: runner.base, runner.contract, runner.ledger, runner.stores, runner.calls.
"""
