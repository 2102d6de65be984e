"""Targets the runner calls: a contract's commands (commands), the HTTP requests a contract declares (http, whose
section runner.contract.http checks, over http_client, which knows nothing of effects, with http_secrets and
http_answers), a mail server that is sent one message per effect and cannot be read back (smtp), git repositories
released by one commit, a tag and an atomic push (git, whose section runner.contract.git checks), a file artifact
written once under its key, which users may reuse (artifact), and adapter_for, which builds the adapter a contract
names for an effect key (factory).

May import: runner.base, runner.contract, runner.ledger, runner.stores, runner.calls.
"""
