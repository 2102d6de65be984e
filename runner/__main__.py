"""``python3 -m runner ...`` from the skill root, or ``python3 path/to/runner ...`` from anywhere.

This is the program: the library's command line plus the proof verbs. It is
the one place outside ``runner/proof/`` allowed to import it (see
``tools/check_layers.py``).
"""

import gc
import os
import sys

# What is imported lives as long as the process: collecting while importing finds nothing, and
# frozen afterwards it is never walked again by the collections of a long command.
gc.disable()
if not __package__:
    # Run as a folder: put the folder's parent first on the path (instead of
    # the folder itself, whose module names would shadow others) and import
    # the package by name.
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    from runner.surfaces.cli import main
    from runner.proof.cli import add_proof_verbs
else:
    from .surfaces.cli import main
    from .proof.cli import add_proof_verbs
gc.freeze()
gc.enable()

code = main(extensions=(add_proof_verbs,))
# The command is done and has closed what it opened: the collector need not walk every object once more
# while the interpreter ends (with the above, a sixth of a short command's processor time).
gc.freeze()
sys.exit(code)
