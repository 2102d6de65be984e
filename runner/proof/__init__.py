"""What exists to prove or demonstrate the runner: fault injection, the conformance kit, the
crash-state explorer, the ticket service, the demo, the campaign and the benchmarks.

The library never imports this package (``tools/check_layers.py``); the program
(``python3 -m runner``) adds its verbs to the command line.

May import: any package; only runner/__main__.py imports it.
"""

from ..base.paths import PACKAGE_PARENT

__all__ = ["PACKAGE_PARENT"]
