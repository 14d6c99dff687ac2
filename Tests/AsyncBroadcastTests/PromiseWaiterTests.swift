import Foundation
import Testing
@_spi(Testing) @testable import AsyncBroadcast

/// SEMANTICS P4 (and P3's "forgotten"): many waiters, O(1) removal of
/// cancelled ones, storage that does not grow with them, resumption
/// outside the lock.
// claims: PROM-MANY-WAITERS, PROM-SAME-RESULT
@Suite struct PromiseWaiterTests {
    @Test func p4OneHundredThousandWaitersAllGetTheValue() async throws {
        let waiterCount = 100_000
        let promise = BroadcastPromise<Int, Never>()
        let clock = ContinuousClock()
        let start = clock.now
        let (received, allRight) = try await withDeadline("100,000 waiters") {
            try await withThrowingTaskGroup(of: Int.self) { group in
                for _ in 0..<waiterCount { group.addTask { try await promise.value } }
                try await waitUntil("100,000 waiting") { promise.waiterCount == waiterCount }
                #expect(promise.succeed(7))
                var received = 0
                var allRight = true
                for try await value in group {
                    received += 1
                    if value != 7 { allRight = false }
                }
                return (received, allRight)
            }
        }
        #expect(received == waiterCount)
        #expect(allRight, "a waiter got another value")
        #expect(promise.waiterCount == 0)
        print("p4OneHundredThousandWaitersAllGetTheValue: \(clock.now - start)")
    }

    /// Rounds of waiters that all cancel: each round empties the table, and
    /// the table does not grow with rounds.
    // claims: PROM-NO-GROWTH
    @Test func p4CancelledWaitersAreForgottenAndTheTableDoesNotGrow() async throws {
        let promise = BroadcastPromise<Int, TestError>()
        let perRound = 200
        var capacityAfterFirstRound = 0
        for round in 0..<40 {
            let waiters = (0..<perRound).map { _ in Task { await outcome(of: promise) } }
            try await waitUntil("\(perRound) waiting, round \(round)") { promise.waiterCount == perRound }
            // Cancel in an order that is neither arrival order nor its reverse.
            let order = (0..<perRound).sorted { ($0 * 7919 + round) % perRound < ($1 * 7919 + round) % perRound }
            for index in order { waiters[index].cancel() }
            for waiter in waiters {
                #expect(try await withDeadline("cancelled waiter, round \(round)") { await waiter.value } == .cancelled)
            }
            #expect(promise.waiterCount == 0, "round \(round)")
            if round == 0 {
                capacityAfterFirstRound = promise.waiterSlotCapacity
            } else {
                #expect(promise.waiterSlotCapacity <= capacityAfterFirstRound,
                        "round \(round): capacity \(promise.waiterSlotCapacity) grew from \(capacityAfterFirstRound)")
            }
        }
        #expect(promise.succeed(1))
        #expect(promise.waiterCount == 0)
    }

    /// Waiters that stay while others come and cancel around them (removal
    /// from the middle of the table): the staying ones all get the value,
    /// and the table stays bounded by the most waiters there were at once.
    // claims: PROM-NO-GROWTH
    @Test func p4RemovingCancelledWaitersKeepsTheOthers() async throws {
        let promise = BroadcastPromise<Int, TestError>()
        var staying: [Task<PromiseOutcome<Int>, Never>] = []
        var maxCapacity = 0
        var mostAtOnce = 0
        for round in 0..<30 {
            let batch = (0..<30).map { _ in Task { await outcome(of: promise) } }
            let expected = staying.count + batch.count
            try await waitUntil("batch waiting, round \(round)") { promise.waiterCount == expected }
            mostAtOnce = max(mostAtOnce, expected)
            // Keep every 10th, cancel the rest (in reverse).
            for (index, waiter) in batch.enumerated().reversed() where index % 10 != 0 { waiter.cancel() }
            for (index, waiter) in batch.enumerated() where index % 10 != 0 {
                #expect(try await withDeadline("cancelled, round \(round)") { await waiter.value } == .cancelled)
            }
            staying += batch.enumerated().filter { $0.offset % 10 == 0 }.map(\.element)
            #expect(promise.waiterCount == staying.count, "round \(round)")
            maxCapacity = max(maxCapacity, promise.waiterSlotCapacity)
        }
        // Cancelled slots are reused: the table is sized by the most waiters
        // at once (allowing for doubling growth), not by all that ever came.
        #expect(maxCapacity <= 2 * mostAtOnce, "table grew to \(maxCapacity) for at most \(mostAtOnce) waiters")
        #expect(promise.succeed(99))
        for waiter in staying {
            #expect(try await withDeadline("staying waiter") { await waiter.value } == .success(99))
        }
        #expect(promise.waiterCount == 0)
    }

    /// Waiters are resumed after the promise's lock is released: the
    /// executor's enqueue (run inside the resume, on the completing thread)
    /// takes the lock again. Under the lock it would deadlock.
    // claims: PROM-RESUME-OUTSIDE-LOCK, DRF-NO-USER-CODE-UNDER-LOCK
    @Test func p4WaitersAreResumedOutsideTheLock() async throws {
        let executor = ManualExecutor()
        let promise = BroadcastPromise<Int, TestError>()
        let waiter = Task(executorPreference: executor) { await outcome(of: promise) }
        executor.runUntilIdle()
        try #require(promise.waiterCount == 1)
        let againInsideResume = Locked<[Bool]>([])
        let resultInsideResume = Locked<[PromiseOutcome<Int>?]>([])
        executor.setOnEnqueue { _ in
            let again = promise.succeed(2)
            againInsideResume.withLock { $0.append(again) }
            let result = promise.result.map(PromiseOutcome.init)
            resultInsideResume.withLock { $0.append(result) }
        }
        let won = try await onThread("succeed resuming a waiter") { promise.succeed(1) }
        executor.setOnEnqueue(nil)
        #expect(won)
        #expect(againInsideResume.value == [false])
        #expect(resultInsideResume.value == [.success(1)])
        executor.runUntilIdle()
        #expect(try await withDeadline("waiter") { await waiter.value } == .success(1))
    }
}
