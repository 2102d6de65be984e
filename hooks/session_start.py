"""The SessionStart hook of Claude Code and Codex (`--harness codex`); see runner/surfaces/hooks.py for what it does.

Standard library only. Any failure, even to import the runner, exits 0 with
nothing on stdout: a broken hook must never block a session.
"""

import os
import sys

try:
    # The plugin root (this folder's parent) first, so `runner` is this copy's runner.
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    from runner.surfaces.hooks import main
except Exception as exc:  # pragma: no cover - a damaged install
    sys.stderr.write(f"long-running-agent-sessions SessionStart hook: cannot load the runner: {exc}\n")
    sys.exit(0)

sys.exit(main("SessionStart", sys.argv[1:]))
