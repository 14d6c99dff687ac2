#!/usr/bin/env bash
# Proves the fuzz targets can fail: builds the library with each injected
# fault and checks that the target meant to catch it reports a finding
# (non-zero exit) within the budget. Prints PASS/FAIL per fault; exits
# non-zero if any fault goes unnoticed. The faults are defined in
# Sources/AsyncBroadcast/Support/FaultInjection.swift.
#
# Two kinds: the library's deliberate faults (`run.sh --sc --fault`: built
# sequentially consistent as before, in one build for all of them,
# Fuzz/.build-faults, where ASYNCBROADCAST_FAULT=<NAME> switches each on
# when the target starts; the same code as -DASYNCBROADCAST_FAULT_<NAME>),
# and removed orderings of the cross-thread handshakes, switched at run time
# in the one weak-memory build (`run.sh --remove-ordering`, no extra build;
# see WeakMemoryModel.Ordering and Fuzz/README.md, "Weak memory").
#
#   Fuzz/fault-check.sh [SECONDS [TARGET...]]   (budget per fault, default 60;
#                                               only the faults of these targets)
#   FUZZ_FAULTS=NAME[,NAME] Fuzz/fault-check.sh ...   only these faults/orderings
set -uo pipefail
cd "$(dirname "$0")"
seconds="${1:-60}"
only=("${@:2}")
selected=",${FUZZ_FAULTS:-},"
picked() { [[ "$selected" == ",," || "$selected" == *",$1,"* ]]; }

# fault            target  what it breaks
checks=(
    # MISCOUNT_EVICTION claims: SEQ-DROPPEDCOUNT-EXACT, SEQ-NEWEST-KEEPS-LAST
    "MISCOUNT_EVICTION seq   bufferingNewest eviction not counted in droppedCount"
    # SKIP_WAKE claims: DRF-RESUME-ONCE
    "SKIP_WAKE         sched a parked consumer is never woken"
    # LEAK_SUBSCRIBER claims: SEQ-END-WAYS
    "LEAK_SUBSCRIBER   seq   ended subscribers never leave the registry"
    # LEAK_SUBSCRIBER claims: SEQ-END-WAYS
    "LEAK_SUBSCRIBER   sched ended subscribers never leave the registry"
    # DROP_EMIT claims: SEQ-EMIT-CANCEL-NONE
    "DROP_EMIT         sched a served emit claims success but delivers nothing"
    # VALUE_SKIP_WAKE claims: VAL-NEVER-TWICE, DRF-RESUME-ONCE
    "VALUE_SKIP_WAKE   value a BroadcastValue change never wakes its parked readers"
    # VALUE_DUPLICATE claims: VAL-NEVER-TWICE
    "VALUE_DUPLICATE   value a BroadcastValue reader can return the same change twice"
    # VALUE_EQUAL_IS_CHANGE claims: VAL-EQUAL-NOT-CHANGE
    "VALUE_EQUAL_IS_CHANGE value a BroadcastValue send or update that leaves the value equal is a change"
    # SHARING_SKIP_STOP claims: SHARE-WHILE-SUBSCRIBED-STOP, SHARE-UNREGISTER-ONCE
    "SHARING_SKIP_STOP share a shared sequence never stops a run (no unregister, no task cancellation)"
    # SHARING_STALE_DELIVERY claims: SHARE-STALE-SINK, SHARE-STOPPED-RUN
    "SHARING_STALE_DELIVERY share a stopped run's sink or upstream task still delivers"
    # COUNTS_SKIP_REMOVAL claims: SEQ-COUNTS-FOLLOW
    "COUNTS_SKIP_REMOVAL share subscriberCounts misses the changes made by subscribers leaving"
    # TOPIC_RETIRES_BUSY claims: TOPIC-SUBSCRIBE-LEAVE-RACE
    "TOPIC_RETIRES_BUSY topics a topic is dropped on a notice without checking that it is idle (a subscriber left on a sequence no send reaches)"
    # TOPIC_STARTS_UNBLOCKED claims: TOPIC-REGISTER-ALTERNATE
    "TOPIC_STARTS_UNBLOCKED topics a topic's new generation registers its listener while the previous unregister runs"
    "EVICTION_COMPARES_HELD seq a lossy subscriber that replay over-filled past its hard limit is evicted by a send its policy drops"
    "EVICTION_OFF_BY_ONE seq the hard limit ends a subscriber at u unread elements, not u + 1"
    "END_SKIPS_PENDING_LAG seq an ended events reader (evicted, cancelled) returns nil without its last .lagged: the sum falls short of droppedCount"
    "LAG_MARKER_OFF_BY_ONE seq a .bufferingOldest gap is reported one element late"
    "REPLAYABLE_IGNORED seq send(_:replayable: false) is stored in the replay window"
    "CANCELLED_SUBSCRIBE_GOES_LIVE topics a subscribe from a cancelled task makes the topic live until it returns: a send then fills a replay window a real subscriber starts with"
    "SUBSCRIBE_IGNORES_FINISH topics a subscribe whose generation finish(topic:) ended before it returned returns that ended subscriber"
    "READY_IGNORED     share sink.ready() does not wake the upstreamReady() callers already waiting"
)

# ordering          target  what it breaks (only those the target finds 3 runs out of 3)
orderings=(
    # popSkipsFence claims: SEQ-FINISH-IDLE-LEAVES
    "popSkipsFence     sched a consumer that takes its last element while finish() runs stays counted (Bug 2)"
    # finishSkipsFence claims: SEQ-FINISH-IDLE-LEAVES, DRF-RESUME-ONCE
    "finishSkipsFence  sched finish() misses a reader about to park or a consumer taking its last element"
    # wakeSkipsFence claims: DRF-RESUME-ONCE
    "wakeSkipsFence    sched a send looks for parked readers before its element is visible"
    # cancelSkipsFence claims: SEQ-END-EFFECTS
    "cancelSkipsFence  sched cancel() looks for a parked reader before its end is visible"
    # boundedHeadRelease claims: SEQ-EMIT-WAITS-WHILE-FULL
    "boundedHeadRelease sched a .bounded consumer's head store stays invisible to a waiting emitter"
)

failed=0
mkdir -p artifacts
for check in "${checks[@]}"; do
    read -r fault target what <<<"$check"
    if [[ ${#only[@]} -gt 0 && ! " ${only[*]} " =~ " $target " ]]; then continue; fi
    picked "$fault" || continue
    log="artifacts/fault-$fault-$target.log"
    start=$(date +%s)
    ./run.sh --sc --fault "$fault" "$target" "$seconds" >"$log" 2>&1
    status=$?
    elapsed=$(( $(date +%s) - start ))
    finding=$(grep -m1 -E "MISMATCH at step|ERROR: LeakSanitizer|ERROR: AddressSanitizer|ERROR: libFuzzer" "$log" || true)
    if [[ $status -ne 0 && -n "$finding" ]]; then
        echo "PASS  $fault ($target): found in ${elapsed}s (incl. build): $finding"
    else
        echo "FAIL  $fault ($target): no finding in ${seconds}s (exit $status); log: Fuzz/$log"
        failed=1
    fi
done
for check in "${orderings[@]}"; do
    read -r ordering target what <<<"$check"
    if [[ ${#only[@]} -gt 0 && ! " ${only[*]} " =~ " $target " ]]; then continue; fi
    picked "$ordering" || continue
    log="artifacts/ordering-$ordering-$target.log"
    start=$(date +%s)
    ./run.sh --remove-ordering "$ordering" "$target" "$seconds" >"$log" 2>&1
    status=$?
    elapsed=$(( $(date +%s) - start ))
    finding=$(grep -m1 -E "MISMATCH at step|ERROR: LeakSanitizer|ERROR: AddressSanitizer|ERROR: libFuzzer" "$log" || true)
    if [[ $status -ne 0 && -n "$finding" ]]; then
        echo "PASS  ordering $ordering ($target): found in ${elapsed}s (incl. build): $finding"
    else
        echo "FAIL  ordering $ordering ($target): no finding in ${seconds}s (exit $status); log: Fuzz/$log"
        failed=1
    fi
done
exit $failed
