#!/usr/bin/env bash
# Proves that broadcast-stress can fail: for each deliberate fault of
# AsyncBroadcast (all defined in Sources/AsyncBroadcast/Support/
# FaultInjection.swift), asserts that a short stress run with it reports a
# failure (non-zero exit). One release build serves every fault: built with
# ASYNCBROADCAST_RUNTIME_FAULTS=1, the library has them all compiled in and
# switches on the one named by ASYNCBROADCAST_FAULT=<NAME> when the process
# starts (the same code as -DASYNCBROADCAST_FAULT_<NAME>, without a build per
# fault). Also runs the same binary with no fault as a control, which must
# pass (a checker that always fails proves nothing either).
#
#   bash scripts/stress-faults.sh                   # the twelve faults below
#   bash scripts/stress-faults.sh DROP_EMIT         # any fault names
#
# The faults: BroadcastSequence (SKIP_WAKE, LEAK_SUBSCRIBER,
# MISCOUNT_EVICTION, DROP_EMIT), caught by the sequence rounds;
# BroadcastValue (VALUE_SKIP_WAKE, VALUE_DUPLICATE, VALUE_EQUAL_IS_CHANGE),
# caught by the value rounds; BroadcastPromise (PROMISE_LEAK_CANCELLED,
# PROMISE_DOUBLE_COMPLETE), caught by the promise rounds; sharing an upstream
# (SHARING_SKIP_STOP, SHARING_STALE_DELIVERY, COUNTS_SKIP_REMOVAL,
# SHARING_PARALLEL_RECONCILERS), caught by
# the sharing rounds; topics (TOPIC_RETIRES_BUSY, TOPIC_STARTS_UNBLOCKED),
# caught by the topics rounds. Every run uses the normal mix of round kinds but the
# litmus rounds (which hammer one cross-thread handshake; their orderings are
# checked by scripts/litmus.sh and Fuzz/fault-check.sh).
#
# Environment: STRESS_FAULT_SECONDS (budget per run, default 20),
# STRESS_FAULT_DEADLINE (per-round deadline, default 10), STRESS_SEED (master
# seed, default random), STRESS_FAULTS_CONTROL=0 to skip the control run.
# Build and logs: .build-faults-stress/ (build.log, stress-<name>.log,
# stress-control.log). Exit status: 0 iff every fault was detected and the
# control passed.
set -uo pipefail
cd "$(dirname "$0")/.."

budget=${STRESS_FAULT_SECONDS:-20}
deadline=${STRESS_FAULT_DEADLINE:-10}
seed_args=()
[[ -n "${STRESS_SEED:-}" ]] && seed_args=(--seed "$STRESS_SEED")
faults=("$@")
[[ ${#faults[@]} -eq 0 ]] && faults=(SKIP_WAKE LEAK_SUBSCRIBER MISCOUNT_EVICTION DROP_EMIT
                                    VALUE_SKIP_WAKE VALUE_DUPLICATE PROMISE_LEAK_CANCELLED
                                    VALUE_EQUAL_IS_CHANGE PROMISE_DOUBLE_COMPLETE
                                    SHARING_SKIP_STOP SHARING_STALE_DELIVERY COUNTS_SKIP_REMOVAL
                                    SHARING_PARALLEL_RECONCILERS TOPIC_RETIRES_BUSY TOPIC_STARTS_UNBLOCKED)
# Generous outer bound: the stress tool enforces its own deadline and exits.
hard_limit=$(( budget + 3 * deadline + 60 ))

status=0
declare -a summary

# Runs the stress binary with fault FAULT on ("" for none); sets run_rc.
run_stress() {
    local binary=$1 log=$2 fault=$3
    # Litmus rounds hammer one handshake and catch none of these faults: the
    # other kinds keep the whole budget, as before litmus rounds existed.
    ASYNCBROADCAST_FAULT="$fault" timeout "$hard_limit" "$binary" --seconds "$budget" --deadline "$deadline" --quiet \
        --kinds sequence,value,promise,sharing,topics "${seed_args[@]}" >"$log" 2>&1
    run_rc=$?
}

first_failure() {
    grep -m 3 -E "invariant broken|^FAIL" "$1" | cut -c1-220 | sed 's/^ */      /'
}

scratch=.build-faults-stress
mkdir -p "$scratch"
echo "=== building broadcast-stress once, every fault switchable at run time ($scratch)"
build_start=$(date +%s)
if ! ASYNCBROADCAST_RUNTIME_FAULTS=1 swift build -c release --product broadcast-stress \
        --scratch-path "$scratch" >"$scratch/build.log" 2>&1; then
    tail -30 "$scratch/build.log"
    echo "FAIL: build failed (see $scratch/build.log)"
    exit 1
fi
echo "    built in $(( $(date +%s) - build_start ))s"
binary="$scratch/release/broadcast-stress"

for fault in "${faults[@]}"; do
    name=$(echo "$fault" | tr 'A-Z_' 'a-z-')
    log="$scratch/stress-$name.log"
    # A fault without its run-time switch would run unfaulted: say so.
    if ! grep -qF "RuntimeFault.isOn(\"$fault\")" Sources/AsyncBroadcast/Support/FaultInjection.swift; then
        echo "FAIL $fault: FaultInjection.swift has no run-time switch for it (#elseif ASYNCBROADCAST_RUNTIME_FAULTS, return RuntimeFault.isOn(\"$fault\"))"
        summary+=("FAIL $fault (no run-time switch)")
        status=1
        continue
    fi
    echo "=== fault $fault: running broadcast-stress --seconds $budget --deadline $deadline"
    run_stress "$binary" "$log" "$fault"
    head -1 "$log" | sed 's/^/      /'
    if [[ $run_rc -eq 0 ]]; then
        echo "FAIL $fault: NOT detected: the stress run passed ($(tail -1 "$log"))"
        summary+=("FAIL $fault (undetected)")
        status=1
    elif [[ $run_rc -eq 124 ]]; then
        echo "FAIL $fault: the stress run itself did not end within ${hard_limit}s (its watchdog failed)"
        summary+=("FAIL $fault (stress tool hung)")
        status=1
    else
        echo "PASS $fault: detected (exit $run_rc, $(tail -1 "$log"))"
        first_failure "$log"
        summary+=("PASS $fault")
    fi
done

if [[ "${STRESS_FAULTS_CONTROL:-1}" != 0 ]]; then
    log="$scratch/stress-control.log"
    echo "=== control (no fault): running the same binary"
    run_stress "$binary" "$log" ""
    head -1 "$log" | sed 's/^/      /'
    if [[ $run_rc -eq 0 ]]; then
        echo "PASS control: the binary passes with no fault on ($(tail -1 "$log"))"
        summary+=("PASS control")
    else
        echo "FAIL control: the binary failed with no fault on (exit $run_rc, see $log):"
        first_failure "$log"
        summary+=("FAIL control")
        status=1
    fi
fi

echo
echo "=== summary"
printf '  %s\n' "${summary[@]}"
exit $status
