"""``python3 -m runner.proof.ticketservice --db PATH --port-file FILE ...``: run the service."""

import gc
import sys

# As the runner's command line does (runner/__main__.py): import with the collector off, then freeze what was imported.
gc.disable()
from .server import main  # noqa: E402

gc.freeze()
gc.enable()
sys.exit(main())
