#!/usr/bin/env bash
# Builds Tests/ClientTSan, a client package that depends on AsyncBroadcast by
# path exactly as a user's package does, with ThreadSanitizer, and runs its
# hammer RUNS times:
#
#   bash scripts/client-tsan.sh                 # one run, built with --sanitize=thread
#   bash scripts/client-tsan.sh 5               # five runs in a row
#   bash scripts/client-tsan.sh --xswiftc 2     # built with -Xswiftc -sanitize=thread
#
# The two ways a user turns ThreadSanitizer on:
#   (default)   `swift build --sanitize=thread`: SwiftPM instruments every
#               Swift and C target, the library's C shim (_CAtomics) too.
#   --xswiftc   `swift build -Xswiftc -sanitize=thread`: only the Swift
#               compiler instruments and links TSan; the C shim is compiled
#               without it. The library's TSan hooks must work here too,
#               which is why they look for the TSan runtime when the program
#               runs instead of asking how the shim was compiled.
# Each way has its own scratch path (.build-client-tsan, .build-client-tsan-x).
#
# Each run runs with TSAN_OPTIONS=halt_on_error=1 and nothing else: no
# suppression file, as in a user's build. A run fails on any ThreadSanitizer
# report, a failed check, a hang (the tool's watchdog), or a non-zero exit.
# In particular this catches the Swift runtime's false positive
# swiftlang/swift#57803, which any library that resumes a value-carrying
# `UnsafeContinuation` across threads triggers in its clients' TSan builds.
#
# Environment: CLIENT_TSAN_SECONDS (time budget of one run, default 35),
# CLIENT_TSAN_ARGS (extra arguments for client-tsan, e.g. "--seed 42").
# Build output and one log per run go to .build-client-tsan/.
# Exit status: 0 iff the build and every run passed.
# claims: DRF-CLIENT-TSAN, DRF-VOID-CONTINUATIONS
set -uo pipefail
cd "$(dirname "$0")/.."

usage="usage: bash scripts/client-tsan.sh [--xswiftc] [RUNS]   (RUNS: a positive integer, default 1)"
sanitize=(--sanitize=thread)
scratch=.build-client-tsan
if [[ "${1:-}" == "--xswiftc" ]]; then
    sanitize=(-Xswiftc -sanitize=thread)
    scratch=.build-client-tsan-x
    shift
fi
runs=${1:-1}
if ! [[ $runs =~ ^[1-9][0-9]*$ && $# -le 1 ]]; then
    echo "$usage" >&2
    exit 2
fi
seconds=${CLIENT_TSAN_SECONDS:-35}
read -r -a extra_args <<<"${CLIENT_TSAN_ARGS:-}"
package=Tests/ClientTSan
mkdir -p "$scratch"

echo "=== client-tsan: building $package with ${sanitize[*]} (scratch $scratch)"
build_start=$(date +%s)
if ! swift build "${sanitize[@]}" --package-path "$package" --scratch-path "$scratch" >"$scratch/build.log" 2>&1; then
    tail -30 "$scratch/build.log"
    echo "FAIL client-tsan: build failed (see $scratch/build.log)"
    exit 1
fi
binary="$(swift build "${sanitize[@]}" --package-path "$package" --scratch-path "$scratch" --show-bin-path)/client-tsan"
echo "    built in $(( $(date +%s) - build_start ))s"

# The tool stops itself (time budget, per-scenario watchdog of 90 s); this
# outer bound only guards against the tool itself wedging.
hard_limit=$(( seconds + 240 ))
failed_runs=()
for run in $(seq 1 "$runs"); do
    log="$scratch/run-$run.log"
    run_start=$(date +%s)
    TSAN_OPTIONS="halt_on_error=1" timeout --kill-after=10 "$hard_limit" \
        "$binary" --seconds "$seconds" "${extra_args[@]}" >"$log" 2>&1
    rc=$?
    elapsed=$(( $(date +%s) - run_start ))
    reports=$(grep -c "WARNING: ThreadSanitizer" "$log")
    last=$(tail -1 "$log")
    seed_line=$(grep -m 1 "client-tsan: seed" "$log")
    if [[ $rc -eq 0 && $reports -eq 0 && $last =~ ^[0-9]+\ passed,\ 0\ failed$ ]]; then
        echo "PASS run $run/$runs (${elapsed}s): $last"
        continue
    fi
    failed_runs+=("$run")
    if [[ $reports -gt 0 ]]; then
        why="ThreadSanitizer report"
    elif [[ $rc -eq 124 || $rc -eq 137 ]]; then
        why="did not end within ${hard_limit}s"
    else
        why="exit status $rc"
    fi
    echo "FAIL run $run/$runs (${elapsed}s): $why ($seed_line); log: $log"
    if [[ $reports -gt 0 ]]; then
        # The first report's headline and the top frames of its two accesses.
        grep -m 1 "WARNING: ThreadSanitizer" "$log" | sed 's/^ */      /'
        grep -m 2 -E "^ +#0 " "$log" | cut -c1-200 | sed 's/^ */      /'
        grep -m 1 "SUMMARY: ThreadSanitizer" "$log" | cut -c1-200 | sed 's/^ */      /'
    else
        grep -E "^FAIL |^    [^ ]" "$log" | head -8 | cut -c1-200 | sed 's/^ */      /'
        echo "      last line: ${last:0:200}"
    fi
done

if [[ ${#failed_runs[@]} -eq 0 ]]; then
    echo "client-tsan (${sanitize[*]}): all $runs runs passed"
    exit 0
fi
echo "client-tsan (${sanitize[*]}): ${#failed_runs[@]} of $runs runs FAILED (run ${failed_runs[*]})"
exit 1
