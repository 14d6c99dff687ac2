import Foundation
import Testing
@_spi(Testing) @testable import AsyncBroadcast

/// Reads `subscription`'s events until the end.
private func drainEvents<Element: Sendable>(
    _ subscription: BroadcastSequence<Element, Never>.Subscription
) async throws -> [BroadcastEvent<Element>] {
    try await withDeadline("end of events") {
        var result: [BroadcastEvent<Element>] = []
        for await event in subscription.events { result.append(event) }
        return result
    }
}

private func lagSum<Element>(_ events: [BroadcastEvent<Element>]) -> Int {
    events.reduce(0) { total, event in
        if case .lagged(let n) = event { return total + n }
        return total
    }
}

/// For a stream of consecutive integers from `first`: every run of missing
/// integers between two received ones (and before the first, after the
/// last, up to `last`) must be exactly the `.lagged` sum reported there.
private func checkGapsExact(_ events: [BroadcastEvent<Int>], first: Int, last: Int) {
    var expected = first  // the next integer if nothing was dropped
    var lagSinceElement = 0
    for event in events {
        switch event {
        case .lagged(let n):
            #expect(n >= 1, "a lag of \(n)")
            lagSinceElement += n
        case .element(let value):
            #expect(value - expected == lagSinceElement,
                    "\(value - expected) missing before \(value), but \(lagSinceElement) reported there")
            expected = value + 1
            lagSinceElement = 0
        }
    }
    #expect(last + 1 - expected == lagSinceElement, "\(last + 1 - expected) missing at the end, \(lagSinceElement) reported")
}

// claims: EVENTS-GAP-OLDEST
@Suite struct LagEventsTests {
    @Test func bufferingOldestPutsTheGapAfterWhatItHeldBeforeTheNextAccepted() async throws {
        let sequence = BroadcastSequence(of: Int.self)
        let subscription = sequence.subscribe(bufferingPolicy: .bufferingOldest(2))
        for value in 1...4 { sequence.send(value) }  // holds 1, 2; 3 and 4 dropped after 2
        var iterator = subscription.events.makeAsyncIterator()
        #expect(await iterator.next() == .element(1))
        sequence.send(5)  // room again: 5 lands after the gap
        sequence.send(6)  // full (2, 5): dropped after 5
        sequence.finish()
        let rest = try await drainEvents(subscription)  // a second iterator carries on
        #expect(rest == [.element(2), .lagged(2), .element(5), .lagged(1)])
        #expect(subscription.droppedCount == 3)
    }

    // claims: EVENTS-GAP-NEWEST
    @Test func bufferingNewestPutsTheGapBeforeTheElementNowOldest() async throws {
        let sequence = BroadcastSequence(of: Int.self)
        let subscription = sequence.subscribe(bufferingPolicy: .bufferingNewest(2))
        for value in 1...4 { sequence.send(value) }  // 1 and 2 evicted: holds 3, 4
        var iterator = subscription.events.makeAsyncIterator()
        #expect(await iterator.next() == .lagged(2))
        #expect(await iterator.next() == .element(3))
        sequence.send(5)
        sequence.send(6)  // evicts 4: the gap is before 5
        sequence.finish()
        let rest = try await drainEvents(subscription)  // a second iterator carries on
        #expect(rest == [.lagged(1), .element(5), .element(6)])
        #expect(subscription.droppedCount == 3)
    }

    // claims: EVENTS-GAP-CAPACITY-ZERO
    @Test func capacityZeroPutsTheGapAfterWhatItHolds() async throws {
        // Replay gives the capacity-0 subscriber something to hold.
        let sequence = BroadcastSequence(of: Int.self, replay: 2)
        sequence.send(1)
        sequence.send(2)
        let subscription = sequence.subscribe(bufferingPolicy: .bufferingOldest(0))
        sequence.send(3)  // no reader waits: dropped after 1, 2
        var iterator = subscription.events.makeAsyncIterator()
        #expect(await iterator.next() == .element(1))
        sequence.send(4)  // still after 2
        #expect(await iterator.next() == .element(2))
        #expect(await iterator.next() == .lagged(2))
        // A waiting reader is handed the element.
        let reader = Task {
            var iterator = subscription.events.makeAsyncIterator()
            return await iterator.next()
        }
        try await waitUntil("the reader waits") { subscription.isConsumerWaiting }
        #expect(sequence.send(5) == BroadcastSendResult(delivered: 1))
        #expect(try await withDeadline("the waiting reader") { await reader.value } == .element(5))
        sequence.send(6)  // nobody waits: a gap at the end
        sequence.finish()
        #expect(try await drainEvents(subscription) == [.lagged(1)])
        #expect(subscription.droppedCount == 3)
    }

    // claims: EVENTS-GAP-CAPACITY-ZERO
    @Test func capacityZeroReportsADropAtOnceToTheNextRead() async throws {
        let sequence = BroadcastSequence(of: Int.self, bufferingPolicy: .bufferingNewest(0))
        let subscription = sequence.subscribe()
        #expect(sequence.send(1) == BroadcastSendResult(dropped: 1))
        var iterator = subscription.events.makeAsyncIterator()
        #expect(await iterator.next() == .lagged(1))
    }

    // claims: EVENTS-GAP-BATCH
    @Test func aBatchSendPutsTheGapWhereConsecutiveSendsWould() async throws {
        let sequence = BroadcastSequence(of: Int.self)
        let oldest = sequence.subscribe(bufferingPolicy: .bufferingOldest(2))
        let newest = sequence.subscribe(bufferingPolicy: .bufferingNewest(2))
        sequence.send(contentsOf: 1...5)
        sequence.send(6)
        sequence.finish()
        let (count, after, batch) = try await withDeadline("a batch") {
            var iterator = oldest.events.makeAsyncIterator()
            var batch: [BroadcastEvent<Int>] = []
            let count = await iterator.next(upTo: 10, into: &batch)
            let after = await iterator.next(upTo: 10, into: &batch)
            return (count, after, batch)
        }
        #expect(count == 3 && after == 0)
        #expect(batch == [.element(1), .element(2), .lagged(4)])
        #expect(try await drainEvents(newest) == [.lagged(4), .element(5), .element(6)])
    }

    @Test func aGapPendingAtTheEndComesBeforeTheError() async throws {
        let sequence = BroadcastSequence(of: Int.self, throwing: TestError.self)
        let subscription = sequence.subscribe(bufferingPolicy: .bufferingOldest(1))
        sequence.send(1)
        sequence.send(2)
        sequence.finish(throwing: TestError(code: 7))
        let outcome = try await withDeadline("events then error") { () -> ([BroadcastEvent<Int>], TestError?) in
            var events: [BroadcastEvent<Int>] = []
            var iterator = subscription.events.makeAsyncIterator()
            do throws(TestError) {
                while let event = try await iterator.next() { events.append(event) }
                return (events, nil)
            } catch {
                return (events, error)
            }
        }
        #expect(outcome.0 == [.element(1), .lagged(1)])
        #expect(outcome.1 == TestError(code: 7))
    }

    // claims: EVENTS-SWITCH
    @Test func plainReadsThenEventsReportThePassedGapAtTheFirstEventsRead() async throws {
        let sequence = BroadcastSequence(of: Int.self)
        let subscription = sequence.subscribe(bufferingPolicy: .bufferingOldest(2))
        for value in 1...3 { sequence.send(value) }  // 3 dropped after 2
        #expect(pollOne(subscription) == 1)
        #expect(pollOne(subscription) == 2)
        sequence.send(4)
        sequence.finish()
        #expect(try await drainEvents(subscription) == [.lagged(1), .element(4)])
    }

    // claims: EVENTS-LAGGED-WHERE-DROPPED
    @Test func noDropsMeansNoLagEvents() async throws {
        let sequence = BroadcastSequence(of: Int.self)
        let subscription = sequence.subscribe(bufferingPolicy: .bufferingOldest(8))
        for value in 1...8 { sequence.send(value) }
        sequence.finish()
        #expect(try await drainEvents(subscription) == (1...8).map { .element($0) })
    }

    /// A sender thread and a reader of events, for each dropping policy:
    /// every gap is reported exactly where the missing integers are, and the
    /// lags add up to `droppedCount` (also under ThreadSanitizer).
    // claims: EVENTS-LAGGED-WHERE-DROPPED, EVENTS-BATCH-READ
    @Test(arguments: [BroadcastBufferingPolicy.bufferingOldest(4), .bufferingNewest(4), .bufferingOldest(0), .bufferingNewest(0)])
    func gapsAreExactWhileASenderThreadRaces(policy: BroadcastBufferingPolicy) async throws {
        let count = 20_000
        let sequence = BroadcastSequence(of: Int.self)
        let subscription = sequence.subscribe(bufferingPolicy: policy)
        let batchReader = sequence.subscribe(bufferingPolicy: policy)
        let reader = Task { () -> [BroadcastEvent<Int>] in
            var events: [BroadcastEvent<Int>] = []
            for await event in subscription.events { events.append(event) }
            return events
        }
        let batches = Task { () -> [BroadcastEvent<Int>] in
            var events: [BroadcastEvent<Int>] = []
            var iterator = batchReader.events.makeAsyncIterator()
            while await iterator.next(upTo: 3, into: &events) > 0 {}
            return events
        }
        _ = try await onThread("the sender") {
            for value in 0..<count {
                sequence.send(value)
                if value % 64 == 0 { sched_yield() }
            }
            sequence.finish()
            return true
        }
        let events = try await withDeadline("the reader") { await reader.value }
        let batched = try await withDeadline("the batch reader") { await batches.value }
        for (name, events, subscription) in [("next", events, subscription), ("batch", batched, batchReader)] {
            checkGapsExact(events, first: 0, last: count - 1)
            #expect(lagSum(events) == subscription.droppedCount, "\(name): lags \(lagSum(events)) != dropped \(subscription.droppedCount)")
            #expect(events.count - events.filter { if case .lagged = $0 { true } else { false } }.count
                        + subscription.droppedCount == count, "\(name)")
        }
    }
}
