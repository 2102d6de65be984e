# shellcheck shell=bash
# Sourced by .ci/run: headless Chromium for the timeline page's browser test.
#
#   source .ci/chromium.sh
#
# Installs the distribution's chromium package when no chromium is on the
# PATH (and this shell is root with apt-get), then prints the browser's
# version. Any failure prints one line saying why there is no browser, and
# returns 0: this script never stops CI by itself. The test looks for
# chromium itself (tests/support/browser.py); in the real suite that CI runs it then
# fails, saying why.

# shellcheck source=.ci/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

_runner_chromium_say() { echo "== chromium: $*"; }

_runner_chromium_find() {
  command -v chromium 2>/dev/null || command -v chromium-browser 2>/dev/null || { [ -x /usr/bin/chromium ] && echo /usr/bin/chromium; }
}

_runner_chromium_setup() {
  local browser out
  browser=$(_runner_chromium_find)
  if [ -z "$browser" ]; then
    if ! out=$(_runner_apt_install chromium chromium); then
      echo "== no chromium: the browser test will fail: $out"
      return 0
    fi
    browser=$(_runner_chromium_find)
    [ -n "$browser" ] || { echo "== no chromium: the browser test will fail: the chromium package installed no chromium"; return 0; }
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
