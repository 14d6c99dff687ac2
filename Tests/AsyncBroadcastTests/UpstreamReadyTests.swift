import Foundation
import Testing
@_spi(Testing) @testable import AsyncBroadcast

/// `BroadcastSink.ready()` and `Subscription.upstreamReady()`: a subscriber
/// waits for the registration that serves it; `false` when the sequence or
/// the subscriber ends first; cancellation throws at once.
@Suite struct UpstreamReadyTests {
    typealias Shared = BroadcastSequence<Int, Never>

    /// The sinks of a `register` listener, in call order.
    final class Sinks: Sendable {
        let all = Locked<[BroadcastSink<Int, Never>]>([])
        let readyInRegister: Bool
        init(readyInRegister: Bool = false) { self.readyInRegister = readyInRegister }
        var count: Int { all.value.count }
        subscript(_ index: Int) -> BroadcastSink<Int, Never> { all.value[index] }

        @Sendable func register(_ sink: BroadcastSink<Int, Never>) -> @Sendable () -> Void {
            all.withLock { $0.append(sink) }
            if readyInRegister { sink.ready() }
            return {}
        }
    }

    /// `upstreamReady()` in a task of its own; its outcome once it returns.
    enum Outcome: Equatable, Sendable {
        case ready(Bool)
        case cancelled
    }

    final class Waiter: Sendable {
        let outcome = Locked<Outcome?>(nil)
        let task: Task<Void, Never>
        init(_ subscription: Shared.Subscription) {
            let outcome = outcome
            task = Task {
                do throws(CancellationError) {
                    let ready = try await subscription.upstreamReady()
                    outcome.withLock { $0 = .ready(ready) }
                } catch {
                    outcome.withLock { $0 = .cancelled }
                }
            }
        }
        func result() async throws -> Outcome {
            try await withDeadline("upstreamReady() returned") { await self.task.value }
            return outcome.value!
        }
    }

    static func parked(_ shared: Shared, _ count: Int = 1) async throws {
        try await waitUntil("\(count) upstreamReady() waiter(s) parked") { shared.upstreamWaiterCounts.ready == count }
    }

    // claims: READY-TRUE
    @Test func readyBeforeSubscribingIsTrueAtOnce() async throws {
        let sinks = Sinks(readyInRegister: true)
        let shared = Shared(started: .eagerly, register: sinks.register)
        let subscription = shared.subscribe()
        #expect(try await subscription.upstreamReady() == true)
        #expect(shared.upstreamWaiterCounts.ready == 0)
    }

    // claims: READY-TRUE
    @Test func aSubscriberWaitsUntilTheSinkSaysReady() async throws {
        let sinks = Sinks()
        let shared = Shared(register: sinks.register)
        let subscription = shared.subscribe()
        #expect(sinks.count == 1)
        let waiter = Waiter(subscription)
        try await Self.parked(shared)
        #expect(waiter.outcome.value == nil, "returned before the listener was ready")
        sinks[0].ready()
        #expect(try await waiter.result() == .ready(true))
        sinks[0].ready()  // idempotent
        #expect(try await subscription.upstreamReady() == true)
        #expect(shared.upstreamWaiterCounts.ready == 0)
    }

    // claims: READY-TRUE
    @Test func everyWaiterIsWokenByOneReady() async throws {
        let sinks = Sinks()
        let shared = Shared(register: sinks.register)
        let subscriptions = (0..<3).map { _ in shared.subscribe() }
        let waiters = subscriptions.map(Waiter.init)
        try await Self.parked(shared, 3)
        sinks[0].ready()
        for waiter in waiters { #expect(try await waiter.result() == .ready(true)) }
    }

    // claims: READY-TRUE, READY-STALE-IGNORED
    @available(macOS 13, iOS 16, tvOS 16, watchOS 9, *)
    @Test func aSubscriberAfterAStopWaitsForTheNextRegistrationNotTheOldOne() async throws {
        let sinks = Sinks()
        let shared = Shared(started: .whileSubscribed(), register: sinks.register)
        let first = shared.subscribe()
        sinks[0].ready()
        #expect(try await first.upstreamReady() == true)
        first.cancel()  // the run stops
        let second = shared.subscribe()
        #expect(sinks.count == 2, "a new registration for the new subscriber")
        let waiter = Waiter(second)
        try await Self.parked(shared)
        sinks[0].ready()  // the stopped registration: ignored
        #expect(shared.upstreamWaiterCounts.ready == 1)
        #expect(waiter.outcome.value == nil, "the old registration's ready served a later subscriber")
        sinks[1].ready()
        #expect(try await waiter.result() == .ready(true))
    }

    // claims: READY-TRUE
    @available(macOS 13, iOS 16, tvOS 16, watchOS 9, *)
    @Test func duringStopAfterTheSameRegistrationServesANewSubscriber() async throws {
        let clock = ManualClock()
        let sinks = Sinks()
        let shared = Shared(started: .whileSubscribed(stopAfter: .seconds(5), clock: clock), register: sinks.register)
        shared.subscribe().cancel()
        sinks[0].ready()
        let later = shared.subscribe()
        #expect(sinks.count == 1)
        #expect(try await later.upstreamReady() == true)
    }

    // claims: READY-FALSE
    @Test func finishingFirstGivesFalse() async throws {
        let sinks = Sinks()
        let shared = Shared(register: sinks.register)
        let subscription = shared.subscribe()
        let waiter = Waiter(subscription)
        try await Self.parked(shared)
        shared.finish()
        #expect(try await waiter.result() == .ready(false))
        sinks[0].ready()  // too late
        #expect(try await subscription.upstreamReady() == false)
    }

    // claims: READY-FALSE
    @Test func theListenerEndingFirstGivesFalse() async throws {
        let sinks = Sinks()
        let shared = Shared(register: sinks.register)
        let waiter = Waiter(shared.subscribe())
        try await Self.parked(shared)
        sinks[0].finish()
        #expect(try await waiter.result() == .ready(false))
    }

    // claims: READY-FALSE
    @Test func aDrainingSubscriberOfAReadyRegistrationGetsTrue() async throws {
        let sinks = Sinks(readyInRegister: true)
        let shared = Shared(register: sinks.register)
        let subscription = shared.subscribe()
        sinks[0].send(1)
        shared.finish()
        #expect(try await subscription.upstreamReady() == true, "ready came before the end")
        #expect(pollAll(subscription) == [1])
    }

    // claims: READY-FALSE
    @Test func theSubscriberEndingFirstGivesFalse() async throws {
        let sinks = Sinks()
        let shared = Shared(register: sinks.register)
        let subscription = shared.subscribe()
        let other = shared.subscribe()
        let waiter = Waiter(subscription)
        let otherWaiter = Waiter(other)
        try await Self.parked(shared, 2)
        subscription.cancel()
        #expect(try await waiter.result() == .ready(false))
        // The other subscriber was woken too (a subscriber left), and waits again.
        try await Self.parked(shared, 1)
        #expect(otherWaiter.outcome.value == nil)
        sinks[0].ready()
        #expect(try await otherWaiter.result() == .ready(true))
        let late = shared.subscribe()
        late.cancel()
        #expect(try await late.upstreamReady() == false)
    }

    // claims: READY-CANCEL
    @Test func cancellationThrowsAtOnceAndLeavesNoWaiter() async throws {
        let sinks = Sinks()
        let shared = Shared(register: sinks.register)
        let subscription = shared.subscribe()
        for _ in 0..<3 {
            let waiter = Waiter(subscription)
            try await Self.parked(shared)
            waiter.task.cancel()
            #expect(try await waiter.result() == .cancelled)
            #expect(shared.upstreamWaiterCounts.ready == 0, "a cancelled waiter stayed in the table")
        }
        // Cancelled before it waits: the tombstone case.
        let early = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            return try await subscription.upstreamReady()
        }
        await #expect(throws: CancellationError.self) { try await early.value }
        sinks[0].ready()
        #expect(try await subscription.upstreamReady() == true)
    }

    // claims: READY-NO-LISTENER
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func withoutAListenerItIsTrueAtOnce() async throws {
        let plain = Shared()
        #expect(try await plain.subscribe().upstreamReady() == true)
        let feed = Feed(of: Never.self)
        let upstream = Shared { feed.make() }
        #expect(try await upstream.subscribe().upstreamReady() == true)
    }

    // claims: TOPIC-READY
    @available(macOS 13, iOS 16, tvOS 16, watchOS 9, *)
    @Test func aTopicsSubscriberWaitsForItsTopicsRegistration() async throws {
        let sinks = Locked<[String: BroadcastSink<Int, Never>]>([:])
        let topics = BroadcastTopics<String, Int, Never> { topic, sink in
            sinks.withLock { $0[topic] = sink }
            return {}
        }
        let a = topics.subscribe(to: "a")
        let b = topics.subscribe(to: "b")
        let waiterA = Waiter(a)
        let waiterB = Waiter(b)
        sinks.value["b"]!.ready()
        #expect(try await waiterB.result() == .ready(true))
        #expect(waiterA.outcome.value == nil, "another topic's ready served this one")
        topics.finish(topic: "a")
        #expect(try await waiterA.result() == .ready(false))
        topics.finish()
        #expect(try await topics.subscribe(to: "c").upstreamReady() == false, "after finish, no listener serves it")
    }

    // claims: TOPIC-READY
    @available(macOS 13, iOS 16, tvOS 16, watchOS 9, *)
    @Test func aTopicsAsyncListenerSaysReadyAfterItsSetUp() async throws {
        let connected = BroadcastPromise<Void, Never>()
        let topics = BroadcastTopics<String, Int, Never> { topic, sink in
            _ = try? await connected.value
            sink.ready()
            return {}
        }
        let subscription = topics.subscribe(to: "a")
        let waiter = Waiter(subscription)
        connected.succeed()
        #expect(try await waiter.result() == .ready(true))
    }
}
