#!/usr/bin/env bash
# Starts a throwaway PostgreSQL on loopback for the feed example.
#
#   eval "$(Examples/scripts/pg-up.sh)"     # sets PGDIR and FEED_POSTGRES
#   PG_STATE=/tmp/my.env Examples/scripts/pg-up.sh
#
# Installs Debian's postgresql with apt-get only if initdb/pg_ctl are missing,
# runs initdb as the postgres user into a fresh temporary directory, starts the
# server with trust auth on 127.0.0.1 and a free port (unix socket inside the
# directory), creates the database `feed`, and prints exactly two lines:
#   PGDIR=/tmp/feed-pg.XXXXXX
#   FEED_POSTGRES=postgres://postgres@127.0.0.1:PORT/feed
# The same two lines go to the state file ${PG_STATE:-/tmp/feed-pg.env}, which
# pg-down.sh and pg-pause.sh read. Calling it again while that cluster runs
# prints the same lines (and restarts the cluster if pg-pause.sh stopped it).
#
# Environment: PG_STATE (state file), PG_BIN (a directory with initdb and pg_ctl),
# PG_WAIT_SECONDS (readiness limit, default 60).
set -euo pipefail

STATE=${PG_STATE:-/tmp/feed-pg.env}
WAIT=${PG_WAIT_SECONDS:-60}
while [[ $# -gt 0 ]]; do
    case $1 in
        --state) STATE=$2; shift 2 ;;
        --state=*) STATE=${1#--state=}; shift ;;
        -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "pg-up: unknown argument: $1" >&2; exit 2 ;;
    esac
done

log() { echo "pg-up: $*" >&2; }
die() { log "$*"; exit 1; }

find_bindir() {
    if [[ -n ${PG_BIN:-} && -x $PG_BIN/initdb && -x $PG_BIN/pg_ctl ]]; then
        echo "$PG_BIN"; return 0
    fi
    local dir
    for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
        if [[ -x $dir/initdb && -x $dir/pg_ctl ]]; then echo "$dir"; return 0; fi
    done
    return 1
}

# Runs a command as the postgres user when we are root (PostgreSQL refuses to
# run as root), else as ourselves; always from a directory that user can read.
source "$(dirname "${BASH_SOURCE[0]}")/pg-common.sh"  # as_pg

free_port() {
    if command -v python3 >/dev/null; then
        python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
        return
    fi
    local port
    for port in $(seq 54320 54999); do
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then echo "$port"; return; fi
    done
    die "no free port found in 54320-54999"
}

# Waits until the server answers on 127.0.0.1:$2, at most $WAIT seconds.
wait_ready() {
    local bin=$1 port=$2 deadline=$((SECONDS + WAIT))
    until "$bin/pg_isready" -q -h 127.0.0.1 -p "$port" -t 2; do
        if (( SECONDS >= deadline )); then
            return 1
        fi
        sleep 0.2
    done
}

print_state() {
    local dir=$1 port=$2
    local lines
    lines="PGDIR=$dir
FEED_POSTGRES=postgres://postgres@127.0.0.1:$port/feed"
    mkdir -p "$(dirname "$STATE")"
    printf '%s\n' "$lines" > "$STATE.tmp.$$"
    mv -f "$STATE.tmp.$$" "$STATE"
    printf '%s\n' "$lines"
}

BIN=$(find_bindir) || {
    [[ $(id -u) -eq 0 ]] || die "initdb/pg_ctl not found and not root: install Debian's postgresql"
    log "initdb/pg_ctl not found: installing Debian's postgresql with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    timeout 600 apt-get update -qq
    timeout 1200 apt-get install -y -qq postgresql >/dev/null
    BIN=$(find_bindir) || die "postgresql installed, but no /usr/lib/postgresql/*/bin/initdb"
}
if [[ $(id -u) -eq 0 ]]; then
    id postgres >/dev/null 2>&1 || die "no postgres user (Debian's postgresql package creates it)"
fi

# Already up (or paused) from an earlier call with the same state file?
if [[ -f $STATE ]]; then
    OLD_DIR=$(sed -n 's/^PGDIR=//p' "$STATE")
    if [[ -n $OLD_DIR && -f $OLD_DIR/.feed-pg && -f $OLD_DIR/data/PG_VERSION ]]; then
        OLD_PORT=$(cat "$OLD_DIR/port")
        if ! as_pg "$BIN/pg_ctl" -D "$OLD_DIR/data" status >/dev/null 2>&1; then
            log "restarting the cluster in $OLD_DIR"
            as_pg "$BIN/pg_ctl" -D "$OLD_DIR/data" -l "$OLD_DIR/postgres.log" -w -t "$WAIT" start >/dev/null \
                || die "could not restart the cluster in $OLD_DIR (see $OLD_DIR/postgres.log)"
        fi
        wait_ready "$BIN" "$OLD_PORT" || die "cluster in $OLD_DIR not ready after ${WAIT}s"
        head -1 "$OLD_DIR/data/postmaster.pid" > "$OLD_DIR/postmaster.pid.saved"
        print_state "$OLD_DIR" "$OLD_PORT"
        log "already up: $OLD_DIR on 127.0.0.1:$OLD_PORT (state $STATE)"
        exit 0
    fi
    log "ignoring stale state file $STATE"
fi

DIR=$(mktemp -d /tmp/feed-pg.XXXXXX)
touch "$DIR/.feed-pg"
STARTED=0
cleanup_on_error() {
    [[ $STARTED -eq 1 ]] && return
    if [[ -f $DIR/data/postmaster.pid ]]; then
        as_pg "$BIN/pg_ctl" -D "$DIR/data" -m immediate -w -t 10 stop >/dev/null 2>&1 || true
    fi
    rm -rf "$DIR"
}
trap 'cleanup_on_error' EXIT
if [[ $(id -u) -eq 0 ]]; then chown -R postgres: "$DIR"; fi
chmod 700 "$DIR"

as_pg timeout 120 "$BIN/initdb" -D "$DIR/data" -U postgres --auth=trust --no-locale -E UTF8 --no-sync \
    > "$DIR/initdb.log" 2>&1 || { log "initdb failed:"; cat "$DIR/initdb.log" >&2; false; }

PORT=$(free_port)
echo "$PORT" > "$DIR/port"
cat >> "$DIR/data/postgresql.conf" <<EOF

# feed example (pg-up.sh): throwaway, loopback only
listen_addresses = '127.0.0.1'
port = $PORT
unix_socket_directories = '$DIR'
fsync = off
synchronous_commit = off
full_page_writes = off
max_connections = 200
EOF
cat > "$DIR/data/pg_hba.conf" <<EOF
# feed example (pg-up.sh): trust on loopback only
local all all              trust
host  all all 127.0.0.1/32 trust
EOF
if [[ $(id -u) -eq 0 ]]; then chown postgres: "$DIR/data/postgresql.conf" "$DIR/data/pg_hba.conf"; fi

as_pg "$BIN/pg_ctl" -D "$DIR/data" -l "$DIR/postgres.log" -w -t "$WAIT" start >/dev/null \
    || { log "pg_ctl start failed:"; tail -20 "$DIR/postgres.log" >&2; false; }
head -1 "$DIR/data/postmaster.pid" > "$DIR/postmaster.pid.saved"
wait_ready "$BIN" "$PORT" || { log "not ready after ${WAIT}s"; tail -20 "$DIR/postgres.log" >&2; false; }
timeout 30 "$BIN/createdb" -h 127.0.0.1 -p "$PORT" -U postgres feed
STARTED=1

print_state "$DIR" "$PORT"
log "PostgreSQL $("$BIN/pg_ctl" --version | awk '{print $3}') up in $DIR on 127.0.0.1:$PORT, pid $(cat "$DIR/postmaster.pid.saved"), database feed (state $STATE; stop with pg-down.sh)"
