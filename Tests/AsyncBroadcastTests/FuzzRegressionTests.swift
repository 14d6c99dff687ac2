// Regression tests from the fuzz targets (Fuzz/). Each one is the minimal
// program of a finding, written out as a test.
//
// The interleaving tests run their tasks on `FuzzManualExecutor`, a task
// executor that only queues jobs; the test runs them one by one, on a
// thread of its own, so every interleaving is exact (as in Fuzz/fuzz-sched).

import Foundation
import Testing
@_spi(Testing) @testable import AsyncBroadcast

// MARK: - Regressions for library bugs the fuzzers found (all fixed; each failed before its fix)

@Suite struct FuzzFoundBugTests {
    /// Fuzz finding "replay-overfill" (fuzz-sched, minimal program):
    ///     create(replay: 2); send(1); send(2)
    ///     s = subscribe(.bounded(1))      // replay gives s [1, 2]: 2 >= 1
    ///     Task { emit(3) }
    /// The contract (Semantics.md in the DocC catalog): "`emit` waits while a `.bounded(n)` subscriber holds n or more
    /// unread elements". The library never marks a subscriber that replay
    /// filled as full (`BroadcastState.subscribe` ignores `offer`'s
    /// `.deliveredFull`), so the emit delivers at once and `s` holds 3.
    // claims: SEQ-REPLAY-OVERFILL-FULL
    @Test func replayOverfilledBoundedSubscriberMakesEmitWait() async {
        let (waitingEmitters, emitDone, finalResult) = await onOwnThread { () -> (Int, Bool, BroadcastSendResult?) in
            let executor = ManualExecutor()
            let sequence = BroadcastSequence(of: Int.self, replay: 2)
            sequence.send(1)
            sequence.send(2)
            let subscription = sequence.subscribe(bufferingPolicy: .bounded(1))
            let done = Locked(false)
            let result = Locked<BroadcastSendResult?>(nil)
            let emitter = Task(executorPreference: executor) {
                result.value = try? await sequence.emit(3)
                done.value = true
            }
            executor.runUntilIdle()
            let waiting = sequence.waitingEmitterCount
            let doneEarly = done.value
            #expect(pollAll(subscription).prefix(2) == [1, 2])  // reading makes room
            executor.runUntilIdle()
            _ = emitter
            return (waiting, doneEarly, result.value)
        }
        #expect(waitingEmitters == 1, "emit must wait: the .bounded(1) subscriber holds 2 replayed elements")
        #expect(emitDone == false)
        #expect(finalResult == BroadcastSendResult(delivered: 1, dropped: 0))
    }

    /// Fuzz finding "cancelled-reader-throws" (fuzz-sched, minimal program):
    ///     s = subscribe()
    ///     r = Task { try await s.next() }   // runs until it parks
    ///     r.cancel()                          // resumes r (not yet run)
    ///     finish(throwing: E)
    ///     run r                               // next() throws E
    /// README: "A cancelled consuming task gets `nil` (never an error)";
    /// The contract (Semantics.md in the DocC catalog): "the task waiting in `next()` is cancelled (`next()` returns
    /// `nil`, also for throwing sequences)". The cancellation came first, but
    /// `endForTaskCancellation` keeps the `.failed` terminal that `finish`
    /// stored meanwhile.
    // claims: SEQ-TASK-CANCEL-NO-ERROR
    @Test func readerCancelledWhileParkedGetsNilWhenTheSequenceFailsBeforeItRuns() async {
        let outcome = await onOwnThread { () -> String in
            let executor = ManualExecutor()
            let sequence = BroadcastSequence(of: Int.self, throwing: TestError.self)
            let subscription = sequence.subscribe()
            let result = Locked<String>("not run")
            let reader = Task(executorPreference: executor) {
                var iterator = subscription.makeAsyncIterator()
                do {
                    let element = try await iterator.next()
                    result.value = element.map { "element \($0)" } ?? "nil"
                } catch {
                    result.value = "threw \(error)"
                }
            }
            executor.runUntilIdle()
            guard subscription.isConsumerWaiting else { return "reader did not park" }
            reader.cancel()
            sequence.finish(throwing: TestError(code: 7))
            executor.runUntilIdle()
            return result.value
        }
        #expect(outcome == "nil")
    }

    /// Fuzz finding "stale-tombstone" (fuzz-sched, `--strict`):
    ///     s = subscribe()
    ///     r = Task { await s.next() }   // runs until it parks
    ///     send(1)                         // resumes r with 1 (not yet run)
    ///     r.cancel()                      // r's cancellation handler still runs
    ///     run r                           // next() returns 1
    ///     send(2)                         // delivered 0, dropped 0
    /// The handler leaves the "cancelled" tombstone although r was already
    /// resumed. From then on every send skips `s` (not delivered, not counted
    /// as dropped), yet `s` stays registered: `subscriberCount` is 1, with no
    /// end in sight unless someone calls `next()` again (which then returns
    /// nil, even from a task that is not cancelled). The contract: an ended
    /// subscriber is "removed from the sequence promptly (counted out of
    /// `subscriberCount`)"; `droppedCount` "counts exactly the elements this
    /// subscriber's policy dropped". Either `s` goes on receiving, or it
    /// leaves the registry.
    // claims: SEQ-TASK-CANCEL-PARKED
    @Test func readerCancelledAfterItWasResumedDoesNotLeaveADeafSubscriber() async {
        let (first, count, result) = await onOwnThread { () -> (String, Int, BroadcastSendResult) in
            let executor = ManualExecutor()
            let sequence = BroadcastSequence(of: Int.self)
            let subscription = sequence.subscribe()
            let received = Locked<String>("not run")
            let reader = Task(executorPreference: executor) {
                var iterator = subscription.makeAsyncIterator()
                received.value = (await iterator.next()).map { "\($0)" } ?? "nil"
            }
            executor.runUntilIdle()  // parks
            sequence.send(1)
            reader.cancel()
            executor.runUntilIdle()
            let result = sequence.send(2)
            return (received.value, sequence.subscriberCount, result)
        }
        // The reader was cancelled while it waited: it ends as with
        // `cancel()`, discarding the element it had been handed.
        #expect(first == "nil")
        #expect(count == 0 || result.delivered == 1,
                "s is counted in subscriberCount (\(count)) but the send skipped it: \(result)")
    }
}

// MARK: - Regressions for the faults the fuzzers must catch

@Suite struct FuzzRegressionTests {
    /// `ASYNCBROADCAST_FAULT_MISCOUNT_EVICTION` (found by fuzz-seq): an
    /// eviction must count in `droppedCount` whatever the ring's allocation,
    /// including when it equals the limit (1, 2, 4, 8, 16) and capacity 0.
    // claims: SEQ-DROPPEDCOUNT-EXACT
    @Test(arguments: [0, 1, 2, 3, 4, 5, 8, 9, 16, 17, 33])
    func bufferingNewestCountsEveryEviction(capacity: Int) {
        let sequence = BroadcastSequence(of: Int.self)
        let subscription = sequence.subscribe(bufferingPolicy: .bufferingNewest(capacity))
        let total = capacity + 3
        var reportedDrops = 0
        for value in 0..<total {
            let result = sequence.send(value)
            reportedDrops += result.dropped
            #expect(result.delivered == (capacity == 0 ? 0 : 1))
        }
        #expect(reportedDrops == 3)
        #expect(subscription.droppedCount == 3)
        #expect(pollAll(subscription) == Array(3..<total))
    }

    /// Same, with replay over-filling a `.bufferingNewest` subscriber
    /// (fuzz-seq's minimal program): the whole window arrives, then each
    /// send evicts the oldest and counts it.
    // claims: SEQ-REPLAY-OVERFILL-FULL, SEQ-DROPPEDCOUNT-EXACT
    @Test func bufferingNewestCountsEvictionsAfterReplayOverFill() {
        let sequence = BroadcastSequence(of: Int.self, replay: 3)
        for value in 1...3 { sequence.send(value) }
        let subscription = sequence.subscribe(bufferingPolicy: .bufferingNewest(2))
        #expect(subscription.droppedCount == 0)
        #expect(sequence.send(4) == BroadcastSendResult(delivered: 1, dropped: 1))
        #expect(subscription.droppedCount == 1)
        #expect(pollAll(subscription) == [2, 3, 4])
    }

    /// `ASYNCBROADCAST_FAULT_SKIP_WAKE` (found by fuzz-sched): a reader
    /// parked in `next()` is resumed by the send that reaches it, for every
    /// policy (lock-free ones are woken to look, locked ones are handed the
    /// element).
    @Test(arguments: [
        BroadcastBufferingPolicy.unbounded, .bounded(1), .bufferingOldest(1), .bufferingOldest(0),
        .bufferingNewest(1), .bufferingNewest(0), .bufferingNewest(4),
    ])
    func parkedReaderIsWokenBySend(policy: BroadcastBufferingPolicy) async {
        let (parked, sendResult, queuedAfterSend, received) = await onOwnThread {
            () -> (Bool, BroadcastSendResult, Int, String) in
            let executor = ManualExecutor()
            let sequence = BroadcastSequence(of: Int.self)
            let subscription = sequence.subscribe(bufferingPolicy: policy)
            let result = Locked<String>("not run")
            let reader = Task(executorPreference: executor) {
                var iterator = subscription.makeAsyncIterator()
                result.value = (await iterator.next()).map { "\($0)" } ?? "nil"
            }
            executor.runUntilIdle()
            let parked = subscription.isConsumerWaiting
            let sendResult = sequence.send(42)
            let queued = executor.queuedCount
            executor.runUntilIdle()
            let received = result.value
            sequence.finish()
            executor.runUntilIdle()
            _ = reader
            return (parked, sendResult, queued, received)
        }
        #expect(parked)
        #expect(sendResult == BroadcastSendResult(delivered: 1, dropped: 0))
        #expect(queuedAfterSend == 1, "the send must resume the parked reader")
        #expect(received == "42")
    }

    /// `ASYNCBROADCAST_FAULT_LEAK_SUBSCRIBER` (found by fuzz-seq and by
    /// LeakSanitizer): every way of ending leaves the registry at once.
    // claims: SEQ-END-WAYS
    @Test func everyWayOfEndingLeavesTheRegistry() async {
        let counts = await onOwnThread { () -> [Int] in
            let executor = ManualExecutor()
            let sequence = BroadcastSequence(of: Int.self, throwing: TestError.self)
            var counts: [Int] = []
            let cancelled = sequence.subscribe()
            var released: BroadcastSequence<Int, TestError>.Subscription? = sequence.subscribe()
            let drained = sequence.subscribe(bufferingPolicy: .bufferingNewest(2))
            let readByCancelledTask = sequence.subscribe(bufferingPolicy: .bounded(3))
            counts.append(sequence.subscriberCount)  // 4
            cancelled.cancel()
            counts.append(sequence.subscriberCount)  // 3
            released = nil
            counts.append(sequence.subscriberCount)  // 2
            let reader = Task(executorPreference: executor) {
                var iterator = readByCancelledTask.makeAsyncIterator()
                _ = try? await iterator.next()
            }
            executor.runUntilIdle()  // parks
            reader.cancel()
            executor.runUntilIdle()
            counts.append(sequence.subscriberCount)  // 1
            sequence.send(1)
            sequence.finish(throwing: TestError(code: 1))
            counts.append(sequence.subscriberCount)  // 1: drained still holds [1] and the error
            _ = drained.poll()
            _ = drained.poll()  // the error: consumed, so it leaves
            counts.append(sequence.subscriberCount)  // 0
            _ = released
            return counts
        }
        #expect(counts == [4, 3, 2, 1, 1, 0])
    }

    /// `ASYNCBROADCAST_FAULT_DROP_EMIT`: an emit that waited for room, then
    /// was served, reaches every subscriber (all or nothing).
    // claims: SEQ-EMIT-CANCEL-NONE
    @Test func servedEmitReachesEverySubscriber() async {
        let (waitedFirst, emitResult, bounded, other) = await onOwnThread {
            () -> (Int, BroadcastSendResult?, [Int], [Int]) in
            let executor = ManualExecutor()
            let sequence = BroadcastSequence(of: Int.self)
            let bounded = sequence.subscribe(bufferingPolicy: .bounded(1))
            let other = sequence.subscribe()
            sequence.send(1)  // bounded is full
            let result = Locked<BroadcastSendResult?>(nil)
            let emitter = Task(executorPreference: executor) {
                result.value = try? await sequence.emit(2)
            }
            executor.runUntilIdle()
            let waiting = sequence.waitingEmitterCount
            _ = bounded.poll()  // room: the emitter is served here
            executor.runUntilIdle()
            _ = emitter
            return (waiting, result.value, pollAll(bounded), pollAll(other))
        }
        #expect(waitedFirst == 1)
        #expect(emitResult == BroadcastSendResult(delivered: 2, dropped: 0))
        #expect(bounded == [2])
        #expect(other == [1, 2])
    }
}

/// Runs `body` on a new thread (outside any task, like a libFuzzer driver)
/// and returns its result.
private func onOwnThread<T: Sendable>(_ body: @escaping @Sendable () -> T) async -> T {
    // A payload-free continuation: the result travels through a locked box
    // (see `FirstResult` in Support.swift).
    let result = Locked<T?>(nil)
    await withUnsafeContinuation { (continuation: UnsafeContinuation<Void, Never>) in
        let thread = Thread {
            result.value = body()
            continuation.resume()
        }
        thread.start()
    }
    return result.value!
}
