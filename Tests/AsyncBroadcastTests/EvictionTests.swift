import Foundation
import Testing
@_spi(Testing) @testable import AsyncBroadcast
import AsyncBroadcastTestSupport

// claims: EVICT-HARD, EVICT-ENDS-LIKE-CANCEL, EVICT-ISEVICTED
@Suite struct EvictionTests {
    @Test func theSendThatWouldExceedTheHardLimitEndsTheSubscriber() async throws {
        let sequence = BroadcastSequence(of: Int.self)
        let subscription = sequence.subscribe(eviction: .hardLimit(3))
        let other = sequence.subscribe()
        for value in 1...3 { #expect(sequence.send(value) == BroadcastSendResult(delivered: 2)) }
        #expect(!subscription.isEvicted)
        #expect(sequence.send(4) == BroadcastSendResult(delivered: 1, evicted: 1))
        #expect(subscription.isEvicted)
        #expect(sequence.subscriberCount == 1)
        #expect(subscription.bufferedCount == 0)
        #expect(try await drain(subscription) == [])  // what it held is discarded
        #expect(sequence.send(5) == BroadcastSendResult(delivered: 1))
        sequence.finish()
        #expect(try await drain(other) == [1, 2, 3, 4, 5])
        #expect(subscription.isEvicted)
    }

    // claims: EVICT-HARD
    @Test func aReaderThatKeepsUpIsNeverEvicted() async throws {
        let sequence = BroadcastSequence(of: Int.self)
        let subscription = sequence.subscribe(eviction: .hardLimit(1))
        for value in 1...100 {
            #expect(sequence.send(value).evicted == 0)
            #expect(pollOne(subscription) == value)
        }
        #expect(!subscription.isEvicted)
    }

    // claims: EVICT-ENDS-LIKE-CANCEL, EVICT-IN-EVERY-SEND
    @Test(arguments: [BroadcastBufferingPolicy.unbounded, .bufferingNewest(8)])
    func aWaitingReaderIsWokenWithTheEnd(policy: BroadcastBufferingPolicy) async throws {
        let sequence = BroadcastSequence(of: Int.self)
        let subscription = sequence.subscribe(bufferingPolicy: policy, eviction: .hardLimit(1))
        let plain = Task { () -> Int? in
            var iterator = subscription.makeAsyncIterator()
            return await iterator.next()
        }
        try await waitUntil("the reader waits") { subscription.isConsumerWaiting }
        #expect(sequence.send(contentsOf: [1, 2]) == BroadcastSendResult(evicted: 1))
        #expect(try await withDeadline("the woken reader") { await plain.value } == nil)
        #expect(subscription.isEvicted)

        let events = sequence.subscribe(bufferingPolicy: policy, eviction: .hardLimit(1))
        let reader = Task { () -> [BroadcastEvent<Int>] in
            var result: [BroadcastEvent<Int>] = []
            for await event in events.events { result.append(event) }
            return result
        }
        try await waitUntil("the events reader waits") { events.isConsumerWaiting }
        #expect(sequence.send(contentsOf: [1, 2]) == BroadcastSendResult(evicted: 1))
        #expect(try await withDeadline("the woken events reader") { await reader.value } == [])
    }

    // claims: EVICT-IN-EVERY-SEND
    @Test func emitEvictsToo() async throws {
        let sequence = BroadcastSequence(of: Int.self)
        let subscription = sequence.subscribe(eviction: .hardLimit(2))
        #expect(try await sequence.emit(1) == BroadcastSendResult(delivered: 1))
        #expect(try await sequence.emit(2) == BroadcastSendResult(delivered: 1))
        #expect(try await sequence.emit(3) == BroadcastSendResult(evicted: 1))
        #expect(subscription.isEvicted)
        #expect(sequence.subscriberCount == 0)
    }

    // claims: EVICT-ISEVICTED
    @Test func isEvictedIsFalseAfterCancelAndAfterFinish() async throws {
        let sequence = BroadcastSequence(of: Int.self)
        let cancelled = sequence.subscribe(eviction: .hardLimit(1))
        let finished = sequence.subscribe(eviction: .hardLimit(1))
        sequence.send(1)
        cancelled.cancel()
        sequence.finish()
        #expect(try await drain(finished) == [1])
        #expect(!cancelled.isEvicted)
        #expect(!finished.isEvicted)
        #expect(sequence.send(2).isFinished)
    }

    // claims: EVICT-ENDS-LIKE-CANCEL, EVICT-BOUNDED-STOPS-GROWTH
    @Test func emittersWaitingOnAnEvictedBoundedSubscriberAreReleased() async throws {
        let sequence = BroadcastSequence(of: Int.self)
        let subscription = sequence.subscribe(bufferingPolicy: .bounded(2), eviction: .hardLimit(3))
        _ = try await sequence.emit(1)
        _ = try await sequence.emit(2)  // full
        let emitter = Task { try await sequence.emit(3) }
        try await waitUntil("the emitter waits") { sequence.waitingEmitterCount == 1 }
        #expect(sequence.send(4) == BroadcastSendResult(delivered: 1))  // over-filled to 3: the limit
        #expect(sequence.waitingEmitterCount == 1)
        #expect(sequence.send(5) == BroadcastSendResult(evicted: 1))  // would hold 4: evicted
        let released = try await withDeadline("the released emitter") { try await emitter.value }
        #expect(released == BroadcastSendResult())  // nobody left to deliver to
        #expect(subscription.isEvicted)
        #expect(sequence.waitingEmitterCount == 0)
    }

    // claims: EVICT-BATCH, EVICT-IN-EVERY-SEND
    @Test func aBatchThatWouldExceedTheLimitIsNotDeliveredToIt() async throws {
        let sequence = BroadcastSequence(of: Int.self)
        let subscription = sequence.subscribe(eviction: .hardLimit(4))
        #expect(sequence.send(contentsOf: [1, 2, 3]) == BroadcastSendResult(delivered: 3))
        #expect(sequence.send(contentsOf: [4, 5]) == BroadcastSendResult(evicted: 1))
        #expect(subscription.isEvicted)
        #expect(try await drain(subscription) == [])
    }

    @Test func droppingPoliciesWithinTheLimitAreNeverEvicted() async throws {
        let sequence = BroadcastSequence(of: Int.self)
        let oldest = sequence.subscribe(bufferingPolicy: .bufferingOldest(2), eviction: .hardLimit(2))
        let newest = sequence.subscribe(bufferingPolicy: .bufferingNewest(2), eviction: .hardLimit(2))
        let tight = sequence.subscribe(bufferingPolicy: .bufferingNewest(4), eviction: .hardLimit(2))
        for value in 1...10 { sequence.send(value) }
        #expect(!oldest.isEvicted && !newest.isEvicted)
        #expect(tight.isEvicted)  // its capacity lets it grow past the limit
        sequence.finish()
        #expect(try await drain(oldest) == [1, 2])
        #expect(try await drain(newest) == [9, 10])
    }

    // claims: EVICT-IN-EVERY-SEND
    @Test func aListenersSinkEvicts() async throws {
        let sinks = Locked<[BroadcastSink<Int, Never>]>([])
        let sequence = BroadcastSequence<Int, Never>(started: .lazily) { sink in
            sinks.withLock { $0.append(sink) }
            return {}
        }
        let subscription = sequence.subscribe(eviction: .hardLimit(1))
        try await waitUntil("the listener is registered") { !sinks.value.isEmpty }
        let sink = sinks.value[0]
        #expect(sink.send(1) == BroadcastSendResult(delivered: 1))
        #expect(sink.send(2) == BroadcastSendResult(evicted: 1))
        #expect(subscription.isEvicted)
        #expect(sequence.subscriberCount == 0)
        #expect(try await drain(subscription) == [])
    }

    // claims: EVICT-ENDS-LIKE-CANCEL
    @Test func aTopicSubscriberIsEvictedAndTheTopicRetired() async throws {
        let topics = BroadcastTopics<String, Int, Never>()
        let member = topics.subscribe(to: "room", eviction: .hardLimit(2))
        let other = topics.subscribe(to: "other", bufferingPolicy: .bufferingOldest(1), eviction: .hardLimit(1))
        topics.send(1, to: "room")
        topics.send(2, to: "room")
        #expect(topics.send(3, to: "room") == BroadcastSendResult(evicted: 1))
        #expect(member.isEvicted && !other.isEvicted)
        #expect(topics.subscriberCount(of: "room") == 0)
        #expect(topics.topicCount == 1)  // "room" retired
        #expect(try await drain(member) == [])
    }

    // claims: EVICT-SOFT
    @available(macOS 13, iOS 16, tvOS 16, watchOS 9, *)
    @Test func theSoftLimitEvictsOnlyAfterItWasExceededAtEverySendForTheDuration() async throws {
        let clock = ManualClock()
        let sequence = BroadcastSequence(of: Int.self)
        let subscription = sequence.subscribe(eviction: .softLimit(2, for: .seconds(10)), clock: clock)
        for value in 1...3 { sequence.send(value) }  // holds 3 > 2 from now on
        #expect(sequence.send(4).evicted == 0)       // over: the time starts
        clock.advance(by: .seconds(9))
        #expect(sequence.send(5).evicted == 0)       // over for 9 s
        // The reader catches up to 2: the next send resets the time.
        for value in 1...3 { #expect(pollOne(subscription) == value) }
        #expect(sequence.send(6).evicted == 0)       // held 2: reset
        #expect(sequence.send(7).evicted == 0)       // held 3: over, the time starts again
        clock.advance(by: .seconds(9))
        #expect(sequence.send(8).evicted == 0)
        clock.advance(by: .seconds(1))
        #expect(sequence.send(9) == BroadcastSendResult(evicted: 1))  // over for 10 s at every send
        #expect(subscription.isEvicted)
    }

    // claims: EVICT-BOTH
    @available(macOS 13, iOS 16, tvOS 16, watchOS 9, *)
    @Test func bothLimitsWhicheverComesFirst() async throws {
        let clock = ManualClock()
        let sequence = BroadcastSequence(of: Int.self)
        let subscription = sequence.subscribe(eviction: .limits(hard: 5, soft: 1, for: .seconds(60)), clock: clock)
        for value in 1...5 { #expect(sequence.send(value).evicted == 0) }
        #expect(sequence.send(6).evicted == 1)  // the hard limit, long before 60 s
        #expect(subscription.isEvicted)
        #expect(BroadcastEviction.never == BroadcastEviction.never)
        #expect(BroadcastEviction.hardLimit(3) != BroadcastEviction.hardLimit(4))
    }

    /// A sender thread and a reader that stops reading: the sender evicts it
    /// while the reader may be anywhere (also under ThreadSanitizer); what it
    /// read is an in-order prefix, and exactly one send reports the eviction.
    // claims: EVICT-ISEVICTED, EVICT-BOUNDED-STOPS-GROWTH
    @Test(arguments: [BroadcastBufferingPolicy.unbounded, .bounded(8), .bufferingNewest(64)])
    func aSenderThreadEvictsAReaderThatFallsBehind(policy: BroadcastBufferingPolicy) async throws {
        let sequence = BroadcastSequence(of: Int.self)
        let evicting = sequence.subscribe(bufferingPolicy: policy, eviction: .hardLimit(16))
        let keeper = sequence.subscribe(bufferingPolicy: .unbounded)
        let stopAt = 500
        // Completed by the sender at the send that evicts (or when it is
        // done): the stopped reader parks on it instead of spinning, so the
        // cooperative pool stays free for the other tests.
        let evictedOrDone = BroadcastPromise<Void, Never>()
        let reader = Task { () -> [Int] in
            var received: [Int] = []
            for await value in evicting.events {
                guard case .element(let value) = value else { continue }
                received.append(value)
                if received.count == stopAt {
                    // Stop reading until evicted.
                    _ = try? await evictedOrDone.value
                }
            }
            return received
        }
        try await waitUntil("the reader waits") { evicting.isConsumerWaiting }
        let count = 50_000
        let evictions = try await onThread("the sender") {
            var evictions = 0
            for value in 0..<count {
                let evicted = sequence.send(value).evicted
                if evicted > 0 { evictedOrDone.succeed() }
                evictions += evicted
            }
            evictedOrDone.succeed()
            sequence.finish()
            return evictions
        }
        let received = try await withDeadline("the evicted reader") { await reader.value }
        #expect(evictions == 1)
        #expect(evicting.isEvicted)
        #expect(received.count <= stopAt + 16)  // it read at most its limit past where it stopped
        #expect(received == Array(0..<received.count))
        #expect(try await drain(keeper).count == count)
    }

    /// The soft limit can come first: over 1 unread element at every send
    /// for 10 s ends the subscriber long before its hard limit of 100.
    // claims: EVICT-BOTH, EVICT-SOFT
    @available(macOS 13, iOS 16, tvOS 16, watchOS 9, *)
    @Test func bothLimitsTheSoftOneFirst() async throws {
        let clock = ManualClock()
        let sequence = BroadcastSequence(of: Int.self)
        let subscription = sequence.subscribe(eviction: .limits(hard: 100, soft: 1, for: .seconds(10)), clock: clock)
        for value in 1...3 { #expect(sequence.send(value).evicted == 0) }  // the third finds it over 1: the time starts
        clock.advance(by: .seconds(10))
        #expect(sequence.send(4) == BroadcastSendResult(evicted: 1))
        #expect(subscription.isEvicted)
    }

    /// An evicted subscriber's reader gets the end, never the sequence's
    /// error, even once the sequence has failed; a subscriber ended by its
    /// task's cancellation is not evicted, and later sends skip it.
    // claims: EVICT-ENDS-LIKE-CANCEL, EVICT-ISEVICTED
    @Test func anEvictedReaderGetsTheEndNeverTheErrorAndATaskCancellationIsNoEviction() async throws {
        let sequence = BroadcastSequence(of: Int.self, throwing: TestError.self)
        let evicted = sequence.subscribe(eviction: .hardLimit(1))
        let cancelled = sequence.subscribe(eviction: .hardLimit(1))
        let cancelledRead = try await withDeadline("a read from a cancelled task") {
            try await Task { () async throws -> Int? in
                withUnsafeCurrentTask { $0?.cancel() }
                var iterator = cancelled.makeAsyncIterator()
                return try await iterator.next()
            }.value
        }
        #expect(cancelledRead == nil)
        #expect(sequence.send(1) == BroadcastSendResult(delivered: 1))
        #expect(sequence.send(2) == BroadcastSendResult(evicted: 1))
        sequence.finish(throwing: TestError(code: 7))
        var iterator = evicted.makeAsyncIterator()
        #expect(try await iterator.next() == nil, "an evicted reader got an element or the error")
        #expect(try await iterator.next() == nil)
        #expect(evicted.isEvicted)
        #expect(!cancelled.isEvicted, "a task's cancellation counted as an eviction")
    }

    /// Elements of an upstream are checked against the limits as they are
    /// delivered, as any send's: the third element ends a subscriber with a
    /// hard limit of 2 that reads nothing.
    // claims: EVICT-IN-EVERY-SEND
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func anUpstreamsElementEvicts() async throws {
        let feed = Feed(of: Never.self)
        let shared = BroadcastSequence<Int, Never>(started: .lazily) { feed.make() }
        let subscription = shared.subscribe(eviction: .hardLimit(2))
        let keeper = shared.subscribe()
        let run = try await feed.waitForRun(1)
        run.send(contentsOf: 1...3)
        // `isEvicted` is set inside the send's critical section, its removal
        // runs right after it, in the upstream's task: wait for the send.
        try await waitUntil("the upstream's third element evicts it") {
            subscription.isEvicted && shared.subscriberCount == 1
        }
        #expect(try await take(3, from: keeper) == [1, 2, 3])
        #expect(try await drain(subscription) == [])
    }
}
