# A throw-away PostgreSQL server on loopback for the tests marked `postgres` (and for benchmarks/bench_postgres.py).
#
# Sourced by tests/run.sh:   . tests/pg.sh; pg_start; trap pg_stop EXIT
# Or run by hand:            eval "$(bash tests/pg.sh start)"   ...   bash tests/pg.sh stop
#
# pg_start installs Debian's `postgresql` package when no server binaries are found (needs root and apt-get), runs
# initdb into a fresh temporary directory, starts the server on 127.0.0.1 on a free port and exports
# EVALSTOP_PG_URL (a superuser URL: the tests create and drop one database each) and EVALSTOP_PG_DIR. If
# EVALSTOP_PG_URL is already set it does nothing, so a developer can point the tests at a server of their own.
# PostgreSQL refuses to run as root, so as root (as in CI) the server runs as the `postgres` user of the package.
# Nothing here is fatal: when no server can be had, the postgres tests skip with a reason and the rest still runs.

_pg_log() { echo "tests/pg.sh: $*" >&2; }

_pg_bindir() {  # newest installed server's bin dir, or nothing
    local d
    for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
        [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ] && { echo "$d"; return 0; }
    done
    command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1 && dirname "$(command -v pg_ctl)"
}

_pg_as_owner() {  # run a command as the server's owner (the postgres user when we are root)
    if [ "$(id -u)" -eq 0 ]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

pg_start() {
    if [ -n "${EVALSTOP_PG_URL:-}" ]; then
        _pg_log "using EVALSTOP_PG_URL from the environment"
        return 0
    fi
    local bindir
    bindir=$(_pg_bindir || true)
    if [ -z "$bindir" ] && [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
        _pg_log "installing postgresql with apt-get"
        # Try without a package-list refresh first: it is the slow part and usually not needed.
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends postgresql >/dev/null 2>&1 \
            || { apt-get update -q >/dev/null 2>&1 \
                 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends postgresql >/dev/null 2>&1; } \
            || _pg_log "apt-get install postgresql failed"
        bindir=$(_pg_bindir || true)
    fi
    if [ -z "$bindir" ]; then
        _pg_log "no PostgreSQL server found; tests marked postgres will be skipped"
        return 0
    fi
    if [ "$(id -u)" -eq 0 ] && ! id postgres >/dev/null 2>&1; then
        _pg_log "running as root but there is no postgres user to own the server; postgres tests will be skipped"
        return 0
    fi
    local dir port
    dir=$(mktemp -d "${TMPDIR:-/tmp}/evalstop-pg.XXXXXX")
    [ "$(id -u)" -eq 0 ] && chown postgres: "$dir"
    chmod 700 "$dir"
    # A free port: bind to port 0 and read what the kernel gave. A race with another process is possible but rare;
    # pg_ctl then fails and we say so.
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    # trust auth on loopback only: a test server in a private temp dir, not a deployment (see docs/service.md).
    if ! _pg_as_owner "$bindir/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 --no-sync >"$dir/initdb.log" 2>&1; then
        _pg_log "initdb failed (see $dir/initdb.log); postgres tests will be skipped"
        return 0
    fi
    if ! _pg_as_owner "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 30 \
            -o "-h 127.0.0.1 -p $port -k $dir -c max_connections=300 -c shared_buffers=64MB" start >/dev/null 2>&1; then
        _pg_log "the server did not start (see $dir/server.log); postgres tests will be skipped"
        return 0
    fi
    export EVALSTOP_PG_DIR="$dir" EVALSTOP_PG_BINDIR="$bindir"
    export EVALSTOP_PG_URL="postgresql://postgres@127.0.0.1:$port/postgres"
    _pg_log "PostgreSQL $("$bindir/pg_ctl" --version | awk '{print $3}') on 127.0.0.1:$port (data in $dir)"
}

pg_stop() {
    # Only stop what pg_start started (EVALSTOP_PG_DIR is unset when the URL came from outside).
    local dir=${EVALSTOP_PG_DIR:-} bindir=${EVALSTOP_PG_BINDIR:-$(_pg_bindir || true)}
    [ -n "$dir" ] && [ -d "$dir/data" ] || return 0
    _pg_as_owner "$bindir/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null 2>&1 || true
    rm -rf "$dir"
    unset EVALSTOP_PG_DIR EVALSTOP_PG_URL
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then  # executed, not sourced
    case "${1:-}" in
        start) pg_start; [ -n "${EVALSTOP_PG_DIR:-}" ] && \
                   echo "export EVALSTOP_PG_URL='$EVALSTOP_PG_URL' EVALSTOP_PG_DIR='$EVALSTOP_PG_DIR' EVALSTOP_PG_BINDIR='$EVALSTOP_PG_BINDIR'" ;;
        stop) pg_stop ;;
        *) echo "usage: bash tests/pg.sh start|stop   (start prints export lines for eval)" >&2; exit 2 ;;
    esac
fi
