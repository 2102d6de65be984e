"""This process's host and user: who makes a run, begins an effect or registers a call from here.

Records that name their maker (a run's identity, an effect's ``begun_by``, a
call in flight) tell a record written on another machine, or by another
user, from one of this process's own.
"""

import os
from typing import Any, Dict

__all__ = ["local_maker"]


def local_maker() -> Dict[str, Any]:
    """Who makes a run from this process: the host's name and the process's user id (None where there is none)."""
    uid = os.getuid() if hasattr(os, "getuid") else None
    # the name gethostname() gives, without importing socket (whose constants cost a start more)
    if hasattr(os, "uname"):
        return {"host": os.uname().nodename, "uid": uid}
    import socket

    return {"host": socket.gethostname(), "uid": uid}
