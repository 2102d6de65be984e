# shellcheck shell=bash
# The real harness clients, installed once per CI run into a throwaway folder.
#
#   source .ci/harness.sh [PYTHON]     # from .ci/run: install, check once, export
#   bash .ci/harness.sh --install DIR  # install into DIR (reused when complete)
#
# Installs Claude Code (@anthropic-ai/claude-code) and Codex (@openai/codex)
# from the npm registry into DIR/npm, and the Agent Skills reference validator
# (skills-ref, command agentskills) from PyPI into the venv DIR/venv. Node.js
# and npm come from the OS packages when they are missing. Sourced, it then
# runs tools/harness_check.py once, which prints the one line
#
#   harness-check: claude=V codex=V skills=N hooks=E,... validate=ok
#
# then runs whole sessions of both CLIs against scripted models once
# (RUNNER_REAL_TESTS=1 python -m unittest tests.test_sessions), which print
#
#   session-check: client=claude-V brief=yes pushes=3 ... resumed_dup=0 ...
#
# one line per CLI, and exports RUNNER_TEST_HARNESS_CLIENTS=DIR, so the test
# suite (run once per Python) reuses the install instead of repeating it. The
# sessions run once, with the newest Python: what they check is the CLIs and
# the plugin's wiring, while the hooks' code is checked under every Python by
# tests.test_hooks. When the packages cannot
# be had it prints one line saying so and why, exports
# RUNNER_TEST_HARNESS_SKIP with the reason (the real-client test then fails
# with it), and returns 0; a failed check stops CI (the line says what failed).

# shellcheck source=.ci/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

_RUNNER_HX_DIR=${_RUNNER_HX_DIR:-}

# Node.js and npm from the OS packages, when either is missing.
_runner_hx_node() {
  if command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then
    return 0
  fi
  _runner_apt_install "node/npm" nodejs npm || return 1
  command -v npm >/dev/null 2>&1 || { echo "the npm package installed no npm command"; return 1; }
}

# Install the three clients into $1 (skipped when a previous install completed).
_runner_hx_install() {
  local dir=$1 python=${2:-python3} out
  [ -f "$dir/complete" ] && return 0
  out=$(_runner_hx_node) || { echo "$out"; return 1; }
  mkdir -p "$dir/npm" || { echo "cannot make $dir/npm"; return 1; }
  if ! out=$(_runner_limit 900 npm install --prefix "$dir/npm" --no-audit --no-fund --loglevel=error \
    @anthropic-ai/claude-code @openai/codex 2>&1); then
    echo "npm could not install @anthropic-ai/claude-code and @openai/codex: $(printf '%s\n' "$out" | grep -v '^\s*$' | tail -n 1)"
    return 1
  fi
  if ! out=$("$python" -m venv "$dir/venv" 2>&1); then
    echo "cannot make a venv with $python: $(printf '%s\n' "$out" | tail -n 1)"
    return 1
  fi
  if ! out=$(PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PIP_RETRIES=2 PIP_TIMEOUT=30 \
    _runner_limit 600 "$dir/venv/bin/python" -m pip install --quiet skills-ref 2>&1); then
    echo "pip could not install skills-ref: $(printf '%s\n' "$out" | grep -v '^\s*$' | tail -n 1)"
    return 1
  fi
  touch "$dir/complete"
}

_runner_hx_stop() {
  local dir=${_RUNNER_HX_DIR:-}
  _RUNNER_HX_DIR=
  [ -n "$dir" ] && rm -rf "$dir"
  return 0
}

_runner_hx_source() {
  local python=${1:-python3} dir reason
  unset RUNNER_TEST_HARNESS_CLIENTS RUNNER_TEST_HARNESS_SKIP
  dir=$(mktemp -d "${TMPDIR:-/tmp}/runner-harness.XXXXXX") || { export RUNNER_TEST_HARNESS_SKIP="cannot make a temporary folder"; return 0; }
  _RUNNER_HX_DIR=$dir
  if ! reason=$(_runner_hx_install "$dir" "$python"); then
    echo "== harness-check not run: $reason"
    export RUNNER_TEST_HARNESS_SKIP="$reason"
    _runner_hx_stop
    return 0
  fi
  export RUNNER_TEST_HARNESS_CLIENTS=$dir
  "$python" tools/harness_check.py --clients "$dir" || _RUNNER_HX_FAILED=1
  local start
  start=$(date +%s)
  echo "== whole sessions of the real clients against scripted models (tests.test_sessions)"
  RUNNER_REAL_TESTS=1 PYTHONDONTWRITEBYTECODE=1 _runner_limit 900 "$python" -m unittest tests.test_sessions || _RUNNER_HX_FAILED=1
  echo "== whole sessions: $(( $(date +%s) - start ))s"
  return 0
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  # Executed: --install DIR [PYTHON]
  set -uo pipefail
  [ "${1:-}" = "--install" ] && [ -n "${2:-}" ] || { echo "usage: bash .ci/harness.sh --install DIR [PYTHON]" >&2; exit 2; }
  reason=$(_runner_hx_install "$2" "${3:-python3}") || { echo "$reason" >&2; exit 1; }
  exit 0
fi

_runner_hx_options=$(set +o)
set +e
_RUNNER_HX_FAILED=0
_runner_hx_source "$@"
eval "$_runner_hx_options"
unset _runner_hx_options
true
