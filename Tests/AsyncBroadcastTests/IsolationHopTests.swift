import Dispatch
import Testing
@_spi(Testing) @testable import AsyncBroadcast

/// A serial executor that counts the jobs enqueued on it: every time a task
/// arrives on (or returns to) an actor that uses it. Jobs run on a private
/// serial queue.
final class CountingExecutor: SerialExecutor, @unchecked Sendable {
    private let queue = DispatchQueue(label: "CountingExecutor")
    private let counts = Locked((enqueued: 0, finished: 0))

    var count: Int { counts.value.enqueued }

    /// Every enqueued job has run and returned: nothing is left to run on
    /// the actor, so a count read now is final.
    var isIdle: Bool { counts.withLock { $0.enqueued == $0.finished } }

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        counts.withLock { $0.enqueued += 1 }
        queue.async {
            job.runSynchronously(on: self.asUnownedSerialExecutor())
            self.counts.withLock { $0.finished += 1 }
        }
    }

    func checkIsolated() {
        dispatchPrecondition(condition: .onQueue(queue))
    }
}

/// Consumers isolated to a `CountingExecutor`.
actor HopCountingConsumer {
    let executor: CountingExecutor
    nonisolated var unownedExecutor: UnownedSerialExecutor { executor.asUnownedSerialExecutor() }

    init(executor: CountingExecutor) { self.executor = executor }

    func read(_ subscription: BroadcastSequence<Int, Never>.Subscription, into received: Locked<[Int]>) async {
        for await value in subscription {
            assertIsolated("the loop left the actor")
            received.withLock { $0.append(value) }
        }
    }

    func read(_ subscription: BroadcastValue<Int, Never>.Subscription, into received: Locked<[Int]>) async {
        for await value in subscription {
            assertIsolated("the loop left the actor")
            received.withLock { $0.append(value) }
        }
    }

    func read(_ promise: BroadcastPromise<Int, Never>, into received: Locked<[Int]>) async throws {
        let value = try await promise.value
        assertIsolated("the promise's reader resumed off the actor")
        received.withLock { $0.append(value) }
    }
}

/// A consumer isolated to an actor parks on an empty buffer without first
/// leaving the actor and coming back (as a `Task.yield()` before parking
/// did: one extra enqueue per catch-up), and each wake-up costs its actor
/// exactly one enqueue. The count is of jobs enqueued on the actor's
/// executor; a switch to the global executor is seen when the task comes
/// back.
@Suite struct IsolationHopTests {
    static let wakes = 20

    /// Sends 1...`wakes` one at a time; after each, waits until the reader
    /// has read it, parked again and left the actor idle, and records how
    /// many jobs that took on the actor's executor.
    private func enqueuesPerWakeUp(_ executor: CountingExecutor, send: (Int) -> Void,
                                   readCount: @escaping @Sendable () -> Int, alreadyRead: Int,
                                   isParked: @escaping @Sendable () -> Bool) async throws -> [Int] {
        var perWake: [Int] = []
        for i in 1...Self.wakes {
            let before = executor.count
            send(i)
            try await waitUntil("value \(i) read, and the reader parked again") {
                readCount() == i + alreadyRead && isParked() && executor.isIdle
            }
            perWake.append(executor.count - before)
        }
        return perWake
    }

    @Test func parkedSequenceConsumerCostsOneEnqueuePerWakeUp() async throws {
        let executor = CountingExecutor()
        let consumer = HopCountingConsumer(executor: executor)
        let sequence = BroadcastSequence(of: Int.self)
        let subscription = sequence.subscribe()
        let received = Locked<[Int]>([])
        let reader = Task { await consumer.read(subscription, into: received) }
        try await waitUntil("the reader parks") { subscription.isConsumerWaiting && executor.isIdle }
        // The one enqueue is the task's arrival on the actor.
        #expect(executor.count == 1, "enqueues before the first park")
        let perWake = try await enqueuesPerWakeUp(executor, send: { sequence.send($0) },
                                                  readCount: { received.value.count }, alreadyRead: 0,
                                                  isParked: { subscription.isConsumerWaiting })
        #expect(perWake == Array(repeating: 1, count: Self.wakes), "enqueues per wake-up")
        sequence.finish()
        try await withDeadline("the reader ends") { await reader.value }
        #expect(received.value == Array(1...Self.wakes))
    }

    @Test func parkedValueConsumerCostsOneEnqueuePerWakeUp() async throws {
        let executor = CountingExecutor()
        let consumer = HopCountingConsumer(executor: executor)
        let value = BroadcastValue(0)
        let subscription = value.subscribe()
        let received = Locked<[Int]>([])
        let reader = Task { await consumer.read(subscription, into: received) }
        // The reader takes the current value, then parks.
        try await waitUntil("the reader parks") {
            received.value.count == 1 && subscription.isConsumerWaiting && executor.isIdle
        }
        #expect(executor.count == 1, "enqueues before the first park")
        let perWake = try await enqueuesPerWakeUp(executor, send: { value.send($0) },
                                                  readCount: { received.value.count }, alreadyRead: 1,
                                                  isParked: { subscription.isConsumerWaiting })
        #expect(perWake == Array(repeating: 1, count: Self.wakes), "enqueues per wake-up")
        value.finish()
        try await withDeadline("the reader ends") { await reader.value }
        #expect(received.value == Array(0...Self.wakes))
    }

    /// A completed promise's value is read on the actor: no hop off and back.
    @Test func completedPromiseIsReadWithoutLeavingTheActor() async throws {
        let executor = CountingExecutor()
        let consumer = HopCountingConsumer(executor: executor)
        let promise = BroadcastPromise<Int, Never>()
        promise.succeed(7)
        let received = Locked<[Int]>([])
        try await withDeadline("the reads") {
            for _ in 0..<Self.wakes { try await consumer.read(promise, into: received) }
        }
        #expect(received.value == Array(repeating: 7, count: Self.wakes))
        // One arrival per call from outside; none from inside the getter.
        #expect(executor.count == Self.wakes, "enqueues for \(Self.wakes) calls")
    }
}
