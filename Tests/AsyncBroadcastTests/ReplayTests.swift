import Testing
@_spi(Testing) @testable import AsyncBroadcast

// claims: SEQ-REPLAY-WINDOW
@Suite struct ReplayTests {
    @Test func newSubscriberStartsWithTheLastKElements() {
        let sequence = BroadcastSequence(of: Int.self, replay: 3)
        for i in 1...5 { sequence.send(i) }
        let subscription = sequence.subscribe()
        sequence.send(6)
        #expect(pollAll(subscription) == [3, 4, 5, 6])
    }

    // claims: SEQ-REPLAY-WINDOW
    @Test func replayShorterThanWindow() {
        let sequence = BroadcastSequence(of: Int.self, replay: 10)
        sequence.send(1)
        #expect(pollAll(sequence.subscribe()) == [1])
    }

    // claims: SEQ-REPLAY-THEN-END, SEQ-UNREGISTERED-SUBSCRIBE
    @Test func replayThenTerminalAfterFinish() async throws {
        let sequence = BroadcastSequence(of: Int.self, throwing: TestError.self, replay: 2)
        for i in 1...3 { sequence.send(i) }
        sequence.finish(throwing: TestError(code: 5))
        var iterator = sequence.makeAsyncIterator()
        #expect(try await iterator.next() == 2)
        #expect(try await iterator.next() == 3)
        await #expect(throws: TestError(code: 5)) { _ = try await iterator.next() }
        #expect(try await iterator.next() == nil)
    }

    /// The whole window, whatever the policy; the policy governs what comes
    /// after: an over-filled subscriber counts as full.
    // claims: SEQ-REPLAY-NOT-CUT, SEQ-REPLAY-OVERFILL-FULL
    @Test(arguments: [
        (BroadcastBufferingPolicy.bufferingNewest(0), [Int](), 1),
        (.bufferingOldest(0), [], 1),
        (.bufferingNewest(1), [6], 1),
        (.bufferingOldest(1), [], 1),
        (.bufferingNewest(2), [6], 1),
        (.bufferingOldest(3), [], 1),
        (.bounded(1), [6], 0),
        (.unbounded, [6], 0),
    ])
    func replayIsNotCutByThePolicy(policy: BroadcastBufferingPolicy, afterWindow: [Int], dropped: Int) {
        let sequence = BroadcastSequence(of: Int.self, replay: 5)
        for i in 1...5 { sequence.send(i) }
        let subscription = sequence.subscribe(bufferingPolicy: policy)
        #expect(subscription.droppedCount == 0)
        let result = sequence.send(6)
        #expect(result.dropped == dropped)
        #expect(subscription.droppedCount == dropped)
        let expected: [Int]
        if case .bufferingNewest = policy, !afterWindow.isEmpty {
            expected = [2, 3, 4, 5, 6]  // the oldest was evicted for the new element
        } else {
            expected = [1, 2, 3, 4, 5] + afterWindow
        }
        #expect(pollAll(subscription) == expected)
    }

    /// A `.bounded` subscriber over-filled by replay makes `emit` wait.
    // claims: SEQ-REPLAY-OVERFILL-FULL, SEQ-EMIT-WAITS-WHILE-FULL
    @Test func replayOverFillingABoundedSubscriberMakesEmitWait() async throws {
        let sequence = BroadcastSequence(of: Int.self, replay: 3)
        for i in 1...3 { sequence.send(i) }
        let subscription = sequence.subscribe(bufferingPolicy: .bounded(2))
        let emitter = Task { try await sequence.emit(4) }
        try await waitUntil("emit waits on the over-filled subscriber") { sequence.waitingEmitterCount == 1 }
        #expect(pollOne(subscription) == 1)
        #expect(sequence.waitingEmitterCount == 1)  // still holds 2: full
        #expect(pollOne(subscription) == 2)
        let result = try await withDeadline("emit released") { try await emitter.value }
        #expect(result.delivered == 1)
        #expect(pollAll(subscription) == [3, 4])
    }

    // claims: SEQ-NOTHING-BEFORE-SUBSCRIBE
    @Test func replayZeroKeepsNothing() {
        let sequence = BroadcastSequence(of: Int.self)
        sequence.send(1)
        #expect(pollAll(sequence.subscribe()) == [])
    }
}
