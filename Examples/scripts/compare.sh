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
# --cost: issue 28's measurement instead: server CPU seconds per 100,000
# deliveries, fast clients only (feed-load --slow 0%), 1,000 connections at
# 200 messages/s unless said, every build and hub interleaved in each round:
#
#   SCRATCH=.build-release bash Examples/scripts/compare.sh --cost [--rounds 3] [--seconds 10] \
#       [--builds before=/tmp/old-release,after=.build-release/release] [--out results/FILE.md]
#
# --builds NAME=DIR[:FLAGS],...: feed-server binaries to compare (DIR holds feed-server;
# FLAGS, e.g. `:--batch-writes`, are added to its command line);
# default: this tree's build only. feed-load is this tree's ($SCRATCH/release, or
# FEED_LOAD=PATH); --no-build skips building this tree. Records
# `uptime` with every run; the table gives each run, then per build and hub the
# median CPU s/100k and p99, and the ratios (to the first build's broadcast hub,
# and to the same build's lock-stream hub).
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
COST=0
ROUNDS=3
RATE=100
BUILDS=
NO_BUILD=0
while [[ $# -gt 0 ]]; do
    case $1 in
        --cost) COST=1; CONNECTIONS=1000; RATE=200; SECONDS_PER_RUN=10; shift ;;
        --rounds) ROUNDS=$2; shift 2 ;;
        --rate) RATE=$2; shift 2 ;;
        --builds) BUILDS=$2; shift 2 ;;
        --no-build) NO_BUILD=1; shift ;;
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
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true  # every connection is a file, in feed-load too

if [[ $NO_BUILD == 0 ]]; then
    swift build -c release --scratch-path "$SCRATCH" >"$WORK/build.log" 2>&1 || { tail -30 "$WORK/build.log"; exit 1; }
fi
FEED_LOAD=${FEED_LOAD:-$SCRATCH/release/feed-load}
timeout 900 bash scripts/pg-up.sh >/dev/null || exit 1
source "$PG_STATE"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }

DATE=$(date -u +%Y-%m-%d)

start_servers() {  # BINARY_DIR HUB [FLAGS]: two servers on free ports, sets A, B, PIDS
    A=$(free_port); B=$(free_port)
    for port in $A $B; do
        # shellcheck disable=SC2086  # FLAGS: extra server flags, split on spaces
        "$1"/feed-server --port "$port" --postgres "$FEED_POSTGRES" --hub "$2" --log-level warning ${3:-} >"$WORK/server-$port.log" 2>&1 &
        PIDS+=($!)
    done
    for port in $A $B; do
        for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/stats" >/dev/null && break; sleep 0.1; done
    done
}
stop_servers() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null; done
    wait "${PIDS[@]}" 2>/dev/null
    PIDS=()
}

if [[ $COST == 1 ]]; then
    OUT=${OUT:-results/$DATE-cost.md}
    [[ -z $BUILDS ]] && BUILDS="this=$SCRATCH/release"
    IFS=, read -ra builds <<<"$BUILDS"
    IFS=, read -ra hubs <<<"$HUBS"
    RUNS=$WORK/runs.tsv
    for round in $(seq "$ROUNDS"); do
        for build in "${builds[@]}"; do
            for hub in "${hubs[@]}"; do
                name=${build%%=*}; dir=${build#*=}; flags=
                [[ $dir == *:* ]] && { flags=${dir#*:}; dir=${dir%%:*}; }
                start_servers "$dir" "$hub" "$flags"
                load=$(uptime | sed 's/.*load average: //')
                timeout 1800 "$FEED_LOAD" --servers "127.0.0.1:$A,127.0.0.1:$B" --connections "$CONNECTIONS" \
                    --rate "$RATE" --seconds "$SECONDS_PER_RUN" --slow 0% --hub "$hub" >"$WORK/cost.log" 2>&1
                stop_servers
                line=$(grep -m1 ' conns: published/s' "$WORK/cost.log")
                summary=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$WORK/cost.log" | tail -1)
                printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$name" "$hub" "$(date -u +%H:%M:%S)" "$load" "$line" "${summary:-no summary}" >>"$RUNS"
                echo "compare --cost: round $round, $name, $hub: ${line#*: } [$summary] (load $load)" >&2
            done
        done
    done
    COMMIT=$(git -C "$HERE" rev-parse --short HEAD)
    python3 - "$RUNS" "$OUT" "$COMMIT" "$CONNECTIONS" "$RATE" "$SECONDS_PER_RUN" "$(nproc)" "$(uname -sr)" "$BUILDS" <<'PY'
import re, statistics, sys
runs, out, commit, conns, rate, secs, cores, kernel, builds = sys.argv[1:10]
rows = []
for line in open(runs):
    rnd, build, hub, at, load, text, summary = line.rstrip('\n').split('\t')
    num = lambda key: float(m.group(1)) if (m := re.search(key + r' ([0-9.]+)', text)) else float('nan')
    rows.append(dict(round=rnd, build=build, hub=hub, at=at, load=load, pub=num('published/s'), dlv=num('delivered/s'),
                     p50=num('p50'), p99=num('p99'), mem=num('mem/conn'), cpu=num(r'CPU'), per=num(r'CPU/100k'), summary=summary))
    r = rows[-1]
    if r['per'] != r['per'] and summary.endswith(' 0 failed'):
        # A feed-load without CPU/100k: with every check passed, every client got every message.
        r['per'] = r['cpu'] / (int(conns) * int(rate) * int(secs)) * 100_000
w = open(out, 'w')
w.write(f"# Server cost per delivery ({conns} connections, {rate} messages/s)\n\n")
w.write(f"Taken by `compare.sh --cost` at commit {commit}: builds {builds}; two feed-server processes per run on one PostgreSQL on\n"
        f"loopback, feed-load (this tree's) with {conns} fast clients (`policy=newest&capacity=250`), {rate} messages/s for {secs} s, no slow\n"
        f"client; CPU: both servers' user+system seconds from all connected to all delivered (`/stats` cpuSeconds), per 100,000\n"
        f"messages the clients received. {cores} cores, {kernel}; every build and hub once per round, in that order.\n\n")
w.write("| round | build | hub | at (UTC) | load (1, 5, 15 min) | published/s | delivered/s | p50 ms | p99 ms | mem/conn KB | server CPU s | CPU s/100k | checks |\n")
w.write("|---:|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|\n")
for r in rows:
    w.write(f"| {r['round']} | {r['build']} | {r['hub']} | {r['at']} | {r['load']} | {r['pub']:.0f} | {r['dlv']:.0f} | {r['p50']:.2f} | {r['p99']:.2f} | {r['mem']:.1f} | {r['cpu']:.2f} | {r['per']:.3f} | {r['summary']} |\n")
med = {}
for r in rows: med.setdefault((r['build'], r['hub']), []).append(r)
first = rows[0]['build'] if rows else ''
base = statistics.median([r['per'] for r in med.get((first, 'broadcast'), [])] or [float('nan')])
w.write("\n| build | hub | runs | median CPU s/100k | median p99 ms | / first build's broadcast | / same build's lock-stream |\n|---|---|---:|---:|---:|---:|---:|\n")
for (build, hub), rs in med.items():
    per = statistics.median([r['per'] for r in rs]); p99 = statistics.median([r['p99'] for r in rs])
    ls = med.get((build, 'lock-stream'))
    lsper = statistics.median([r['per'] for r in ls]) if ls else float('nan')
    w.write(f"| {build} | {hub} | {len(rs)} | {per:.3f} | {p99:.2f} | {per / base:.2f} | {per / lsper:.2f} |\n")
w.close()
PY
    echo "compare: wrote $OUT" >&2
    exit 0
fi

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
        --rate "$RATE" --seconds "$SECONDS_PER_RUN" --slow 5% --hub "$hub" --topics "$topics" 2>&1 | tee "$WORK/$hub-$topics.log" | grep -v '^run ' >>"$OUT"
    echo '```' >>"$OUT"
    echo >>"$OUT"
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null; done
    wait "${PIDS[@]}" 2>/dev/null
    PIDS=()
  done
done
echo "compare: wrote $OUT" >&2
