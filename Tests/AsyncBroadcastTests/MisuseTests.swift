import Testing
@_spi(Testing) import AsyncBroadcast

/// Programmer errors trap with a message naming the argument.
@Suite struct MisuseTests {
    @Test func negativeReplayTraps() async {
        await #expect(processExitsWith: .failure) {
            _ = BroadcastSequence(of: Int.self, replay: -1)
        }
    }

    @Test func boundedZeroTraps() async {
        await #expect(processExitsWith: .failure) {
            _ = BroadcastSequence(of: Int.self, bufferingPolicy: .bounded(0))
        }
        await #expect(processExitsWith: .failure) {
            _ = BroadcastSequence(of: Int.self).subscribe(bufferingPolicy: .bounded(0))
        }
    }

    @Test func negativeCapacityTraps() async {
        await #expect(processExitsWith: .failure) {
            _ = BroadcastSequence(of: Int.self, bufferingPolicy: .bufferingNewest(-1))
        }
        await #expect(processExitsWith: .failure) {
            _ = BroadcastSequence(of: Int.self).subscribe(bufferingPolicy: .bufferingOldest(-2))
        }
    }

    @Test func concurrentNextOnOneSubscriptionTraps() async {
        await #expect(processExitsWith: .failure) {
            let sequence = BroadcastSequence(of: Int.self)
            let subscription = sequence.subscribe()
            let first = Task {
                var iterator = subscription.makeAsyncIterator()
                return await iterator.next()
            }
            while !subscription.isConsumerWaiting { await Task.yield() }
            var second = subscription.makeAsyncIterator()
            _ = await second.next()
            _ = await first.value
        }
    }
}
