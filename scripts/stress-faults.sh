#!/usr/bin/env bash
# Proves that broadcast-stress can fail: for each deliberate fault compiled
# into AsyncBroadcast (-DASYNCBROADCAST_FAULT_<NAME>, all defined in
# Sources/AsyncBroadcast/Support/FaultInjection.swift), builds broadcast-stress
# in release with it and asserts that a short stress run reports a failure
# (non-zero exit). Also runs the unfaulted build as a control, which must
# pass (a checker that always fails proves nothing either).
#
#   bash scripts/stress-faults.sh                   # every fault below
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
# caught by the topics rounds; the v5 surface of topics (END_SKIPS_PENDING_LAG,
# EVICTION_COMPARES_HELD, SUBSCRIBE_IGNORES_FINISH,
# CANCELLED_SUBSCRIBE_GOES_LIVE), caught by the lifecycle rounds, which
# these runs ask for alone (--kinds lifecycle: the fault is theirs to find).
# Every other run uses the normal mix of round kinds but the litmus rounds
# (which hammer one cross-thread handshake; their orderings are checked by
# scripts/litmus.sh and Fuzz/fault-check.sh).
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
faults=("$@")
[[ ${#faults[@]} -eq 0 ]] && faults=(SKIP_WAKE LEAK_SUBSCRIBER MISCOUNT_EVICTION DROP_EMIT
                                    VALUE_SKIP_WAKE VALUE_DUPLICATE PROMISE_LEAK_CANCELLED
                                    VALUE_EQUAL_IS_CHANGE PROMISE_DOUBLE_COMPLETE
                                    SHARING_SKIP_STOP SHARING_STALE_DELIVERY COUNTS_SKIP_REMOVAL
                                    SHARING_PARALLEL_RECONCILERS TOPIC_RETIRES_BUSY TOPIC_STARTS_UNBLOCKED
                                    END_SKIPS_PENDING_LAG EVICTION_COMPARES_HELD SUBSCRIBE_IGNORES_FINISH
                                    CANCELLED_SUBSCRIBE_GOES_LIVE)
# Generous outer bound: the stress tool enforces its own deadline and exits.
hard_limit=$(( budget + 3 * deadline + 60 ))

status=0
declare -a summary

# The round kinds that must catch a fault: the lifecycle rounds alone for
# the v5 topics faults, else every kind but litmus.
kinds_for() {
    case $1 in
        END_SKIPS_PENDING_LAG|EVICTION_COMPARES_HELD|SUBSCRIBE_IGNORES_FINISH|CANCELLED_SUBSCRIBE_GOES_LIVE)
            echo lifecycle ;;
        *)
            # Litmus rounds hammer one handshake and catch none of these
            # faults: the other kinds keep the whole budget.
            echo sequence,value,promise,sharing,topics,lifecycle ;;
    esac
}

# The budget of a fault's run: twice the budget for the rare window of
# CANCELLED_SUBSCRIBE_GOES_LIVE (about 5 % of lifecycle rounds hit it).
budget_for() {
    case $1 in
        CANCELLED_SUBSCRIBE_GOES_LIVE) echo $(( 2 * budget )) ;;
        *) echo "$budget" ;;
    esac
}

# Runs the stress binary; sets run_rc and prints where the log is.
run_stress() {
    local binary=$1 log=$2 kinds=$3 seconds=${4:-$budget}
    timeout "$(( hard_limit + seconds - budget ))" "$binary" --seconds "$seconds" --deadline "$deadline" --quiet \
        --kinds "$kinds" "${seed_args[@]}" >"$log" 2>&1
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
    kinds=$(kinds_for "$fault")
    seconds=$(budget_for "$fault")
    echo "=== fault $fault: running broadcast-stress --seconds $seconds --deadline $deadline --kinds $kinds"
    run_stress "$scratch/release/broadcast-stress" "$scratch/stress.log" "$kinds" "$seconds"
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
        run_stress "$scratch/release/broadcast-stress" "$log" "$(kinds_for control)"
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
