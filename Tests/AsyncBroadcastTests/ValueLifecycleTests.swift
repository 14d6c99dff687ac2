import Foundation
import Testing
@_spi(Testing) @testable import AsyncBroadcast

/// How `BroadcastValue` subscribers end: SEMANTICS V7 (finish), V8
/// (subscriberCount), V9 (subscribing after finish or from a cancelled
/// task), V10 (cancel()), V11 (task cancellation), V12 (releasing), V15
/// (for-await on the value). Test names start with the sentence they check.
@Suite struct ValueLifecycleTests {
    // MARK: V7 — finish: first call wins; the value is final; last unseen value, then nil / the error

    // claims: VAL-FINISH-IGNORED
    @Test func v7FirstFinishWins() async throws {
        let finishedFirst = BroadcastValue(1, throwing: TestError.self)
        let subscription = finishedFirst.subscribe()
        #expect(!finishedFirst.isFinished)
        finishedFirst.finish()
        finishedFirst.finish(throwing: TestError(code: 1))
        #expect(finishedFirst.isFinished)
        #expect(try await events(subscription) == [.value(1), .end])

        let failedFirst = BroadcastValue(1, throwing: TestError.self)
        let failing = failedFirst.subscribe()
        failedFirst.finish(throwing: TestError(code: 2))
        failedFirst.finish(throwing: TestError(code: 3))
        failedFirst.finish()
        #expect(failedFirst.isFinished)
        #expect(try await events(failing) == [.value(1), .error(TestError(code: 2)), .end])
    }

    // claims: VAL-VALUE-FINAL, VAL-FINISH-IGNORED
    @Test func v7SendAfterFinishIsIgnored() {
        let value = BroadcastValue(1)
        value.finish()
        value.send(2)
        #expect(value.value == 1)
        #expect(value.changeCount == 0)
    }

    /// After finish `update` still runs its body (on the final value) and
    /// returns its result, but what it changes is discarded.
    // claims: VAL-FINISH-IGNORED
    @Test func v7UpdateAfterFinishRunsOnADiscardedCopy() async throws {
        let value = BroadcastValue([1, 2])
        value.finish()
        let result = value.update { array -> [Int] in
            let before = array
            array.append(3)
            array[0] = 100
            return before
        }
        #expect(result == [1, 2], "the body saw the final value")
        #expect(value.value == [1, 2])
        #expect(value.changeCount == 0)
        #expect(throws: TestError(code: 7)) {
            try value.update { (array: inout [Int]) throws(TestError) in
                array = []
                throw TestError(code: 7)
            }
        }
        #expect(value.value == [1, 2])
        #expect(value.changeCount == 0)
    }

    // claims: VAL-FINISH-LAST-VALUE
    @Test func v7ASubscriberGetsItsLastUnseenValueThenNil() async throws {
        let value = BroadcastValue(0)
        let seenAll = value.subscribe()
        let behind = value.subscribe()
        #expect(try await take(1, from: seenAll) == [0])
        value.send(1)
        #expect(try await take(1, from: seenAll) == [1])
        value.finish()
        #expect(try await drain(seenAll) == [], "nothing unseen: nil at once")
        #expect(try await drain(behind) == [1], "the last value, not the backlog")
        #expect(try await drain(behind) == [], "nil stays nil")
    }

    // claims: VAL-FINISH-LAST-VALUE
    @Test func v7FinishThrowingGivesTheUnseenValueThenTheErrorOnceThenNil() async throws {
        try await withDeadline("v7FinishThrowingGivesTheUnseenValueThenTheErrorOnceThenNil") { () async throws -> Void in
            let value = BroadcastValue(0, throwing: TestError.self)
            let seenAll = value.subscribe()
            let behind = value.subscribe()
            var iterator = seenAll.makeAsyncIterator()
            #expect(try await iterator.next() == 0)
            value.send(1)
            #expect(try await iterator.next() == 1)
            value.finish(throwing: TestError(code: 9))
            #expect(try await events(seenAll) == [.error(TestError(code: 9)), .end])
            #expect(try await events(behind) == [.value(1), .error(TestError(code: 9)), .end])
        }
    }

    // claims: VAL-FINISH-LAST-VALUE, VAL-COUNT-AFTER-FINISH
    @Test func v7FinishWakesParkedReaders() async throws {
        let value = BroadcastValue(0, throwing: TestError.self)
        let subscriptions = (0..<3).map { _ in value.subscribe() }
        let readers = subscriptions.map { subscription in Task { try await events(subscription) } }
        for subscription in subscriptions {
            try await waitUntil("reader parked after 0") { subscription.isConsumerWaiting }
        }
        #expect(value.parkedSubscriberCount == 3)
        let wakes = value.wakeCount
        value.finish(throwing: TestError(code: 3))
        #expect(value.wakeCount == wakes + 3)
        for reader in readers {
            #expect(try await withDeadline("woken by finish") { try await reader.value }
                    == [.value(0), .error(TestError(code: 3)), .end])
        }
        #expect(value.subscriberCount == 0)
        #expect(value.parkedSubscriberCount == 0)
    }

    // MARK: V8 — subscriberCount; after finish, only subscribers with an unseen value count

    // claims: VAL-COUNT-AFTER-FINISH
    @Test func v8AfterFinishOnlySubscribersWithAnUnseenValueCount() async throws {
        try await withDeadline("v8AfterFinishOnlySubscribersWithAnUnseenValueCount") { () async throws -> Void in
            let value = BroadcastValue(0, throwing: TestError.self)
            let upToDate = value.subscribe()
            let behind = value.subscribe()
            var upToDateIterator = upToDate.makeAsyncIterator()
            var behindIterator = behind.makeAsyncIterator()
            #expect(try await upToDateIterator.next() == 0)
            #expect(try await behindIterator.next() == 0)
            value.send(1)
            #expect(try await upToDateIterator.next() == 1)
            let neverRead = value.subscribe()
            #expect(value.subscriberCount == 3)
            value.finish(throwing: TestError(code: 8))
            #expect(value.subscriberCount == 2, "the one that has seen the last value leaves at once")
            #expect(try await behindIterator.next() == 1)
            #expect(value.subscriberCount == 1, "taking its last value, it leaves")
            #expect(try await events(neverRead) == [.value(1), .error(TestError(code: 8)), .end])
            #expect(value.subscriberCount == 0)
            #expect(try await events(behind) == [.error(TestError(code: 8)), .end])
            #expect(try await events(upToDate) == [.error(TestError(code: 8)), .end])
        }
    }

    // claims: VAL-COUNT-AFTER-FINISH
    @Test func v8SubscriberCountCountsRegisteredSubscribers() async throws {
        try await withDeadline("v8SubscriberCountCountsRegisteredSubscribers") { () async throws -> Void in
            let value = BroadcastValue(0)
            #expect(value.subscriberCount == 0)
            let a = value.subscribe()
            let b = value.subscribe()
            var iterator = value.makeAsyncIterator()
            #expect(value.subscriberCount == 3)
            _ = await iterator.next()
            a.cancel()
            #expect(value.subscriberCount == 2)
            _ = b
        }
    }

    // MARK: V9 — subscribing after finish, or from a cancelled task

    // claims: VAL-UNREGISTERED-SUBSCRIBE
    @Test func v9SubscribingAfterFinishYieldsTheValueOnceAndIsNotRegistered() async throws {
        let value = BroadcastValue(4)
        value.send(5)
        value.finish()
        let subscription = value.subscribe()
        #expect(value.subscriberCount == 0)
        #expect(try await drain(subscription) == [5])
        var loop: [Int] = []
        for await next in value { loop.append(next) }
        #expect(loop == [5])
        #expect(value.subscriberCount == 0)
    }

    // claims: VAL-UNREGISTERED-SUBSCRIBE
    @Test func v9SubscribingAfterFinishThrowingYieldsTheValueThenTheErrorOnce() async throws {
        let value = BroadcastValue(4, throwing: TestError.self)
        value.finish(throwing: TestError(code: 9))
        let subscription = value.subscribe()
        #expect(value.subscriberCount == 0)
        #expect(try await events(subscription) == [.value(4), .error(TestError(code: 9)), .end])
    }

    /// Subscribed from a cancelled task: not registered, so it sees the
    /// current value once and no later change.
    // claims: VAL-UNREGISTERED-SUBSCRIBE
    @Test func v9SubscribingFromACancelledTaskIsNotRegistered() async throws {
        try await withDeadline("v9SubscribingFromACancelledTaskIsNotRegistered") { () async throws -> Void in
            let value = BroadcastValue(1)
            let subscription = await Task { () -> BroadcastValue<Int, Never>.Subscription in
                withUnsafeCurrentTask { $0?.cancel() }
                return value.subscribe()
            }.value
            #expect(value.subscriberCount == 0)
            var iterator = subscription.makeAsyncIterator()
            #expect(await iterator.next() == 1)
            value.send(2)
            #expect(await iterator.next() == nil)
            #expect(value.subscriberCount == 0)
            #expect(value.parkedSubscriberCount == 0)
        }
    }

    /// The same, read in the cancelled task itself (a `for await` loop
    /// started in a cancelled task): the current value once, then the end.
    // claims: VAL-UNREGISTERED-SUBSCRIBE
    @Test func v9ALoopStartedInACancelledTaskYieldsTheCurrentValueOnce() async throws {
        let value = BroadcastValue(3, throwing: TestError.self)
        let (seen, count) = try await withDeadline("loop in a cancelled task") {
            try await Task { () throws -> ([Int], Int) in
                withUnsafeCurrentTask { $0?.cancel() }
                var seen: [Int] = []
                for try await next in value { seen.append(next) }
                return (seen, value.subscriberCount)
            }.value
        }
        #expect(seen == [3])
        #expect(count == 0)
    }

    // MARK: V10 — Subscription.cancel()

    // claims: VAL-CANCEL
    @Test func v10CancelEndsAtOnceAndIsIdempotent() async throws {
        let value = BroadcastValue(0)
        let subscription = value.subscribe()
        let other = value.subscribe()
        value.send(1)  // pending for both
        subscription.cancel()
        #expect(value.subscriberCount == 1, "count drops at once")
        #expect(try await drain(subscription) == [], "the pending value is discarded")
        subscription.cancel()
        #expect(value.subscriberCount == 1)
        value.send(2)
        #expect(try await drain(subscription) == [])
        #expect(try await take(1, from: other) == [2], "the other subscriber is unaffected")
    }

    // claims: VAL-CANCEL
    @Test func v10CancelWakesAParkedReaderWithNil() async throws {
        let value = BroadcastValue(0, throwing: TestError.self)
        let subscription = value.subscribe()
        let reader = Task { try await events(subscription) }
        try await waitUntil("reader parked after 0") { subscription.isConsumerWaiting }
        subscription.cancel()
        #expect(value.subscriberCount == 0)
        #expect(try await withDeadline("woken by cancel()") { try await reader.value } == [.value(0), .end])
        #expect(value.parkedSubscriberCount == 0)
        value.send(1)  // nobody to wake
        #expect(value.wakeCount == 0)
    }

    // MARK: V11 — task cancellation

    // claims: VAL-TASK-CANCEL
    @Test func v11ACancelledParkedReaderReturnsNilAtOnceAndDoesNotThrow() async throws {
        let value = BroadcastValue(0, throwing: TestError.self)
        let subscription = value.subscribe()
        let reader = Task { () -> [ValueEvent<Int>] in
            var iterator = subscription.makeAsyncIterator()
            var result: [ValueEvent<Int>] = []
            do throws(TestError) {
                while let next = try await iterator.next() { result.append(.value(next)) }
                result.append(.end)
            } catch {
                result.append(.error(error))
            }
            return result
        }
        try await waitUntil("reader parked after 0") { subscription.isConsumerWaiting }
        reader.cancel()
        #expect(try await withDeadline("cancelled reader") { await reader.value } == [.value(0), .end])
        #expect(value.subscriberCount == 0, "ended as with cancel()")
        #expect(value.parkedSubscriberCount == 0)
        value.send(1)
        var iterator = subscription.makeAsyncIterator()
        #expect(try await iterator.next() == nil)
    }

    // claims: VAL-TASK-CANCEL
    @Test func v11AReaderInACancelledTaskEndsOnItsFirstCall() async throws {
        let value = BroadcastValue(0, throwing: TestError.self)
        let subscription = value.subscribe()
        value.send(1)
        let result = try await withDeadline("next in a cancelled task") {
            try await Task { () throws -> Int? in
                withUnsafeCurrentTask { $0?.cancel() }
                var iterator = subscription.makeAsyncIterator()
                return try await iterator.next()
            }.value
        }
        #expect(result == nil)
        #expect(value.subscriberCount == 0)
    }

    /// A reader that never parks (it sends itself the next value each time)
    /// notices its task's cancellation within 32 calls.
    // claims: VAL-TASK-CANCEL
    @Test(arguments: [0, 1, 5, 31, 32, 33, 40])
    func v11TaskCancellationIsNoticedWithin32Calls(readBeforeCancel: Int) async throws {
        let value = BroadcastValue(0, throwing: TestError.self)
        let subscription = value.subscribe()
        let gate = Gate()
        let reader = Task { () -> (before: Int, after: Int, threw: Bool) in
            var iterator = subscription.makeAsyncIterator()
            var before = 0
            var after = 0
            do {
                while before < readBeforeCancel, let next = try await iterator.next() {
                    before += 1
                    value.send(next + 1)
                }
                await gate.pass()  // the test cancels this task here
                while after < 1_000, let next = try await iterator.next() {
                    after += 1
                    value.send(next + 1)
                }
            } catch {
                return (before, after, true)
            }
            return (before, after, false)
        }
        try await waitUntil("reader at the gate") { gate.isWaiting }
        reader.cancel()
        gate.open()
        let (before, after, threw) = try await withDeadline("cancelled reader ends") { await reader.value }
        #expect(before == readBeforeCancel)
        #expect(after <= 31, "received \(after) values after its task was cancelled")
        #expect(!threw, "task cancellation never throws")
        #expect(value.subscriberCount == 0)
    }

    // MARK: V12 — releasing

    // claims: VAL-RELEASE-ENDS
    @Test func v12ReleasingTheSubscriptionEndsIt() {
        let value = BroadcastValue(0)
        do {
            let subscription = value.subscribe()
            value.send(1)
            #expect(value.subscriberCount == 1)
            _ = subscription
        }
        #expect(value.subscriberCount == 0)
    }

    // claims: VAL-RELEASE-ENDS
    @Test func v12AnIteratorKeepsItsSubscriptionAlive() async throws {
        try await withDeadline("v12AnIteratorKeepsItsSubscriptionAlive") { () async throws -> Void in
            let value = BroadcastValue(0)
            var iterator = value.subscribe().makeAsyncIterator()
            #expect(value.subscriberCount == 1)
            #expect(await iterator.next() == 0)
            value.send(1)
            #expect(await iterator.next() == 1)
            _ = consume iterator
            #expect(value.subscriberCount == 0)
        }
    }

    // claims: VAL-DEINIT-FINISHES
    @Test func v12SubscriptionsDoNotKeepTheValueAlive() async throws {
        var value: BroadcastValue<Int, Never>? = BroadcastValue(1)
        let subscription = value!.subscribe()
        let weak = WeakBox(value)
        value = nil
        #expect(weak.isNil, "a subscription kept the BroadcastValue alive")
        #expect(try await drain(subscription) == [1], "the unseen value, then nil")
    }

    /// Releasing the last reference finishes it: a parked reader (nothing
    /// unseen) gets nil, one that is behind gets its unseen value, then nil.
    // claims: VAL-DEINIT-FINISHES
    @Test func v12ReleasingTheLastReferenceWhileSubscribersWaitFinishesIt() async throws {
        var value: BroadcastValue<Int, Never>? = BroadcastValue(0)
        let parked = value!.subscribe()
        let behind = value!.subscribe()
        let seen = Locked<[Int]>([])
        let reader = Task {
            for await next in parked { seen.withLock { $0.append(next) } }
        }
        try await waitUntil("reader parked after 0") { seen.value == [0] && parked.isConsumerWaiting }
        value!.send(1)
        try await waitUntil("reader parked again after 1") { seen.value == [0, 1] && parked.isConsumerWaiting }
        let weak = WeakBox(value)
        value = nil
        #expect(weak.isNil)
        try await withDeadline("parked reader ends") { await reader.value }
        #expect(seen.value == [0, 1])
        #expect(try await drain(behind) == [1])
    }

    /// A reader woken by a change but not yet run when the last reference
    /// goes away (its task is held by a manual executor) still gets that
    /// unseen value, then nil.
    // claims: VAL-DEINIT-FINISHES
    @Test func v12AWokenReaderStillGetsItsUnseenValueAfterTheValueIsReleased() async throws {
        let executor = ManualExecutor()
        var value: BroadcastValue<Int, Never>? = BroadcastValue(0)
        let subscription = value!.subscribe()
        let reader = Task(executorPreference: executor) { () -> [Int] in
            var seen: [Int] = []
            for await next in subscription { seen.append(next) }
            return seen
        }
        executor.runUntilIdle()
        try #require(subscription.isConsumerWaiting, "took 0 and parked")
        value!.send(1)  // wakes it; it has not run yet
        #expect(executor.queuedCount > 0)
        value = nil
        executor.runUntilIdle()
        #expect(try await withDeadline("reader ends") { await reader.value } == [0, 1])
    }

    @Test func v12DroppingEverythingReleasesEveryValue() async throws {
        let counter = LiveCounter()
        do {
            let value = BroadcastValue(Payload(0, counter))
            let a = value.subscribe()
            let b = value.subscribe()
            for i in 1...20 { value.send(Payload(i, counter)) }
            #expect(try await take(1, from: a).map(\.value) == [20])
            value.send(Payload(21, counter))
            _ = (a, b)
        }
        // What `take` returned may outlive this scope briefly (inside
        // withDeadline's abandoned timer task): wait, do not sleep.
        try await waitUntil("every payload released") { counter.live == 0 }
    }

    // MARK: V15 — for await on the BroadcastValue = subscribe().makeAsyncIterator()

    // claims: VAL-LOOP-SUBSCRIBES
    @Test func v15MakeAsyncIteratorSubscribesAtOnce() async throws {
        try await withDeadline("v15MakeAsyncIteratorSubscribesAtOnce") { () async throws -> Void in
            let value = BroadcastValue(0)
            var first = value.makeAsyncIterator()
            var second = value.makeAsyncIterator()
            #expect(value.subscriberCount == 2, "each iterator is its own subscriber, registered now")
            value.send(1)
            #expect(await first.next() == 1)
            #expect(await second.next() == 1)
            value.finish()
            #expect(await first.next() == nil)
            #expect(await second.next() == nil)
        }
    }

    // claims: VAL-LOOP-SUBSCRIBES
    @Test func v15AForAwaitLoopOnTheValueSeesTheCurrentValueThenChanges() async throws {
        let value = BroadcastValue(0)
        let seen = Locked<[Int]>([])
        let loop = Task {
            for await next in value {
                seen.withLock { $0.append(next) }
                if next == 2 { break }
            }
        }
        try await waitUntil("loop took 0") { seen.value == [0] && value.parkedSubscriberCount == 1 }
        value.send(1)
        try await waitUntil("loop took 1") { seen.value == [0, 1] && value.parkedSubscriberCount == 1 }
        value.send(2)
        try await withDeadline("loop ends") { await loop.value }
        #expect(seen.value == [0, 1, 2])
        #expect(value.subscriberCount == 0, "leaving the loop released its subscription")
    }
}
