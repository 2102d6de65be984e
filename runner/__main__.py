"""``python3 -m runner ...`` from the skill root, or ``python3 path/to/runner ...`` from anywhere."""

import os
import sys

if not __package__:
    # Run as a folder: put the folder's parent first on the path (instead of
    # the folder itself, whose module names would shadow others) and import
    # the package by name.
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    from runner.cli import main
else:
    from .cli import main

sys.exit(main())
