#!/usr/bin/env bash
# Proves that a unit test can fail where no stress round or fuzz target
# would: for each deliberate fault below, runs the named test with the fault
# on and asserts that it fails; then runs the same test unfaulted as a
# control, which must pass. The faulted runs share one test build, made with
# ASYNCBROADCAST_RUNTIME_FAULTS=1 (every fault compiled in, the one named by
# ASYNCBROADCAST_FAULT=<NAME> on: the same code as
# -DASYNCBROADCAST_FAULT_<NAME>, without a build per fault).
#
#   bash scripts/test-faults.sh
#
# The faults:
#   GATE_UNLOCK_IGNORES_REQUESTS
#                        the sequence lock's unlock releases its word without
#                        looking for requests pushed meanwhile (SequenceGate):
#                        a request is lost; caught by SequenceGateTests (the
#                        requester never returns: the test's deadline).
#   GATE_HOLDER_NEVER_SERVES
#                        the holder grants the lock to the first waiter
#                        instead of running the waiting requests itself;
#                        caught by SequenceGateTests (the request's body must
#                        run on the thread that held the lock). Nothing else
#                        can see it: it changes who runs a body, not what.
#   TOPIC_RETIRES_BUSY  a topic is dropped when its last subscriber leaves
#                        without rechecking, under the shard lock, that it
#                        is idle (a hand-built dictionary's race); caught by
#                        TopicsTests' subscribe racing the last cancel.
#   TOPIC_RETIRES_UNDER_SHARD_LOCK
#                        a topic's notice asks its generation whether it is
#                        idle (the sequence lock) while holding the shard
#                        lock, as it once did; caught by LockNestingTests (the
#                        internal checks trap on a sequence lock taken with a
#                        shard lock held, in the test's child process).
#   TOPIC_STARTS_UNBLOCKED
#                        a topic's new generation registers its listener
#                        while the previous one's unregister still runs;
#                        caught by TopicsListenerTests.
#   SHARING_RESTART_BEFORE_TAKEDOWN
#                        an asynchronous listener (init(listen:)) restarts as
#                        soon as its run is stopped, while the previous
#                        take-down still runs; caught by ListenTests' restart
#                        test (the take-down is held open by a promise; the
#                        new subscriber must not start a run before it returns).
#   TORN_BUFFERED_COUNT  bufferedCount loads head, then tail, as two separate
#                        reads; caught by BufferedCountTests' concurrent
#                        snapshot test (an observer thread reading while a
#                        producer sends and a reader keeps up: a count above
#                        the policy's capacity). No stress round or fuzz
#                        target reads bufferedCount concurrently.
#   LAG_MARKER_OFF_BY_ONE
#                        a lock-free buffer records a lag marker one element
#                        late; caught by LagEventsTests' .bufferingOldest
#                        placement test (the `.lagged(n)` comes after the
#                        element that follows the gap). Element counts and
#                        droppedCount stay right: only the events' order shows it.
#   EVICTION_COMPARES_HELD
#                        the hard limit compares what a subscriber holds with
#                        the limit instead of asking whether the send adds:
#                        a lossy subscriber over-filled by replay is evicted
#                        by a send its policy drops; caught by
#                        CoreV6DefectTests.
#   END_SKIPS_PENDING_LAG
#                        an events reader that ended (evicted, cancelled, its
#                        task cancelled) returns nil without its last gap;
#                        caught by CoreV6DefectTests' last-gap tests.
#   CANCELLED_SUBSCRIBE_GOES_LIVE
#                        a subscribe from a cancelled task stores a new
#                        generation as live and retires it after the shard
#                        lock; caught by CoreV6DefectTests (a send and a real
#                        subscriber in that window, through the test hook).
#   SUBSCRIBE_IGNORES_FINISH
#                        subscribe(to:) returns a subscriber whose generation
#                        finish(topic:) retired before it returned; caught by
#                        CoreV6DefectTests (a finish in the window, and in a
#                        listener's register).
#
# Environment: TEST_FAULT_ATTEMPTS (faulted runs per fault, default 3).
# Scratch: .build-fault-test (ignored by git; logs test-faults-<name>.log).
# Exit status: 0 iff every fault was caught and every control passed.
set -uo pipefail
cd "$(dirname "$0")/.."

pairs=(
    # GATE_UNLOCK_IGNORES_REQUESTS claims: GATE-REQUEST-SERVED-BY-HOLDER
    "GATE_UNLOCK_IGNORES_REQUESTS aRequestPushedWhileASendHoldsTheLockIsServedByItsUnlock"
    # GATE_HOLDER_NEVER_SERVES claims: GATE-REQUEST-SERVED-BY-HOLDER
    "GATE_HOLDER_NEVER_SERVES aRequestPushedWhileASendHoldsTheLockIsServedByItsUnlock"
    # TOPIC_RETIRES_BUSY claims: TOPIC-SUBSCRIBE-LEAVE-RACE
    "TOPIC_RETIRES_BUSY aSubscribeRacingTheLastCancelMissesNothingSentAfterIt"
    # TOPIC_RETIRES_UNDER_SHARD_LOCK claims: TOPIC-NO-WAIT-UNDER-SHARD
    "TOPIC_RETIRES_UNDER_SHARD_LOCK noRegistryPathTakesASequenceLockWhileHoldingAShardLock"
    # TOPIC_STARTS_UNBLOCKED claims: TOPIC-REGISTER-ALTERNATE
    "TOPIC_STARTS_UNBLOCKED TopicsListenerTests"
    # TORN_BUFFERED_COUNT claims: SEQ-BUFFEREDCOUNT-IN-BOUNDS
    "TORN_BUFFERED_COUNT aSnapshotWhileTheReaderKeepsUpNeverExceedsWhatThePolicyAllows"
    # LAG_MARKER_OFF_BY_ONE claims: EVENTS-GAP-OLDEST
    "LAG_MARKER_OFF_BY_ONE bufferingOldestPutsTheGapAfterWhatItHeldBeforeTheNextAccepted"
    # SHARING_RESTART_BEFORE_TAKEDOWN claims: LISTEN-RESTART-WAITS
    "SHARING_RESTART_BEFORE_TAKEDOWN aRestartWaitsForThePreviousTakeDownToReturn"
    # EVICTION_COMPARES_HELD claims: EVICT-LOSSY-NEVER-HARD
    "EVICTION_COMPARES_HELD aReplayOverfilledLossySubscriberIsNotEvictedByASendThatAddsNothing"
    # END_SKIPS_PENDING_LAG claims: EVENTS-LAGGED-SUM
    "END_SKIPS_PENDING_LAG LastGapBeforeTheEnd"
    # CANCELLED_SUBSCRIBE_GOES_LIVE claims: TOPIC-CANCELLED-NOT-LIVE
    "CANCELLED_SUBSCRIBE_GOES_LIVE aCancelledSubscribeLeavesNoWindowInWhichATopicKeepsSends"
    # SUBSCRIBE_IGNORES_FINISH claims: TOPIC-SUBSCRIBE-FINISH-RACE
    "SUBSCRIBE_IGNORES_FINISH DoesNotEndTheNewSubscriber"
)

# Any failing attempt counts as caught.
attempts=${TEST_FAULT_ATTEMPTS:-3}
failures=0
for pair in "${pairs[@]}"; do
    read -r fault test <<<"$pair"
    scratch=".build-fault-test"
    mkdir -p "$scratch"
    log="$scratch/test-faults-$(echo "$fault" | tr 'A-Z_' 'a-z-').log"
    echo "== $fault: $test must fail (up to $attempts attempts)"
    caught=0
    # A fault without its run-time switch would run unfaulted: say so.
    if ! grep -qF "RuntimeFault.isOn(\"$fault\")" Sources/AsyncBroadcast/Support/FaultInjection.swift; then
        echo "FAIL: FaultInjection.swift has no run-time switch for $fault (#elseif ASYNCBROADCAST_RUNTIME_FAULTS, return RuntimeFault.isOn(\"$fault\"))"
        failures=$((failures + 1))
        continue
    fi
    for attempt in $(seq 1 "$attempts"); do
        if ASYNCBROADCAST_INTERNAL_CHECKS=1 ASYNCBROADCAST_RUNTIME_FAULTS=1 ASYNCBROADCAST_FAULT="$fault" \
            swift test --scratch-path "$scratch" --filter "$test" >"$log" 2>&1; then
            echo "attempt $attempt: $test passed with $fault"
        elif grep -q "Expectation failed" "$log"; then
            echo "ok: caught on attempt $attempt ($(grep -m1 'Expectation failed' "$log" | sed 's/.*Expectation failed: //'))"
            caught=1
            break
        else
            echo "attempt $attempt: $test did not fail on an expectation (a build error?); log: $log"
            tail -n 20 "$log"
            break
        fi
    done
    if [[ $caught -eq 0 ]]; then
        echo "FAIL: $fault not caught (last log: $log)"
        failures=$((failures + 1))
    fi
    echo "== control: $test must pass unfaulted"
    # The README's test configuration, so CI's earlier build in .build is reused.
    if ASYNCBROADCAST_INTERNAL_CHECKS=1 swift test --filter "$test" >"$log.control" 2>&1; then
        echo "ok: passed"
    else
        echo "FAIL: $test failed unfaulted (log: $log.control)"
        tail -n 20 "$log.control"
        failures=$((failures + 1))
    fi
done
if [[ $failures -eq 0 ]]; then echo "test-faults: every fault caught, every control passed"; fi
exit $((failures > 0))
