#!/usr/bin/env bash
# The full comparison, in release: each hub behind two feed-server processes,
# 100 and 1,000 connections, each without and then with 5 % slow clients,
# 100 messages a second for 20 s per run. Writes results/DATE.md.
#
#   bash Examples/scripts/compare.sh [--seconds 20] [--connections 100,1000] [--hubs broadcast,lock-stream,actor-channel]
#                                    [--topics 1,100,1000] [--out results/FILE.md]
#
# --topics: one set of runs per topic count (feed-load --topics N: client i on
# topic i mod N, message n to topic n mod N); 1 is the default topic `feed`.
# SCRATCH=DIR builds in DIR instead of .build.
#
# Not a CI step: about 15 minutes on a 2-core machine. Stops everything it
# started, by PID.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$HERE"
SECONDS_PER_RUN=20
CONNECTIONS=100,1000
HUBS=broadcast,lock-stream,actor-channel
TOPICS=1
OUT=
SCRATCH=${SCRATCH:-.build}
while [[ $# -gt 0 ]]; do
    case $1 in
        --seconds) SECONDS_PER_RUN=$2; shift 2 ;;
        --connections) CONNECTIONS=$2; shift 2 ;;
        --hubs) HUBS=$2; shift 2 ;;
        --topics) TOPICS=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        *) echo "compare: unknown argument $1" >&2; exit 2 ;;
    esac
done
WORK=$(mktemp -d /tmp/feed-compare.XXXXXX)
export PG_STATE=$WORK/pg.env
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null; done
    wait 2>/dev/null
    [[ -f $PG_STATE ]] && timeout 120 bash scripts/pg-down.sh >/dev/null 2>&1
    rm -rf "$WORK"
}
trap cleanup EXIT
ulimit -n 65536 2>/dev/null || true

timeout 2400 swift build -c release --scratch-path "$SCRATCH" >"$WORK/build.log" 2>&1 || { tail -30 "$WORK/build.log"; exit 1; }
timeout 900 bash scripts/pg-up.sh >/dev/null || exit 1
source "$PG_STATE"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }

DATE=$(date -u +%Y-%m-%d)
OUT=${OUT:-results/$DATE.md}
COMMIT=$(git -C "$HERE" rev-parse --short HEAD)
{
    echo "# LiveFeed: three hubs under load ($DATE)"
    echo
    echo "Taken by \`bash Examples/scripts/compare.sh\` at commit $COMMIT: release builds; for each hub, two"
    echo "\`feed-server\` processes (\`--sndbuf 32768\`) on one PostgreSQL $(psql "$FEED_POSTGRES" -Atc 'show server_version') on loopback;"
    echo "\`feed-load\` publishing ${SECONDS_PER_RUN} s at 100 messages/s (POST /publish alternating between the servers, 256-byte padding),"
    echo "with fast clients (\`policy=newest&capacity=250\`, HummingbirdWSClient) and, in the second run of each pair,"
    echo "5 % slow clients (\`policy=newest&capacity=64\`, 10 reads a second, 4 KiB receive buffer)."
    echo "Everything on one machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -sr)."
    echo "Latency: the publisher's clock at POST to the fast client's receipt, every message. mem/conn: server RSS growth while"
    echo "connecting, per connection. CPU: both servers' user+system seconds during publishing."
    echo "Topics per set of runs: $TOPICS (clients spread evenly; with more than one, \`feed-load --topics N\`)."
    echo
} >"$OUT"

IFS=, read -ra hubs <<<"$HUBS"
IFS=, read -ra topic_counts <<<"$TOPICS"
for hub in "${hubs[@]}"; do
  for topics in "${topic_counts[@]}"; do
    A=$(free_port); B=$(free_port)
    for port in $A $B; do
        "$SCRATCH"/release/feed-server --port "$port" --postgres "$FEED_POSTGRES" --hub "$hub" --log-level warning >"$WORK/server-$port.log" 2>&1 &
        PIDS+=($!)
    done
    for port in $A $B; do
        for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/stats" >/dev/null && break; sleep 0.1; done
    done
    echo "## $hub, $topics topic(s)" >>"$OUT"
    echo >>"$OUT"
    echo '```' >>"$OUT"
    timeout 1800 "$SCRATCH"/release/feed-load --servers "127.0.0.1:$A,127.0.0.1:$B" --connections "$CONNECTIONS" \
        --rate 100 --seconds "$SECONDS_PER_RUN" --slow 5% --hub "$hub" --topics "$topics" 2>&1 | tee "$WORK/$hub-$topics.log" | grep -v '^run ' >>"$OUT"
    echo '```' >>"$OUT"
    echo >>"$OUT"
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null; done
    wait "${PIDS[@]}" 2>/dev/null
    PIDS=()
  done
done
echo "compare: wrote $OUT" >&2
