#!/usr/bin/env bash
# The offline suite kept offline: the README's test command, with no network
# and an empty home folder, must pass and leave nothing behind.
#
#   bash .ci/offline.sh [PYTHON]
#
# Runs PYTHON -m unittest (default python3) from the repository root with
# RUNNER_REAL_TESTS and the real parts' variables unset, HOME an empty
# temporary folder and its own TMPDIR, in a network namespace of its own where
# only loopback is up (unshare -n as root, else unshare -rn; when neither
# works, every proxy variable points at a closed port and pip and npm are told
# to stay offline, and the line says so). Then it lists what appeared in HOME
# and in the repository (Python's __pycache__ aside), what was left in its
# TMPDIR, and what appeared in /tmp/runner-calls-UID/ (the one folder the
# runner writes outside TMPDIR: a PostgreSQL run's calls in flight, and the
# offline suite has no PostgreSQL run), and exits 1 if anything did or if the
# suite failed. Its time is printed with the processor time of a fixed loop
# run by python3 (one interpreter for every suite's Python: each runs the loop
# at its own pace) just before and just after it: on shared cores the speed of
# the machine changes from hour to hour, and the loop says how fast the cores
# were.
set -uo pipefail
cd "$(dirname "$0")/.."

python=${1:-python3}
home=$(mktemp -d "${TMPDIR:-/tmp}/runner-offline-home.XXXXXX") || exit 1
tmp=$(mktemp -d "${TMPDIR:-/tmp}/runner-offline-tmp.XXXXXX") || exit 1
marker=$(mktemp "${TMPDIR:-/tmp}/runner-offline-marker.XXXXXX") || exit 1
trap 'rm -rf "$home" "$tmp" "$marker"' EXIT

suite=(env -u RUNNER_REAL_TESTS -u RUNNER_TEST_POSTGRES_URL -u RUNNER_TEST_HARNESS_CLIENTS -u RUNNER_TEST_HARNESS_SKIP
       -u RUNNER_TEST_CACHE -u XDG_CACHE_HOME -u PYTHONDONTWRITEBYTECODE HOME="$home" TMPDIR="$tmp" timeout --kill-after=30 600 "$python" -m unittest)
inner='ip link set lo up 2>/dev/null || ifconfig lo up 2>/dev/null; exec "$@"'
network="none: a network namespace with only loopback"
if unshare -n true 2>/dev/null; then
  run=(unshare -n sh -c "$inner" sh "${suite[@]}")
elif unshare -rn true 2>/dev/null; then
  run=(unshare -rn sh -c "$inner" sh "${suite[@]}")
else
  network="not blocked (no network namespace here): every proxy points at 127.0.0.1:9, pip and npm are offline"
  dead=http://127.0.0.1:9
  run=(env http_proxy=$dead https_proxy=$dead HTTP_PROXY=$dead HTTPS_PROXY=$dead ALL_PROXY=$dead all_proxy=$dead no_proxy= NO_PROXY=
       PIP_NO_INDEX=1 npm_config_offline=true "${suite[@]}")
fi

echo "== offline suite with $("$python" --version 2>&1); network $network; HOME=$home"
loop() { python3 -S -c 'import time; t = time.process_time(); sum(i * i for i in range(5_000_000)); print("%.2f" % (time.process_time() - t))'; }
calls() { find /tmp -mindepth 2 -maxdepth 2 -path "/tmp/runner-calls-$(id -u)/*" 2>/dev/null | sort; }
calls_before=$(calls)
before=$(loop)
start=$(date +%s)
"${run[@]}"
rc=$?
took=$(( $(date +%s) - start ))
echo "== offline suite: exit $rc, ${took}s (a fixed loop of $(python3 -S -c 'import platform; print("Python", platform.python_version())') took ${before} s of processor time before it, $(loop) s after)"

status=$rc
# nothing_written WHERE PATHS [NOTE]: PATHS (one per line) are what the suite wrote into WHERE; any fails the run.
nothing_written() {
  if [ -n "$2" ]; then
    echo "== the offline suite wrote into $1:"
    printf '%s\n' "$2" | head -n 50
    status=1
  else
    echo "== $1: nothing written${3:+ ($3)}"
  fi
}
nothing_written HOME "$(cd "$home" && find . -mindepth 1 | sort)"
# Python's own bytecode cache beside the sources (git ignores it) is not the suite's doing: discovery
# imports every package under the root, runner's among them, before the suite's code runs.
nothing_written repository "$(find . -path ./.git -prune -o -type f -newer "$marker" -print | grep -v -E '/__pycache__/[^/]+\.pyc$' | sort)" \
  "Python's __pycache__ aside"
nothing_written "/tmp/runner-calls-$(id -u)/" "$(comm -13 <(printf '%s\n' "$calls_before") <(calls) | sed '/^$/d')"
left=$(find "$tmp" -mindepth 1 -maxdepth 1 | wc -l)
echo "== TMPDIR: $left entr$([ "$left" -eq 1 ] && echo y || echo ies) left behind (removed now)"
find "$tmp" -mindepth 1 -maxdepth 1 -printf '%f\n' | sed -E 's/[-_.][A-Za-z0-9_]{6,}$//' | sort | uniq -c | head -n 20
[ "$left" -eq 0 ] || status=1
exit $status
