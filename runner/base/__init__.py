"""What every part of the runner stands on: the error classes and the exit table (errors), the file-system seam
(fs) and its commit windows (windows), quoting of text the runner did not write (quoting), output that never stops
work (output), names a package exports lazily (lazy), key patterns (keypattern) and JSON pointers (pointer).

May import: the standard library only.
"""
