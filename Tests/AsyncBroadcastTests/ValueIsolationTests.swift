import Testing
@_spi(Testing) @testable import AsyncBroadcast

actor ValueCollector {
    var values: [Int] = []

    /// Iterates on this actor: `next(isolation:)` keeps the loop isolated.
    func consume(_ subscription: BroadcastValue<Int, Never>.Subscription, until last: Int) async {
        for await value in subscription {
            assertIsolated("the loop left the actor")
            values.append(value)  // synchronous access to actor state
            if value == last { break }
        }
    }
}

/// SEMANTICS V14: `next(isolation:)` runs on the caller's actor.
// claims: VAL-ISOLATION
@Suite struct ValueIsolationTests {
    @MainActor
    @Test func v14MainActorConsumerStaysOnTheMainActor() async throws {
        let value = BroadcastValue(0)
        let subscription = value.subscribe()
        Task.detached {
            for i in 1...100 { value.send(i) }
            value.finish()
        }
        let received = try await withDeadline("main-actor loop") { @MainActor () -> [Int] in
            var received: [Int] = []
            for await next in subscription {
                MainActor.assertIsolated("the loop left the main actor")
                received.append(next)
            }
            return received
        }
        #expect(received.last == 100)
        #expect(zip(received, received.dropFirst()).allSatisfy { $0 < $1 })
    }

    // claims: VAL-ISOLATION
    @MainActor
    @Test func v14ExplicitNextIsolationOnTheMainActor() async throws {
        try await withDeadline("v14ExplicitNextIsolationOnTheMainActor") { @MainActor () async throws -> Void in
            let value = BroadcastValue(0, throwing: TestError.self)
            let subscription = value.subscribe()
            var iterator = subscription.makeAsyncIterator()
            #expect(try await iterator.next(isolation: MainActor.shared) == 0)
            MainActor.assertIsolated()
            Task.detached { value.send(1) }
            #expect(try await iterator.next(isolation: MainActor.shared) == 1)  // parks, then resumes on the main actor
            MainActor.assertIsolated()
        }
    }

    // claims: VAL-ISOLATION
    @Test func v14ActorIsolatedConsumerIteratesOnItsActor() async throws {
        let value = BroadcastValue(0)
        let subscription = value.subscribe()
        let collector = ValueCollector()
        let consumer = Task { await collector.consume(subscription, until: 3) }
        for i in 1...3 {
            try await waitUntil("consumer parked before \(i)") { subscription.isConsumerWaiting }
            value.send(i)
        }
        try await withDeadline("actor consumer") { await consumer.value }
        #expect(await collector.values == [0, 1, 2, 3])
    }
}
