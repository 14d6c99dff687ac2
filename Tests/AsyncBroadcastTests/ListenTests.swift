import Foundation
import Testing
@_spi(Testing) @testable import AsyncBroadcast

/// `init(listen:)` and BroadcastTopics' `init(stopAfter:listen:)`: an async
/// set-up returning an async take-down; a restart never before the previous
/// take-down returned; a stop during `listen` cancels it and takes it down
/// once it returns; `upstreamStopped()` / `listenersStopped()`.
@Suite struct ListenTests {
    typealias Shared = BroadcastSequence<Int, Never>

    /// A listener whose set-up and take-down are held by gates the test
    /// opens, counting how many are in place at once.
    final class Listener: Sendable {
        struct State {
            var listens = 0
            var takeDowns = 0
            /// From the start of `listen` to the end of its take-down.
            var active = 0
            var maxActive = 0
            var listenSawCancellation = false
            var takeDownSawCancellation = false
            var sinks: [BroadcastSink<Int, Never>] = []
        }
        let state = Locked(State())
        /// Each `listen` waits for this before returning (when set).
        let setUpGate = Locked<BroadcastPromise<Void, Never>?>(nil)
        /// Each take-down waits for this before returning (when set).
        let takeDownGate = Locked<BroadcastPromise<Void, Never>?>(nil)
        let takeDownStarted = Locked(0)

        var listens: Int { state.value.listens }
        var takeDowns: Int { state.value.takeDowns }

        @Sendable func listen(_ sink: BroadcastSink<Int, Never>) async -> @Sendable () async -> Void {
            state.withLock { state in
                state.listens += 1
                state.active += 1
                state.maxActive = Swift.max(state.maxActive, state.active)
                state.sinks.append(sink)
            }
            if let gate = setUpGate.value { _ = try? await gate.value }
            if Task.isCancelled { state.withLock { $0.listenSawCancellation = true } }
            sink.ready()
            return {
                self.takeDownStarted.withLock { $0 += 1 }
                if let gate = self.takeDownGate.value { _ = try? await gate.value }
                self.state.withLock { state in
                    if Task.isCancelled { state.takeDownSawCancellation = true }
                    state.takeDowns += 1
                    state.active -= 1
                }
            }
        }

        @Sendable func listen(_ topic: String, _ sink: BroadcastSink<Int, Never>) async -> @Sendable () async -> Void {
            await listen(sink)
        }
    }

    func stopped(_ shared: Shared) async throws {
        try await withDeadline("upstreamStopped()") { await shared.upstreamStopped() }
    }

    // claims: LISTEN-TAKEDOWN
    @available(macOS 13, iOS 16, tvOS 16, watchOS 9, *)
    @Test func listenRunsAtTheFirstSubscriberAndItsTakeDownAtTheStop() async throws {
        let listener = Listener()
        let shared = Shared(started: .whileSubscribed(), listen: listener.listen)
        #expect(listener.listens == 0)
        let subscription = shared.subscribe()
        #expect(try await subscription.upstreamReady() == true)
        #expect(listener.listens == 1)
        #expect(listener.state.value.sinks[0].send(7).delivered == 1)
        #expect(pollAll(subscription) == [7])
        subscription.cancel()
        try await stopped(shared)
        #expect(listener.takeDowns == 1)
        #expect(!listener.state.value.takeDownSawCancellation, "the take-down ran cancelled")
        #expect(listener.state.value.sinks[0].send(8).delivered == 0, "a stopped listener's sink still delivers")
    }

    // claims: LISTEN-RESTART-WAITS
    @available(macOS 13, iOS 16, tvOS 16, watchOS 9, *)
    @Test func aRestartWaitsForThePreviousTakeDownToReturn() async throws {
        let listener = Listener()
        let gate = BroadcastPromise<Void, Never>()
        listener.takeDownGate.withLock { $0 = gate }
        let shared = Shared(started: .whileSubscribed(), listen: listener.listen)
        let first = shared.subscribe()
        #expect(try await first.upstreamReady() == true)
        first.cancel()
        try await waitUntil("the take-down started") { listener.takeDownStarted.value == 1 }
        let second = shared.subscribe()
        #expect(shared.sharingCounters.starts == 1, "a new run started while the previous take-down ran")
        let waiter = Task { try await second.upstreamReady() }
        try await waitUntil("a readiness waiter parked") { shared.upstreamWaiterCounts.ready == 1 }
        #expect(listener.listens == 1)
        gate.succeed()
        #expect(try await withDeadline("ready after the restart") { try await waiter.value } == true)
        #expect(listener.listens == 2)
        #expect(shared.sharingCounters.starts == 2)
        #expect(listener.state.value.maxActive == 1, "two listeners were in place at once")
        second.cancel()
        try await stopped(shared)
        #expect(listener.takeDowns == 2)
    }

    // claims: LISTEN-STOP-DURING-LISTEN
    @available(macOS 13, iOS 16, tvOS 16, watchOS 9, *)
    @Test func aStopDuringASlowListenCancelsItAndTakesItDownWhenItReturns() async throws {
        let listener = Listener()
        let setUp = BroadcastPromise<Void, Never>()  // never completed: only cancellation lets listen go
        listener.setUpGate.withLock { $0 = setUp }
        let shared = Shared(started: .whileSubscribed(), listen: listener.listen)
        let subscription = shared.subscribe()
        try await waitUntil("listen started") { listener.listens == 1 }
        let waiter = Task { try await subscription.upstreamReady() }
        try await waitUntil("a readiness waiter parked") { shared.upstreamWaiterCounts.ready == 1 }
        subscription.cancel()
        #expect(try await withDeadline("upstreamReady() of a cancelled subscriber") { try await waiter.value } == false)
        try await stopped(shared)
        let state = listener.state.value
        #expect(state.listenSawCancellation, "listen was not cancelled by the stop")
        #expect(state.takeDowns == 1, "the take-down did not run once listen returned")
        #expect(state.active == 0)
        #expect(state.sinks[0].send(1).delivered == 0)
    }

    // claims: LISTEN-UPSTREAM-STOPPED
    @Test func upstreamStoppedReturnsAfterFinishOnceTheTakeDownReturned() async throws {
        let listener = Listener()
        let gate = BroadcastPromise<Void, Never>()
        listener.takeDownGate.withLock { $0 = gate }
        let shared = Shared(started: .eagerly, listen: listener.listen)
        let subscription = shared.subscribe()
        #expect(try await subscription.upstreamReady() == true)
        shared.finish()
        let stoppedTask = Task { await shared.upstreamStopped() }
        try await waitUntil("upstreamStopped() parked") { shared.upstreamWaiterCounts.stopped == 1 }
        #expect(listener.takeDowns == 0)
        gate.succeed()
        try await withDeadline("upstreamStopped()") { await stoppedTask.value }
        #expect(listener.takeDowns == 1)
        // Already stopped: at once; and at once for a plain sequence.
        await shared.upstreamStopped()
        await Shared().upstreamStopped()
    }

    // claims: LISTEN-TAKEDOWN
    @Test func theListenersOwnFinishTakesItDown() async throws {
        let listener = Listener()
        let shared = Shared(listen: listener.listen)
        let subscription = shared.subscribe()
        #expect(try await subscription.upstreamReady() == true)
        listener.state.value.sinks[0].send(1)
        listener.state.value.sinks[0].finish()
        #expect(try await drain(subscription) == [1])
        try await stopped(shared)
        #expect(listener.takeDowns == 1)
    }

    // claims: LISTEN-UPSTREAM-STOPPED
    @Test func upstreamStoppedCancelledReturns() async throws {
        let listener = Listener()
        let shared = Shared(started: .eagerly, listen: listener.listen)
        let waiter = Task { await shared.upstreamStopped() }
        try await waitUntil("upstreamStopped() parked") { shared.upstreamWaiterCounts.stopped == 1 }
        waiter.cancel()
        try await withDeadline("a cancelled upstreamStopped()") { await waiter.value }
        #expect(shared.upstreamWaiterCounts.stopped == 0)
        #expect(listener.takeDowns == 0)
        shared.finish()
        try await stopped(shared)
    }

    // claims: LISTEN-RESTART-WAITS, READY-TRUE
    @available(macOS 13, iOS 16, tvOS 16, watchOS 9, *)
    @Test func subscribersComingAndGoingAlwaysFindTheirRegistrationReadyAndListenersNeverOverlap() async throws {
        let listener = Listener()
        let shared = Shared(started: .whileSubscribed(), listen: listener.listen)
        let notReady = Locked(0)
        try await withDeadline("4 tasks × 50 subscribe / upstreamReady / cancel") {
            await withTaskGroup(of: Void.self) { group in
                for _ in 0..<4 {
                    group.addTask {
                        for _ in 0..<50 {
                            let subscription = shared.subscribe()
                            if (try? await subscription.upstreamReady()) != true { notReady.withLock { $0 += 1 } }
                            subscription.cancel()
                        }
                    }
                }
            }
        }
        #expect(notReady.value == 0, "a registered subscriber's upstreamReady() was not true")
        shared.finish()
        try await stopped(shared)
        let state = listener.state.value
        #expect(state.maxActive == 1, "two listeners were in place at once")
        #expect(state.listens == state.takeDowns && state.active == 0, "\(state.listens) listens, \(state.takeDowns) take-downs")
        #expect(shared.upstreamWaiterCounts.ready == 0 && shared.upstreamWaiterCounts.stopped == 0)
    }

    // MARK: Topics

    // claims: TOPIC-LISTEN-SERIAL
    @available(macOS 13, iOS 16, tvOS 16, watchOS 9, *)
    @Test func aTopicsNextListenWaitsForItsPreviousTakeDown() async throws {
        let listener = Listener()
        let gate = BroadcastPromise<Void, Never>()
        listener.takeDownGate.withLock { $0 = gate }
        let topics = BroadcastTopics<String, Int, Never>(listen: listener.listen)
        let first = topics.subscribe(to: "a")
        #expect(try await first.upstreamReady() == true)
        first.cancel()
        try await waitUntil("the take-down started") { listener.takeDownStarted.value == 1 }
        // The topic stays live while its take-down runs: the new subscriber
        // lands on it, and its restart waits.
        let second = topics.subscribe(to: "a")
        let readyWaiter = Task { try await second.upstreamReady() }
        #expect(listener.listens == 1, "a topic's listen started while its previous take-down ran")
        let reopened = BroadcastPromise<Void, Never>()
        listener.takeDownGate.withLock { $0 = reopened }
        gate.succeed()
        #expect(try await withDeadline("the restarted topic ready") { try await readyWaiter.value } == true)
        #expect(listener.listens == 2)
        // `finish(topic:)` retires the generation: the next one is created
        // blocked until the take-down has returned.
        topics.finish(topic: "a")
        try await waitUntil("the second take-down started") { listener.takeDownStarted.value == 2 }
        let third = topics.subscribe(to: "a")
        #expect(topics.topicsCounters.blockedStarts == 1, "the new generation did not wait for the take-down")
        #expect(listener.listens == 2)
        reopened.succeed()
        #expect(try await withDeadline("the third run ready") { try await third.upstreamReady() } == true)
        #expect(listener.listens == 3)
        #expect(listener.state.value.maxActive == 1, "two listeners of one topic were in place at once")
        topics.finish()
        try await withDeadline("listenersStopped()") { await topics.listenersStopped() }
        #expect(listener.takeDowns == 3)
        #expect(listener.state.value.active == 0)
    }

    // claims: TOPIC-REGISTER-LIFECYCLE
    @available(macOS 13, iOS 16, tvOS 16, watchOS 9, *)
    @Test func aTopicsTakeDownRunsStopAfterTheLastSubscriberLeft() async throws {
        let clock = ManualClock()
        let listener = Listener()
        let topics = BroadcastTopics<String, Int, Never>(stopAfter: .seconds(5), clock: clock, listen: listener.listen)
        let subscription = topics.subscribe(to: "a")
        #expect(try await subscription.upstreamReady() == true)
        subscription.cancel()
        try await withDeadline("the stop timer asleep") { await clock.waitForSleepers(1) }
        clock.advance(by: .seconds(5) - .nanoseconds(1))
        #expect(listener.takeDowns == 0 && topics.topicCount == 1)
        clock.advance(by: .nanoseconds(1))
        try await withDeadline("listenersStopped()") { await topics.listenersStopped() }
        #expect(listener.takeDowns == 1)
        try await waitUntil("the topic retired") { topics.topicCount == 0 }
    }

    // claims: TOPIC-LISTENERS-STOPPED
    @available(macOS 13, iOS 16, tvOS 16, watchOS 9, *)
    @Test func listenersStoppedWaitsForATopicLetGoByFinish() async throws {
        let listener = Listener()
        let gate = BroadcastPromise<Void, Never>()
        listener.takeDownGate.withLock { $0 = gate }
        let topics = BroadcastTopics<String, Int, Never>(listen: listener.listen)
        let subscriptions = ["a", "b"].map { topics.subscribe(to: $0) }
        for subscription in subscriptions { #expect(try await subscription.upstreamReady() == true) }
        topics.finish()
        let waiter = Task { await topics.listenersStopped() }
        try await waitUntil("both take-downs started") { listener.takeDownStarted.value == 2 }
        #expect(listener.takeDowns == 0)
        gate.succeed()
        try await withDeadline("listenersStopped()") { await waiter.value }
        #expect(listener.takeDowns == 2)
        // Without a listener: at once.
        await BroadcastTopics<String, Int, Never>().listenersStopped()
    }
}
