"""Loopback stand-ins for real targets, which recipes and adapters are tested against, with faults a test scripts.

Each is a program of the standard library only, one module per target:
tracker (a GitHub-shaped issues API), webhook (a chat incoming webhook that
cannot be read back), smtpd (a mail server) and rest (a REST API with a lookup
by key). Each runs as ``python3 -m tests.support.standins.NAME --port 0
--state DIR``, prints its URL on its first line, keeps what it received in DIR
(written atomically, so it survives the kill of the program under test, and
of itself) and counts it there for the test that asserts no duplicate. common
holds what the servers share; harness starts one as a process for a test.
Nothing here is used at run time. This package imports nothing.
"""
