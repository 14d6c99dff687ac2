import Testing
@_spi(Testing) @testable import AsyncBroadcast

// claims: SEQ-END-WAYS, SEQ-CANCEL-IDEMPOTENT
@Suite struct LifecycleTests {
    @Test func subscriberCountReturnsToZeroAfterCancel() {
        let sequence = BroadcastSequence(of: Int.self)
        let subscription = sequence.subscribe()
        #expect(sequence.subscriberCount == 1)
        subscription.cancel()
        #expect(sequence.subscriberCount == 0)
        subscription.cancel()  // idempotent
        #expect(sequence.send(1).delivered == 0)
    }

    // claims: SEQ-END-WAYS
    @Test func subscriberCountReturnsToZeroWhenAnUnreadSubscriptionIsDropped() {
        let sequence = BroadcastSequence(of: Int.self)
        do {
            let subscription = sequence.subscribe()
            sequence.send(1)
            _ = subscription
        }
        #expect(sequence.subscriberCount == 0)
    }

    // claims: SEQ-END-WAYS
    @Test func iteratorKeepsTheSubscriptionAlive() async {
        let sequence = BroadcastSequence(of: Int.self)
        var iterator = sequence.subscribe().makeAsyncIterator()
        #expect(sequence.subscriberCount == 1)
        sequence.send(5)
        #expect(await iterator.next() == 5)
        _ = consume iterator
        #expect(sequence.subscriberCount == 0)
    }

    // claims: SEQ-END-WAYS, SEQ-TASK-CANCEL-ENDS, SEQ-TASK-CANCEL-PARKED
    @Test func subscriberCountReturnsToZeroAfterTaskCancellation() async throws {
        let sequence = BroadcastSequence(of: Int.self)
        let subscription = sequence.subscribe()
        let consumer = Task { try await drain(subscription) }
        try await waitUntil("parked") { subscription.isConsumerWaiting }
        consumer.cancel()
        #expect(try await withDeadline("cancelled consumer") { try await consumer.value } == [])
        #expect(sequence.subscriberCount == 0)
    }

    // claims: SEQ-END-EFFECTS
    @Test func cancelWakesAParkedConsumerWithNil() async throws {
        let sequence = BroadcastSequence(of: Int.self, throwing: TestError.self)
        let subscription = sequence.subscribe()
        let consumer = Task { () async throws -> Int? in
            var iterator = subscription.makeAsyncIterator()
            return try await iterator.next()
        }
        try await waitUntil("parked") { subscription.isConsumerWaiting }
        subscription.cancel()
        #expect(try await withDeadline("woken by cancel()") { try await consumer.value } == nil)
    }

    // claims: SEQ-END-EFFECTS
    @Test func cancelFreesTheBufferAtOnce() {
        let counter = LiveCounter()
        let sequence = BroadcastSequence(of: Payload.self)
        let subscription = sequence.subscribe()
        for i in 0..<100 { sequence.send(Payload(i, counter)) }
        #expect(counter.live == 100)
        subscription.cancel()
        #expect(counter.live == 0)
        #expect(subscription.poll().isEnd)
    }

    @Test func droppingEverythingReleasesEveryElement() async throws {
        let counter = LiveCounter()
        do {
            let sequence = BroadcastSequence(of: Payload.self, bufferingPolicy: .bufferingNewest(3), replay: 2)
            let a = sequence.subscribe()
            let b = sequence.subscribe(bufferingPolicy: .unbounded)
            for i in 0..<50 { sequence.send(Payload(i, counter)) }
            _ = a.poll()
            _ = (a, b)
        }
        #expect(counter.live == 0)
    }

    // claims: SEQ-TASK-CANCEL-NO-ERROR
    @Test func nextFromACancelledTaskReturnsNilAlsoForThrowingSequences() async throws {
        let sequence = BroadcastSequence(of: Int.self, throwing: TestError.self)
        let subscription = sequence.subscribe()
        let result = try await withDeadline("next from cancelled task") {
            try await Task { () async throws -> Int? in
                withUnsafeCurrentTask { $0?.cancel() }
                var iterator = subscription.makeAsyncIterator()
                return try await iterator.next()
            }.value
        }
        #expect(result == nil)
        #expect(sequence.subscriberCount == 0)
        #expect(sequence.send(1).delivered == 0)
    }

    // claims: SEQ-TASK-CANCEL-ENDS, SEQ-TASK-CANCEL-NO-ERROR
    @Test func taskCancellationEndsTheSubscriberLikeCancel() async throws {
        // Noticed on the first call: what it held is discarded, it leaves
        // the count at once, and `next()` returns nil.
        let sequence = BroadcastSequence(of: Int.self)
        let subscription = sequence.subscribe()
        sequence.send(1)
        sequence.send(2)
        let result = try await withDeadline("next after cancellation") {
            await Task { () -> [Int] in
                withUnsafeCurrentTask { $0?.cancel() }
                var received: [Int] = []
                for await value in subscription { received.append(value) }
                return received
            }.value
        }
        #expect(result == [])
        #expect(sequence.subscriberCount == 0)
        #expect(sequence.send(3).delivered == 0)
    }

    /// A consumer cancelled mid-stream receives at most 31 more elements,
    /// however many are sent after the cancellation.
    // claims: SEQ-TASK-CANCEL-32
    @Test(arguments: [0, 1, 5, 31, 32, 33, 40])
    func taskCancellationIsNoticedWithin32Calls(readBeforeCancel: Int) async throws {
        let sequence = BroadcastSequence(of: Int.self)
        let subscription = sequence.subscribe()
        let gate = Gate()
        let reader = Task { () -> (before: Int, after: Int) in
            var iterator = subscription.makeAsyncIterator()
            var before = 0
            for _ in 0..<readBeforeCancel { if await iterator.next() != nil { before += 1 } }
            await gate.pass()  // the test cancels this task and sends 1000 more
            var after = 0
            while await iterator.next() != nil { after += 1 }
            return (before, after)
        }
        for i in 0..<readBeforeCancel { sequence.send(i) }
        try await waitUntil("reader at the gate") { gate.isWaiting }
        reader.cancel()
        for i in 0..<1000 { sequence.send(i) }
        gate.open()
        let (before, after) = try await withDeadline("cancelled reader ends") { await reader.value }
        #expect(before == readBeforeCancel)
        #expect(after <= 31, "received \(after) elements after its task was cancelled")
        #expect(sequence.subscriberCount == 0)
        #expect(sequence.send(0).delivered == 0)
    }

    // claims: SEQ-END-ISOLATED, SEQ-END-EFFECTS
    @Test func anEndedSubscriberNeverAffectsOthers() async throws {
        let sequence = BroadcastSequence(of: Int.self)
        let leaving = sequence.subscribe(bufferingPolicy: .bounded(1))
        let staying = sequence.subscribe()
        sequence.send(1)
        leaving.cancel()
        try await sequence.emit(2)  // would wait if the cancelled one still counted
        #expect(pollAll(staying) == [1, 2])
    }

    @Test func manyParkedConsumersAllWake() async throws {
        let sequence = BroadcastSequence(of: Int.self)
        let subscriptions = (0..<64).map { _ in sequence.subscribe() }
        let readers = subscriptions.map { subscription in Task { try await take(1, from: subscription) } }
        for subscription in subscriptions { try await waitUntil("parked") { subscription.isConsumerWaiting } }
        #expect(sequence.send(1).delivered == 64)
        for reader in readers { #expect(try await reader.value == [1]) }
    }

    /// Elements the library lets go of (evicted by `.bufferingNewest`,
    /// dropped by `.bufferingOldest`, discarded by `cancel()`, pushed out of
    /// the replay window) are released after its lock: each one's deinit
    /// sends into the same sequence, which would deadlock under the lock. On
    /// a thread of its own, so a deadlock fails at the deadline.
    // claims: DRF-NO-USER-CODE-UNDER-LOCK
    @Test func anElementsDeinitRunsAfterTheLockAndMayUseTheSequence() async throws {
        typealias Broadcast = BroadcastSequence<SendsOnRelease, Never>
        let seen = try await onThread("releases whose deinit sends into the sequence") { () -> [[Int]] in
            func ids(_ subscription: Broadcast.Subscription) -> [Int] { pollAll(subscription).map(\.id) }
            var seen: [[Int]] = []
            // Evicted: the deinit's send evicts the element that evicted it.
            let evicting = Broadcast()
            let evictingTarget = WeakBox(evicting)
            let newest = evicting.subscribe(bufferingPolicy: .bufferingNewest(1))
            evicting.send(SendsOnRelease(1, sendsOnDeinit: 100, into: evictingTarget))
            evicting.send(SendsOnRelease(2, sendsOnDeinit: nil, into: evictingTarget))
            seen.append(ids(newest))
            // Dropped by a capacity-0 subscriber with no reader: so is the deinit's.
            let dropping = Broadcast()
            let droppingTarget = WeakBox(dropping)
            let oldest = dropping.subscribe(bufferingPolicy: .bufferingOldest(0))
            dropping.send(SendsOnRelease(3, sendsOnDeinit: 200, into: droppingTarget))
            seen.append([oldest.droppedCount])
            // Discarded by cancel(): the deinit's send reaches the subscriber left.
            let discarding = Broadcast()
            let discardingTarget = WeakBox(discarding)
            let cancelled = discarding.subscribe()
            discarding.send(SendsOnRelease(4, sendsOnDeinit: 300, into: discardingTarget))
            let watcher = discarding.subscribe()
            cancelled.cancel()
            seen.append(ids(watcher))
            // Pushed out of the replay window, with nobody subscribed.
            let replaying = Broadcast(replay: 1)
            let replayingTarget = WeakBox(replaying)
            replaying.send(SendsOnRelease(5, sendsOnDeinit: 400, into: replayingTarget))
            replaying.send(SendsOnRelease(6, sendsOnDeinit: nil, into: replayingTarget))
            seen.append(ids(replaying.subscribe()))
            return seen
        }
        #expect(seen == [[100], [2], [300], [400]], "the deinits' sends did not arrive as ordinary sends after the releases")
    }
}

extension BroadcastSequence.Subscription.PollResult {
    var isEnd: Bool { if case .end = self { return true } else { return false } }
}

/// An element whose deinit sends a new element into the sequence that
/// released it (weakly referenced: no cycle).
final class SendsOnRelease: Sendable {
    let id: Int
    let replacement: Int?
    let target: WeakBox<BroadcastSequence<SendsOnRelease, Never>>

    init(_ id: Int, sendsOnDeinit replacement: Int?, into target: WeakBox<BroadcastSequence<SendsOnRelease, Never>>) {
        self.id = id
        self.replacement = replacement
        self.target = target
    }

    deinit {
        if let replacement, let sequence = target.object {
            sequence.send(SendsOnRelease(replacement, sendsOnDeinit: nil, into: target))
        }
    }
}
