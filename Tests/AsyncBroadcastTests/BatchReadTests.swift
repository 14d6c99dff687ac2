import Foundation
import Testing
@_spi(Testing) @testable import AsyncBroadcast

/// `next(upTo:into:)`: waits only while nothing is ready, then takes what is
/// buffered, up to the limit.
// claims: SEQ-BATCH-READ
@Suite struct BatchReadTests {
    @Test func takesWhatIsBufferedUpToTheLimitWithoutWaitingAgain() async throws {
        let sequence = BroadcastSequence(of: Int.self)
        let subscription = sequence.subscribe()
        for i in 1...5 { sequence.send(i) }
        var iterator = subscription.makeAsyncIterator()
        var batch: [Int] = [0]
        // Everything below finds elements buffered: nothing waits.
        #expect(await iterator.next(upTo: 3, into: &batch) == 3)
        #expect(batch == [0, 1, 2, 3], "appended, in order, after what the buffer held")
        batch.removeAll()
        #expect(await iterator.next(upTo: 10, into: &batch) == 2)
        #expect(batch == [4, 5])
    }

    // claims: SEQ-BATCH-READ
    @Test func waitsWhileNothingIsReadyThenTakesEverythingThatArrived() async throws {
        let sequence = BroadcastSequence(of: Int.self)
        let subscription = sequence.subscribe(bufferingPolicy: .bufferingNewest(8))
        let reader = Task { () -> [Int] in
            var iterator = subscription.makeAsyncIterator()
            var batch: [Int] = []
            _ = await iterator.next(upTo: 8, into: &batch)
            return batch
        }
        try await waitUntil("the reader waits") { subscription.isConsumerWaiting }
        sequence.send(contentsOf: [1, 2, 3])  // one step: the reader wakes to all three
        #expect(try await withDeadline("the batch") { await reader.value } == [1, 2, 3])
    }

    // claims: SEQ-BATCH-READ-END
    @Test func returnsZeroAtTheEndAndAfterTheError() async throws {
        let sequence = BroadcastSequence(of: Int.self, throwing: TestError.self)
        let subscription = sequence.subscribe()
        sequence.send(1)
        sequence.send(2)
        sequence.finish(throwing: TestError(code: 7))
        var iterator = subscription.makeAsyncIterator()
        var batch: [Int] = []
        #expect(try await iterator.next(upTo: 10, into: &batch) == 2)
        #expect(batch == [1, 2], "the elements before the error come first")
        await #expect(throws: TestError(code: 7)) { try await iterator.next(upTo: 10, into: &batch) }
        #expect(try await iterator.next(upTo: 10, into: &batch) == 0)
        #expect(batch == [1, 2])

        let plain = BroadcastSequence(of: Int.self)
        let ended = plain.subscribe()
        plain.send(3)
        plain.finish()
        var plainIterator = ended.makeAsyncIterator()
        var elements: [Int] = []
        #expect(await plainIterator.next(upTo: 4, into: &elements) == 1)
        #expect(await plainIterator.next(upTo: 4, into: &elements) == 0)
        #expect(elements == [3])
        #expect(plain.subscriberCount == 0)
    }

    // claims: SEQ-BATCH-READ-CANCEL
    @Test func aCancelledConsumersBatchEndsTheSubscriber() async throws {
        let sequence = BroadcastSequence(of: Int.self)
        let subscription = sequence.subscribe()
        for i in 1...3 { sequence.send(i) }
        let result = await Task { () -> (Int, [Int]) in
            withUnsafeCurrentTask { $0!.cancel() }
            var iterator = subscription.makeAsyncIterator()
            var batch: [Int] = []
            return (await iterator.next(upTo: 10, into: &batch), batch)
        }.value
        #expect(result.0 == 0 && result.1.isEmpty)
        #expect(sequence.subscriberCount == 0)
    }

    // claims: SEQ-BATCH-READ-CANCEL, SEQ-TASK-CANCEL-PARKED
    @Test func aParkedBatchReaderNoticesCancellationAtOnce() async throws {
        let sequence = BroadcastSequence(of: Int.self)
        let subscription = sequence.subscribe()
        let reader = Task { () -> Int in
            var iterator = subscription.makeAsyncIterator()
            var batch: [Int] = []
            return await iterator.next(upTo: 4, into: &batch)
        }
        try await waitUntil("the reader waits") { subscription.isConsumerWaiting }
        reader.cancel()
        #expect(try await withDeadline("the cancelled reader") { await reader.value } == 0)
        #expect(sequence.subscriberCount == 0)
    }

    /// A batch from a full `.bounded` subscriber makes room as it goes: the
    /// waiting emitter is served inside the batch's first read, so the same
    /// batch takes its element too.
    // claims: SEQ-BATCH-READ-BOUNDED
    @Test func aBatchFromAFullBoundedSubscriberReleasesTheEmitterAndTakesItsElement() async throws {
        let sequence = BroadcastSequence(of: Int.self)
        let newest = sequence.subscribe(bufferingPolicy: .bufferingNewest(2))
        let bounded = sequence.subscribe(bufferingPolicy: .bounded(2))
        sequence.send(1)
        sequence.send(2)
        let emitter = Task { try await sequence.emit(3) }
        try await waitUntil("the emitter waits") { sequence.waitingEmitterCount == 1 }
        let boundedBatch = try await withDeadline("the bounded batch") { () -> [Int] in
            var iterator = bounded.makeAsyncIterator()
            var batch: [Int] = []
            _ = await iterator.next(upTo: 8, into: &batch)
            return batch
        }
        #expect(boundedBatch == [1, 2, 3])
        _ = try await withDeadline("the emitter goes") { try await emitter.value }
        let newestBatch = try await withDeadline("the locked buffer's batch") { () -> [Int] in
            var iterator = newest.makeAsyncIterator()
            var batch: [Int] = []
            _ = await iterator.next(upTo: 8, into: &batch)
            return batch
        }
        #expect(newestBatch == [2, 3], "a .bufferingNewest(2) subscriber kept the last two")
    }
}
