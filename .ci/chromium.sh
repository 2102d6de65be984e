# shellcheck shell=bash
# Sourced by .ci/run: headless Chromium for the timeline page's browser test.
#
#   source .ci/chromium.sh
#
# Installs the distribution's chromium package when no chromium is on the
# PATH (and this shell is root with apt-get), then prints the browser's
# version. Any failure prints one line saying that the browser test will be
# skipped and why, and returns 0: this script never stops CI. The test looks
# for chromium itself (tests/_browser.py) and skips, saying why, without it.

_runner_chromium_say() { echo "== chromium: $*"; }

_runner_chromium_limit() {
  local seconds=$1
  shift
  if command -v timeout >/dev/null 2>&1; then
    timeout "$seconds" "$@"
  else
    "$@"
  fi
}

_runner_chromium_find() {
  command -v chromium 2>/dev/null || command -v chromium-browser 2>/dev/null || { [ -x /usr/bin/chromium ] && echo /usr/bin/chromium; }
}

_runner_chromium_install() {
  local log
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "no chromium found and no apt-get to install it with"
    return 1
  fi
  if [ "$(id -u)" -ne 0 ]; then
    echo "no chromium found, and installing it needs root"
    return 1
  fi
  log=$(mktemp) || { echo "mktemp failed"; return 1; }
  _runner_chromium_say "installing chromium from the OS packages" >&2
  if ! DEBIAN_FRONTEND=noninteractive _runner_chromium_limit 600 apt-get update >"$log" 2>&1; then
    echo "apt-get update failed: $(tail -n 1 "$log")"
    rm -f "$log"
    return 1
  fi
  if ! DEBIAN_FRONTEND=noninteractive _runner_chromium_limit 1200 apt-get install -y -q chromium >"$log" 2>&1; then
    echo "apt-get install chromium failed: $(tail -n 1 "$log")"
    rm -f "$log"
    return 1
  fi
  rm -f "$log"
  return 0
}

_runner_chromium_setup() {
  local browser out
  browser=$(_runner_chromium_find)
  if [ -z "$browser" ]; then
    if ! out=$(_runner_chromium_install); then
      echo "== the browser test will be skipped: $out"
      return 0
    fi
    browser=$(_runner_chromium_find)
    [ -n "$browser" ] || { echo "== the browser test will be skipped: the chromium package installed no chromium"; return 0; }
  fi
  _runner_chromium_say "$browser: $("$browser" --version 2>/dev/null | head -n 1)"
  return 0
}

_runner_chromium_options=$(set +o)
set +e
_runner_chromium_setup
eval "$_runner_chromium_options"
unset _runner_chromium_options
true
