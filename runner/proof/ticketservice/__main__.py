"""``python3 -m runner.proof.ticketservice --db PATH --port-file FILE ...``: run the service."""

import sys

from .server import main

sys.exit(main())
