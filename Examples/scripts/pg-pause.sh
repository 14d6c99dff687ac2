#!/usr/bin/env bash
# Simulates a database outage: stops or restarts the cluster that pg-up.sh
# started, keeping its data directory and port.
#
#   Examples/scripts/pg-pause.sh stop      # pg_ctl stop -m fast: clients are disconnected
#   Examples/scripts/pg-pause.sh start     # same port, same data; waits until ready
#   Examples/scripts/pg-pause.sh status
#
# Reads ${PG_STATE:-/tmp/feed-pg.env} (or PGDIR from the environment).
set -euo pipefail

STATE=${PG_STATE:-/tmp/feed-pg.env}
WAIT=${PG_WAIT_SECONDS:-60}
ACTION=${1:-}
log() { echo "pg-pause: $*" >&2; }
die() { log "$*"; exit 1; }
case $ACTION in
    stop|start|status) ;;
    *) die "usage: pg-pause.sh stop|start|status" ;;
esac

DIR=${PGDIR:-}
if [[ -z $DIR && -f $STATE ]]; then DIR=$(sed -n 's/^PGDIR=//p' "$STATE"); fi
[[ -n $DIR ]] || die "no PGDIR and no state file $STATE: run pg-up.sh first"
[[ -f $DIR/.feed-pg && -f $DIR/data/PG_VERSION ]] || die "$DIR is not a cluster made by pg-up.sh"
PORT=$(cat "$DIR/port")

BIN=${PG_BIN:-/usr/lib/postgresql/$(cat "$DIR/data/PG_VERSION")/bin}
[[ -x $BIN/pg_ctl ]] || BIN=$(dirname "$(command -v pg_ctl)")

source "$(dirname "${BASH_SOURCE[0]}")/pg-common.sh"  # as_pg

running() { as_pg "$BIN/pg_ctl" -D "$DIR/data" status >/dev/null 2>&1; }

case $ACTION in
    status)
        if running; then echo "running"; else echo "stopped"; fi ;;
    stop)
        if running; then
            as_pg "$BIN/pg_ctl" -D "$DIR/data" -m fast -w -t "$WAIT" stop >/dev/null
            log "stopped (data kept in $DIR, port $PORT)"
        else
            log "already stopped"
        fi ;;
    start)
        if running; then
            log "already running"
        else
            as_pg "$BIN/pg_ctl" -D "$DIR/data" -l "$DIR/postgres.log" -w -t "$WAIT" start >/dev/null \
                || { tail -20 "$DIR/postgres.log" >&2; die "pg_ctl start failed"; }
        fi
        deadline=$((SECONDS + WAIT))
        until "$BIN/pg_isready" -q -h 127.0.0.1 -p "$PORT" -t 2; do
            (( SECONDS < deadline )) || die "not ready after ${WAIT}s"
            sleep 0.2
        done
        head -1 "$DIR/data/postmaster.pid" > "$DIR/postmaster.pid.saved"
        log "running on 127.0.0.1:$PORT" ;;
esac
