import Testing
@_spi(Testing) @testable import AsyncBroadcast

/// The events view is the subscription's one consumer, and eviction limits
/// below 1 are programmer errors: each traps with a message naming it.
// claims: EVENTS-SWITCH, MISUSE-CONCURRENT-NEXT
@Suite struct LagEvictionMisuseTests {
    @Test func eventsWhilePlainNextIsParkedTraps() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let sequence = BroadcastSequence(of: Int.self)
            let subscription = sequence.subscribe()
            let first = Task {
                var iterator = subscription.makeAsyncIterator()
                return await iterator.next()
            }
            while !subscription.isConsumerWaiting { await Task.yield() }
            var events = subscription.events.makeAsyncIterator()
            _ = await events.next()
            _ = await first.value
        }
        expectMessage(result, "AsyncBroadcast misuse: concurrent next() calls on one Subscription")
    }

    // claims: EVENTS-SWITCH, MISUSE-CONCURRENT-NEXT
    @Test func plainNextWhileEventsAreParkedTraps() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let sequence = BroadcastSequence(of: Int.self)
            let subscription = sequence.subscribe()
            let first = Task {
                var events = subscription.events.makeAsyncIterator()
                return await events.next()
            }
            while !subscription.isConsumerWaiting { await Task.yield() }
            var plain = subscription.makeAsyncIterator()
            _ = await plain.next()
            _ = await first.value
        }
        expectMessage(result, "AsyncBroadcast misuse: concurrent next() calls on one Subscription")
    }

    // claims: MISUSE-BATCH-LIMIT
    @Test func anEventsBatchLimitBelowOneTraps() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let subscription = BroadcastSequence(of: Int.self).subscribe()
            var events = subscription.events.makeAsyncIterator()
            var batch: [BroadcastEvent<Int>] = []
            _ = await events.next(upTo: 0, into: &batch)
        }
        expectMessage(result, "next(upTo:into:) needs a limit of at least 1 (got 0)")
    }

    // claims: EVICT-MISUSE-TRAPS
    @Test func aHardLimitBelowOneTraps() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            _ = BroadcastEviction.hardLimit(0)
        }
        expectMessage(result, "hardLimit(_:) needs at least 1 unread element (got 0)")
    }

    // claims: EVICT-MISUSE-TRAPS
    @available(macOS 13, iOS 16, tvOS 16, watchOS 9, *)
    @Test func aSoftLimitBelowOneOrANegativeDurationTraps() async {
        let unread = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            _ = BroadcastEviction.softLimit(0, for: .seconds(1))
        }
        expectMessage(unread, "softLimit(_:for:) needs at least 1 unread element (got 0)")
        let duration = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            _ = BroadcastEviction.limits(hard: 2, soft: 1, for: .seconds(-1))
        }
        expectMessage(duration, "limits(hard:soft:for:) needs a duration of at least zero")
    }
}
