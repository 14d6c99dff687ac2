import Dispatch
import Foundation
import Testing
@_spi(Testing) @testable import AsyncBroadcast

/// `send(contentsOf:)` delivers a whole batch to each subscriber, with one
/// wake pass per chunk of subscribers: these check that it still behaves exactly like
/// consecutive `send(_:)` calls (see also `SharingBatchTests`).
@Suite struct BatchSendTests {
    static let policies: [BroadcastBufferingPolicy] = [
        .unbounded, .bounded(2), .bounded(100), .bufferingOldest(3), .bufferingOldest(0),
        .bufferingNewest(3), .bufferingNewest(0), .bufferingOldest(1000), .bufferingNewest(1000),
    ]

    /// Batches around the lock-free ring's first segment (16 `Int`s) and
    /// the old 64, so the ring grows inside the batch: every subscriber
    /// holds, drops and counts what one-by-one sends give, and the results
    /// add up the same.
    // claims: SEQ-BATCH-AS-CONSECUTIVE
    @Test(arguments: [1, 3, 16, 17, 64, 65, 300])
    func aBatchEqualsConsecutiveSends(count: Int) {
        let batched = BroadcastSequence(of: Int.self)
        let oneByOne = BroadcastSequence(of: Int.self)
        let batchedSubscriptions = Self.policies.map { batched.subscribe(bufferingPolicy: $0) }
        let oneByOneSubscriptions = Self.policies.map { oneByOne.subscribe(bufferingPolicy: $0) }
        batched.send(-1)
        oneByOne.send(-1)

        let result = batched.send(contentsOf: Array(0..<count))
        var sum = BroadcastSendResult()
        for element in 0..<count {
            let single = oneByOne.send(element)
            sum.delivered += single.delivered
            sum.dropped += single.dropped
        }
        #expect(result == sum)
        for (index, policy) in Self.policies.enumerated() {
            let got = pollAll(batchedSubscriptions[index])
            #expect(got == pollAll(oneByOneSubscriptions[index]), "policy \(policy)")
            #expect(batchedSubscriptions[index].droppedCount == oneByOneSubscriptions[index].droppedCount,
                    "policy \(policy)")
        }
    }

    /// Replay over-fills every subscriber (a window of 5, capacities up to
    /// 3): a batch then drops, evicts and counts as consecutive sends do,
    /// and every element it does not keep is released.
    // claims: SEQ-BATCH-AS-CONSECUTIVE
    @Test(arguments: [1, 2, 5, 12])
    func aBatchAfterAnOverFillingReplayEqualsConsecutiveSends(count: Int) {
        let counter = LiveCounter()
        let batched = BroadcastSequence(of: Payload.self, replay: 5)
        let oneByOne = BroadcastSequence(of: Payload.self, replay: 5)
        for element in 0..<5 {
            batched.send(Payload(-1 - element, counter))
            oneByOne.send(Payload(-1 - element, counter))
        }
        let batchedSubscriptions = Self.policies.map { batched.subscribe(bufferingPolicy: $0) }
        let oneByOneSubscriptions = Self.policies.map { oneByOne.subscribe(bufferingPolicy: $0) }

        let result = batched.send(contentsOf: (0..<count).map { Payload($0, counter) })
        var sum = BroadcastSendResult()
        for element in 0..<count {
            let single = oneByOne.send(Payload(element, counter))
            sum.delivered += single.delivered
            sum.dropped += single.dropped
        }
        #expect(result == sum)
        for (index, policy) in Self.policies.enumerated() {
            #expect(pollAll(batchedSubscriptions[index]).map(\.value) == pollAll(oneByOneSubscriptions[index]).map(\.value),
                    "policy \(policy)")
            #expect(batchedSubscriptions[index].droppedCount == oneByOneSubscriptions[index].droppedCount,
                    "policy \(policy)")
        }
        // Read out: only the two replay windows remain.
        #expect(counter.live == 10)
    }

    /// The totals per policy, spelled out for a batch of 10 after one element.
    // claims: SEQ-BATCH-RESULT-SUM
    @Test func theResultCountsEveryElementOfEveryPolicy() {
        let sequence = BroadcastSequence(of: Int.self)
        let unbounded = sequence.subscribe()
        let bounded = sequence.subscribe(bufferingPolicy: .bounded(2))
        let oldest = sequence.subscribe(bufferingPolicy: .bufferingOldest(3))
        let newest = sequence.subscribe(bufferingPolicy: .bufferingNewest(3))
        let zero = sequence.subscribe(bufferingPolicy: .bufferingNewest(0))
        sequence.send(0)
        let result = sequence.send(contentsOf: 1...10)
        // unbounded 10; bounded 10 (send never waits); oldest 2 delivered, 8 dropped;
        // newest 10 delivered, 8 of them evicting; capacity 0, nobody waiting: 10 dropped.
        #expect(result == BroadcastSendResult(delivered: 32, dropped: 26))
        #expect(pollAll(unbounded) == Array(0...10))
        #expect(pollAll(bounded) == Array(0...10))
        #expect(pollAll(oldest) == [0, 1, 2])
        #expect(pollAll(newest) == [8, 9, 10])
        #expect(pollAll(zero) == [])
        #expect([unbounded, bounded, oldest, newest, zero].map(\.droppedCount) == [0, 0, 8, 8, 11])
    }

    @Test(arguments: [0, 1, 2, 3, 4, 10])
    func theReplayWindowKeepsTheLastElementsOfABatch(count: Int) {
        let sequence = BroadcastSequence(of: Int.self, replay: 3)
        sequence.send(-2)
        sequence.send(-1)
        sequence.send(contentsOf: Array(0..<count))
        let expected = Array((Array(-2..<0) + Array(0..<count)).suffix(3))
        #expect(pollAll(sequence.subscribe()) == expected)
        sequence.send(contentsOf: [100])
        #expect(pollAll(sequence.subscribe()) == Array((expected + [100]).suffix(3)))
    }

    /// Elements of a batch that fall out of the replay window (or never
    /// enter it) are released; the window keeps exactly its own.
    @Test func aBatchLargerThanTheWindowReleasesWhatItDoesNotKeep() {
        let counter = LiveCounter()
        let sequence = BroadcastSequence(of: Payload.self, replay: 2)
        do {
            sequence.send(Payload(-1, counter))
            sequence.send(contentsOf: (0..<10).map { Payload($0, counter) })
        }
        #expect(counter.live == 2)
        #expect(pollAll(sequence.subscribe()).map(\.value) == [8, 9])
        sequence.finish()
    }

    /// `send` never waits: a `.bounded(2)` subscriber takes a batch of 5,
    /// counts as full, and an `emit` then waits until it drains below 2.
    @Test func aBatchOverFillsABoundedSubscriberAndEmitWaits() async throws {
        let sequence = BroadcastSequence(of: Int.self)
        let subscription = sequence.subscribe(bufferingPolicy: .bounded(2))
        #expect(sequence.send(contentsOf: 1...5) == BroadcastSendResult(delivered: 5))
        let emitter = Task { try await sequence.emit(6) }
        try await waitUntil("emit waits") { sequence.waitingEmitterCount == 1 }
        #expect(pollOne(subscription) == 1)
        #expect(pollOne(subscription) == 2)
        #expect(pollOne(subscription) == 3)
        #expect(sequence.waitingEmitterCount == 1)  // 2 left: still full
        #expect(pollOne(subscription) == 4)
        #expect(try await withDeadline("emit served") { try await emitter.value } == BroadcastSendResult(delivered: 1))
        #expect(pollAll(subscription) == [5, 6])
    }

    /// A capacity-0 subscriber whose reader waits takes the first element of
    /// the batch; the reader has not run before the next one (the sequence
    /// lock is held throughout), so the rest is dropped.
    // claims: SEQ-BATCH-CONCURRENT-READER
    @Test func aWaitingCapacityZeroReaderTakesTheFirstElementOfABatch() async throws {
        for policy in [BroadcastBufferingPolicy.bufferingNewest(0), .bufferingOldest(0)] {
            let sequence = BroadcastSequence(of: Int.self)
            let subscription = sequence.subscribe(bufferingPolicy: policy)
            let reader = Task {
                var iterator = subscription.makeAsyncIterator()
                return await iterator.next()
            }
            try await waitUntil("reader parked") { subscription.isConsumerWaiting }
            #expect(sequence.send(contentsOf: [1, 2, 3]) == BroadcastSendResult(delivered: 1, dropped: 2))
            #expect(try await withDeadline("handed element") { await reader.value } == 1)
            #expect(subscription.droppedCount == 2)
        }
    }

    /// A parked reader is resumed once for a whole batch (its task is
    /// enqueued on its executor exactly once) and then reads the batch
    /// without suspending. Had the wake come before the batch was
    /// published, the reader would find it incomplete and suspend again.
    // claims: SEQ-BATCH-ONE-WAKE
    @Test(arguments: [BroadcastBufferingPolicy.unbounded, .bufferingNewest(100)])
    func aParkedReaderIsWokenOncePerBatch(policy: BroadcastBufferingPolicy) async throws {
        let executor = WakeCountingExecutor()
        let sequence = BroadcastSequence(of: Int.self)
        let subscription = sequence.subscribe(bufferingPolicy: policy)
        let other = sequence.subscribe()  // a second subscriber in the same wake pass
        let batch = Array(0..<100)
        let reader = Task(executorPreference: executor) {
            var iterator = subscription.makeAsyncIterator()
            var seen: [Int] = []
            while seen.count < batch.count, let element = await iterator.next() { seen.append(element) }
            return seen
        }
        // Parked, and the job that parked it has returned: the task is
        // suspended, so the wake-up must enqueue it.
        try await waitUntil("reader parked") { subscription.isConsumerWaiting && executor.isIdle }
        let before = executor.enqueued
        #expect(sequence.send(contentsOf: batch) == BroadcastSendResult(delivered: 200))
        #expect(try await withDeadline("batch read") { await reader.value } == batch)
        #expect(executor.enqueued - before == 1)
        #expect(pollAll(other) == batch)
    }

    // MARK: One step for a concurrent reader

    /// A reader running on another thread while a producer thread sends
    /// batches sees each batch as one step, whatever its policy: it never
    /// takes an element from the middle of a batch. After a batch of `L`
    /// (longer than any capacity here), a subscriber holds
    /// - `.bufferingNewest(n > 0)`: the batch's last `n` (everything older
    ///   was evicted), so the reader takes `L - n, L - n + 1, …` until the
    ///   next batch evicts the rest: a prefix of the last `n`;
    /// - `.bufferingOldest(n > 0)`: a prefix of the batch (as much as fitted
    ///   at its start; nothing is evicted later), so the reader takes
    ///   `0, 1, …, k - 1`, `k <= n`;
    /// - capacity 0: the batch's first element if the reader waited when the
    ///   batch began, else nothing.
    /// Per element, a reader that popped (or parked again) between two
    /// elements made room for, or was handed, an element from the middle.
    // claims: SEQ-BATCH-CONCURRENT-READER, SEQ-BATCH-ATOMIC
    @Test(arguments: [
        BroadcastBufferingPolicy.bufferingNewest(1), .bufferingNewest(0), .bufferingOldest(0),
        .bufferingOldest(1), .bufferingOldest(8), .bufferingNewest(8),
    ])
    func aConcurrentReaderSeesEachBatchAsOneStep(policy: BroadcastBufferingPolicy) async throws {
        let length = 100
        let allowed: (Int) -> [Int]  // the longest run a reader may see of a batch, for `count` seen
        switch policy {
        case .bufferingNewest(let n) where n > 0: allowed = { Array((length - n)..<(length - n + $0)) }
        case .bufferingOldest(let n) where n > 0: allowed = { Array(0..<$0) }
        default: allowed = { Array(0..<$0) }  // capacity 0: nothing, or the first
        }
        let capacity: Int
        switch policy {
        case .bufferingNewest(let n), .bufferingOldest(let n), .bounded(let n): capacity = Swift.max(n, 1)
        case .unbounded: capacity = .max
        }

        let seen = try await Self.readWhileSendingBatches(policy: policy, length: length)
        var bad: [String] = []
        var batchesSeen = 0
        var mostOfOneBatch = 0
        var position = 0
        while position < seen.count {
            let batch = seen[position] / length
            var positions: [Int] = []
            while position < seen.count && seen[position] / length == batch {
                positions.append(seen[position] % length)
                position += 1
            }
            batchesSeen += 1
            mostOfOneBatch = Swift.max(mostOfOneBatch, positions.count)
            if positions.count > capacity || positions != allowed(positions.count) {
                bad.append("batch \(batch): \(positions)")
            }
        }
        #expect(batchesSeen > 0, "the reader saw nothing (it waited before the first batch)")
        #expect(bad.isEmpty, "\(policy): \(bad.count) of \(batchesSeen) batches seen split (at most \(mostOfOneBatch) elements of one batch); first: \(bad.prefix(3).joined(separator: "; "))")
    }

    /// Sends batches of `length` consecutive integers (batch `b` holds
    /// `b * length ..< (b + 1) * length`) from a thread of its own, while a
    /// detached task reads the subscription; returns what it read. Sending
    /// starts once the reader waits, and stops after a bounded number of
    /// batches or of seconds (a fifth of them under ThreadSanitizer),
    /// whichever comes first. A hang fails with `DeadlineExceeded`.
    static func readWhileSendingBatches(policy: BroadcastBufferingPolicy, length: Int) async throws -> [Int] {
        let underTSan = ThreadSanitizer.isActive
        let batches = underTSan ? 4_000 : 20_000
        let seconds: Double = underTSan ? 4 : 1.5
        let sequence = BroadcastSequence<Int, Never>()
        let subscription = sequence.subscribe(bufferingPolicy: policy)
        let reader = Task.detached {
            var seen: [Int] = []
            for await element in subscription { seen.append(element) }
            return seen
        }
        try await waitUntil("reader waits") { subscription.isConsumerWaiting }
        Thread.detachNewThread {
            let clock = ContinuousClock()
            let deadline = clock.now + .milliseconds(Int(seconds * 1000))
            var batch = Array(0..<length)
            for b in 0..<batches {
                for i in 0..<length { batch[i] = b * length + i }
                sequence.send(contentsOf: batch)
                if b % 64 == 0 && clock.now > deadline { break }
            }
            sequence.finish()
        }
        return try await withDeadline("reader ends") { await reader.value }
    }
}

/// A task executor that counts the jobs enqueued on it (each resume of a
/// suspended task is one) and runs them on a serial queue.
private final class WakeCountingExecutor: TaskExecutor, @unchecked Sendable {
    private let queue = DispatchQueue(label: "BatchSendTests.WakeCountingExecutor")
    private let counts = Locked((enqueued: 0, running: 0))

    var enqueued: Int { counts.value.enqueued }
    /// No job is queued or running.
    var isIdle: Bool { counts.value.running == 0 }

    func enqueue(_ job: consuming ExecutorJob) {
        counts.withLock {
            $0.enqueued += 1
            $0.running += 1
        }
        let job = UnownedJob(job)
        queue.async {
            job.runSynchronously(on: self.asUnownedTaskExecutor())
            self.counts.withLock { $0.running -= 1 }
        }
    }
}
