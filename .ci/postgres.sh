# shellcheck shell=bash
# Sourced by .ci/run: a throwaway PostgreSQL server for the PostgreSQL store tests.
#
#   source .ci/postgres.sh [PYTHON...]      # then, at exit: postgres_stop
#
# Installs PostgreSQL from the OS packages when initdb/pg_ctl are not found,
# installs psycopg 3 for each PYTHON given (default: python3), runs initdb in
# a temporary folder owned by the postgres user, starts the server on
# 127.0.0.1 at a free port with trust login for loopback connections, creates
# the database runner_test and exports
#
#   RUNNER_TEST_POSTGRES_URL=postgresql://postgres@127.0.0.1:PORT/runner_test
#
# postgres_stop stops the server and removes its folder; it is safe to call
# more than once. It is also set as the EXIT trap when the sourcing shell has
# none. Any failure prints one line saying why there is no server, leaves
# RUNNER_TEST_POSTGRES_URL unset, and returns 0: this script never stops CI
# by itself; the PostgreSQL tests of the real suite then fail with the reason.

_RUNNER_PG_DIR=${_RUNNER_PG_DIR:-}
_RUNNER_PG_BIN=${_RUNNER_PG_BIN:-}

# shellcheck source=.ci/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

_runner_pg_say() { echo "== postgres: $*"; }

_runner_pg_skip() {
  echo "== no PostgreSQL: its real tests will fail: $*"
  postgres_stop
  unset RUNNER_TEST_POSTGRES_URL
}

# Run a server command as the server's owner: postgres when this shell is
# root (PostgreSQL refuses to run as root), else this user.
_runner_pg_as() {
  if [ "$(id -u)" -ne 0 ]; then
    "$@"
  elif command -v runuser >/dev/null 2>&1; then
    runuser -u postgres -- "$@"
  else
    su postgres -s /bin/sh -c "$(printf '%q ' "$@")"
  fi
}

postgres_stop() {
  local dir=${_RUNNER_PG_DIR:-}
  [ -n "$dir" ] || return 0
  _RUNNER_PG_DIR=
  unset RUNNER_TEST_POSTGRES_URL
  if [ -f "$dir/data/postmaster.pid" ]; then
    if ! (cd "$dir" && _runner_pg_as "$_RUNNER_PG_BIN/pg_ctl" -D "$dir/data" -m fast -w -t 30 stop) >/dev/null 2>&1; then
      local pid
      pid=$(head -n 1 "$dir/data/postmaster.pid" 2>/dev/null)
      case "$pid" in
        '' | *[!0-9]*) ;;
        *) kill -9 "$pid" 2>/dev/null ;;
      esac
    fi
  fi
  rm -rf "$dir"
  return 0
}

# The folder holding initdb and pg_ctl, or nothing.
_runner_pg_find_bin() {
  local pg_ctl initdb dir
  pg_ctl=$(command -v pg_ctl 2>/dev/null)
  initdb=$(command -v initdb 2>/dev/null)
  if [ -n "$pg_ctl" ] && [ -n "$initdb" ]; then
    dir=$(dirname "$(readlink -f "$pg_ctl")")
    if [ -x "$dir/initdb" ] && [ -x "$dir/postgres" ]; then
      echo "$dir"
      return 0
    fi
  fi
  for dir in $(printf '%s\n' /usr/lib/postgresql/*/bin | sort -t/ -k5,5 -V -r); do
    if [ -x "$dir/pg_ctl" ] && [ -x "$dir/initdb" ] && [ -x "$dir/postgres" ]; then
      echo "$dir"
      return 0
    fi
  done
  return 1
}


# psycopg 3 for each interpreter; succeeds when at least one can import it.
_runner_pg_psycopg() {
  local py out ok=0 version
  for py in "$@"; do
    if ! version=$("$py" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null); then
      _runner_pg_say "$py is not a working Python interpreter; skipped"
      continue
    fi
    if "$py" -c 'import psycopg' >/dev/null 2>&1; then
      ok=1
      continue
    fi
    if out=$(PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore PIP_NO_INPUT=1 PIP_RETRIES=2 PIP_TIMEOUT=30 \
      _runner_limit 600 "$py" -m pip install --quiet 'psycopg[binary]' 2>&1) && "$py" -c 'import psycopg' >/dev/null 2>&1; then
      _runner_pg_say "installed psycopg $("$py" -c 'import psycopg; print(psycopg.__version__)') for Python $version ($py)"
      ok=1
    else
      _runner_pg_say "could not install psycopg for Python $version ($py): $(printf '%s\n' "$out" | grep -v '^\s*$' | tail -n 1); its PostgreSQL tests will fail"
    fi
  done
  [ "$ok" -eq 1 ]
}

# A TCP port on 127.0.0.1 that nothing listens on.
_runner_pg_free_port() {
  local port
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    port=$(( 20000 + (RANDOM * 32768 + RANDOM) % 40000 ))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      echo "$port"
      return 0
    fi
  done
  return 1
}

_runner_pg_start() {
  local bin dir port out psql ready
  unset RUNNER_TEST_POSTGRES_URL
  postgres_stop

  bin=$(_runner_pg_find_bin)
  if [ -z "$bin" ]; then
    out=$(_runner_apt_install PostgreSQL postgresql) || { _runner_pg_skip "$out"; return 0; }
    bin=$(_runner_pg_find_bin)
    [ -n "$bin" ] || { _runner_pg_skip "the postgresql package installed no initdb/pg_ctl under /usr/lib/postgresql/*/bin"; return 0; }
  fi
  _RUNNER_PG_BIN=$bin
  _runner_pg_say "server binaries: $bin ($("$bin/postgres" --version 2>/dev/null))"

  if [ $# -eq 0 ]; then
    set -- python3
  fi
  if ! _runner_pg_psycopg "$@"; then
    _runner_pg_skip "psycopg 3 could not be imported or installed for any of: $*"
    return 0
  fi

  if [ "$(id -u)" -eq 0 ] && ! id postgres >/dev/null 2>&1; then
    useradd --system --no-create-home --shell /usr/sbin/nologin postgres >/dev/null 2>&1 \
      || { _runner_pg_skip "running as root and there is no postgres user to run the server as (useradd failed)"; return 0; }
  fi

  dir=$(mktemp -d "${TMPDIR:-/tmp}/runner-pg.XXXXXX" 2>&1) || { _runner_pg_skip "cannot make a temporary folder: $dir"; return 0; }
  _RUNNER_PG_DIR=$dir
  mkdir -p "$dir/data" "$dir/sock" || { _runner_pg_skip "cannot make the data folder in $dir"; return 0; }
  chmod 700 "$dir" "$dir/data"
  if [ "$(id -u)" -eq 0 ]; then
    chown -R postgres: "$dir" || { _runner_pg_skip "cannot give $dir to the postgres user"; return 0; }
  fi

  if ! out=$(cd "$dir" && _runner_pg_as "$bin/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 --locale=C --no-sync 2>&1); then
    _runner_pg_skip "initdb failed: $(printf '%s\n' "$out" | tail -n 1)"
    return 0
  fi
  printf '%s\n' \
    "local all all trust" \
    "host all all 127.0.0.1/32 trust" \
    "host all all ::1/128 trust" >"$dir/data/pg_hba.conf"

  for _ in 1 2 3; do
    port=$(_runner_pg_free_port) || { _runner_pg_skip "found no free TCP port on 127.0.0.1"; return 0; }
    if out=$(cd "$dir" && _runner_pg_as "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
      -o "-c listen_addresses=127.0.0.1 -p $port -k $dir/sock" start 2>&1); then
      break
    fi
    port=
    grep -qi "address already in use" "$dir/server.log" 2>/dev/null || break
  done
  if [ -z "$port" ]; then
    _runner_pg_skip "the server did not start: $(tail -n 1 "$dir/server.log" 2>/dev/null || printf '%s\n' "$out" | tail -n 1)"
    return 0
  fi

  ready=0
  for _ in $(seq 1 100); do
    if [ -x "$bin/pg_isready" ]; then
      "$bin/pg_isready" -q -h 127.0.0.1 -p "$port" -t 2 && { ready=1; break; }
    elif (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      ready=1
      break
    fi
    sleep 0.1
  done
  [ "$ready" -eq 1 ] || { _runner_pg_skip "the server on port $port did not answer within 10 seconds"; return 0; }

  psql=$bin/psql
  [ -x "$psql" ] || psql=$(command -v psql 2>/dev/null)
  [ -n "$psql" ] || { _runner_pg_skip "no psql to create the database with"; return 0; }
  if ! out=$(PGCONNECT_TIMEOUT=10 "$psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U postgres -d postgres \
    -c "CREATE DATABASE runner_test" 2>&1); then
    _runner_pg_skip "cannot create the database runner_test: $(printf '%s\n' "$out" | tail -n 1)"
    return 0
  fi

  export RUNNER_TEST_POSTGRES_URL="postgresql://postgres@127.0.0.1:$port/runner_test"
  _runner_pg_say "PostgreSQL is up: RUNNER_TEST_POSTGRES_URL=$RUNNER_TEST_POSTGRES_URL (data in $dir)"
  if [ -z "$(trap -p EXIT)" ]; then
    trap postgres_stop EXIT
  fi
  return 0
}

_runner_pg_options=$(set +o)
set +e
_runner_pg_start "$@"
eval "$_runner_pg_options"
unset _runner_pg_options
true
