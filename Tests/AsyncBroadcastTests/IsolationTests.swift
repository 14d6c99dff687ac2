import Testing
@_spi(Testing) @testable import AsyncBroadcast

actor Collector {
    var values: [Int] = []

    /// Iterates on this actor: `next(isolation:)` keeps the loop isolated.
    func consume(_ subscription: BroadcastSequence<Int, Never>.Subscription) async {
        for await value in subscription {
            assertIsolated("the loop left the actor")
            values.append(value)  // synchronous access to actor state
        }
    }
}

@Suite struct IsolationTests {
    @Test func actorIsolatedConsumerIteratesOnItsActor() async throws {
        let sequence = BroadcastSequence(of: Int.self)
        let subscription = sequence.subscribe()
        let collector = Collector()
        let consumer = Task { await collector.consume(subscription) }
        for i in 0..<100 { sequence.send(i) }
        sequence.finish()
        try await withDeadline("actor consumer") { await consumer.value }
        #expect(await collector.values == Array(0..<100))
    }

    @MainActor
    @Test func mainActorConsumer() async throws {
        let sequence = BroadcastSequence(of: Int.self)
        let subscription = sequence.subscribe()
        Task.detached {
            for i in 0..<10 { sequence.send(i) }
            sequence.finish()
        }
        var received: [Int] = []
        for await value in subscription {
            MainActor.assertIsolated()
            received.append(value)
        }
        #expect(received == Array(0..<10))
    }
}
