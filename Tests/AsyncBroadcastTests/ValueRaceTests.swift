import Foundation
import Testing
@_spi(Testing) @testable import AsyncBroadcast

/// `BroadcastValue` under concurrency (run under TSan too): every round
/// must end (a lost wake-up trips the deadline), and the runtime traps if a
/// continuation is resumed twice.
@Suite struct ValueRaceTests {
    /// V1 + V2 under load: readers that subscribe while a producer runs
    /// each see strictly increasing values and, after finish, the last one.
    @Test func v1v2ReadersSubscribingDuringSendsSeeIncreasingValuesEndingWithTheLast() async throws {
        let last = 20_000
        for round in 0..<5 {
            let value = BroadcastValue(0)
            let producer = Task.detached {
                for i in 1...last { value.send(i) }
                value.finish()
            }
            let readers = (0..<4).map { _ in
                Task { () -> (floor: Int, seen: [Int]) in
                    let floor = value.value
                    var seen: [Int] = []
                    for await next in value { seen.append(next) }
                    return (floor, seen)
                }
            }
            try await withDeadline("producer, round \(round)") { await producer.value }
            for reader in readers {
                let (floor, seen) = try await withDeadline("reader, round \(round)") { await reader.value }
                #expect(seen.last == last, "round \(round): lost the last value: \(seen.suffix(5))")
                #expect((seen.first ?? -1) >= floor, "started from a value older than the one current before subscribing")
                #expect(zip(seen, seen.dropFirst()).allSatisfy { $0 < $1 }, "round \(round): not strictly increasing")
            }
            #expect(value.subscriberCount == 0)
        }
    }

    /// V7 + V10 + V11: a change, cancel(), task cancellation and finish race
    /// on a parked reader.
    // claims: DRF-RESUME-ONCE
    @Test func v7v10v11WakeCancelAndFinishRaceOnAParkedReader() async throws {
        for round in 0..<300 {
            let value = BroadcastValue(0, throwing: TestError.self)
            let subscription = value.subscribe()
            let reader = Task { () -> [Int] in
                var received: [Int] = []
                do {
                    for try await next in subscription { received.append(next) }
                } catch {}
                return received
            }
            try await waitUntil("parked, round \(round)") { subscription.isConsumerWaiting }
            await withTaskGroup(of: Void.self) { group in
                group.addTask { value.send(round + 1) }
                if round % 2 == 0 { group.addTask { reader.cancel() } }
                if round % 3 == 0 { group.addTask { subscription.cancel() } }
                if round % 5 == 0 { group.addTask { value.finish(throwing: TestError(code: round)) } }
                group.addTask { value.finish() }
            }
            let received = try await withDeadline("reader ends, round \(round)") { await reader.value }
            #expect(received.first == 0)
            #expect(received.dropFirst().allSatisfy { $0 == round + 1 } && received.count <= 2, "round \(round): \(received)")
            #expect(value.subscriberCount == 0)
            #expect(value.parkedSubscriberCount == 0)
        }
    }

    /// Subscribers come and go (cancel(), release, task cancellation) while
    /// values change on other threads; at the end nobody is left.
    @Test func v8v10v12SubscriberChurnDuringSendsLeavesNobody() async throws {
        let value = BroadcastValue(0)
        let stop = Locked(false)
        let producer = Task.detached {
            var i = 0
            while !stop.value {
                i += 1
                value.send(i)
                if i % 64 == 0 { await Task.yield() }
            }
        }
        try await withDeadline("churn") {
            await withTaskGroup(of: Void.self) { group in
                for worker in 0..<4 {
                    group.addTask {
                        for round in 0..<200 {
                            let subscription = value.subscribe()
                            var iterator = subscription.makeAsyncIterator()
                            _ = await iterator.next()
                            switch (worker + round) % 3 {
                            case 0: subscription.cancel()
                            case 1: break  // released at the end of the iteration
                            default: _ = await iterator.next()
                            }
                        }
                    }
                }
            }
        }
        stop.value = true
        try await withDeadline("producer") { await producer.value }
        #expect(value.subscriberCount == 0)
        #expect(value.parkedSubscriberCount == 0)
    }

    /// A woken reader is resumed after the value's lock is released: the
    /// executor's enqueue (run inside the resume, on the sending thread)
    /// reads the value. Under the lock it would deadlock or trap.
    // claims: DRF-NO-USER-CODE-UNDER-LOCK
    @Test func wakesHappenOutsideTheLock() async throws {
        let executor = ManualExecutor()
        let value = BroadcastValue(0)
        let subscription = value.subscribe()
        let reader = Task(executorPreference: executor) { () -> [Int] in
            var iterator = subscription.makeAsyncIterator()
            var seen: [Int] = []
            while seen.count < 2, let next = await iterator.next() { seen.append(next) }
            return seen
        }
        executor.runUntilIdle()
        try #require(subscription.isConsumerWaiting)
        let readInsideResume = Locked<[Int]>([])
        executor.setOnEnqueue { _ in
            readInsideResume.withLock { $0.append(value.value) }
            _ = value.subscriberCount
        }
        try await onThread("send waking a reader") { value.send(1) }
        executor.setOnEnqueue(nil)
        #expect(readInsideResume.value == [1])
        executor.runUntilIdle()
        #expect(try await withDeadline("reader") { await reader.value } == [0, 1])
    }
}
