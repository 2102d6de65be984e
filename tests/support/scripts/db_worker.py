"""A worker process for ``tests/test_db_stores.py``: ``MODE URL TASK OPTIONS-JSON``.

* ``hold``: begin a transaction, print ``inside``, wait for a line on stdin
  inside it, then commit ``counters.n + 1`` (tried again on a new connection
  if the server ended the session meanwhile) and print ``committed REV``.
* ``count``: commit ``counters.n + 1`` once and print ``committed REV``.
* ``open``: open the run, print ``opened REV``.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))

from runner.stores import open_store  # noqa: E402


def main(argv: list) -> int:
    mode, url, task, options = argv[0], argv[1], argv[2], json.loads(argv[3])
    store = open_store(url, task, **options)
    if mode == "open":
        print(f"opened {store.revision}", flush=True)
        return 0
    waited = []

    def increment(state: dict) -> list:
        if mode == "hold" and not waited:
            waited.append(True)
            print("inside", flush=True)
            sys.stdin.readline()
        return [["set", ["counters", "n"], state["counters"].get("n", 0) + 1]]

    state = store.transact(increment)
    print(f"committed {state['revision']}", flush=True)
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
