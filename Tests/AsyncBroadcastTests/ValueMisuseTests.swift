import Testing
@_spi(Testing) @testable import AsyncBroadcast

/// `BroadcastValue` programmer errors trap with a message that names the
/// misuse: SEMANTICS V5 (calling back into the same value from inside its
/// `update` body or from `Value.==`) and V13 (concurrent next()).
@Suite struct ValueMisuseTests {
    static let reentrance = "AsyncBroadcast misuse: BroadcastValue called back from inside its own update body"

    // MARK: V5 — every API, from inside update's body

    // claims: MISUSE-VALUE-REENTRY
    @Test func v5ReadingTheValueFromInsideUpdateTraps() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            startExitTestWatchdog(exitingWith: 0)
            let value = BroadcastValue(0)
            value.update { _ in _ = value.value }
        }
        expectMessage(result, Self.reentrance)
    }

    // claims: MISUSE-VALUE-REENTRY
    @Test func v5SendFromInsideUpdateTraps() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            startExitTestWatchdog(exitingWith: 0)
            let value = BroadcastValue(0)
            value.update { $0 += 1; value.send(5) }
        }
        expectMessage(result, Self.reentrance)
    }

    // claims: MISUSE-VALUE-REENTRY
    @Test func v5UpdateFromInsideUpdateTraps() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            startExitTestWatchdog(exitingWith: 0)
            let value = BroadcastValue(0)
            value.update { _ in value.update { $0 += 1 } }
        }
        expectMessage(result, Self.reentrance)
    }

    // claims: MISUSE-VALUE-REENTRY
    @Test func v5SubscribeFromInsideUpdateTraps() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            startExitTestWatchdog(exitingWith: 0)
            let value = BroadcastValue(0)
            value.update { _ in _ = value.subscribe() }
        }
        expectMessage(result, Self.reentrance)
    }

    @Test func v5MakeAsyncIteratorFromInsideUpdateTraps() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            startExitTestWatchdog(exitingWith: 0)
            let value = BroadcastValue(0)
            value.update { _ in _ = value.makeAsyncIterator() }
        }
        expectMessage(result, Self.reentrance)
    }

    // claims: MISUSE-VALUE-REENTRY
    @Test func v5FinishFromInsideUpdateTraps() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            startExitTestWatchdog(exitingWith: 0)
            let value = BroadcastValue(0)
            value.update { _ in value.finish() }
        }
        expectMessage(result, Self.reentrance)
    }

    @Test func v5FinishThrowingFromInsideUpdateTraps() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            startExitTestWatchdog(exitingWith: 0)
            let value = BroadcastValue(0, throwing: TestError.self)
            value.update { _ in value.finish(throwing: TestError(code: 1)) }
        }
        expectMessage(result, Self.reentrance)
    }

    @Test func v5SubscriberCountFromInsideUpdateTraps() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            startExitTestWatchdog(exitingWith: 0)
            let value = BroadcastValue(0)
            value.update { $0 = value.subscriberCount }
        }
        expectMessage(result, Self.reentrance)
    }

    @Test func v5IsFinishedFromInsideUpdateTraps() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            startExitTestWatchdog(exitingWith: 0)
            let value = BroadcastValue(0)
            value.update { $0 = value.isFinished ? 1 : 2 }
        }
        expectMessage(result, Self.reentrance)
    }

    /// Also after finish, where update runs its body on a discarded copy.
    @Test func v5CallingBackFromInsideUpdateAfterFinishTraps() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            startExitTestWatchdog(exitingWith: 0)
            let value = BroadcastValue(0)
            value.finish()
            value.update { _ in _ = value.value }
        }
        expectMessage(result, Self.reentrance)
    }

    /// A throwing body must not leave the guard set: the value works after.
    @Test func v5AThrowingUpdateBodyLeavesNoGuardBehind() async {
        await #expect(processExitsWith: .success) {
            startExitTestWatchdog(exitingWith: 1)
            let value = BroadcastValue(0)
            do {
                try value.update { (number: inout Int) throws(TestError) in
                    number = 1
                    throw TestError(code: 1)
                }
            } catch {}
            value.send(2)
            value.update { $0 += 1 }
            precondition(value.value == 3 && value.subscriberCount == 0 && !value.isFinished)
        }
    }

    // MARK: V5 — from Value.==

    // claims: MISUSE-VALUE-REENTRY
    @Test func v5ReadingTheValueFromEqualsDuringSendTraps() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            startExitTestWatchdog(exitingWith: 0)
            let value = BroadcastValue(ComparesBack(id: 0))
            ComparesBack.onCompare = { _ = value.value }
            value.send(ComparesBack(id: 1))
        }
        expectMessage(result, Self.reentrance)
        expectMessage(result, "Value.==")
    }

    @Test func v5SendFromEqualsDuringUpdateTraps() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            startExitTestWatchdog(exitingWith: 0)
            let value = BroadcastValue(ComparesBack(id: 0))
            ComparesBack.onCompare = { value.send(ComparesBack(id: 9)) }
            value.update { $0 = ComparesBack(id: 1) }
        }
        expectMessage(result, Self.reentrance)
    }

    @Test func v5SubscribeFromEqualsTraps() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            startExitTestWatchdog(exitingWith: 0)
            let value = BroadcastValue(ComparesBack(id: 0))
            ComparesBack.onCompare = { _ = value.subscribe() }
            value.send(ComparesBack(id: 0))
        }
        expectMessage(result, Self.reentrance)
    }

    /// Control: an `==` that does not call back is fine, and so is one that
    /// calls into a different BroadcastValue.
    // claims: VAL-OTHER-VALUES
    @Test func v5EqualsCallingIntoAnotherValueWorks() async {
        await #expect(processExitsWith: .success) {
            startExitTestWatchdog(exitingWith: 1)
            let other = BroadcastValue(0)
            let value = BroadcastValue(ComparesBack(id: 0))
            ComparesBack.onCompare = { other.update { $0 += 1 } }
            value.send(ComparesBack(id: 0))
            value.send(ComparesBack(id: 1))
            precondition(value.changeCount == 1 && other.value >= 2)
        }
    }

    // MARK: V13 — concurrent next() on one Subscription

    // claims: MISUSE-CONCURRENT-NEXT
    @Test func v13ConcurrentNextWhileTheFirstIsParkedTraps() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            startExitTestWatchdog(exitingWith: 0)
            let value = BroadcastValue(0)
            let subscription = value.subscribe()
            let first = Task {
                var iterator = subscription.makeAsyncIterator()
                _ = await iterator.next()  // 0
                return await iterator.next()  // parks
            }
            while !subscription.isConsumerWaiting { await Task.yield() }
            var second = subscription.makeAsyncIterator()
            _ = await second.next()
            _ = await first.value
        }
        expectMessage(result, "AsyncBroadcast misuse: concurrent next() calls on one Subscription")
    }

    /// The second reader arrives while the first is inside `next()` but not
    /// parked (held by a manual executor before it runs).
    // claims: MISUSE-CONCURRENT-NEXT
    @Test func v13ConcurrentNextBeforeTheFirstParksTraps() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            startExitTestWatchdog(exitingWith: 0)
            let executor = ManualExecutor()
            let value = BroadcastValue(0)
            let subscription = value.subscribe()
            let first = Task(executorPreference: executor) {
                var iterator = subscription.makeAsyncIterator()
                _ = await iterator.next()
                _ = await iterator.next()
            }
            executor.runUntilIdle()  // took 0, parked
            precondition(subscription.isConsumerWaiting)
            value.send(1)  // woken; its job is queued, not run: still inside next()
            precondition(!subscription.isConsumerWaiting)
            var second = subscription.makeAsyncIterator()
            _ = await second.next()
            _ = first
        }
        expectMessage(result, "AsyncBroadcast misuse: concurrent next() calls on one Subscription")
    }
}

/// An Equatable value whose `==` runs `onCompare` first (set inside an exit
/// test, which runs in a process of its own).
struct ComparesBack: Equatable, Sendable {
    let id: Int
    nonisolated(unsafe) static var onCompare: (@Sendable () -> Void)?

    static func == (lhs: Self, rhs: Self) -> Bool {
        onCompare?()
        return lhs.id == rhs.id
    }
}
