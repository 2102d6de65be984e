# shellcheck shell=bash
# What the CI scripts share: a time limit on a command, and an install from the OS packages.
# Sourced by .ci/postgres.sh, .ci/chromium.sh and .ci/harness.sh.

# _runner_limit SECONDS COMMAND...: run COMMAND, ended after SECONDS when coreutils' timeout is there.
_runner_limit() {
  local seconds=$1
  shift
  if command -v timeout >/dev/null 2>&1; then
    timeout "$seconds" "$@"
  else
    "$@"
  fi
}

# _runner_apt_install WHAT PACKAGE...: install PACKAGEs from the OS packages; on failure print one
# line saying why (WHAT names what was missing) and return 1.
_runner_apt_install() {
  local what=$1 log
  shift
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "no $what found and no apt-get to install it with"
    return 1
  fi
  if [ "$(id -u)" -ne 0 ]; then
    echo "no $what found, and installing it needs root"
    return 1
  fi
  log=$(mktemp) || { echo "mktemp failed"; return 1; }
  echo "== installing $what from the OS packages ($*)" >&2
  if ! DEBIAN_FRONTEND=noninteractive _runner_limit 600 apt-get update >"$log" 2>&1; then
    echo "apt-get update failed: $(tail -n 1 "$log")"
    rm -f "$log"
    return 1
  fi
  if ! DEBIAN_FRONTEND=noninteractive _runner_limit 1200 apt-get install -y -q "$@" >"$log" 2>&1; then
    echo "apt-get install $* failed: $(tail -n 1 "$log")"
    rm -f "$log"
    return 1
  fi
  rm -f "$log"
}
