#!/usr/bin/env bash
# Stops the throwaway PostgreSQL that pg-up.sh started and removes its directory.
#
#   Examples/scripts/pg-down.sh                      # reads ${PG_STATE:-/tmp/feed-pg.env}
#   PGDIR=/tmp/feed-pg.XXXXXX Examples/scripts/pg-down.sh
#
# `pg_ctl stop -m fast` as the postgres user; if that fails, the postmaster is
# killed by its recorded PID. Does nothing (and succeeds) when nothing is up.
set -euo pipefail

STATE=${PG_STATE:-/tmp/feed-pg.env}
while [[ $# -gt 0 ]]; do
    case $1 in
        --state) STATE=$2; shift 2 ;;
        --state=*) STATE=${1#--state=}; shift ;;
        -h|--help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "pg-down: unknown argument: $1" >&2; exit 2 ;;
    esac
done

log() { echo "pg-down: $*" >&2; }

DIR=${PGDIR:-}
if [[ -z $DIR && -f $STATE ]]; then
    DIR=$(sed -n 's/^PGDIR=//p' "$STATE")
fi
if [[ -z $DIR ]]; then
    log "nothing to stop (no PGDIR and no state file $STATE)"
    exit 0
fi
if [[ ! -d $DIR ]]; then
    log "nothing to stop ($DIR is gone)"
    if [[ -f $STATE ]] && grep -qxF "PGDIR=$DIR" "$STATE"; then rm -f "$STATE"; fi
    exit 0
fi
if [[ ! -f $DIR/.feed-pg ]]; then
    log "refusing to touch $DIR: not made by pg-up.sh (no .feed-pg marker)"
    exit 1
fi

source "$(dirname "${BASH_SOURCE[0]}")/pg-common.sh"  # as_pg

find_pg_ctl() {
    if [[ -n ${PG_BIN:-} && -x $PG_BIN/pg_ctl ]]; then echo "$PG_BIN/pg_ctl"; return 0; fi
    local version dir
    version=$(cat "$DIR/data/PG_VERSION" 2>/dev/null || true)
    if [[ -n $version && -x /usr/lib/postgresql/$version/bin/pg_ctl ]]; then
        echo "/usr/lib/postgresql/$version/bin/pg_ctl"; return 0
    fi
    for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
        if [[ -x $dir/pg_ctl ]]; then echo "$dir/pg_ctl"; return 0; fi
    done
    command -v pg_ctl
}

# The postmaster's PID: from the live postmaster.pid, else the one pg-up.sh saved.
PID=
if [[ -f $DIR/data/postmaster.pid ]]; then
    PID=$(head -1 "$DIR/data/postmaster.pid")
elif [[ -f $DIR/postmaster.pid.saved ]]; then
    PID=$(cat "$DIR/postmaster.pid.saved")
fi
# Only a PID that is still a postgres process running on this data directory.
is_ours() {
    [[ -n $1 ]] && [[ -r /proc/$1/cmdline ]] && tr '\0' ' ' < "/proc/$1/cmdline" | grep -q -- "$DIR/data"
}

if [[ -f $DIR/data/postmaster.pid ]]; then
    PG_CTL=$(find_pg_ctl || true)
    if [[ -n $PG_CTL ]] && as_pg "$PG_CTL" -D "$DIR/data" -m fast -w -t 30 stop >/dev/null 2>&1; then
        log "stopped PostgreSQL in $DIR"
    else
        log "pg_ctl stop failed; killing postmaster ${PID:-?}"
    fi
fi
if is_ours "$PID"; then
    kill -TERM "$PID" 2>/dev/null || true
    for _ in $(seq 1 50); do is_ours "$PID" || break; sleep 0.2; done
    if is_ours "$PID"; then kill -KILL "$PID" 2>/dev/null || true; sleep 0.5; fi
    if is_ours "$PID"; then log "postmaster $PID did not die"; exit 1; fi
fi

rm -rf "$DIR"
if [[ -f $STATE ]] && grep -qxF "PGDIR=$DIR" "$STATE"; then rm -f "$STATE"; fi
log "removed $DIR"
