"""Programs the tests start as child processes, by path or with ``-m``; a folder of their own, because a
program run by path has its folder first on ``sys.path``, and no helper here may hide a standard-library module.

This package imports nothing.
"""
