import Testing
@_spi(Testing) @testable import AsyncBroadcast

// claims: SEQ-FINISH-DRAIN-THEN-END, SEQ-FINISH-REFUSES
@Suite struct FinishTests {
    @Test func subscribersDrainTheirBufferThenEnd() async throws {
        let sequence = BroadcastSequence(of: Int.self)
        let subscription = sequence.subscribe()
        for i in 1...3 { sequence.send(i) }
        sequence.finish()
        #expect(sequence.isFinished)
        #expect(try await drain(subscription) == [1, 2, 3])
        var iterator = subscription.makeAsyncIterator()
        #expect(await iterator.next() == nil)
    }

    // claims: SEQ-FINISH-DRAIN-THEN-END
    @Test func finishThrowingThrowsOnceAfterTheBufferThenNil() async throws {
        let sequence = BroadcastSequence(of: Int.self, throwing: TestError.self)
        let subscription = sequence.subscribe()
        sequence.send(1)
        sequence.finish(throwing: TestError(code: 1))
        var iterator = subscription.makeAsyncIterator()
        #expect(try await iterator.next() == 1)
        await #expect(throws: TestError(code: 1)) { _ = try await iterator.next() }
        #expect(try await iterator.next() == nil)
        #expect(try await iterator.next() == nil)
    }

    // claims: SEQ-FINISH-FIRST-WINS
    @Test func firstFinishWins() async throws {
        let sequence = BroadcastSequence(of: Int.self, throwing: TestError.self)
        let subscription = sequence.subscribe()
        sequence.finish()
        sequence.finish(throwing: TestError(code: 2))
        var iterator = subscription.makeAsyncIterator()
        #expect(try await iterator.next() == nil)

        let failing = BroadcastSequence(of: Int.self, throwing: TestError.self)
        let failingSubscription = failing.subscribe()
        failing.finish(throwing: TestError(code: 3))
        failing.finish(throwing: TestError(code: 4))
        failing.finish()
        var failingIterator = failingSubscription.makeAsyncIterator()
        await #expect(throws: TestError(code: 3)) { _ = try await failingIterator.next() }
    }

    // claims: SEQ-FINISH-IDLE-LEAVES
    @Test func finishWakesParkedConsumers() async throws {
        let sequence = BroadcastSequence(of: Int.self, throwing: TestError.self)
        let subscriptions = (0..<4).map { _ in sequence.subscribe() }
        let readers = subscriptions.map { subscription in
            Task { () -> String in
                do {
                    for try await _ in subscription {}
                    return "nil"
                } catch { return "threw \((error as? TestError)?.code ?? -1)" }
            }
        }
        for subscription in subscriptions {
            try await waitUntil("parked") { subscription.isConsumerWaiting }
        }
        sequence.finish(throwing: TestError(code: 9))
        for reader in readers {
            #expect(try await withDeadline("woken by finish") { await reader.value } == "threw 9")
        }
        #expect(sequence.subscriberCount == 0)
    }

    // claims: SEQ-COUNT-FINISHED, SEQ-FINISH-REFUSES
    @Test func sendAfterFinishReportsIsFinished() async throws {
        let sequence = BroadcastSequence(of: Int.self)
        let subscription = sequence.subscribe()
        sequence.finish()
        #expect(sequence.send(1) == BroadcastSendResult(delivered: 0, dropped: 0, isFinished: true))
        #expect(try await sequence.emit(1) == BroadcastSendResult(delivered: 0, dropped: 0, isFinished: true))
        #expect(try await drain(subscription) == [])
    }

    // claims: SEQ-UNREGISTERED-SUBSCRIBE
    @Test func subscribingAfterFinishEndsAtOnce() async throws {
        let sequence = BroadcastSequence(of: Int.self)
        sequence.send(1)
        sequence.finish()
        let subscription = sequence.subscribe()
        #expect(sequence.subscriberCount == 0)
        #expect(try await drain(subscription) == [])
    }

    // claims: SEQ-DEINIT-FINISHES
    @Test func lastReferenceGoingAwayFinishesAndWakesWaitingConsumers() async throws {
        var sequence: BroadcastSequence<Int, Never>? = BroadcastSequence(of: Int.self)
        let subscription = sequence!.subscribe()
        let reader = Task { try await drain(subscription) }
        sequence!.send(1)
        try await waitUntil("consumer parked") { subscription.isConsumerWaiting }
        sequence = nil
        #expect(try await withDeadline("consumer ended by deinit") { try await reader.value } == [1])
    }

    // claims: SEQ-FINISH-IDLE-LEAVES
    @Test func finishedSubscribersCountUntilDrained() async throws {
        let sequence = BroadcastSequence(of: Int.self)
        let subscription = sequence.subscribe()
        sequence.send(1)
        sequence.send(2)
        sequence.finish()
        #expect(sequence.subscriberCount == 1)
        #expect(pollOne(subscription) == 1)
        #expect(sequence.subscriberCount == 1)
        // Taking the last element ends it: it leaves before its `nil`.
        #expect(pollOne(subscription) == 2)
        #expect(sequence.subscriberCount == 0)
        #expect(try await drain(subscription) == [])
    }

    /// A subscriber that holds nothing when the sequence finishes has ended:
    /// it leaves the count at once, iterated or not, parked or not.
    // claims: SEQ-FINISH-IDLE-LEAVES
    @Test(arguments: [
        BroadcastBufferingPolicy.unbounded, .bounded(2), .bufferingOldest(2), .bufferingNewest(2), .bufferingNewest(0),
    ])
    func idleSubscribersLeaveAtFinish(policy: BroadcastBufferingPolicy) async throws {
        let sequence = BroadcastSequence(of: Int.self, throwing: TestError.self)
        let parked = sequence.subscribe(bufferingPolicy: policy)
        let holding = sequence.subscribe(bufferingPolicy: .unbounded)
        let reader = Task { () -> Int? in
            var iterator = parked.makeAsyncIterator()
            return try await iterator.next()
        }
        try await waitUntil("reader parked") { parked.isConsumerWaiting }
        sequence.send(7)
        #expect(try await withDeadline("parked reader gets 7") { try await reader.value } == 7)
        let neverIterated = sequence.subscribe(bufferingPolicy: policy)
        #expect(sequence.subscriberCount == 3)
        sequence.finish(throwing: TestError(code: 9))
        #expect(sequence.subscriberCount == 1, "only the subscriber still holding an element counts")
        for ended in [parked, neverIterated] {
            guard case .failure(let error) = ended.poll() else {
                Issue.record("an idle subscriber did not get the error first")
                continue
            }
            #expect(error == TestError(code: 9))
            guard case .end = ended.poll() else { Issue.record("no end after the error"); continue }
        }
        #expect(pollOne(holding) == 7)
        #expect(sequence.subscriberCount == 0)
    }
}
