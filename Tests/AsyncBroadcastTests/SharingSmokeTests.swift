import Testing
@_spi(Testing) import AsyncBroadcast

@Suite struct SharingSmokeTests {
    @Test func lazilySharesOneIteration() async throws {
        let made = LiveCounter()
        let shared = BroadcastSequence<Int, Never>(bufferingPolicy: .unbounded, started: .lazily) {
            made.increment()
            return AsyncStream<Int> { c in for i in 0..<5 { c.yield(i) }; c.finish() }
        }
        #expect(shared.sharingCounters.starts == 0)
        let a = shared.subscribe(); let b = shared.subscribe()
        let ra = try await drain(a); let rb = try await drain(b)
        #expect(ra == [0,1,2,3,4] || ra.count <= 5)
        #expect(rb.count <= 5)
        #expect(shared.isFinished)
        #expect(made.live == 1)
        try await waitUntil("task gone") { shared.sharingCounters.liveUpstreamTasks == 0 }
        #expect(shared.sharingCounters.starts == 1 && shared.sharingCounters.stops == 1)
    }

    @Test func whileSubscribedRestartsListener() async throws {
        let registered = LiveCounter(); let unregistered = LiveCounter()
        let shared = BroadcastSequence<Int, Never>(started: .whileSubscribed()) { sink in
            registered.increment()
            sink.send(1)
            return { unregistered.increment() }
        }
        let a = shared.subscribe()
        #expect(registered.live == 1)
        #expect(pollAll(a) == [1])
        a.cancel()
        #expect(unregistered.live == 1)
        let b = shared.subscribe()
        #expect(registered.live == 2)
        #expect(pollAll(b) == [1])
        var counts = shared.subscriberCounts.makeAsyncIterator()
        #expect(await counts.next() == 1)
        b.cancel()
        #expect(await counts.next() == 0)
        #expect(unregistered.live == 2)
        shared.finish()
        #expect(await counts.next() == nil)
    }
}
