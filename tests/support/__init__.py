"""What the tests share: helpers (util, cli, batch, ...) and, in scripts/, the programs tests start as children.

Discovery collects nothing here (only ``tests/test*.py``). This package imports nothing, so that a child
that imports one helper pays for that helper alone.
"""
