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
# EVICTION_COMPARES_HELD, SUBSCRIBE_IGNORES_FINISH), caught by the lifecycle
# rounds, which these runs ask for alone (--kinds lifecycle: the fault is
# theirs to find). CANCELLED_SUBSCRIBE_GOES_LIVE is not in the default list:
# the lifecycle rounds see it only as a stale element in a later subscriber,
# which a second rule now prevents on its own (an emptied topic generation
# keeps nothing), so no stress run can show it; CoreV6DefectTests (the topic
# live in the window) and fuzz-topics catch it. It can still be named.
# Every other run uses the normal mix of round kinds but the litmus rounds
# (which hammer one cross-thread handshake; their orderings are checked by
# scripts/litmus.sh and Fuzz/fault-check.sh).
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
                                    SHARING_PARALLEL_RECONCILERS TOPIC_RETIRES_BUSY TOPIC_STARTS_UNBLOCKED
                                    END_SKIPS_PENDING_LAG EVICTION_COMPARES_HELD SUBSCRIBE_IGNORES_FINISH)
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

# Runs the stress binary with fault FAULT on ("" for none) over the kinds
# that must catch it, for SECONDS; sets run_rc.
run_stress() {
    local binary=$1 log=$2 fault=$3 seconds=${4:-$budget}
    ASYNCBROADCAST_FAULT="$fault" timeout "$(( hard_limit + seconds - budget ))" "$binary" --seconds "$seconds" \
        --deadline "$deadline" --quiet --kinds "$(kinds_for "${fault:-control}")" "${seed_args[@]}" >"$log" 2>&1
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
    seconds=$(budget_for "$fault")
    echo "=== fault $fault: running broadcast-stress --seconds $seconds --deadline $deadline --kinds $(kinds_for "$fault")"
    run_stress "$binary" "$log" "$fault" "$seconds"
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
