import Foundation
import Testing
@_spi(Testing) @testable import AsyncBroadcast

/// `send(contentsOf:)`: SHARING 13. Test names start with the sentence
/// they check.
// claims: SEQ-BATCH-AS-CONSECUTIVE
@Suite struct SharingBatchTests {
    @Test func s13ElementsArriveInOrder() {
        let sequence = BroadcastSequence(of: Int.self)
        let subscription = sequence.subscribe()
        sequence.send(0)
        sequence.send(contentsOf: [1, 2, 3])
        sequence.send(contentsOf: 4..<7)
        #expect(pollAll(subscription) == Array(0..<7))
    }

    /// The result is the sum of what the same elements sent one by one
    /// would have returned, per policy.
    // claims: SEQ-BATCH-RESULT-SUM
    @Test func s13TheResultSumsDeliveredAndDroppedOverTheElements() {
        func make() -> BroadcastSequence<Int, Never> { BroadcastSequence(of: Int.self) }
        let policies: [BroadcastBufferingPolicy] = [.unbounded, .bufferingNewest(1), .bufferingOldest(1), .bounded(1)]
        let batched = make()
        let oneByOne = make()
        let batchedSubscriptions = policies.map { batched.subscribe(bufferingPolicy: $0) }
        let oneByOneSubscriptions = policies.map { oneByOne.subscribe(bufferingPolicy: $0) }
        let batch = batched.send(contentsOf: [1, 2, 3])
        var sum = BroadcastSendResult()
        for element in [1, 2, 3] {
            let result = oneByOne.send(element)
            sum.delivered += result.delivered
            sum.dropped += result.dropped
        }
        #expect(batch == sum)
        // unbounded 3; newest(1) 3 delivered, 2 evicted; oldest(1) 1 delivered, 2 dropped; bounded(1) 3.
        #expect(batch == BroadcastSendResult(delivered: 10, dropped: 4))
        for (batchedOne, single) in zip(batchedSubscriptions, oneByOneSubscriptions) {
            #expect(pollAll(batchedOne) == pollAll(single))
        }
        #expect(batched.send(contentsOf: []) == BroadcastSendResult())
    }

    // claims: SEQ-BATCH-RESULT-SUM
    @Test func s13AfterFinishNothingIsDeliveredAndTheResultIsFinished() {
        let sequence = BroadcastSequence(of: Int.self)
        let subscription = sequence.subscribe()
        sequence.send(1)
        sequence.finish()
        #expect(sequence.send(contentsOf: [2, 3]) == BroadcastSendResult(isFinished: true))
        #expect(sequence.send(contentsOf: (4..<6).lazy.map { $0 }) == BroadcastSendResult(isFinished: true))
        #expect(pollAll(subscription) == [1])
        #expect(subscription.poll().isEnd)
    }

    /// Two threads send tagged batches at once: every subscriber sees each
    /// batch whole, never another producer's element inside it.
    // claims: SEQ-BATCH-ATOMIC
    @Test func s13NoOtherProducersElementLandsInsideABatch() async throws {
        let batchSize = 16
        let batches = 300
        let sequence = BroadcastSequence(of: Int.self)
        let subscriptions = [sequence.subscribe(), sequence.subscribe(bufferingPolicy: .bounded(4))]
        try await raceOnThreads(3, "two batch producers and a single-send producer") { thread in
            for batch in 0..<batches {
                if thread == 2 {
                    sequence.send(-1)
                } else {
                    let base = (thread * batches + batch) * 1000
                    // A lazy, non-contiguous batch on one thread, an array on the other.
                    if thread == 0 {
                        sequence.send(contentsOf: (0..<batchSize).map { base + $0 })
                    } else {
                        sequence.send(contentsOf: (0..<batchSize).lazy.map { base + $0 })
                    }
                }
            }
        }
        sequence.finish()
        for subscription in subscriptions {
            let seen = pollAll(subscription)
            #expect(seen.count == 2 * batches * batchSize + batches)
            var index = 0
            var broken: [Int] = []
            while index < seen.count {
                if seen[index] == -1 { index += 1; continue }
                let base = seen[index] - seen[index] % 1000
                let run = Array(seen[index..<min(index + batchSize, seen.count)])
                if run != (0..<batchSize).map({ base + $0 }) { broken = run; break }
                index += batchSize
            }
            #expect(broken.isEmpty, "a batch was interleaved: \(broken)")
        }
    }

    // claims: SEQ-BATCH-NO-USER-CODE-UNDER-LOCK
    @Test func s13ALazySequenceIsGatheredFirst() {
        let sequence = BroadcastSequence(of: Int.self)
        let subscription = sequence.subscribe()
        let result = sequence.send(contentsOf: (0..<5).lazy.map { $0 * 2 })
        #expect(result == BroadcastSendResult(delivered: 5))
        #expect(pollAll(subscription) == [0, 2, 4, 6, 8])
        sequence.send(contentsOf: Set([9]))
        #expect(pollAll(subscription) == [9])
    }

    /// A sequence whose iterator reads and sends into the same broadcast
    /// sequence: that runs before the lock is taken, so it neither
    /// deadlocks nor traps, and what it sent comes first.
    // claims: SEQ-BATCH-NO-USER-CODE-UNDER-LOCK, DRF-NO-USER-CODE-UNDER-LOCK
    @Test func s13ASequenceThatCallsBackIntoTheSequenceDoesNotDeadlock() async throws {
        let sequence = BroadcastSequence(of: Int.self)
        let subscription = sequence.subscribe()
        let counts = Locked<[Int]>([])
        let result = try await onThread("send(contentsOf:) with a re-entrant iterator") {
            sequence.send(contentsOf: CallingBack(count: 3) {
                counts.withLock { $0.append(sequence.subscriberCount) }
                sequence.send(-1)
                _ = sequence.send(contentsOf: [-2])
            })
        }
        #expect(result == BroadcastSendResult(delivered: 3))
        #expect(counts.value == [1, 1, 1])
        #expect(pollAll(subscription) == [-1, -2, -1, -2, -1, -2, 0, 1, 2])
    }
}

/// `0..<count` as a sequence whose iterator calls `callback` before each
/// element (no contiguous storage: it must be gathered by iterating).
struct CallingBack: Sequence, Sendable {
    let count: Int
    let callback: @Sendable () -> Void

    struct Iterator: IteratorProtocol {
        let count: Int
        let callback: @Sendable () -> Void
        var index = 0
        mutating func next() -> Int? {
            guard index < count else { return nil }
            callback()
            defer { index += 1 }
            return index
        }
    }

    func makeIterator() -> Iterator { Iterator(count: count, callback: callback) }
}
