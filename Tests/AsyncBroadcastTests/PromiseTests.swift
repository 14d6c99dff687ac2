import Foundation
import Testing
@_spi(Testing) @testable import AsyncBroadcast

/// `BroadcastPromise`: SEMANTICS P1 (first completion wins), P2 (`result`),
/// P3 (`value`), P5 (lifetime). P4 (many waiters, cancelled waiters
/// forgotten, resumed outside the lock) is in PromiseWaiterTests. Test
/// names start with the sentence they check.
@Suite struct PromiseTests {
    // MARK: P1 — first succeed/fail wins

    // claims: PROM-FIRST-WINS
    @Test func p1FirstSucceedWins() async throws {
        let promise = BroadcastPromise(of: Int.self, throwing: TestError.self)
        #expect(promise.succeed(1))
        #expect(!promise.succeed(2))
        #expect(!promise.fail(TestError(code: 3)))
        #expect(promise.result == .success(1))
        #expect(try await promise.value == 1)
    }

    // claims: PROM-FIRST-WINS
    @Test func p1FirstFailWins() async throws {
        let promise: BroadcastPromise<Int, TestError> = BroadcastPromise(throwing: TestError.self)  // `of:` defaulted
        #expect(promise.fail(TestError(code: 1)))
        #expect(!promise.succeed(2))
        #expect(!promise.fail(TestError(code: 3)))
        #expect(promise.result == .failure(TestError(code: 1)))
        await #expect(throws: TestError(code: 1)) { _ = try await promise.value }
    }

    @Test func p1SucceedWithoutAnArgumentWhenValueIsVoid() async throws {
        let promise = BroadcastPromise<Void, Never>()
        let waiter = Task { try await promise.value }
        try await waitUntil("waiting") { promise.waiterCount == 1 }
        #expect(promise.succeed())
        #expect(!promise.succeed())
        try await withDeadline("void waiter") { try await waiter.value }
        guard case .success = promise.result else { Issue.record("no result"); return }
    }

    /// succeed and fail race from 8 threads, with waiters parked before and
    /// arriving after: one wins, and every waiter sees its result.
    // claims: PROM-FIRST-WINS
    @Test func p1SucceedAndFailRacingFromEightThreadsExactlyOneWins() async throws {
        for round in 0..<200 {
            let promise = BroadcastPromise<Int, TestError>()
            let early = (0..<4).map { _ in Task { await outcome(of: promise) } }
            try await waitUntil("early waiters, round \(round)") { promise.waiterCount == early.count }
            let winners = Locked<[Int]>([])
            try await raceOnThreads(8, "8 completers, round \(round)") { thread in
                let won = thread % 2 == 0
                    ? promise.succeed(round * 100 + thread)
                    : promise.fail(TestError(code: round * 100 + thread))
                if won { winners.withLock { $0.append(thread) } }
            }
            let won = winners.value
            try #require(won.count == 1, "round \(round): winners \(won)")
            let expected: PromiseOutcome<Int> = won[0] % 2 == 0
                ? .success(round * 100 + won[0]) : .failure(TestError(code: round * 100 + won[0]))
            #expect(promise.result.map(PromiseOutcome.init) == expected)
            let late = (0..<4).map { _ in Task { await outcome(of: promise) } }
            for waiter in early + late {
                #expect(try await withDeadline("waiter, round \(round)") { await waiter.value } == expected)
            }
            #expect(promise.waiterCount == 0)
        }
    }

    // MARK: P2 — result never suspends: nil until completed

    // claims: PROM-RESULT
    @Test func p2ResultIsNilUntilCompleted() async throws {
        let promise = BroadcastPromise<String, TestError>()
        #expect(promise.result == nil)
        let waiter = Task { await outcome(of: promise) }
        try await waitUntil("waiting") { promise.waiterCount == 1 }
        #expect(promise.result == nil, "a waiter does not complete it")
        promise.succeed("done")
        #expect(promise.result == .success("done"))
        #expect(try await withDeadline("waiter") { await waiter.value } == .success("done"))
    }

    // MARK: P3 — value

    // claims: PROM-VALUE-AT-ONCE
    @Test func p3ACompletedPromiseAnswersAtOnceEvenInACancelledTask() async throws {
        let succeeded = BroadcastPromise<Int, TestError>()
        succeeded.succeed(5)
        let failed = BroadcastPromise<Int, TestError>()
        failed.fail(TestError(code: 6))
        let (a, b) = try await withDeadline("cancelled task") {
            await Task { () -> (PromiseOutcome<Int>, PromiseOutcome<Int>) in
                withUnsafeCurrentTask { $0?.cancel() }
                return (await outcome(of: succeeded), await outcome(of: failed))
            }.value
        }
        #expect(a == .success(5))
        #expect(b == .failure(TestError(code: 6)))
    }

    // claims: PROM-SAME-RESULT
    @Test func p3EveryWaiterGetsTheSameResult() async throws {
        let counter = LiveCounter()
        let promise = BroadcastPromise<Payload, Never>()
        let payload = Payload(42, counter)
        let waiters = (0..<32).map { _ in Task { try await promise.value } }
        try await waitUntil("32 waiting") { promise.waiterCount == 32 }
        promise.succeed(payload)
        for waiter in waiters {
            #expect(try await withDeadline("waiter") { try await waiter.value } === payload)
        }
        #expect(try await promise.value === payload, "a late waiter too")
        #expect(promise.waiterCount == 0)
    }

    // claims: PROM-SAME-RESULT
    @Test func p3WaitersGetTheFailure() async throws {
        let promise = BroadcastPromise<Int, TestError>()
        let waiters = (0..<8).map { _ in Task { await outcome(of: promise) } }
        try await waitUntil("8 waiting") { promise.waiterCount == 8 }
        promise.fail(TestError(code: 13))
        for waiter in waiters {
            #expect(try await withDeadline("waiter") { await waiter.value } == .failure(TestError(code: 13)))
        }
    }

    // claims: PROM-CANCEL
    @Test func p3AWaiterWhoseTaskIsCancelledThrowsCancellationErrorAndIsForgotten() async throws {
        let promise = BroadcastPromise<Int, TestError>()
        let staying = Task { await outcome(of: promise) }
        let leaving = Task { await outcome(of: promise) }
        try await waitUntil("2 waiting") { promise.waiterCount == 2 }
        leaving.cancel()
        #expect(try await withDeadline("cancelled waiter") { await leaving.value } == .cancelled)
        #expect(promise.waiterCount == 1, "the cancelled waiter is forgotten")
        #expect(promise.result == nil, "cancelling a waiter does not complete the promise")
        #expect(promise.succeed(3))
        #expect(try await withDeadline("staying waiter") { await staying.value } == .success(3))
    }

    // claims: PROM-CANCEL
    @Test func p3AnAlreadyCancelledTaskThrowsAtOnceAndNeverWaits() async throws {
        let promise = BroadcastPromise<Int, TestError>()
        let result = try await withDeadline("cancelled task") {
            await Task { () -> PromiseOutcome<Int> in
                withUnsafeCurrentTask { $0?.cancel() }
                return await outcome(of: promise)
            }.value
        }
        #expect(result == .cancelled)
        #expect(promise.waiterCount == 0)
        #expect(promise.result == nil)
    }

    /// A Never-failing promise's value throws only CancellationError.
    // claims: PROM-SAME-RESULT
    @Test func p3ValueThrowsOnlyCancellationErrorWhenFailureIsNever() async throws {
        let promise = BroadcastPromise<Int, Never>()
        let waiter = Task { () -> String in
            do { return "value \(try await promise.value)" } catch { return "\(type(of: error))" }
        }
        try await waitUntil("waiting") { promise.waiterCount == 1 }
        waiter.cancel()
        #expect(try await withDeadline("waiter") { await waiter.value } == "CancellationError")
    }

    /// Cancellation racing completion: each waiter gets the value or
    /// CancellationError, never hangs, and nothing is left in the table.
    // claims: PROM-CANCEL, DRF-RESUME-ONCE
    @Test func p3CancellationRacingCompletion() async throws {
        for round in 0..<300 {
            let promise = BroadcastPromise<Int, TestError>()
            let waiters = (0..<4).map { _ in Task { await outcome(of: promise) } }
            try await waitUntil("waiting, round \(round)") { promise.waiterCount == waiters.count }
            await withTaskGroup(of: Void.self) { group in
                group.addTask { promise.succeed(round) }
                for (index, waiter) in waiters.enumerated() where index != 0 {
                    group.addTask { waiter.cancel() }
                }
            }
            for waiter in waiters {
                let result = try await withDeadline("waiter, round \(round)") { await waiter.value }
                #expect(result == .success(round) || result == .cancelled, "round \(round): \(result)")
            }
            #expect(try await withDeadline("uncancelled") { await waiters[0].value } == .success(round))
            #expect(promise.waiterCount == 0)
        }
    }

    /// A waiter that has entered `value` (it is in the table) when the
    /// promise completes, and whose task is cancelled only after that, gets
    /// the result: the promise was complete before the cancellation, and a
    /// completed promise answers even a cancelled task. (Completing and
    /// then cancelling run in this order on one thread; the waiter may be
    /// anywhere between entering the table and suspending.)
    // claims: PROM-VALUE-AT-ONCE
    @Test func p3AWaiterCancelledAfterCompletionGetsTheResult() async throws {
        var cancelledRounds: [Int] = []
        for round in 0..<300 {
            let result = try await completeThenCancelAWaiterInTheTable(round)
            if result == .cancelled {
                cancelledRounds.append(round)
            } else {
                #expect(result == .success(round))
            }
        }
        #expect(cancelledRounds.isEmpty,
                "\(cancelledRounds.count) of 300 waiters threw CancellationError although the promise was completed before their task was cancelled")
    }

    /// Starts a waiter; as soon as it is in the table, on another thread:
    /// `succeed(round)`, then cancels the waiter's task. Returns its outcome.
    private func completeThenCancelAWaiterInTheTable(_ round: Int) async throws -> PromiseOutcome<Int> {
        let promise = BroadcastPromise<Int, TestError>()
        let waiterBox = Locked<Task<PromiseOutcome<Int>, Never>?>(nil)
        // The completer spins on its own thread before the waiter starts,
        // so that it completes as soon as the waiter enters the table.
        let completerStarted = Locked(false)
        let completerDone = Locked(false)
        Thread.detachNewThread {
            completerStarted.value = true
            while promise.waiterCount == 0 { sched_yield() }
            let won = promise.succeed(round)
            precondition(won)
            var waiter: Task<PromiseOutcome<Int>, Never>? = nil
            while waiter == nil {
                waiter = waiterBox.value
                sched_yield()
            }
            waiter?.cancel()
            completerDone.value = true
        }
        try await waitUntil("completer started") { completerStarted.value }
        let waiter: Task<PromiseOutcome<Int>, Never> = Task.detached { await outcome(of: promise) }
        waiterBox.value = waiter
        try await waitUntil("completer done, round \(round)") { completerDone.value }
        return try await withDeadline("waiter, round \(round)") { await waiter.value }
    }

    // MARK: P5 — lifetime: a waiter keeps the promise alive; no leak, no cycle

    // claims: PROM-LIFETIME
    @Test func p5AWaiterKeepsThePromiseAliveUntilItsTaskIsCancelled() async throws {
        let weak = WeakBox<BroadcastPromise<Int, Never>>()
        let waiter: Task<Int, any Error>
        do {
            let promise = BroadcastPromise<Int, Never>()
            weak.object = promise
            waiter = Task { try await promise.value }
            try await waitUntil("waiting") { weak.object?.waiterCount == 1 }
        }
        #expect(!weak.isNil, "the waiting task holds the promise")
        waiter.cancel()
        let result = try await withDeadline("cancelled waiter") { await waiter.result }
        #expect(throws: CancellationError.self) { try result.get() }
        try await waitUntil("promise freed after its only waiter left") { weak.isNil }
    }

    // claims: PROM-LIFETIME
    @Test func p5APromiseWithNoWaitersIsFreed() {
        let weak = WeakBox<BroadcastPromise<Int, TestError>>()
        do {
            let promise = BroadcastPromise<Int, TestError>()
            weak.object = promise
        }
        #expect(weak.isNil)
    }

    // claims: PROM-LIFETIME
    @Test func p5ACompletedPromiseIsFreedWithItsValue() async throws {
        let counter = LiveCounter()
        let weak = WeakBox<BroadcastPromise<Payload, Never>>()
        do {
            let promise = BroadcastPromise<Payload, Never>()
            weak.object = promise
            let waiters = (0..<4).map { _ in Task { try await promise.value.value } }
            try await waitUntil("4 waiting") { promise.waiterCount == 4 }
            promise.succeed(Payload(1, counter))
            for waiter in waiters { #expect(try await withDeadline("waiter") { try await waiter.value } == 1) }
        }
        try await waitUntil("promise freed") { weak.isNil }
        #expect(counter.live == 0)
    }

    /// A promise whose cancelled waiters have all left is freed, although
    /// it was never completed.
    // claims: PROM-LIFETIME
    @Test func p5AnUncompletedPromiseIsFreedOnceItsCancelledWaitersLeave() async throws {
        let weak = WeakBox<BroadcastPromise<Int, TestError>>()
        let waiters: [Task<PromiseOutcome<Int>, Never>]
        do {
            let promise = BroadcastPromise<Int, TestError>()
            weak.object = promise
            waiters = (0..<16).map { _ in Task { await outcome(of: promise) } }
            try await waitUntil("16 waiting") { weak.object?.waiterCount == 16 }
        }
        for waiter in waiters { waiter.cancel() }
        for waiter in waiters { #expect(try await withDeadline("waiter") { await waiter.value } == .cancelled) }
        try await waitUntil("promise freed") { weak.isNil }
    }
}
