import Testing
@_spi(Testing) @testable import AsyncBroadcast

@Suite struct ReplayTests {
    @Test func newSubscriberStartsWithTheLastKElements() {
        let sequence = BroadcastSequence(of: Int.self, replay: 3)
        for i in 1...5 { sequence.send(i) }
        let subscription = sequence.subscribe()
        sequence.send(6)
        #expect(pollAll(subscription) == [3, 4, 5, 6])
    }

    @Test func replayShorterThanWindow() {
        let sequence = BroadcastSequence(of: Int.self, replay: 10)
        sequence.send(1)
        #expect(pollAll(sequence.subscribe()) == [1])
    }

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

    @Test func replayGoesThroughTheSubscribersPolicy() {
        let sequence = BroadcastSequence(of: Int.self, replay: 5)
        for i in 1...5 { sequence.send(i) }
        let newest = sequence.subscribe(bufferingPolicy: .bufferingNewest(2))
        #expect(newest.droppedCount == 3)
        #expect(pollAll(newest) == [4, 5])
    }

    @Test func replayZeroKeepsNothing() {
        let sequence = BroadcastSequence(of: Int.self)
        sequence.send(1)
        #expect(pollAll(sequence.subscribe()) == [])
    }
}
