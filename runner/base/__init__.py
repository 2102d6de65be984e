"""What every part of the runner stands on: the error classes and the exit table (errors), canonical JSON, digests
and size checks (canonical), time stamps (times), checked ids and one-line texts (values), the file-system seam
(fs) and its commit windows (windows), quoting of text the runner did not write (quoting), output that never stops
work (output), names a package exports lazily (lazy), key patterns (keypattern), JSON pointers (pointer), paths
kept inside a workspace (workspace), this process's host and user (host), and where this package lies (paths).

May import: the standard library only.
"""
