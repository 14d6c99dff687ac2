#!/usr/bin/env bash
# The example's whole check in one command, as CI runs it:
#
#   bash Examples/scripts/smoke.sh
#
# Builds Examples/ in debug and runs its unit tests, starts a throwaway
# PostgreSQL (pg-up.sh) and feed-server processes on free ports, then runs:
#   - lifecycle_check.py against a fresh server: LISTEN only while clients are
#     there (and 5 s after), replay, a PostgreSQL outage (503, then resync),
#     eviction of a stalled `.bounded` client (close code 1013);
#   - feed-load --smoke across two servers: 50 connections, without and with
#     slow clients, then 50 on 10 topics (each gets its topic's messages only);
#   - feed-server --batch-writes: a client that stops reading gets its batch in
#     order, written in fewer flushes than messages (/stats writes);
#   - recovery (issue 28): feed-load --reconnect (clients leave mid-run and come
#     back with since=: every message exactly once, in order) and ws_check.py
#     --only-recovery (the missed messages then `recovered`; resync for another
#     epoch, a since ahead, a since out of the window; bad since/epoch are 400);
#   - ws_check.py (Python websockets): a client that stops reading, then reads a
#     batch (every message, in order, in fewer flushes than messages), 50 clients
#     and a slow one on both servers, then clients on 3 topics (isolation,
#     listeningTopics, bad topics refused);
#   - metrics_check.py: /metrics on both servers (Prometheus text format: names,
#     types, the histogram's buckets) against /stats, around 10 clients per
#     server and 20 messages;
#   - browser_check.py: the live page in headless Chromium (installed if missing),
#     its topic box too;
#   - hardening_check.py: a hostile client (issue 26) against servers it starts
#     itself: concurrent first publishes, bad bodies, 21 clients that never read,
#     40,000 connections opened and closed, SIGTERM with a client that ignores
#     the close, timeouts and the connection cap, malformed HTTP, RFC 6455 errors,
#     a valid request and bad bytes in one packet (its own answer first), refused
#     upgrades (each answered with its reason), SIGTERM while PostgreSQL does not
#     answer; then the process-wide limits (the history cap, the channel
#     namespace, the topic cap, stalled recovering clients); all of those last
#     seven against --batch-writes servers too;
#   - seven deliberate faults that must be caught: a server that skips `gap`
#     frames and the actor-channel hub, where one slow client holds everyone
#     back (feed-load), a server that never evicts a stalled `.bounded`
#     client (lifecycle_check.py), one that puts every topic on `feed`
#     (feed-load --topics and ws_check.py --only-topics), one that leaves
#     out a recovered message (feed-load --reconnect and ws_check.py
#     --only-recovery), one whose /metrics misses deliveries (metrics_check.py),
#     and one that counts a connection's drops twice in /stats (ws_check.py's
#     stats-dropped-exact: the clients' last gap frames against /stats).
# With --tsan, the servers are built with ThreadSanitizer (about 7 more
# minutes of build) and any report stops them, which fails the checks.
# Stops everything it started, by PID, even on failure. Every step has a time
# limit. Prints `N passed, N failed` last (the sum over every check it ran)
# and exits 1 if anything failed.
set -uo pipefail
# Every connection is a file: take the hard limit (feed-server also raises its own).
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$HERE"
SERVER=.build/debug/feed-server
TSAN=0
[[ ${1:-} == --tsan ]] && TSAN=1
WORK=$(mktemp -d /tmp/feed-smoke.XXXXXX)
export PG_STATE=$WORK/pg.env
PIDS=()
declare -A SERVER_PID
passed=0
failed=0
started=$(date +%s)

cleanup() {
    # Only the script itself cleans up. A subshell (stop_server's killer) that
    # is signalled before it has reset the inherited traps (on a loaded machine
    # it may not have run at all yet) would otherwise run this too: stop every
    # server, PostgreSQL, and remove $WORK in the middle of the run.
    [[ $BASHPID == "$$" ]] || return 0
    # Servers hardening_check.py started, should it have been killed before stopping them.
    for file in "$WORK"/hardening/*.pid; do [[ -f $file ]] && PIDS+=("$(cat "$file")"); done
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null; done
    for pid in "${PIDS[@]}"; do
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null
    done
    [[ -f $PG_STATE ]] && timeout 120 bash scripts/pg-down.sh >/dev/null 2>&1
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

step() { echo; echo "=== $* (t+$(( $(date +%s) - started ))s)"; }
fail_now() {  # an infrastructure step failed: nothing after it can run
    echo "smoke: $*" >&2
    failed=$((failed + 1))
    echo "$passed passed, $failed failed"
    exit 1
}
# tally LOG: adds the counts of the log's last "N passed, N failed" line
# (a tool that died before printing it counts as one failure).
tally() {
    local line
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$1" | tail -1)
    if [[ -z $line ]]; then
        echo "smoke: $(basename "$1") printed no summary: counted as 1 failure" >&2
        failed=$((failed + 1))
        return
    fi
    passed=$((passed + ${line%% passed*}))
    local f=${line#*, }
    failed=$((failed + ${f%% failed}))
}
# run NAME SECONDS command...: runs a checker, shows its FAIL lines and summary, tallies it.
run() {
    local name=$1 seconds=$2; shift 2
    local log=$WORK/$name.log
    timeout --kill-after=10 "$seconds" "$@" >"$log" 2>&1
    local status=$?
    [[ $status -eq 124 || $status -eq 137 ]] && echo "smoke: $name timed out after ${seconds}s" | tee -a "$log"
    grep -E '^(FAIL|[0-9]+ passed)' "$log" || tail -20 "$log"
    tally "$log"
    if [[ $status -ne 0 ]] && ! grep -q '^FAIL' "$log"; then
        tail -20 "$log"
        failed=$((failed + 1))  # it failed without saying which check
    fi
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }
# start_server PORT HUB [ENV=VALUE...]: starts a feed-server, waits until /stats answers.
start_server() {
    local port=$1 hub=$2; shift 2
    # shellcheck disable=SC2086  # SERVER_ARGS: extra flags, split on spaces
    env "$@" "$SERVER" --port "$port" --postgres "$FEED_POSTGRES" --hub "$hub" ${SERVER_ARGS:-} \
        >"$WORK/server-$port.log" 2>&1 &
    PIDS+=($!)
    SERVER_PID[$port]=$!
    for _ in $(seq 300); do
        curl -sf "http://127.0.0.1:$port/stats" >/dev/null 2>&1 && return 0
        kill -0 "${PIDS[-1]}" 2>/dev/null || break
        sleep 0.1
    done
    tail -20 "$WORK/server-$port.log"
    fail_now "feed-server on $port ($hub) did not start"
}
# stop_server PORT: SIGTERM by the PID start_server recorded; a server must
# shut down gracefully (exit 0 within 10 s), which counts as a check.
stop_server() {
    local pid=${SERVER_PID[$1]} status
    kill "$pid" 2>/dev/null
    ( trap - EXIT INT TERM; sleep 10; kill -9 "$pid" 2>/dev/null ) &
    local killer=$!
    wait "$pid"; status=$?
    kill "$killer" 2>/dev/null; wait "$killer" 2>/dev/null
    if [[ $status -eq 0 ]]; then
        passed=$((passed + 1)); echo "PASS feed-server on $1 shut down cleanly on SIGTERM"
    else
        failed=$((failed + 1)); echo "FAIL feed-server on $1 exited with status $status on SIGTERM"; tail -5 "$WORK/server-$1.log"
    fi
}

step "build Examples (debug) and run its unit tests"
timeout --kill-after=30 1800 swift build >"$WORK/build.log" 2>&1 || { tail -30 "$WORK/build.log"; fail_now "build failed"; }
timeout --kill-after=30 900 swift test >"$WORK/test.log" 2>&1
if [[ $? -eq 0 ]]; then passed=$((passed + 1)); echo "PASS unit tests ($(grep -Eo 'with [0-9]+ tests' "$WORK/test.log" | tail -1))"
else tail -30 "$WORK/test.log"; failed=$((failed + 1)); echo "FAIL unit tests"; fi

if [[ $TSAN -eq 1 ]]; then
    step "build feed-server with ThreadSanitizer"
    timeout --kill-after=30 2400 swift build --sanitize=thread --scratch-path .build-tsan --product feed-server >"$WORK/build-tsan.log" 2>&1 \
        || { tail -30 "$WORK/build-tsan.log"; fail_now "TSan build failed"; }
    SERVER=.build-tsan/debug/feed-server
    export TSAN_OPTIONS="halt_on_error=1"  # no suppressions: a report stops the server
fi

step "PostgreSQL (pg-up.sh) and the Python clients (setup.sh)"
timeout 900 bash scripts/pg-up.sh >"$WORK/pg.out" 2>"$WORK/pg.err" || { cat "$WORK/pg.err"; fail_now "pg-up.sh failed"; }
source "$PG_STATE"  # PostgreSQL is stopped by pg-down.sh in cleanup, by its PID
timeout 900 bash clients/setup.sh || fail_now "clients/setup.sh failed"
PY=$HERE/.venv/bin/python

A=$(free_port); B=$(free_port)
step "lifecycle: LISTEN start and stop, replay, outage and resync (server on $A)"
start_server "$A" broadcast
run lifecycle 240 "$PY" clients/lifecycle_check.py --server "127.0.0.1:$A" --postgres "$FEED_POSTGRES" --pause scripts/pg-pause.sh

step "feed-load --smoke: two servers, 50 connections, without and with slow clients"
start_server "$B" broadcast
run feed-load 300 .build/debug/feed-load --servers "127.0.0.1:$A,127.0.0.1:$B" --connections 50 --slow 10% --smoke

step "feed-load --topics: two servers, 50 connections on 10 topics"
run feed-load-topics 300 .build/debug/feed-load --servers "127.0.0.1:$A,127.0.0.1:$B" --connections 50 --topics 10 --slow 0% --smoke

step "Python websockets clients: a batch in order, 50 and a slow one on both servers, then 3 topics"
run ws-check 300 "$PY" clients/ws_check.py --servers "127.0.0.1:$A,127.0.0.1:$B" --clients 50 --messages 200 --slow 1 \
    --topics 3 --batch-messages 60 --timeout 120

step "feed-server --batch-writes: a stopped client's batch in order, in fewer flushes than messages; eviction's close frame"
G=$(free_port)
SERVER_ARGS=--batch-writes start_server "$G" broadcast
run batch-writes 120 "$PY" clients/ws_check.py --servers "127.0.0.1:$G" --clients 5 --messages 20 --slow 0 \
    --batch-messages 60 --batch-flushes --timeout 60
# The batch writer sends an evicted client's close frame itself (behind its batches).
run lifecycle-batch 180 "$PY" clients/lifecycle_check.py --only-eviction --server "127.0.0.1:$G" \
    --postgres "$FEED_POSTGRES" --pause scripts/pg-pause.sh
stop_server "$G"

step "recovery: clients that leave mid-run come back with since= (feed-load --reconnect, ws_check.py --only-recovery)"
run feed-load-reconnect 300 .build/debug/feed-load --servers "127.0.0.1:$A,127.0.0.1:$B" --connections 50 --slow 0% \
    --reconnect 20% --smoke
run ws-recovery 180 "$PY" clients/ws_check.py --servers "127.0.0.1:$A,127.0.0.1:$B" --only-recovery --timeout 120

step "metrics: /metrics against /stats on both servers"
run metrics 120 "$PY" clients/metrics_check.py --servers "127.0.0.1:$A,127.0.0.1:$B" --clients 10 --messages 20 --timeout 60

step "headless Chromium: the live page"
if timeout 1500 bash clients/install-chromium.sh; then
    run browser 180 "$PY" clients/browser_check.py --server "127.0.0.1:$A" --screenshot "$WORK/live-page.png" --timeout 120
else
    echo "FAIL chromium could not be installed"; failed=$((failed + 1))
fi
stop_server "$A"; stop_server "$B"

step "hardening: a hostile client (issue 26), against servers the checker starts"
HARDENING=(--binary "$SERVER" --postgres "$FEED_POSTGRES" --logs "$WORK/hardening")
# ThreadSanitizer: RSS is not measured, so the volume that makes it meaningful is not needed.
[[ $TSAN -eq 1 ]] && HARDENING+=(--tsan --messages 1000 --cycles 2000)
run hardening 900 "$PY" clients/hardening_check.py "${HARDENING[@]}"
run hardening-batch 420 "$PY" clients/hardening_check.py "${HARDENING[@]}" --server-flags=--batch-writes \
    --only answer-first,upgrade-refusals,hung-postgres,history-cap,namespace,topic-cap,stalled-recovery

# A checker is only as good as the faults it catches: each of these must make its checker fail.
# caught LOG SECONDS PATTERN CHECKER WHAT command...: the command must exit 1 with a line
# matching PATTERN (a FAIL of the check meant to catch the fault), else the fault was missed.
caught() {
    local log=$WORK/$1.log seconds=$2 pattern=$3 checker=$4 what=$5; shift 5
    timeout --kill-after=10 "$seconds" "$@" >"$log" 2>&1
    if [[ $? -eq 1 ]] && grep -q "$pattern" "$log"; then
        passed=$((passed + 1)); echo "PASS $checker caught it: $(grep -m1 "$pattern" "$log" | cut -c1-200)"
    else
        failed=$((failed + 1)); echo "FAIL $checker missed $what"; tail -25 "$log"
    fi
}

step "deliberate fault: a server that never sends gap frames"
C=$(free_port)
start_server "$C" broadcast FEED_SERVER_FAULT=skip-gaps
caught fault-gaps 300 '^FAIL .*every slow client saw a gap' feed-load "a server that skips gap frames" \
    .build/debug/feed-load --servers "127.0.0.1:$C" --connections 20 --slow 10% --smoke
stop_server "$C"

step "deliberate fault: a hub where one slow client holds everyone back (actor-channel)"
D=$(free_port)
start_server "$D" actor-channel
caught fault-hol 300 '^FAIL .*p99 within 2x' feed-load "head-of-line blocking" \
    .build/debug/feed-load --servers "127.0.0.1:$D" --connections 20 --slow 10% --smoke --hub actor-channel
stop_server "$D"

step "deliberate fault: a server that never evicts a stalled bounded client"
E=$(free_port)
start_server "$E" broadcast FEED_SERVER_FAULT=no-eviction
caught fault-evict 120 '^FAIL .*is evicted' lifecycle_check "a server that never evicts" \
    "$PY" clients/lifecycle_check.py --only-eviction --server "127.0.0.1:$E" \
    --postgres "$FEED_POSTGRES" --pause scripts/pg-pause.sh
stop_server "$E"

step "deliberate fault: a server that puts every topic on feed (topic-crosstalk)"
F=$(free_port)
start_server "$F" broadcast FEED_SERVER_FAULT=topic-crosstalk
caught fault-topics 300 "^FAIL .*no client got another topic's message" feed-load "a server that mixes topics" \
    .build/debug/feed-load --servers "127.0.0.1:$F" --connections 20 --topics 4 --slow 0% --smoke
caught fault-topics-ws 120 '^FAIL topic-isolation' ws_check "a server that mixes topics" \
    "$PY" clients/ws_check.py --servers "127.0.0.1:$F" --only-topics --topics 3 --timeout 60
stop_server "$F"

step "deliberate fault: a server whose recovery leaves out a message (recovery-skips-one)"
G=$(free_port)
start_server "$G" broadcast FEED_SERVER_FAULT=recovery-skips-one
caught fault-recovery 300 '^FAIL .*every reconnecting client got every message exactly once' feed-load \
    "a recovery that leaves out a message" \
    .build/debug/feed-load --servers "127.0.0.1:$G" --connections 20 --slow 0% --reconnect 50% --smoke
caught fault-recovery-ws 120 '^FAIL recovery-missed-then-recovered' ws_check "a recovery that leaves out a message" \
    "$PY" clients/ws_check.py --servers "127.0.0.1:$G" --only-recovery --history-messages 0 --timeout 60
stop_server "$G"

step "deliberate fault: a server whose /metrics misses deliveries (metrics-miss-delivered)"
G=$(free_port)
start_server "$G" broadcast FEED_SERVER_FAULT=metrics-miss-delivered
caught fault-metrics 120 '^FAIL .*feed_delivered_total' metrics_check "a server whose metrics miss deliveries" \
    "$PY" clients/metrics_check.py --servers "127.0.0.1:$G" --clients 5 --messages 10 --timeout 30 --settle 3
stop_server "$G"

step "deliberate fault: a server that counts a connection's drops twice (count-drops-twice)"
G=$(free_port)
start_server "$G" broadcast FEED_SERVER_FAULT=count-drops-twice
caught fault-drops 120 '^FAIL stats-dropped-exact' ws_check "a server that counts drops twice" \
    "$PY" clients/ws_check.py --servers "127.0.0.1:$G" --clients 5 --messages 200 --slow 1 --timeout 60
stop_server "$G"

step "done in $(( $(date +%s) - started ))s"
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
