#!/usr/bin/env bash
# Checks that every misuse of AsyncBroadcast traps with its message in a
# RELEASE build of a client (`precondition` prints nothing under -O; the
# library's misuse traps must). Builds Tests/ReleaseTraps (a client package
# depending on the library by path) with `-c release`, runs `misuse-probe
# CASE` for every case, and checks that each misuse case ends with a non-zero
# status (a trap) AND that its stderr contains the expected fragments of the
# `AsyncBroadcast misuse: ...` message. The control case `none` must exit 0.
#
#   bash scripts/release-traps.sh
#
# Prints one line per case and, last, "<passed> passed, <failed> failed".
# Logs: .build-release-traps/<case>.stderr. Exit status: 0 iff all passed.
set -uo pipefail
cd "$(dirname "$0")/.."

scratch=.build-release-traps
package=Tests/ReleaseTraps
mkdir -p "$scratch"

echo "=== release-traps: building $package -c release (scratch $scratch)"
build_start=$(date +%s)
if ! swift build -c release --package-path "$package" --scratch-path "$scratch" >"$scratch/build.log" 2>&1; then
    tail -30 "$scratch/build.log"
    echo "FAIL release-traps: build failed (see $scratch/build.log)"
    echo "0 passed, 1 failed"
    exit 1
fi
probe="$(swift build -c release --package-path "$package" --scratch-path "$scratch" --show-bin-path)/misuse-probe"
echo "    built in $(( $(date +%s) - build_start ))s"

# case|fragment|fragment...  (every fragment must appear in the case's stderr)
# claims: MISUSE-RELEASE-BUILDS
expectations=(
    # negative-replay claims: MISUSE-NEGATIVE-REPLAY
    "negative-replay|AsyncBroadcast misuse: replay must not be negative (got -1)"
    # bounded-zero claims: MISUSE-BOUNDED-ZERO
    "bounded-zero|AsyncBroadcast misuse: |.bounded|at least 1"
    "bounded-zero-subscribe|AsyncBroadcast misuse: |.bounded|at least 1"
    # negative-newest claims: MISUSE-NEGATIVE-CAPACITY
    "negative-newest|AsyncBroadcast misuse: |.bufferingNewest|must not be negative"
    "negative-oldest-subscribe|AsyncBroadcast misuse: |.bufferingOldest|must not be negative"
    # concurrent-next claims: MISUSE-CONCURRENT-NEXT
    "concurrent-next|AsyncBroadcast misuse: concurrent next() calls on one Subscription"
    # value-update-reentered claims: MISUSE-VALUE-REENTRY
    "value-update-reentered|AsyncBroadcast misuse: BroadcastValue called back from inside its own update body"
    # value-equality-reentered claims: MISUSE-VALUE-REENTRY
    "value-equality-reentered|AsyncBroadcast misuse: BroadcastValue called back from inside its own update body or Value.=="
    "value-concurrent-next|AsyncBroadcast misuse: concurrent next() calls on one Subscription"
    "register-negative-replay|AsyncBroadcast misuse: replay must not be negative (got -1)"
    "upstream-negative-replay|AsyncBroadcast misuse: replay must not be negative (got -2)"
    # negative-stop-after claims: MISUSE-NEGATIVE-STOPAFTER
    "negative-stop-after|AsyncBroadcast misuse: |whileSubscribed(stopAfter:) must not be negative"
    "topics-negative-replay|AsyncBroadcast misuse: replay must not be negative (got -3)"
    "topics-bounded-zero-subscribe|AsyncBroadcast misuse: subscribe(to:bufferingPolicy:)|.bounded|at least 1"
    # batch-limit-zero claims: MISUSE-BATCH-LIMIT
    "batch-limit-zero|AsyncBroadcast misuse: next(upTo:into:) needs a limit of at least 1 (got 0)"
    "events-then-next|AsyncBroadcast misuse: concurrent next() calls on one Subscription"
    "events-batch-limit-zero|AsyncBroadcast misuse: next(upTo:into:) needs a limit of at least 1 (got 0)"
    # eviction-hard-zero claims: EVICT-MISUSE-TRAPS
    "eviction-hard-zero|AsyncBroadcast misuse: hardLimit(_:) needs at least 1 unread element (got 0)"
    "eviction-soft-zero|AsyncBroadcast misuse: softLimit(_:for:) needs at least 1 unread element (got 0)"
    "eviction-limits-hard-zero|AsyncBroadcast misuse: limits(hard:soft:for:) needs a hard limit of at least 1 (got 0)"
    "eviction-limits-soft-zero|AsyncBroadcast misuse: limits(hard:soft:for:) needs a soft limit of at least 1 (got -1)"
    # eviction-negative-duration claims: EVICT-MISUSE-TRAPS
    "eviction-negative-duration|AsyncBroadcast misuse: softLimit(_:for:) needs a duration of at least zero"
    "listen-negative-replay|AsyncBroadcast misuse: replay must not be negative (got -4)"
    # topics-listen-negative-stop-after claims: MISUSE-NEGATIVE-STOPAFTER
    "topics-listen-negative-stop-after|AsyncBroadcast misuse: |whileSubscribed(stopAfter:) must not be negative"
)

passed=0
failed=0

# Runs one case; sets rc. The Swift backtracer is turned off: it only adds a
# slow backtrace after the message, which is printed either way. The
# subshell keeps bash's own "Illegal instruction" job notice off the output.
run_case() {
    local name=$1
    (
        SWIFT_BACKTRACE=enable=no timeout --kill-after=10 60 "$probe" "$name" \
            >"$scratch/$name.stdout" 2>"$scratch/$name.stderr"
        status=$?
        exit $status
    ) 2>/dev/null
    rc=$?
}

describe_status() {
    if [[ $1 -eq 124 || $1 -eq 137 ]]; then echo "timed out after 60s"
    elif [[ $1 -gt 128 ]]; then echo "exit $1 (signal $(( $1 - 128 )))"
    else echo "exit $1"; fi
}

# The control: correct use must not trap.
run_case none
if [[ $rc -eq 0 ]]; then
    echo "PASS none (control): exit 0"
    passed=$((passed + 1))
else
    echo "FAIL none (control): $(describe_status $rc), expected exit 0; stderr: $(head -c 300 "$scratch/none.stderr" | tr '\n' ' ')"
    failed=$((failed + 1))
fi

for expectation in "${expectations[@]}"; do
    IFS='|' read -r -a parts <<<"$expectation"
    name=${parts[0]}
    run_case "$name"
    missing=()
    for fragment in "${parts[@]:1}"; do
        grep -qF -- "$fragment" "$scratch/$name.stderr" || missing+=("\"$fragment\"")
    done
    status=$(describe_status $rc)
    message=$(grep -m 1 -oE "AsyncBroadcast misuse: .*" "$scratch/$name.stderr" | cut -c1-160)
    if [[ $rc -eq 0 || $rc -eq 124 || $rc -eq 137 ]]; then
        echo "FAIL $name: $status, expected a trap; stdout: $(head -c 200 "$scratch/$name.stdout" | tr '\n' ' ')"
        failed=$((failed + 1))
    elif [[ ${#missing[@]} -gt 0 ]]; then
        first_line=$(grep -m 1 -v '^\s*$' "$scratch/$name.stderr" | cut -c1-160)
        echo "FAIL $name: trapped ($status) but stderr lacks ${missing[*]}; stderr starts: ${first_line:-<empty>}"
        failed=$((failed + 1))
    else
        echo "PASS $name: trapped ($status): $message"
        passed=$((passed + 1))
    fi
done

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
