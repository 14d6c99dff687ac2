#!/usr/bin/env bash
# Builds one AsyncBroadcast fuzz target (libFuzzer + AddressSanitizer) and
# runs it from the committed seed corpus. Exits non-zero on a finding.
#
#   Fuzz/run.sh [--sc] [--fault FLAG | --remove-ordering NAME] [--strict[=NAMES]] TARGET [SECONDS] [-- LIBFUZZER_ARGS...]
#
#   TARGET    seq    sequential model check (one sequence, 8 subscribers, poll)
#             sched  interleavings under a deterministic executor (tasks, emit)
#             value  BroadcastValue: model check with interleavings (readers
#                    on the deterministic executor)
#             share  sharing an upstream: start/stop of runs (register
#                    listeners, upstream tasks, stop timers on a manual clock)
#             topics BroadcastTopics: topic lifetime (subscribe racing the
#                    last cancel, stop timers, finish(topic:), listeners)
#   SECONDS   fuzzing time (default 60)
#   --fault FLAG   run with the library's deliberate fault FLAG on
#                  (MISCOUNT_EVICTION, SKIP_WAKE, LEAK_SUBSCRIBER, DROP_EMIT,
#                  VALUE_SKIP_WAKE, VALUE_DUPLICATE, SHARING_SKIP_STOP,
#                  SHARING_STALE_DELIVERY, COUNTS_SKIP_REMOVAL,
#                  TOPIC_RETIRES_BUSY, TOPIC_STARTS_UNBLOCKED,
#                  EVICTION_COMPARES_HELD, EVICTION_OFF_BY_ONE,
#                  END_SKIPS_PENDING_LAG, LAG_MARKER_OFF_BY_ONE,
#                  REPLAYABLE_IGNORED, CANCELLED_SUBSCRIBE_GOES_LIVE,
#                  SUBSCRIBE_IGNORES_FINISH, READY_IGNORED; any fault of
#                  FaultInjection.swift above the removed orderings, which
#                  are --remove-ordering's); a finding is then the expected
#                  outcome (see fault-check.sh). Every fault shares one build
#                  (Fuzz/.build-faults, or .build-faults-wm): the library is
#                  built with ASYNCBROADCAST_RUNTIME_FAULTS=1, every fault
#                  compiled in, and the run exports ASYNCBROADCAST_FAULT=FLAG,
#                  which turns this one on (the same code as
#                  -DASYNCBROADCAST_FAULT_<FLAG>, without a build per fault)
#   --sc      build the old, sequentially consistent way (every atomic is a
#             real C11 atomic; also FUZZ_MEMORY=sc). The default builds the
#             library with ASYNCBROADCAST_WEAK_MEMORY=1: every atomic and lock
#             goes through the weak-memory model (Sources/_CAtomics/WeakMemory.c)
#             and sched, value and share decide when each task's stores become
#             visible (see README.md, "Weak memory"). Scratch folders differ per
#             mode: Fuzz/.build-wm (weak memory), Fuzz/.build (sc).
#   --remove-ordering NAME   a run-time fault of the weak-memory build
#             (WeakMemoryModel.Ordering: parkSkipsFence, wakeSkipsFence,
#             finishSkipsFence, popSkipsFence, cancelSkipsFence,
#             boundedHeadRelease, emitterFlagRelease; comma-separated for
#             several): exported as FUZZ_REMOVE_ORDERING, read by the targets
#             at start-up; no extra build. A finding is the expected outcome.
#   --strict  check the contract for every fixed bug in KnownBugs (already the
#             default; FUZZ_STRICT=none expects the old behaviour instead)
#             (FUZZ_STRICT; see KnownBugs in Sources/FuzzKit/Model.swift)
#
# New corpus entries go to Fuzz/artifacts/corpus-TARGET (ignored by git);
# crashes to Fuzz/artifacts/. Replay one input with a readable program trace:
#   FUZZ_TRACE=1 Fuzz/.build/release/fuzz-TARGET path/to/input
# FUZZ_SCRATCH=DIR builds in DIR instead of Fuzz/.build-wm / Fuzz/.build /
# Fuzz/.build-faults (parallel builds).
set -euo pipefail
cd "$(dirname "$0")"

fault=""
ordering=""
strict=""
memory="${FUZZ_MEMORY:-weak}"
while [[ $# -gt 0 ]]; do
    case "$1" in
        --fault) fault="$2"; shift 2 ;;
        --fault=*) fault="${1#--fault=}"; shift ;;
        --remove-ordering) ordering="$2"; shift 2 ;;
        --remove-ordering=*) ordering="${1#--remove-ordering=}"; shift ;;
        --sc) memory="sc"; shift ;;
        --strict) strict="all"; shift ;;
        --strict=*) strict="${1#--strict=}"; shift ;;
        -h|--help) sed -n '2,47p' "$(basename "$0")"; exit 0 ;;
        *) break ;;
    esac
done
target="${1:-}"
seconds="${2:-60}"
shift $(( $# >= 2 ? 2 : $# ))
[[ "${1:-}" == "--" ]] && shift
case "$target" in
    seq|sched|value|share|topics) ;;
    *) echo "usage: $0 [--sc] [--fault FLAG | --remove-ordering NAME] [--strict] seq|sched|value|share|topics [SECONDS] [-- LIBFUZZER_ARGS...]" >&2; exit 2 ;;
esac
case "$memory" in
    weak|wm) memory="weak" ;;
    sc) ;;
    *) echo "FUZZ_MEMORY must be weak or sc, not $memory" >&2; exit 2 ;;
esac
if [[ -n "$ordering" && "$memory" != "weak" ]]; then
    echo "--remove-ordering needs the weak-memory build (drop --sc)" >&2; exit 2
fi
# Each mode has its own scratch folder, so switching never rebuilds the other.
suffix=""
[[ "$memory" == "weak" ]] && suffix="-wm"

# Not `--sanitize=fuzzer --sanitize=address`: SwiftPM passes those as two
# `-sanitize=` flags in an order that changes from run to run, and the Swift
# driver keeps only the last one (so a build randomly lost either coverage or
# ASan). `--sanitize=fuzzer` stays so that SwiftPM links libFuzzer's `main`.
build_args=(-c release --product "fuzz-$target"
    --sanitize=fuzzer -Xswiftc -sanitize=fuzzer,address -Xcc -fsanitize=fuzzer-no-link,address)
unset ASYNCBROADCAST_FAULT ASYNCBROADCAST_RUNTIME_FAULTS
if [[ -n "$fault" ]]; then
    fault="${fault#ASYNCBROADCAST_FAULT_}"
    # A fault without its run-time switch would run unfaulted: say so.
    if ! grep -qF "RuntimeFault.isOn(\"$fault\")" ../Sources/AsyncBroadcast/Support/FaultInjection.swift; then
        echo "== FaultInjection.swift has no run-time switch for $fault (#elseif ASYNCBROADCAST_RUNTIME_FAULTS, return RuntimeFault.isOn(\"$fault\"))" >&2
        exit 2
    fi
    scratch="${FUZZ_SCRATCH:-.build-faults$suffix}"
    build_args+=(--scratch-path "$scratch")
    # Read by the root Package.swift: every fault compiled in, switched by
    # ASYNCBROADCAST_FAULT when the target starts.
    export ASYNCBROADCAST_RUNTIME_FAULTS=1 ASYNCBROADCAST_FAULT="$fault"
    work="artifacts/fault-$fault-$target"
    rm -rf "$work"  # a fault run starts from the committed corpus only
elif [[ -n "$ordering" ]]; then
    scratch="${FUZZ_SCRATCH:-.build-wm}"
    build_args+=(--scratch-path "$scratch")
    work="artifacts/ordering-${ordering//,/+}-$target"
    rm -rf "$work"  # a fault run starts from the committed corpus only
    export FUZZ_REMOVE_ORDERING="$ordering"
else
    scratch="${FUZZ_SCRATCH:-.build$suffix}"
    build_args+=(--scratch-path "$scratch")
    work="artifacts"
fi
if [[ "$memory" == "weak" ]]; then
    # The root Package.swift defines ASYNCBROADCAST_WEAK_MEMORY when this is
    # set: the library's atomics and locks go through the weak-memory model.
    export ASYNCBROADCAST_WEAK_MEMORY=1
else
    unset ASYNCBROADCAST_WEAK_MEMORY
    unset FUZZ_REMOVE_ORDERING
fi

# The library's internal invariant checks (`_checkInvariants()`, see
# Sources/AsyncBroadcast/Support/InternalChecks.swift) are compiled in: the
# root Package.swift adds -DASYNCBROADCAST_INTERNAL_CHECKS when this is set,
# also when it is built as this package's path dependency.
export ASYNCBROADCAST_INTERNAL_CHECKS=1

echo "== building fuzz-$target${fault:+ with fault $fault} (internal checks on, $( [[ $memory == weak ]] && echo "weak memory" || echo "sequentially consistent"))${ordering:+; run-time fault: removed ordering $ordering}" >&2
swift build "${build_args[@]}" >&2
binary="$scratch/release/fuzz-$target"

export SWIFT_BACKTRACE=enable=no  # let libFuzzer/ASan report crashes
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}"
[[ -n "$strict" ]] && export FUZZ_STRICT="$strict"

# An instrumented binary reports its coverage counters; rebuild once from
# scratch if it does not (seen once or twice after incremental builds).
# The probe runs the empty input, which a fault build may crash on: its
# crash file goes under $work, not into Fuzz/.
mkdir -p "$work"
instrumented() { local out; out=$("$binary" -runs=0 -artifact_prefix="$work/" 2>&1 || true); grep -q "inline 8-bit counters" <<<"$out"; }
if ! instrumented; then
    echo "== $binary is not instrumented; rebuilding from scratch" >&2
    rm -rf "$scratch"
    swift build "${build_args[@]}" >&2
    if ! instrumented; then
        echo "== $binary is still not instrumented for coverage" >&2
        exit 3
    fi
fi

mkdir -p "$work/corpus-$target"
echo "== fuzzing fuzz-$target for ${seconds}s (corpus: corpus/$target, new entries: $work/corpus-$target)" >&2
set +e
"$binary" "$work/corpus-$target" "corpus/$target" \
    -max_total_time="$seconds" \
    -max_len=2048 \
    -timeout=20 \
    -rss_limit_mb=4096 \
    -print_final_stats=1 \
    -artifact_prefix="$work/" \
    "$@"
status=$?
set -e
if [[ $status -ne 0 ]]; then
    echo "== fuzz-$target: FINDING (exit $status); crash input saved under Fuzz/$work/" >&2
else
    echo "== fuzz-$target: clean" >&2
fi
exit $status
