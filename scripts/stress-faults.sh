#!/usr/bin/env bash
# Proves that broadcast-stress can fail: for each deliberate fault compiled
# into AsyncBroadcast (-DASYNCBROADCAST_FAULT_<NAME>, all defined in
# Sources/AsyncBroadcast/Support/FaultInjection.swift), builds broadcast-stress
# in release with it and asserts that a short stress run reports a failure
# (non-zero exit). Also runs the unfaulted build as a control, which must
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
# Logs: .build-fault-<name>/stress.log. Exit status: 0 iff every fault was
# detected and the control passed.
set -uo pipefail
cd "$(dirname "$0")/.."

budget=${STRESS_FAULT_SECONDS:-20}
deadline=${STRESS_FAULT_DEADLINE:-10}
seed_args=()
[[ -n "${STRESS_SEED:-}" ]] && seed_args=(--seed "$STRESS_SEED")
# What each fault breaks, by the claim ids of the docs (scripts/claims.sh):
# SKIP_WAKE claims: DRF-RESUME-ONCE
# LEAK_SUBSCRIBER claims: SEQ-END-WAYS
# MISCOUNT_EVICTION claims: SEQ-DROPPEDCOUNT-EXACT
# DROP_EMIT claims: SEQ-EMIT-CANCEL-NONE
# VALUE_SKIP_WAKE claims: VAL-NEVER-TWICE
# VALUE_DUPLICATE claims: VAL-NEVER-TWICE
# PROMISE_LEAK_CANCELLED claims: PROM-NO-GROWTH
# VALUE_EQUAL_IS_CHANGE claims: VAL-EQUAL-NOT-CHANGE
# PROMISE_DOUBLE_COMPLETE claims: PROM-FIRST-WINS
# SHARING_SKIP_STOP claims: SHARE-WHILE-SUBSCRIBED-STOP
# SHARING_STALE_DELIVERY claims: SHARE-STALE-SINK, SHARE-STOPPED-RUN
# COUNTS_SKIP_REMOVAL claims: SEQ-COUNTS-FOLLOW
# SHARING_PARALLEL_RECONCILERS claims: SHARE-ONE-RECONCILER, SHARE-REGISTER-ALTERNATE
# TOPIC_RETIRES_BUSY claims: TOPIC-SUBSCRIBE-LEAVE-RACE
# TOPIC_STARTS_UNBLOCKED claims: TOPIC-REGISTER-ALTERNATE
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

# Runs the stress binary; sets run_rc and prints where the log is.
run_stress() {
    local binary=$1 log=$2
    # Litmus rounds hammer one handshake and catch none of these faults: the
    # other kinds keep the whole budget, as before litmus rounds existed.
    timeout "$hard_limit" "$binary" --seconds "$budget" --deadline "$deadline" --quiet \
        --kinds sequence,value,promise,sharing,topics "${seed_args[@]}" >"$log" 2>&1
    run_rc=$?
}

first_failure() {
    grep -m 3 -E "invariant broken|^FAIL" "$1" | cut -c1-220 | sed 's/^ */      /'
}

for fault in "${faults[@]}"; do
    name=$(echo "$fault" | tr 'A-Z_' 'a-z-')
    scratch=".build-fault-$name"
    echo "=== fault $fault: building ($scratch)"
    mkdir -p "$scratch"
    if ! swift build -c release --product broadcast-stress --scratch-path "$scratch" \
            -Xswiftc "-DASYNCBROADCAST_FAULT_$fault" >"$scratch/build.log" 2>&1; then
        echo "FAIL $fault: build failed (see $scratch/build.log)"
        summary+=("FAIL $fault (build failed)")
        status=1
        continue
    fi
    echo "=== fault $fault: running broadcast-stress --seconds $budget --deadline $deadline"
    run_stress "$scratch/release/broadcast-stress" "$scratch/stress.log"
    head -1 "$scratch/stress.log" | sed 's/^/      /'
    if [[ $run_rc -eq 0 ]]; then
        echo "FAIL $fault: NOT detected: the stress run passed ($(tail -1 "$scratch/stress.log"))"
        summary+=("FAIL $fault (undetected)")
        status=1
    elif [[ $run_rc -eq 124 ]]; then
        echo "FAIL $fault: the stress run itself did not end within ${hard_limit}s (its watchdog failed)"
        summary+=("FAIL $fault (stress tool hung)")
        status=1
    else
        echo "PASS $fault: detected (exit $run_rc, $(tail -1 "$scratch/stress.log"))"
        first_failure "$scratch/stress.log"
        summary+=("PASS $fault")
    fi
done

if [[ "${STRESS_FAULTS_CONTROL:-1}" != 0 ]]; then
    scratch=".build-stress"
    echo "=== control (no fault): building ($scratch)"
    if ! swift build -c release --product broadcast-stress --scratch-path "$scratch" >"$scratch/control-build.log" 2>&1; then
        echo "FAIL control: build failed (see $scratch/control-build.log)"
        summary+=("FAIL control (build failed)")
        status=1
    else
        log="$scratch/stress-control.log"
        run_stress "$scratch/release/broadcast-stress" "$log"
        head -1 "$log" | sed 's/^/      /'
        if [[ $run_rc -eq 0 ]]; then
            echo "PASS control: the unfaulted build passes ($(tail -1 "$log"))"
            summary+=("PASS control")
        else
            echo "FAIL control: the unfaulted build failed (exit $run_rc, see $log):"
            first_failure "$log"
            summary+=("FAIL control")
            status=1
        fi
    fi
fi

echo
echo "=== summary"
printf '  %s\n' "${summary[@]}"
exit $status
