import Foundation
import Testing
@_spi(Testing) @testable import AsyncBroadcast

/// Two whole uses of sharing, as an app would write them: a snapshot
/// listener bridged while anyone listens, and an app-wide error stream
/// shared by several consumers.
@Suite struct SharingScenarioTests {
    // MARK: Scenario A — listener lifecycle

    /// A listener registered once for any number of subscribers, removed
    /// when the last one leaves (also by its task being cancelled), and
    /// registered again for the next.
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func scenarioListenerLifecycle() async throws {
        let store = SnapshotStore()
        let snapshots = BroadcastSequence<Int, Never>(bufferingPolicy: .bufferingNewest(8),
                                                     started: .whileSubscribed()) { sink in
            let registration = store.addListener { snapshot in sink.send(snapshot) }
            return { registration.remove() }
        }
        #expect(store.added == 0, "registered before anyone subscribed")

        let firstSeen = Locked<[Int]>([])
        let secondSeen = Locked<[Int]>([])
        let firstSubscription = snapshots.subscribe()
        let secondSubscription = snapshots.subscribe()
        let first = Task { for await snapshot in firstSubscription { firstSeen.withLock { $0.append(snapshot) } } }
        let second = Task { for await snapshot in secondSubscription { secondSeen.withLock { $0.append(snapshot) } } }
        #expect(store.added == 1 && store.listenerCount == 1, "two subscribers, \(store.added) registrations")

        try await store.publish(1)
        try await waitUntil("both consumers got snapshot 1") { firstSeen.value == [1] && secondSeen.value == [1] }

        // Cancelling a consumer's task wakes it, and it leaves; the
        // listener stays while the other one listens.
        first.cancel()
        try await withDeadline("the first consumer ended") { await first.value }
        #expect(snapshots.subscriberCount == 1)
        #expect(store.listenerCount == 1)
        try await store.publish(2)
        try await waitUntil("the second consumer got snapshot 2") { secondSeen.value == [1, 2] }
        #expect(firstSeen.value == [1])

        // The last consumer's cancellation removes the listener as soon as
        // the consumer wakes, before its task returns.
        second.cancel()
        try await withDeadline("the second consumer ended") { await second.value }
        #expect(store.listenerCount == 0, "cancelling the last consumer did not remove the listener")
        #expect(store.removed == 1)
        try await store.publish(3)  // nobody listens: goes nowhere

        // The next consumer registers again and gets only what comes after.
        let thirdSeen = Locked<[Int]>([])
        let thirdSubscription = snapshots.subscribe()
        let third = Task { for await snapshot in thirdSubscription { thirdSeen.withLock { $0.append(snapshot) } } }
        #expect(store.added == 2 && store.listenerCount == 1)
        try await store.publish(4)
        try await waitUntil("the third consumer got snapshot 4") { thirdSeen.value == [4] }
        third.cancel()
        try await withDeadline("third consumer ended") { await third.value }
        #expect(store.listenerCount == 0 && store.removed == 2)
    }

    // MARK: Scenario B — an app-wide error stream, shared

    struct DisplayError: Error, Equatable { let message: String }
    struct NetworkError: Error, Equatable { let status: Int }

    static func describe(_ error: any Error) -> String {
        switch error {
        case let error as DisplayError: return "display:\(error.message)"
        case let error as NetworkError: return "network:\(error.status)"
        default: return "other"
        }
    }

    /// One `AsyncStream` of errors, broadcast to a display filter, a logger
    /// and a metrics counter: each sees every error in order, one leaving
    /// does not disturb the others, and releasing the shared sequence ends
    /// the stream (its onTermination runs) and every consumer.
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func scenarioSharedErrorStream() async throws {
        let (stream, continuation) = AsyncStream<any Error>.makeStream()
        let terminated = Locked(0)
        continuation.onTermination = { _ in terminated.withLock { $0 += 1 } }
        var errors: BroadcastSequence<any Error, Never>? = stream.broadcast()
        let storage = errors!.storage

        let displayed = Locked<[String]>([])
        let logged = Locked<[String]>([])
        let counted = Locked(0)
        let displaySubscription = errors!.subscribe()
        let loggerSubscription = errors!.subscribe()
        let metricsSubscription = errors!.subscribe()
        let display = Task {
            for await error in displaySubscription where error is DisplayError {
                displayed.withLock { $0.append(Self.describe(error)) }
            }
        }
        let logger = Task {
            for await error in loggerSubscription { logged.withLock { $0.append(Self.describe(error)) } }
        }
        let metrics = Task {
            for await _ in metricsSubscription { counted.withLock { $0 += 1 } }
        }
        #expect(storage.sharingCounters.starts == 1, "one iteration of the stream for three consumers")

        let first: [any Error] = [DisplayError(message: "a"), NetworkError(status: 500), DisplayError(message: "b"),
                                  NetworkError(status: 404), DisplayError(message: "c")]
        for error in first { continuation.yield(error) }
        try await waitUntil("everyone saw the first five") {
            logged.value.count == 5 && counted.value == 5 && displayed.value.count == 3
        }
        #expect(logged.value == first.map(Self.describe))
        #expect(displayed.value == ["display:a", "display:b", "display:c"])

        // Metrics leaves; the others go on undisturbed.
        try await waitUntil("metrics waits") { metricsSubscription.isConsumerWaiting }
        metrics.cancel()
        try await withDeadline("metrics ended") { await metrics.value }
        continuation.yield(NetworkError(status: 503))
        continuation.yield(DisplayError(message: "d"))
        try await waitUntil("the remaining consumers saw the last two") {
            logged.value.count == 7 && displayed.value.count == 4
        }
        #expect(logged.value == first.map(Self.describe) + ["network:503", "display:d"])
        #expect(displayed.value == ["display:a", "display:b", "display:c", "display:d"])
        #expect(counted.value == 5)

        // Releasing the shared sequence cancels the stream's iteration and ends the consumers.
        let weak = WeakBox(errors)
        errors = nil
        #expect(weak.isNil)
        try await waitUntil("the stream's onTermination ran") { terminated.value == 1 }
        try await withDeadline("the consumers ended") { await display.value; await logger.value }
        try await waitUntil("the iteration task returned") { storage.sharingCounters.liveUpstreamTasks == 0 }
        let counters = storage.sharingCounters
        #expect(counters.starts == 1 && counters.stops == 1 && !counters.isRunning, "\(counters)")
        if case .terminated = continuation.yield(DisplayError(message: "late")) {} else {
            Issue.record("the stream still accepts elements after the shared sequence was released")
        }
    }
}

/// A snapshot-listener API in the style of a database SDK: listeners are
/// added and removed by registration, and called from the API's own
/// background thread.
final class SnapshotStore: Sendable {
    final class Registration: Sendable {
        let id: Int
        let store: SnapshotStore
        init(id: Int, store: SnapshotStore) { self.id = id; self.store = store }
        func remove() { store.remove(id) }
    }

    private struct State {
        var listeners: [Int: @Sendable (Int) -> Void] = [:]
        var nextID = 0
        var added = 0
        var removed = 0
    }
    private let state = Locked(State())

    var added: Int { state.withLock { $0.added } }
    var removed: Int { state.withLock { $0.removed } }
    var listenerCount: Int { state.withLock { $0.listeners.count } }

    func addListener(_ callback: @escaping @Sendable (Int) -> Void) -> Registration {
        let id = state.withLock { state in
            state.nextID += 1
            state.added += 1
            state.listeners[state.nextID] = callback
            return state.nextID
        }
        return Registration(id: id, store: self)
    }

    private func remove(_ id: Int) {
        state.withLock { state in
            if state.listeners.removeValue(forKey: id) != nil { state.removed += 1 }
        }
    }

    /// Calls every current listener with `snapshot` from a background
    /// thread; returns once they have all been called.
    func publish(_ snapshot: Int) async throws {
        let listeners = state.withLock { Array($0.listeners.values) }
        try await onThread("publish snapshot \(snapshot)") {
            for listener in listeners { listener(snapshot) }
        }
    }
}
