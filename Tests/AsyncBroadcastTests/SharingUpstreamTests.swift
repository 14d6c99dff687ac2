import Foundation
import Testing
@_spi(Testing) @testable import AsyncBroadcast

/// Sharing an upstream `AsyncSequence`: SHARING 1 (one iteration, in a
/// library task), 2 (delivered as `emit`), 3 (the upstream's end and error
/// finish the sequence), 4 and 11 (release and `finish()` stop it, nothing
/// outlives the sequence). Test names start with the sentence they check.
@Suite struct SharingUpstreamTests {
    // MARK: S1 — one iteration for every subscriber, in a task the library owns

    // claims: SHARE-ONE-ITERATION
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s1NSubscribersShareOneUpstreamCallAndOneIteration() async throws {
        let feed = Feed(of: Never.self)
        let shared = BroadcastSequence<Int, Never>(started: .lazily) { feed.make() }
        let subscriptions = (0..<3).map { _ in shared.subscribe() }
        // A `for await` loop over the sequence itself is a subscriber too.
        let loop = Task {
            var seen: [Int] = []
            for await element in shared { seen.append(element) }
            return seen
        }
        try await waitUntil("four subscribers") { shared.subscriberCount == 4 }
        let run = try await feed.waitForRun(1)
        run.send(contentsOf: 0..<5)
        run.finish()
        for subscription in subscriptions {
            #expect(try await drain(subscription) == [0, 1, 2, 3, 4])
        }
        #expect(try await withDeadline("the for-await subscriber") { await loop.value } == [0, 1, 2, 3, 4])
        #expect(feed.made == 1, "upstream() called \(feed.made) times for 4 subscribers")
        #expect(run.iterators == 1, "the upstream was iterated \(run.iterators) times")
        #expect(run.pulls == 6, "5 elements and the end, pulled once each")
        #expect(shared.sharingCounters.starts == 1)
    }

    // claims: SHARE-UPSTREAM-IN-LIBRARY-TASK
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s1UpstreamIsCalledInALibraryTaskNotOnTheSubscribersThread() async throws {
        let feed = Feed(of: Never.self)
        let shared = BroadcastSequence<Int, Never>(started: .lazily) { feed.make() }
        // The subscribing thread stays alive until upstream() has been
        // called, so the two thread identities cannot be the same object
        // reused.
        let (subscription, subscriberThread) = try await onThread("subscribe from a plain thread") {
            let subscription = shared.subscribe()
            while feed.made == 0 { sched_yield() }
            return (subscription, ObjectIdentifier(Thread.current))
        }
        let site = try #require(feed.callSites.first)
        #expect(site.inTask, "upstream() must run inside a task")
        #expect(site.thread != subscriberThread, "upstream() ran on the subscriber's thread")
        subscription.cancel()
    }

    // claims: SHARE-UPSTREAM-IN-LIBRARY-TASK
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s1UpstreamRunsDetachedFromTheSubscribersTask() async throws {
        let feed = Feed(of: Never.self)
        let shared = BroadcastSequence<Int, Never>(started: .lazily) { feed.make() }
        let subscription = FeedMarker.$value.withValue(7) { shared.subscribe() }
        _ = try await feed.waitForRun(1)
        let site = try #require(feed.callSites.first)
        #expect(site.inTask)
        #expect(site.marker == nil, "upstream() inherited the subscriber's task-local value: not detached")
        subscription.cancel()
    }

    // MARK: S2 — each element is delivered as `emit` would

    // claims: SHARE-BACKPRESSURE
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s2AFullBoundedSubscriberMakesTheUpstreamWait() async throws {
        let feed = Feed(of: Never.self)
        let shared = BroadcastSequence<Int, Never>(bufferingPolicy: .bounded(2), started: .lazily) { feed.make() }
        let subscription = shared.subscribe()
        let run = try await feed.waitForRun(1)
        run.send(contentsOf: 0..<10)
        try await waitUntil("the upstream waits for room") { shared.waitingEmitterCount == 1 }
        // Two buffered, the third pulled and waiting in emit: the iteration
        // cannot pull a fourth until emit returns.
        #expect(run.pulls == 3, "the upstream ran ahead of a full bounded subscriber: \(run.pulls) pulled")
        #expect(pollOne(subscription) == 0)
        try await waitUntil("the waiting element delivered, the next one waiting") {
            shared.waitingEmitterCount == 1 && run.pulls == 4
        }
        #expect(try await take(9, from: subscription) == Array(1..<10))
        #expect(subscription.droppedCount == 0)
    }

    // claims: SHARE-LOSSY-NEVER-WAIT
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test(arguments: [BroadcastBufferingPolicy.unbounded, .bufferingNewest(2), .bufferingOldest(2)])
    func s2OtherPoliciesNeverMakeTheUpstreamWait(policy: BroadcastBufferingPolicy) async throws {
        let feed = Feed(of: Never.self)
        let shared = BroadcastSequence<Int, Never>(bufferingPolicy: policy, started: .lazily) { feed.make() }
        let subscription = shared.subscribe()  // never read until the upstream has ended
        let run = try await feed.waitForRun(1)
        run.send(contentsOf: 0..<10)
        run.finish()
        try await waitUntil("the upstream ran to its end past an unread subscriber") { shared.isFinished }
        #expect(run.pulls == 11)
        let expected: [Int]
        switch policy {
        case .bufferingNewest: expected = [8, 9]
        case .bufferingOldest: expected = [0, 1]
        default: expected = Array(0..<10)
        }
        #expect(pollAll(subscription) == expected)
        #expect(subscription.poll().isEnd)
    }

    // claims: SHARE-SINK-NEVER-WAITS
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s2ARegisterSinkDeliversToAFullBoundedSubscriberAnyway() async throws {
        let sink = Locked<BroadcastSink<Int, Never>?>(nil)
        let shared = BroadcastSequence<Int, Never>(bufferingPolicy: .bounded(2), started: .lazily) { newSink in
            sink.value = newSink
            return {}
        }
        let subscription = shared.subscribe()
        let results = (0..<5).map { sink.value!.send($0) }
        #expect(results.allSatisfy { $0 == BroadcastSendResult(delivered: 1) }, "\(results)")
        #expect(pollAll(subscription) == [0, 1, 2, 3, 4])
    }

    // MARK: S3 — the upstream's end or error finishes the sequence

    // claims: SHARE-UPSTREAM-END-FINISHES
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s3UpstreamEndFinishesTheSequenceAfterSubscribersDrain() async throws {
        let feed = Feed(of: Never.self)
        let shared = BroadcastSequence<Int, Never>(started: .lazily) { feed.make() }
        let first = shared.subscribe()
        let second = shared.subscribe()
        let run = try await feed.waitForRun(1)
        run.send(contentsOf: [1, 2, 3])
        run.finish()
        #expect(try await drain(first) == [1, 2, 3])
        #expect(try await drain(second) == [1, 2, 3])
        #expect(shared.isFinished)
        #expect(shared.send(4).isFinished)
    }

    // claims: SHARE-UPSTREAM-END-FINISHES
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s3UpstreamErrorIsThrownOnceAfterTheBuffer() async throws {
        let feed = Feed(of: TestError.self)
        let shared = BroadcastSequence<Int, TestError>(started: .lazily) { feed.make() }
        let first = shared.subscribe()
        let second = shared.subscribe()
        let run = try await feed.waitForRun(1)
        run.send(contentsOf: [1, 2])
        run.fail(TestError(code: 7))
        let expected: [ValueEvent<Int>] = [.value(1), .value(2), .error(TestError(code: 7)), .end]
        #expect(try await events(first) == expected)
        #expect(try await events(second) == expected)
        #expect(shared.isFinished)
        // A late subscriber gets the same error.
        #expect(try await events(shared.subscribe()) == [.error(TestError(code: 7)), .end])
    }

    // claims: SHARE-UNTYPED-ERROR
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s3UntypedUpstreamErrorFinishesTheSequence() async throws {
        let feed = Feed(of: TestError.self)
        let shared = BroadcastSequence<Int, any Error>(started: .lazily, upstream: { feed.make() })
        let subscription = shared.subscribe()
        let run = try await feed.waitForRun(1)
        run.send(1)
        run.fail(TestError(code: 3))
        let seen = try await withDeadline("untyped subscriber") { () -> ([Int], TestError?) in
            var elements: [Int] = []
            do {
                for try await element in subscription { elements.append(element) }
                return (elements, nil)
            } catch {
                return (elements, error as? TestError)
            }
        }
        #expect(seen.0 == [1])
        #expect(seen.1 == TestError(code: 3))
    }

    // claims: SHARE-UPSTREAM-END-FINISHES, SHARE-UNREGISTER-ONCE
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s3SinkFinishEndsTheSequenceAndUnregistersExactlyOnce() async throws {
        let log = ListenerLog()
        let sink = Locked<BroadcastSink<Int, Never>?>(nil)
        let shared = BroadcastSequence<Int, Never>(started: .lazily) { newSink in
            log.record(.register) { sink.value = newSink }
            return { log.record(.unregister) {} }
        }
        let subscription = shared.subscribe()
        sink.value!.send(1)
        sink.value!.finish()
        #expect(log.unregisters == 1, "sink.finish() stops the registration before it returns")
        #expect(shared.isFinished)
        sink.value!.finish()
        #expect(sink.value!.send(2).isFinished)
        #expect(try await drain(subscription) == [1])
        #expect(log.events == [.register, .unregister])
        #expect(shared.sharingCounters.starts == 1 && shared.sharingCounters.stops == 1)
    }

    // claims: SHARE-UPSTREAM-END-FINISHES, SHARE-UNREGISTER-ONCE
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s3SinkFinishThrowingEndsWithThatErrorAndUnregistersExactlyOnce() async throws {
        let log = ListenerLog()
        let sink = Locked<BroadcastSink<Int, TestError>?>(nil)
        let shared = BroadcastSequence<Int, TestError>(started: .lazily) { newSink in
            log.record(.register) { sink.value = newSink }
            return { log.record(.unregister) {} }
        }
        let subscription = shared.subscribe()
        sink.value!.send(1)
        sink.value!.finish(throwing: TestError(code: 5))
        #expect(log.unregisters == 1)
        sink.value!.finish(throwing: TestError(code: 6))
        sink.value!.finish()
        #expect(try await events(subscription) == [.value(1), .error(TestError(code: 5)), .end])
        #expect(log.events == [.register, .unregister])
    }

    // MARK: S4, S11 — release and finish() stop the upstream; nothing outlives the sequence

    // claims: SHARE-RELEASE-STOPS
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s4ReleasingTheSequenceCancelsTheUpstreamTask() async throws {
        let feed = Feed(of: Never.self)
        var shared: BroadcastSequence<Int, Never>? = BroadcastSequence(started: .lazily) { feed.make() }
        let weak = WeakBox(shared)
        let storage = shared!.storage
        let subscription = shared!.subscribe()
        let run = try await feed.waitForRun(1)
        run.send(1)
        try await waitUntil("element delivered") { run.pulls == 1 && run.isWaiting }
        shared = nil
        #expect(weak.isNil)
        // The task waits in the upstream's next(): cancelling it runs the
        // upstream's cancellation handler before cancel() returns.
        try #require(run.sawCancellation, "releasing the sequence did not cancel the upstream task")
        #expect(try await drain(subscription) == [1])
        try await waitUntil("the upstream task returned") { storage.sharingCounters.liveUpstreamTasks == 0 }
        let counters = storage.sharingCounters
        #expect(counters.starts == 1 && counters.stops == 1 && !counters.isRunning, "\(counters)")
        #expect(run.ended)
    }

    // claims: SHARE-RELEASE-STOPS, SHARE-UNREGISTER-ONCE
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s4ReleasingTheSequenceCallsUnregisterExactlyOnce() async throws {
        let log = ListenerLog()
        var shared: BroadcastSequence<Int, Never>? = BroadcastSequence(started: .lazily) { _ in
            log.record(.register) {}
            return { log.record(.unregister) {} }
        }
        let storage = shared!.storage
        let subscription = shared!.subscribe()
        #expect(log.events == [.register])
        shared = nil
        #expect(log.events == [.register, .unregister])
        subscription.cancel()
        #expect(log.events == [.register, .unregister])
        #expect(storage.sharingCounters.starts == storage.sharingCounters.stops)
    }

    // claims: SHARE-RELEASE-STOPS
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s4FinishStopsTheUpstreamTask() async throws {
        let feed = Feed(of: Never.self)
        let shared = BroadcastSequence<Int, Never>(started: .lazily) { feed.make() }
        let subscription = shared.subscribe()
        let run = try await feed.waitForRun(1)
        shared.finish()
        try #require(run.sawCancellation, "finish() did not cancel the upstream task")
        #expect(try await drain(subscription) == [])
        try await waitUntil("the upstream task returned") { shared.sharingCounters.liveUpstreamTasks == 0 }
        let counters = shared.sharingCounters
        #expect(counters.starts == 1 && counters.stops == 1 && !counters.isRunning, "\(counters)")
    }

    // claims: SHARE-RELEASE-STOPS, SHARE-UNREGISTER-ONCE
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s4FinishCallsUnregisterExactlyOnce() async throws {
        let log = ListenerLog()
        var shared: BroadcastSequence<Int, Never>? = BroadcastSequence(started: .lazily) { _ in
            log.record(.register) {}
            return { log.record(.unregister) {} }
        }
        let subscription = shared!.subscribe()
        shared!.finish()
        #expect(log.events == [.register, .unregister])
        shared!.finish()
        subscription.cancel()
        shared = nil
        #expect(log.events == [.register, .unregister], "unregister called again by a later finish or the release")
    }

    // claims: SHARE-NOTHING-LEFT
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s11ReleasingWhileAStopIsPendingLeavesNoTaskBehind() async throws {
        let clock = ManualClock()
        let feed = Feed(of: Never.self)
        var shared: BroadcastSequence<Int, Never>? = BroadcastSequence(
            started: .whileSubscribed(stopAfter: .seconds(5), clock: clock)) { feed.make() }
        let storage = shared!.storage
        let subscription = shared!.subscribe()
        let run = try await feed.waitForRun(1)
        subscription.cancel()
        try await withDeadline("the stop timer asleep") { await clock.waitForSleepers(1) }
        #expect(storage.sharingCounters.isStopPending)
        shared = nil
        try #require(run.sawCancellation, "releasing the sequence did not cancel the upstream task")
        try await waitUntil("the timer and upstream tasks returned") {
            let counters = storage.sharingCounters
            return counters.liveTimerTasks == 0 && counters.liveUpstreamTasks == 0
        }
        let counters = storage.sharingCounters
        #expect(counters.starts == 1 && counters.stops == 1 && !counters.isStopPending, "\(counters)")
        #expect(clock.sleeperCount == 0)
    }

    /// `broadcast()` iterates the same sequence at every run: an
    /// `AsyncStream` that the first run's stop ended has nothing left for the
    /// second run, which ends at once and finishes the shared sequence.
    // claims: SHARE-BROADCAST-SINGLE-PASS
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func aSinglePassUpstreamsSecondRunEndsAtOnceAndFinishesTheSequence() async throws {
        let (stream, continuation) = AsyncStream<Int>.makeStream()
        let terminated = Locked(false)
        continuation.onTermination = { _ in terminated.withLock { $0 = true } }
        let shared = stream.broadcast(started: .whileSubscribed())
        let first = shared.subscribe()
        continuation.yield(1)
        #expect(try await take(1, from: first) == [1])
        first.cancel()  // the run stops: its task is cancelled, which ends the stream
        try await waitUntil("the stream ended by the first run's stop") { terminated.value }
        let second = shared.subscribe()
        #expect(try await drain(second) == [])
        #expect(shared.isFinished)
    }
}
