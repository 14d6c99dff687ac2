import Foundation
import Testing
@_spi(Testing) @testable import AsyncBroadcast

/// Runs and their boundaries: SHARING 8 (register/unregister alternate,
/// once each), 9 (the sink, from anywhere, at any time), 10 (a stopped
/// run delivers nothing and cannot finish the sequence). Test names start
/// with the sentence they check.
@Suite struct SharingRunTests {
    // MARK: S8 — register/unregister strictly alternate, never overlap

    /// Eight threads subscribe and cancel at random while a ninth moves the
    /// stop timer's clock: every start and stop goes through one thread at
    /// a time, in order, and the sequence's end unregisters the last run.
    // claims: SHARE-REGISTER-ALTERNATE, SHARE-UNREGISTER-ONCE
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s8RegisterAndUnregisterAlternateUnderConcurrentSubscribeAndCancel() async throws {
        for round in 0..<30 {
            let clock = ManualClock()
            let log = ListenerLog()
            let delayed = round % 2 == 1
            let started: BroadcastStart = delayed
                ? .whileSubscribed(stopAfter: .milliseconds(1), clock: clock) : .whileSubscribed()
            let shared = BroadcastSequence<Int, Never>(started: started) { sink in
                log.record(.register) { sink.send(0) }
                return { log.record(.unregister) {} }
            }
            let done = Locked(0)
            try await raceOnThreads(9, "subscribe/cancel from 8 threads, round \(round)") { thread in
                if thread == 8 {
                    while done.value < 8 { clock.advance(by: .milliseconds(1)); sched_yield() }
                    return
                }
                for step in 0..<40 {
                    let subscription = shared.subscribe()
                    if (step + thread) % 3 == 0 { sched_yield() }
                    subscription.cancel()
                }
                done.withLock { $0 += 1 }
            }
            #expect(log.overlaps == 0, "round \(round): register/unregister overlapped \(log.overlaps) times")
            #expect(log.alternates(closed: false), "round \(round): \(log.events.suffix(8))")
            shared.finish()
            // The last unregister may run on a stop timer's task after it counted
            // itself out (it claims the reconciler role then): wait for both.
            try await waitUntil("round \(round): timers returned and the end unregistered the last run") {
                shared.sharingCounters.liveTimerTasks == 0 && log.alternates(closed: true)
            }
            #expect(log.alternates(closed: true), "round \(round): the end did not unregister the last run: \(log.events.suffix(4))")
            let counters = shared.sharingCounters
            #expect(counters.starts == log.registers && counters.stops == log.unregisters && counters.starts == counters.stops,
                    "round \(round): \(counters), log \(log.registers)/\(log.unregisters)")
            if !delayed { #expect(log.registers >= 1) }
        }
    }

    // MARK: S9 — the sink: inside register, from any thread, after unregister

    // claims: SHARE-STARTER-GETS-ALL, SHARE-SINK-ANY-TIME, SHARE-REGISTER-ALTERNATE, DRF-NO-USER-CODE-UNDER-LOCK
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s9ASinkCalledInsideRegisterReachesTheSubscriberThatStartedIt() {
        let results = Locked<[BroadcastSendResult]>([])
        let shared = BroadcastSequence<Int, Never>(started: .whileSubscribed()) { sink in
            results.withLock { $0 = [sink.send(1), sink.send(2)] }
            return {}
        }
        let subscription = shared.subscribe()
        #expect(pollAll(subscription) == [1, 2])
        #expect(results.value == [BroadcastSendResult(delivered: 1), BroadcastSendResult(delivered: 1)])
    }

    // claims: SHARE-SINK-ANY-TIME
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s9ASinkCalledFromAListenersOwnThreadDelivers() async throws {
        let stop = Locked(false)
        let sent = Locked(0)
        let shared = BroadcastSequence<Int, Never>(started: .whileSubscribed()) { sink in
            // A listener that calls back from a thread of its own.
            Thread.detachNewThread {
                var next = 1
                while !stop.value {
                    if next <= 100, !sink.send(next).isFinished { next += 1; sent.withLock { $0 += 1 } }
                    sched_yield()
                }
            }
            return { stop.value = true }
        }
        let subscription = shared.subscribe()
        #expect(try await take(100, from: subscription) == Array(1...100))
        subscription.cancel()
        #expect(stop.value)
    }

    // claims: SHARE-SINK-ANY-TIME, SHARE-STALE-SINK
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s9ASinkCalledAfterUnregisterIsIgnored() async throws {
        let sinks = Locked<[BroadcastSink<Int, Never>]>([])
        let shared = BroadcastSequence<Int, Never>(started: .whileSubscribed()) { sink in
            sinks.withLock { $0.append(sink) }
            return {}
        }
        shared.subscribe().cancel()
        let stale = sinks.value[0]
        #expect(stale.send(1) == BroadcastSendResult(isFinished: true))
        let later = shared.subscribe()
        #expect(sinks.value.count == 2)
        // Late callbacks of the first registration, here and from another
        // thread, reach nobody and end nothing.
        #expect(stale.send(2).isFinished)
        let fromThread = try await onThread("a late callback on another thread") { stale.send(3) }
        #expect(fromThread.isFinished)
        stale.finish()
        #expect(!shared.isFinished, "a stale sink's finish() ended the sequence")
        sinks.value[1].send(4)
        #expect(pollAll(later) == [4], "a stale sink's element reached the next run's subscriber")
    }

    // claims: SHARE-STALE-SINK
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s9AStaleSinksFinishDoesNotUnregisterTheCurrentRun() {
        let log = ListenerLog()
        let sinks = Locked<[BroadcastSink<Int, TestError>]>([])
        let shared = BroadcastSequence<Int, TestError>(started: .whileSubscribed()) { sink in
            log.record(.register) { sinks.withLock { $0.append(sink) } }
            return { log.record(.unregister) {} }
        }
        shared.subscribe().cancel()
        let later = shared.subscribe()
        sinks.value[0].finish(throwing: TestError(code: 1))
        sinks.value[0].finish()
        #expect(log.events == [.register, .unregister, .register])
        #expect(!shared.isFinished)
        #expect(sinks.value[1].send(5).delivered == 1)
        #expect(pollAll(later) == [5])
    }

    // MARK: S10 — a stopped run's elements are never delivered; its end is not the sequence's

    /// An upstream that ignores cancellation hands over one more element
    /// after its run was stopped: it must be dropped, not delivered to the
    /// next run's subscriber.
    // claims: SHARE-STOPPED-RUN, SHARE-IGNORES-CANCELLATION
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s10AStoppedRunsLateElementIsNotDeliveredToTheNextRun() async throws {
        let feed = Feed(of: Never.self, honoursCancellation: false)
        let shared = BroadcastSequence<Int, Never>(started: .whileSubscribed()) { feed.make() }
        let first = shared.subscribe()
        let stale = try await feed.waitForRun(1)
        first.cancel()
        let second = shared.subscribe()
        let current = try await feed.waitForRun(2)
        stale.send(111)
        // Either the stale task let go (dropped the element), or it went
        // back to waiting (the element went somewhere).
        try await waitUntil("the stale run handed over its element") {
            shared.sharingCounters.liveUpstreamTasks == 1 || (stale.pulls == 1 && stale.isWaiting)
        }
        current.send(222)
        #expect(try await take(1, from: second) == [222], "the stopped run's element was delivered")
        #expect(shared.sharingCounters.liveUpstreamTasks == 1, "the stopped run's task kept iterating")
    }

    // claims: SHARE-STOPPED-RUN
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s10AStoppedRunThatEndsDoesNotFinishTheSequence() async throws {
        let feed = Feed(of: Never.self)
        let shared = BroadcastSequence<Int, Never>(started: .whileSubscribed()) { feed.make() }
        let first = shared.subscribe()
        let stopped = try await feed.waitForRun(1)
        first.cancel()
        try #require(stopped.sawCancellation, "cancel() of the last subscriber did not cancel the upstream task")
        // The cancelled upstream ends (returns nil), as AsyncStream does.
        try await waitUntil("the stopped run's task returned") {
            stopped.ended && shared.sharingCounters.liveUpstreamTasks == 0
        }
        #expect(!shared.isFinished, "the end of a stopped run finished the sequence")
        let second = shared.subscribe()
        let current = try await feed.waitForRun(2)
        current.send(5)
        #expect(try await take(1, from: second) == [5])
        // The current run's end does finish it.
        current.finish()
        #expect(try await drain(second) == [])
        #expect(shared.isFinished)
    }

    // claims: SHARE-STOPPED-RUN
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s10AStoppedRunThatThrowsDoesNotFinishTheSequence() async throws {
        let feed = Feed(of: TestError.self, honoursCancellation: false)
        let shared = BroadcastSequence<Int, TestError>(started: .whileSubscribed()) { feed.make() }
        let first = shared.subscribe()
        let stopped = try await feed.waitForRun(1)
        first.cancel()
        stopped.fail(TestError(code: 1))
        try await waitUntil("the stopped run's task returned") { shared.sharingCounters.liveUpstreamTasks == 0 }
        #expect(!shared.isFinished, "the error of a stopped run finished the sequence")
        let second = shared.subscribe()
        let current = try await feed.waitForRun(2)
        current.send(6)
        current.fail(TestError(code: 2))
        #expect(try await events(second) == [.value(6), .error(TestError(code: 2)), .end])
    }
}
