"""Deciding and carrying out: the payloads an effect sends, made from its step's template or command (payloads).

May import: runner.base, runner.contract, runner.ledger, runner.stores, runner.calls, runner.adapters.
"""
