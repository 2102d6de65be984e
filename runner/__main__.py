"""``python3 -m runner ...`` from the skill root, or ``python3 path/to/runner ...`` from anywhere.

This is the program: the library's command line plus the proof verbs. It is
the one place outside ``runner/proof/`` allowed to import it (see
``tools/check_layers.py``).
"""

import gc
import os
import sys

if not __package__:
    # Run as a folder: put the folder's parent first on the path (instead of
    # the folder itself, whose module names would shadow others) and import
    # the package by name.
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    from runner.cli import main
    from runner.proof.cli import add_proof_verbs
else:
    from .cli import main
    from .proof.cli import add_proof_verbs

code = main(extensions=(add_proof_verbs,))
# The command is done and has closed what it opened: the collector need not walk every object of every module
# once more while the interpreter ends, a sixth of a short command's processor time.
gc.freeze()
sys.exit(code)
