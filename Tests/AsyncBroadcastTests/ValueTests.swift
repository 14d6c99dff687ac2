import Foundation
import Testing
@_spi(Testing) @testable import AsyncBroadcast

/// `BroadcastValue` basics: SEMANTICS V1 (subscribe), V2 (conflation, no
/// duplicates), V3 (Equatable), V4 (update), V6 (the replaced value is
/// released after the lock). Test names start with the sentence they check.
@Suite struct ValueTests {
    // MARK: V1 — subscribe registers now, atomically with its starting value

    // claims: VAL-SUBSCRIBE-ATOMIC
    @Test func v1SubscribeRegistersAtOnceAndStartsWithTheCurrentValue() async throws {
        let value = BroadcastValue(7)
        #expect(value.value == 7)
        #expect(value.subscriberCount == 0)
        let subscription = value.subscribe()
        #expect(value.subscriberCount == 1, "registered before any next()")
        let second = value.subscribe()
        #expect(value.subscriberCount == 2)
        #expect(try await take(1, from: subscription) == [7])
        #expect(try await take(1, from: second) == [7])
    }

    // claims: VAL-SUBSCRIBE-ATOMIC
    @Test func v1FirstNextReturnsTheValueCurrentAtThatNextNotAtSubscribe() async throws {
        let value = BroadcastValue(0)
        let subscription = value.subscribe()
        value.send(1)
        value.send(2)
        #expect(try await take(1, from: subscription) == [2])
    }

    /// The change made between `subscribe()` and the first `next()` is not
    /// lost: after it the reader parks instead of ending or repeating.
    // claims: VAL-SUBSCRIBE-ATOMIC
    @Test func v1NothingIsLostBetweenSubscribeAndTheFirstRead() async throws {
        let value = BroadcastValue(0)
        let subscription = value.subscribe()
        value.send(1)
        let reader = Task { try await take(2, from: subscription) }
        try await waitUntil("reader parked after the first value") { subscription.isConsumerWaiting }
        value.send(2)
        #expect(try await withDeadline("reader") { try await reader.value } == [1, 2])
    }

    /// A subscribe racing a send on another thread either starts from the
    /// old value (and then sees the new one) or from the new one: never
    /// the old one alone (registered after the send but holding the value
    /// from before it).
    // claims: VAL-SUBSCRIBE-ATOMIC
    @Test func v1SubscribeRacingASendNeverMissesIt() async throws {
        for round in 0..<300 {
            let value = BroadcastValue(0)
            let subscription = Locked<BroadcastValue<Int, Never>.Subscription?>(nil)
            try await raceOnThreads(2, "subscribe vs send, round \(round)") { index in
                if index == 0 { subscription.value = value.subscribe() } else { value.send(1) }
            }
            value.finish()
            let seen = try await drain(subscription.value!)
            #expect(seen == [1] || seen == [0, 1], "round \(round): saw \(seen)")
        }
    }

    // MARK: V2 — newer than the last one returned; latest, not a backlog; one pending value

    // claims: VAL-NEVER-TWICE
    @Test func v2NextNeverReturnsTheSameChangeTwice() async throws {
        let value = BroadcastValue(0)
        let subscription = value.subscribe()
        let reader = Task { try await take(2, from: subscription) }
        // The first next() returns 0; the second must park, not return 0 again.
        try await waitUntil("reader parked after the first value") { subscription.isConsumerWaiting }
        #expect(value.parkedSubscriberCount == 1)
        value.send(1)
        #expect(try await withDeadline("reader") { try await reader.value } == [0, 1])
    }

    // claims: VAL-AT-MOST-ONE-PENDING
    @Test func v2ASubscriberThatFellBehindGetsOnlyTheLatest() async throws {
        let value = BroadcastValue(0)
        let subscription = value.subscribe()
        #expect(try await take(1, from: subscription) == [0])
        for i in 1...100 { value.send(i) }
        let reader = Task { try await take(2, from: subscription) }
        try await waitUntil("reader parked after the latest") { subscription.isConsumerWaiting }
        value.send(101)
        #expect(try await withDeadline("reader") { try await reader.value } == [100, 101])
    }

    /// A parked reader woken by the first of several sends reads when it
    /// runs: it sees the latest, once, and no wake-up is counted twice.
    /// (Its task runs on a manual executor, so the three sends all happen
    /// between the wake-up and the read.)
    // claims: VAL-NEVER-TWICE, VAL-AT-MOST-ONE-PENDING
    @Test func v2AParkedReaderWokenBySeveralSendsSeesExactlyTheLatest() async throws {
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
        try #require(subscription.isConsumerWaiting, "the reader took 0 and parked")
        let wakes = value.wakeCount
        value.send(1)
        value.send(2)
        value.send(3)
        #expect(value.wakeCount == wakes + 1, "one parked reader, woken once")
        executor.runUntilIdle()
        #expect(try await withDeadline("reader") { await reader.value } == [0, 3])
    }

    // claims: VAL-AT-MOST-ONE-PENDING
    @Test func v2EachSubscriberHoldsAtMostOnePendingValue() async throws {
        let counter = LiveCounter()
        do {
            let value = BroadcastValue(Payload(0, counter))
            let subscriptions = (0..<3).map { _ in value.subscribe() }
            for i in 1...100 { value.send(Payload(i, counter)) }
            // The current value plus at most one pending value each.
            #expect(counter.live <= 1 + subscriptions.count, "\(counter.live) payloads alive")
            for subscription in subscriptions {
                #expect(try await take(1, from: subscription).map(\.value) == [100])
            }
            _ = subscriptions
        }
        // What `take` returned may outlive this scope briefly (inside
        // withDeadline's abandoned timer task): wait, do not sleep.
        try await waitUntil("every payload released") { counter.live == 0 }
    }

    /// `changeCount` is the version: +1 per effective change, and every
    /// value a subscriber returns is newer than the one before.
    // claims: VAL-NEVER-TWICE
    @Test func v2VersionsStrictlyIncrease() async throws {
        let value = BroadcastValue(0)
        #expect(value.changeCount == 0, "the initial value is not a change")
        let subscription = value.subscribe()
        let seen = Locked<[Int]>([])
        let reader = Task {
            for await next in subscription { seen.withLock { $0.append(next) } }
        }
        for i in 1...2_000 {
            value.send(i)
            #expect(value.changeCount == i)
        }
        value.finish()
        try await withDeadline("reader ends") { await reader.value }
        let values = seen.value
        #expect(values.last == 2_000)
        #expect(zip(values, values.dropFirst()).allSatisfy { $0 < $1 }, "not strictly increasing: \(values.prefix(50))")
    }

    // MARK: V3 — Equatable: an equal send/update is not a change

    // claims: VAL-EQUAL-NOT-CHANGE
    @Test func v3AnEqualSendOrUpdateWakesNobodyAndIsNotSeen() async throws {
        let value = BroadcastValue(0)
        let subscription = value.subscribe()
        let reader = Task { try await take(2, from: subscription) }
        try await waitUntil("reader parked after 0") { subscription.isConsumerWaiting }
        let changes = value.changeCount
        let wakes = value.wakeCount
        value.send(0)
        value.update { $0 = 0 }
        value.update { $0 += 1; $0 -= 1 }
        value.update { _ in }
        #expect(value.changeCount == changes)
        #expect(value.wakeCount == wakes)
        #expect(subscription.isConsumerWaiting, "the reader stays parked")
        #expect(value.parkedSubscriberCount == 1)
        value.send(5)
        #expect(value.changeCount == changes + 1)
        #expect(value.wakeCount == wakes + 1)
        #expect(try await withDeadline("reader") { try await reader.value } == [0, 5])
    }

    /// A subscriber that is not reading and has seen the current value has
    /// nothing unseen after an equal send: at finish it just ends.
    // claims: VAL-EQUAL-NOT-CHANGE
    @Test func v3AnEqualSendIsNotSeenByAnIdleSubscriber() async throws {
        let value = BroadcastValue("a")
        let subscription = value.subscribe()
        #expect(try await take(1, from: subscription) == ["a"])
        value.send("a")
        value.update { $0 = "a" }
        value.finish()
        #expect(value.subscriberCount == 0, "it had seen the last value: it leaves at finish")
        #expect(try await drain(subscription) == [])
    }

    // claims: VAL-EQUAL-NOT-CHANGE
    @Test func v3ANonEquatableValueChangesOnEverySendEvenTheSame() async throws {
        let value = BroadcastValue(Opaque(n: 0))
        let subscription = value.subscribe()
        let reader = Task { try await take(2, from: subscription).map(\.n) }
        try await waitUntil("reader parked after the first value") { subscription.isConsumerWaiting }
        let wakes = value.wakeCount
        value.send(Opaque(n: 0))
        #expect(value.changeCount == 1)
        #expect(value.wakeCount == wakes + 1)
        #expect(try await withDeadline("reader") { try await reader.value } == [0, 0])
        value.update { _ in }
        #expect(value.changeCount == 2, "a no-op update is a change too")
    }

    // claims: VAL-EQUAL-NOT-CHANGE
    @Test func v3SendingTheSameInstanceOfANonEquatableClassIsAChange() async throws {
        let counter = LiveCounter()
        let payload = Payload(1, counter)
        let value = BroadcastValue(payload)
        let subscription = value.subscribe()
        #expect(try await take(1, from: subscription).map(\.value) == [1])
        value.send(payload)
        #expect(value.changeCount == 1)
        #expect(try await take(1, from: subscription).map(\.value) == [1])
    }

    /// `==` decides, not the bits: a send equal by `==` but different in
    /// its other fields is no change.
    // claims: VAL-EQUAL-NOT-CHANGE
    @Test func v3EqualityIsTheValuesOwnEquals() {
        let value = BroadcastValue(IdentifiedByID(id: 1, note: "a"))
        value.send(IdentifiedByID(id: 1, note: "b"))
        #expect(value.changeCount == 0)
        value.send(IdentifiedByID(id: 2, note: "b"))
        #expect(value.changeCount == 1)
    }

    /// Created and driven from code that does not know the type is
    /// Equatable (and for conditional conformances): still detected.
    // claims: VAL-EQUAL-NOT-CHANGE
    @Test func v3EquatableIsDetectedAtRuntimeAlsoInGenericCode() {
        #expect(changesAfterSendingTwiceAndANoOpUpdate(5, 5) == 0)
        #expect(changesAfterSendingTwiceAndANoOpUpdate(5, 6) == 1)
        #expect(changesAfterSendingTwiceAndANoOpUpdate("a", "a") == 0)
        #expect(changesAfterSendingTwiceAndANoOpUpdate(Optional(5), Optional(5)) == 0)
        #expect(changesAfterSendingTwiceAndANoOpUpdate(Int?.none, Int?.none) == 0)
        #expect(changesAfterSendingTwiceAndANoOpUpdate([1, 2], [1, 2]) == 0)
        #expect(changesAfterSendingTwiceAndANoOpUpdate(["k": [1]], ["k": [1]]) == 0)
        #expect(changesAfterSendingTwiceAndANoOpUpdate(IdentifiedByID(id: 1, note: "a"), IdentifiedByID(id: 1, note: "b")) == 0)
        #expect(changesAfterSendingTwiceAndANoOpUpdate(Opaque(n: 1), Opaque(n: 1)) == 3)
        #expect(changesAfterSendingTwiceAndANoOpUpdate([Opaque(n: 1)], [Opaque(n: 1)]) == 3, "[Opaque] is not Equatable")
    }

    /// From code generic over an unconstrained `T`: sends `other` twice,
    /// then runs an update that changes nothing; returns `changeCount`.
    private func changesAfterSendingTwiceAndANoOpUpdate<T: Sendable>(_ initial: T, _ other: T) -> Int {
        let value = BroadcastValue<T, Never>(initial)
        value.send(other)
        value.send(other)
        value.update { _ in }
        return value.changeCount
    }

    // MARK: V4 — update: atomic read-modify-write, result, throwing body, old value kept for comparison

    // claims: VAL-UPDATE-ATOMIC
    @Test func v4UpdateReturnsTheBodysResult() {
        let value = BroadcastValue(1)
        let result = value.update { number -> String in
            number += 1
            return "now \(number)"
        }
        #expect(result == "now 2")
        #expect(value.value == 2)
        #expect(value.changeCount == 1)
    }

    // claims: VAL-UPDATE-ATOMIC
    @Test func v4ConcurrentUpdatesAreAtomic() async throws {
        let value = BroadcastValue(0)
        let subscription = value.subscribe()
        let seen = Locked<[Int]>([])
        let reader = Task {
            for await next in subscription { seen.withLock { $0.append(next) } }
        }
        try await raceOnThreads(8, "8 threads updating") { _ in
            for _ in 0..<1_000 { value.update { $0 += 1 } }
        }
        #expect(value.value == 8_000, "lost updates")
        #expect(value.changeCount == 8_000)
        value.finish()
        try await withDeadline("reader ends") { await reader.value }
        let values = seen.value
        #expect(values.last == 8_000)
        #expect(zip(values, values.dropFirst()).allSatisfy { $0 < $1 })
    }

    /// What the body changed before throwing is kept and published; the
    /// typed error is rethrown.
    // claims: VAL-UPDATE-ATOMIC
    @Test func v4AThrowingBodyKeepsItsChangesAndRethrows() async throws {
        let value = BroadcastValue(1)
        let subscription = value.subscribe()
        let reader = Task { try await take(2, from: subscription) }
        try await waitUntil("reader parked after 1") { subscription.isConsumerWaiting }
        do throws(TestError) {
            try value.update { (number: inout Int) throws(TestError) in
                number = 7
                throw TestError(code: 4)
            }
            Issue.record("update did not rethrow")
        } catch {
            #expect(error == TestError(code: 4))  // statically a TestError
        }
        #expect(value.value == 7)
        #expect(value.changeCount == 1)
        #expect(try await withDeadline("reader") { try await reader.value } == [1, 7])
        // A body that throws without changing anything is no change.
        #expect(throws: TestError(code: 5)) {
            try value.update { (_: inout Int) throws(TestError) in throw TestError(code: 5) }
        }
        #expect(value.changeCount == 1)
        // The value is usable afterwards.
        value.send(8)
        #expect(value.value == 8)
    }

    /// A collection mutated in place is compared with the value from before
    /// the body (a copy-on-write copy), so an in-place append is a change and
    /// an append undone is not.
    // claims: VAL-UPDATE-PREVIOUS-KEPT
    @Test func v4InPlaceMutationIsComparedWithThePreviousValue() async throws {
        let value = BroadcastValue([1, 2, 3])
        let subscription = value.subscribe()
        let reader = Task { try await take(2, from: subscription) }
        try await waitUntil("reader parked after [1, 2, 3]") { subscription.isConsumerWaiting }
        value.update { $0.append(5); $0.removeLast() }
        #expect(value.changeCount == 0)
        value.update { $0.append(4) }
        #expect(value.changeCount == 1)
        let seen = try await withDeadline("reader") { try await reader.value }
        #expect(seen == [[1, 2, 3], [1, 2, 3, 4]])
        // The array the reader got first is not affected by later in-place updates.
        value.update { $0[0] = 100 }
        #expect(seen[0] == [1, 2, 3])
        #expect(value.value == [100, 2, 3, 4])
    }

    /// The previous value is kept alive past the body and released after
    /// the lock: its deinit can send into the same value.
    // claims: VAL-UPDATE-PREVIOUS-KEPT, VAL-REPLACED-AFTER-LOCK, DRF-NO-USER-CODE-UNDER-LOCK
    @Test func v4UpdateReleasesThePreviousValueAfterTheLock() async throws {
        let target = WeakBox<BroadcastValue<SendsOnDeinit, Never>>()
        let value = BroadcastValue(SendsOnDeinit(1, sendsOnDeinit: 200, into: target))
        target.object = value
        let id = try await onThread("update replacing a value whose deinit sends") {
            value.update { $0 = SendsOnDeinit(2, sendsOnDeinit: nil, into: target) }
            return value.value.id
        }
        #expect(id == 200, "the deinit's send applies after the update")
        #expect(value.changeCount == 2)
    }

    /// Different instances do not share a re-entrance guard: updating one
    /// from inside another's update works (and so does the same instance
    /// from another thread, see v4ConcurrentUpdatesAreAtomic).
    // claims: VAL-OTHER-VALUES
    @Test func v4UpdatingAnotherValueFromInsideAnUpdateWorks() {
        let outer = BroadcastValue(0)
        let inner = BroadcastValue(10)
        let result = outer.update { number -> Int in
            let innerResult = inner.update { other -> Int in
                other += 1
                return other
            }
            number = innerResult + inner.value + inner.subscriberCount
            return number
        }
        #expect(result == 22)
        #expect(outer.value == 22)
        #expect(inner.value == 11)
    }

    // MARK: V6 — the replaced value is released after the lock

    // claims: VAL-REPLACED-AFTER-LOCK, DRF-NO-USER-CODE-UNDER-LOCK
    @Test func v6AValueWhoseDeinitSendsIntoTheSameValueWorks() async throws {
        let target = WeakBox<BroadcastValue<SendsOnDeinit, Never>>()
        let value = BroadcastValue(SendsOnDeinit(1, sendsOnDeinit: 100, into: target))
        target.object = value
        let id = try await onThread("send replacing a value whose deinit sends") {
            value.send(SendsOnDeinit(2, sendsOnDeinit: nil, into: target))
            return value.value.id
        }
        #expect(id == 100, "the deinit's send happens after, as a normal send")
        #expect(value.changeCount == 2)
    }

    // claims: VAL-REPLACED-AFTER-LOCK
    @Test func v6ADeinitSendWakesAParkedReaderAsANormalSend() async throws {
        let target = WeakBox<BroadcastValue<SendsOnDeinit, Never>>()
        let value = BroadcastValue(SendsOnDeinit(1, sendsOnDeinit: 100, into: target))
        target.object = value
        let subscription = value.subscribe()
        let reader = Task { () -> [Int] in
            var ids: [Int] = []
            for await next in subscription {
                ids.append(next.id)
                if next.id == 100 { break }
            }
            return ids
        }
        try await waitUntil("reader parked after the first value") { subscription.isConsumerWaiting }
        try await onThread("send") { value.send(SendsOnDeinit(2, sendsOnDeinit: nil, into: target)) }
        let ids = try await withDeadline("reader sees the deinit's value") { await reader.value }
        #expect(ids == [1, 100] || ids == [1, 2, 100], "saw \(ids)")
    }

    @Test func v6ReplacedValuesAreReleased() {
        let counter = LiveCounter()
        let value = BroadcastValue(Payload(0, counter))
        for i in 1...50 {
            value.send(Payload(i, counter))
            #expect(counter.live == 1)
        }
        value.update { $0 = Payload(51, counter) }
        #expect(counter.live == 1)
        #expect(value.value.value == 51)
    }

    /// When `==` does not compare everything, an equal `send` is dropped
    /// (the current instance stays) and an equal `update` keeps what its
    /// closure wrote; neither is a change.
    // claims: VAL-EQUAL-KEEPS
    @Test func anEqualSendKeepsTheCurrentInstanceAndAnEqualUpdateKeepsWhatItWrote() {
        let value = BroadcastValue(IdentifiedByID(id: 1, note: "a"))
        value.send(IdentifiedByID(id: 1, note: "b"))
        #expect(value.value.note == "a", "an equal send replaced the current instance")
        value.update { $0 = IdentifiedByID(id: 1, note: "c") }
        #expect(value.value.note == "c", "an equal update did not keep what it wrote")
        #expect(value.changeCount == 0)
    }

    /// "Newer" is a later change, not a different value: after `a` to `b`
    /// and back to `a`, a reader that last read `a` receives `a` again.
    // claims: VAL-LATER-CHANGE
    @Test func aChangeBackToTheValueLastReadIsStillAChange() async throws {
        let value = BroadcastValue("a")
        let subscription = value.subscribe()
        #expect(try await take(1, from: subscription) == ["a"])
        value.send("b")
        value.send("a")
        #expect(try await take(1, from: subscription) == ["a"])
    }

    /// Cancelling one subscriber leaves the others as they were: still
    /// counted, still receiving each change.
    // claims: VAL-END-ISOLATED
    @Test func endingOneSubscriberLeavesTheOthers() async throws {
        let value = BroadcastValue(0)
        let leaving = value.subscribe()
        let staying = value.subscribe()
        #expect(try await take(1, from: staying) == [0])
        leaving.cancel()
        #expect(value.subscriberCount == 1)
        value.send(1)
        #expect(try await take(1, from: staying) == [1])
        value.finish()
        #expect(try await drain(staying) == [])
        #expect(try await drain(leaving) == [])
    }
}

/// Not Equatable.
struct Opaque: Sendable {
    let n: Int
}

/// Equal when the ids are: `note` does not count.
struct IdentifiedByID: Equatable, Sendable {
    let id: Int
    let note: String
    static func == (lhs: Self, rhs: Self) -> Bool { lhs.id == rhs.id }
}

/// A value (not Equatable) whose deinit sends a new value into the
/// `BroadcastValue` that holds it (weakly referenced: no cycle).
final class SendsOnDeinit: Sendable {
    let id: Int
    let replacement: Int?
    let target: WeakBox<BroadcastValue<SendsOnDeinit, Never>>

    init(_ id: Int, sendsOnDeinit replacement: Int?, into target: WeakBox<BroadcastValue<SendsOnDeinit, Never>>) {
        self.id = id
        self.replacement = replacement
        self.target = target
    }

    deinit {
        if let replacement, let value = target.object {
            value.send(SendsOnDeinit(replacement, sendsOnDeinit: nil, into: target))
        }
    }
}
