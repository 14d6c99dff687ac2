import Testing
@_spi(Testing) @testable import AsyncBroadcast

/// Programmer errors trap with a message that names the misuse. These exit
/// tests run the debug build; `scripts/release-traps.sh` checks the same
/// messages in a release (`-O`) build, where `precondition` would print
/// nothing.
// claims: MISUSE-NEGATIVE-REPLAY
@Suite struct MisuseTests {
    @Test func negativeReplayTraps() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            _ = BroadcastSequence(of: Int.self, replay: -1)
        }
        expectMessage(result, "AsyncBroadcast misuse: replay must not be negative (got -1)")
    }

    // claims: MISUSE-BOUNDED-ZERO
    @Test func boundedZeroTraps() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            _ = BroadcastSequence(of: Int.self, bufferingPolicy: .bounded(0))
        }
        expectMessage(result, "AsyncBroadcast misuse: bufferingPolicy: .bounded capacity must be at least 1 (got 0)")
        let subscribing = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            _ = BroadcastSequence(of: Int.self).subscribe(bufferingPolicy: .bounded(0))
        }
        expectMessage(subscribing, "AsyncBroadcast misuse: subscribe(bufferingPolicy:): .bounded capacity must be at least 1 (got 0)")
    }

    // claims: MISUSE-NEGATIVE-CAPACITY
    @Test func negativeCapacityTraps() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            _ = BroadcastSequence(of: Int.self, bufferingPolicy: .bufferingNewest(-1))
        }
        expectMessage(result, "AsyncBroadcast misuse: bufferingPolicy: .bufferingNewest capacity must not be negative (got -1)")
        let subscribing = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            _ = BroadcastSequence(of: Int.self).subscribe(bufferingPolicy: .bufferingOldest(-2))
        }
        expectMessage(subscribing, "AsyncBroadcast misuse: subscribe(bufferingPolicy:): .bufferingOldest capacity must not be negative (got -2)")
    }

    // claims: MISUSE-BATCH-LIMIT
    @Test func aBatchReadWithALimitBelowOneTraps() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let sequence = BroadcastSequence(of: Int.self)
            var iterator = sequence.subscribe().makeAsyncIterator()
            var batch: [Int] = []
            _ = await iterator.next(upTo: 0, into: &batch)
        }
        expectMessage(result, "AsyncBroadcast misuse: next(upTo:into:) needs a limit of at least 1 (got 0)")
    }

    // claims: MISUSE-NEGATIVE-REPLAY
    @Test func topicsMisuseTraps() async {
        let replay = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            _ = BroadcastTopics<String, Int, Never>(replay: -3)
        }
        expectMessage(replay, "AsyncBroadcast misuse: replay must not be negative (got -3)")
        let subscribing = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            _ = BroadcastTopics<String, Int, Never>().subscribe(to: "a", bufferingPolicy: .bounded(0))
        }
        expectMessage(subscribing, "AsyncBroadcast misuse: subscribe(to:bufferingPolicy:): .bounded capacity must be at least 1 (got 0)")
    }

    /// A second consumer while the first is parked.
    // claims: MISUSE-CONCURRENT-NEXT
    @Test func concurrentNextWhileTheFirstIsParkedTraps() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let sequence = BroadcastSequence(of: Int.self)
            let subscription = sequence.subscribe()
            let first = Task {
                var iterator = subscription.makeAsyncIterator()
                return await iterator.next()
            }
            while !subscription.isConsumerWaiting { await Task.yield() }
            var second = subscription.makeAsyncIterator()
            _ = await second.next()
            _ = await first.value
        }
        expectMessage(result, "AsyncBroadcast misuse: concurrent next() calls on one Subscription")
    }

    /// A second consumer while the first is inside `next()` but not parked:
    /// woken by a send, and held before it runs again by a manual executor
    /// (it still holds the consumer slot). A check made only when parking
    /// lets this one through: it must trap on entry, before it takes the
    /// element meant for the first.
    // claims: MISUSE-CONCURRENT-NEXT
    @Test func concurrentNextBeforeTheFirstRunsAgainTraps() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let executor = ManualExecutor()
            let sequence = BroadcastSequence(of: Int.self)
            let subscription = sequence.subscribe()
            let first = Task(executorPreference: executor) {
                var iterator = subscription.makeAsyncIterator()
                _ = await iterator.next()
            }
            executor.runUntilIdle()  // polls, finds nothing, parks
            precondition(subscription.isConsumerWaiting)
            sequence.send(1)  // wakes the first: queued, not run
            precondition(!subscription.isConsumerWaiting && executor.queuedCount == 1)
            _ = subscription.poll()  // the second consumer
            _ = first
        }
        expectMessage(result, "AsyncBroadcast misuse: concurrent next() calls on one Subscription")
    }

    /// The storage's own guard: an `Effects` dropped without `run()` would
    /// leave continuations suspended forever.
    @Test func droppedEffectsTrap() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            _ = Effects<Int>(pool: nil)
        }
        expectMessage(result, "Effects dropped without run()")
    }
}

func expectMessage(_ result: ExitTest.Result?, _ message: String,
                   sourceLocation: SourceLocation = #_sourceLocation) {
    guard let result else { return }  // the exit expectation already failed
    let stderr = String(decoding: result.standardErrorContent, as: UTF8.self)
    #expect(stderr.contains(message), "stderr lacks \"\(message)\":\n\(stderr.prefix(2000))", sourceLocation: sourceLocation)
}
