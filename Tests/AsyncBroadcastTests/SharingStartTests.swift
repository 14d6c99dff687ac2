import Foundation
import Testing
@_spi(Testing) @testable import AsyncBroadcast

/// When a shared upstream runs: SHARING 5 (`.eagerly`), 6 (`.lazily`),
/// 7 (`.whileSubscribed`, timed by a `ManualClock`). Test names start with
/// the sentence they check.
@Suite struct SharingStartTests {
    /// A listener sequence whose `register` records itself in `log` and
    /// keeps the latest sink in `sink`.
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    static func listener(
        _ log: ListenerLog, _ sink: Locked<BroadcastSink<Int, Never>?>, started: BroadcastStart,
        replay: Int = 0, sendOnRegister: [Int] = []
    ) -> BroadcastSequence<Int, Never> {
        BroadcastSequence(replay: replay, started: started) { newSink in
            log.record(.register) {
                sink.value = newSink
                for element in sendOnRegister { newSink.send(element) }
            }
            return { log.record(.unregister) {} }
        }
    }

    // MARK: S5 — .eagerly

    // claims: SHARE-EAGERLY
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s5EagerlyStartsInInitWithNoSubscriber() async throws {
        let feed = Feed(of: Never.self)
        let shared = BroadcastSequence<Int, Never>(started: .eagerly) { feed.make() }
        #expect(shared.sharingCounters.starts == 1, "the run starts inside init")
        _ = try await feed.waitForRun(1)
        #expect(shared.subscriberCount == 0)
        #expect(feed.made == 1)
    }

    // claims: SHARE-EAGERLY
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s5EagerlyRegistersInInitWithNoSubscriber() {
        let log = ListenerLog()
        let sink = Locked<BroadcastSink<Int, Never>?>(nil)
        let shared = Self.listener(log, sink, started: .eagerly)
        #expect(log.events == [.register], "register is called inside init")
        // With nobody subscribed, an element reaches no one but is accepted.
        #expect(sink.value!.send(1) == BroadcastSendResult())
        #expect(shared.subscriberCount == 0)
    }

    // claims: SHARE-EAGERLY
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s5EagerlyKeepsRunningWhenSubscribersLeaveUntilTheUpstreamEnds() async throws {
        let feed = Feed(of: Never.self)
        let shared = BroadcastSequence<Int, Never>(started: .eagerly) { feed.make() }
        let run = try await feed.waitForRun(1)
        shared.subscribe().cancel()
        #expect(!run.sawCancellation, "a subscriber leaving stopped an .eagerly upstream")
        #expect(shared.sharingCounters.isRunning && shared.sharingCounters.stops == 0)
        let later = shared.subscribe()
        run.send(1)
        run.finish()
        #expect(try await drain(later) == [1])
        #expect(shared.isFinished)
        #expect(feed.made == 1)
        try await waitUntilRunsAreOver(shared, "the run over")
        #expect(shared.sharingCounters.stops == 1)
    }

    // claims: SHARE-EAGERLY
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s5EagerlyListenerStaysRegisteredWhenSubscribersLeave() {
        let log = ListenerLog()
        let sink = Locked<BroadcastSink<Int, Never>?>(nil)
        let shared = Self.listener(log, sink, started: .eagerly)
        let subscription = shared.subscribe()
        subscription.cancel()
        #expect(log.events == [.register])
        let later = shared.subscribe()
        sink.value!.send(2)
        #expect(pollAll(later) == [2])
        shared.finish()
        #expect(log.events == [.register, .unregister])
    }

    // MARK: S6 — .lazily

    // claims: SHARE-LAZILY
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s6LazilyStartsAtTheFirstSubscriberOnly() async throws {
        let log = ListenerLog()
        let sink = Locked<BroadcastSink<Int, Never>?>(nil)
        let shared = Self.listener(log, sink, started: .lazily, sendOnRegister: [1])
        await Task.yield()
        #expect(log.events.isEmpty, "a .lazily listener registered with no subscriber")
        let first = shared.subscribe()
        #expect(log.events == [.register])
        #expect(pollAll(first) == [1], "the sink called inside register reaches the first subscriber")
        let second = shared.subscribe()
        #expect(log.events == [.register])
        _ = second
    }

    // claims: SHARE-LAZILY
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s6LazilyUpstreamStartsAtTheFirstSubscriber() async throws {
        let feed = Feed(of: Never.self)
        let shared = BroadcastSequence<Int, Never>(started: .lazily) { feed.make() }
        await Task.yield()
        #expect(shared.sharingCounters.starts == 0)
        #expect(feed.made == 0)
        let subscription = shared.subscribe()
        #expect(shared.sharingCounters.starts == 1, "started inside subscribe()")
        _ = try await feed.waitForRun(1)
        _ = shared.subscribe()
        #expect(shared.sharingCounters.starts == 1)
        subscription.cancel()
    }

    // claims: SHARE-LAZILY
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s6MakeAsyncIteratorStartsIt() {
        let log = ListenerLog()
        let sink = Locked<BroadcastSink<Int, Never>?>(nil)
        let shared = Self.listener(log, sink, started: .lazily)
        let iterator = shared.makeAsyncIterator()
        #expect(log.events == [.register])
        _ = iterator
    }

    // claims: SHARE-UNREGISTERED-NO-START
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s6ASubscribeFromACancelledTaskDoesNotStartIt() async throws {
        let log = ListenerLog()
        let sink = Locked<BroadcastSink<Int, Never>?>(nil)
        let shared = Self.listener(log, sink, started: .lazily)
        let ended = try await withDeadline("subscribe from a cancelled task") {
            await Task {
                withUnsafeCurrentTask { $0!.cancel() }
                let subscription = shared.subscribe()
                return subscription.poll().isEnd
            }.value
        }
        #expect(ended)
        #expect(log.events.isEmpty, "a subscribe that did not count started the listener")
        #expect(shared.sharingCounters.starts == 0)
    }

    // claims: SHARE-UNREGISTERED-NO-START
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s6ASubscribeAfterFinishDoesNotStartIt() {
        let log = ListenerLog()
        let sink = Locked<BroadcastSink<Int, Never>?>(nil)
        let shared = Self.listener(log, sink, started: .lazily)
        shared.finish()
        let subscription = shared.subscribe()
        #expect(subscription.poll().isEnd)
        #expect(log.events.isEmpty)
        #expect(shared.sharingCounters == SharingCounters())
    }

    // claims: SHARE-LAZILY
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s6LazilyKeepsRunningWhenSubscribersLeave() async throws {
        let log = ListenerLog()
        let sink = Locked<BroadcastSink<Int, Never>?>(nil)
        let shared = Self.listener(log, sink, started: .lazily)
        shared.subscribe().cancel()
        #expect(log.events == [.register], "a .lazily listener was unregistered when its subscriber left")
        #expect(shared.sharingCounters.isRunning)
        let later = shared.subscribe()
        #expect(log.events == [.register])
        sink.value!.send(3)
        #expect(pollAll(later) == [3])
    }

    // claims: SHARE-LAZILY
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s6LazilyUpstreamKeepsRunningWhenSubscribersLeave() async throws {
        let feed = Feed(of: Never.self)
        let shared = BroadcastSequence<Int, Never>(started: .lazily) { feed.make() }
        let first = shared.subscribe()
        let run = try await feed.waitForRun(1)
        first.cancel()
        #expect(!run.sawCancellation)
        let later = shared.subscribe()
        run.send(4)
        #expect(try await take(1, from: later) == [4])
        #expect(feed.made == 1)
    }

    // MARK: S7 — .whileSubscribed

    // claims: SHARE-WHILE-SUBSCRIBED-STOP
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s7ZeroDelayStopsSynchronouslyInCancel() {
        let log = ListenerLog()
        let sink = Locked<BroadcastSink<Int, Never>?>(nil)
        let shared = Self.listener(log, sink, started: .whileSubscribed())
        #expect(log.events.isEmpty)
        let subscription = shared.subscribe()
        #expect(log.events == [.register])
        subscription.cancel()
        #expect(log.events == [.register, .unregister], "cancel() of the last subscriber did not unregister")
        let counters = shared.sharingCounters
        #expect(!counters.isRunning && counters.starts == 1 && counters.stops == 1 && !counters.isStopPending)
    }

    // claims: SHARE-WHILE-SUBSCRIBED-STOP
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s7ZeroDelayCancelsTheUpstreamTaskInCancel() async throws {
        let feed = Feed(of: Never.self)
        let shared = BroadcastSequence<Int, Never>(started: .whileSubscribed()) { feed.make() }
        let subscription = shared.subscribe()
        let run = try await feed.waitForRun(1)
        subscription.cancel()
        try #require(run.sawCancellation, "cancel() of the last subscriber did not cancel the upstream task")
        try await waitUntil("the upstream task returned") { shared.sharingCounters.liveUpstreamTasks == 0 }
        #expect(!shared.isFinished, "a stopped run's end finished the sequence")
    }

    // claims: SHARE-WHILE-SUBSCRIBED-STOP
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s7ZeroDelayStopsWhenTheLastSubscriptionIsReleased() {
        let log = ListenerLog()
        let sink = Locked<BroadcastSink<Int, Never>?>(nil)
        let shared = Self.listener(log, sink, started: .whileSubscribed())
        do {
            let subscription = shared.subscribe()
            #expect(log.events == [.register])
            _ = subscription
        }
        #expect(log.events == [.register, .unregister])
    }

    // claims: SHARE-WHILE-SUBSCRIBED-STOP
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s7ZeroDelayStopsWhenTheForAwaitLoopEnds() async throws {
        let log = ListenerLog()
        let sink = Locked<BroadcastSink<Int, Never>?>(nil)
        let shared = Self.listener(log, sink, started: .whileSubscribed(), sendOnRegister: [1])
        let first = try await withDeadline("a loop that breaks at the first element") {
            await Task { () -> Int? in
                for await element in shared { return element }
                return nil
            }.value
        }
        #expect(first == 1)
        #expect(log.events == [.register, .unregister])
    }

    // claims: SHARE-WHILE-SUBSCRIBED-STOP
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s7OnlyTheLastSubscriberLeavingStopsIt() {
        let log = ListenerLog()
        let sink = Locked<BroadcastSink<Int, Never>?>(nil)
        let shared = Self.listener(log, sink, started: .whileSubscribed())
        let first = shared.subscribe()
        let second = shared.subscribe()
        first.cancel()
        #expect(log.events == [.register])
        second.cancel()
        #expect(log.events == [.register, .unregister])
    }

    // claims: SHARE-WHILE-SUBSCRIBED-STOP
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s7WithADelayTheStopWaitsForTheFullDelay() async throws {
        let clock = ManualClock()
        let log = ListenerLog()
        let sink = Locked<BroadcastSink<Int, Never>?>(nil)
        let shared = Self.listener(log, sink, started: .whileSubscribed(stopAfter: .seconds(5), clock: clock))
        shared.subscribe().cancel()
        #expect(shared.sharingCounters.isStopPending)
        #expect(shared.sharingCounters.liveTimerTasks == 1)
        #expect(log.events == [.register], "stopped at once despite the delay")
        try await withDeadline("the stop timer asleep") { await clock.waitForSleepers(1) }
        clock.advance(by: .seconds(5) - .nanoseconds(1))
        #expect(clock.sleeperCount == 1)
        #expect(shared.sharingCounters.isStopPending)
        #expect(log.events == [.register], "stopped before the delay had elapsed")
        clock.advance(by: .nanoseconds(1))
        try await waitUntil("the delayed stop") { log.unregisters == 1 }
        try await waitUntil("the timer task returned") { shared.sharingCounters.liveTimerTasks == 0 }
        let counters = shared.sharingCounters
        #expect(!counters.isRunning && !counters.isStopPending && counters.starts == 1 && counters.stops == 1, "\(counters)")
        #expect(log.events == [.register, .unregister])
    }

    // claims: SHARE-PENDING-STOP-CANCELLED
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s7ASubscriberArrivingWhileTheStopIsPendingKeepsTheSameRun() async throws {
        let clock = ManualClock()
        let log = ListenerLog()
        let sink = Locked<BroadcastSink<Int, Never>?>(nil)
        let shared = Self.listener(log, sink, started: .whileSubscribed(stopAfter: .seconds(5), clock: clock))
        shared.subscribe().cancel()
        try await withDeadline("the stop timer asleep") { await clock.waitForSleepers(1) }
        let firstSink = sink.value!
        let later = shared.subscribe()
        #expect(!shared.sharingCounters.isStopPending)
        try await waitUntil("the cancelled timer returned") {
            shared.sharingCounters.liveTimerTasks == 0 && clock.sleeperCount == 0
        }
        clock.advance(by: .seconds(10))
        #expect(log.events == [.register], "the pending stop was not cancelled (or the run restarted)")
        let counters = shared.sharingCounters
        #expect(counters.isRunning && counters.starts == 1 && counters.stops == 0, "\(counters)")
        #expect(firstSink.send(1).delivered == 1, "the same registration still feeds the new subscriber")
        #expect(pollAll(later) == [1])
    }

    // claims: SHARE-PENDING-STOP-CANCELLED
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s7ASubscriberArrivingWhileTheStopIsPendingKeepsTheSameUpstreamTask() async throws {
        let clock = ManualClock()
        let feed = Feed(of: Never.self)
        let shared = BroadcastSequence<Int, Never>(
            started: .whileSubscribed(stopAfter: .seconds(1), clock: clock)) { feed.make() }
        shared.subscribe().cancel()
        let run = try await feed.waitForRun(1)
        try await withDeadline("the stop timer asleep") { await clock.waitForSleepers(1) }
        let later = shared.subscribe()
        try await waitUntil("the cancelled timer returned") { shared.sharingCounters.liveTimerTasks == 0 }
        clock.advance(by: .seconds(2))
        #expect(!run.sawCancellation)
        run.send(5)
        #expect(try await take(1, from: later) == [5])
        #expect(feed.made == 1 && shared.sharingCounters.starts == 1)
    }

    // claims: SHARE-RESTART
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s7AfterAStopTheNextSubscriberStartsAFreshRun() async throws {
        let feed = Feed(of: Never.self)
        let shared = BroadcastSequence<Int, Never>(started: .whileSubscribed()) { feed.make() }
        let first = shared.subscribe()
        let firstRun = try await feed.waitForRun(1)
        firstRun.send(1)
        #expect(try await take(1, from: first) == [1])
        first.cancel()
        let second = shared.subscribe()
        let secondRun = try await feed.waitForRun(2)
        #expect(secondRun.iterators == 1)
        secondRun.send(2)
        #expect(try await take(1, from: second) == [2])
        #expect(shared.sharingCounters.starts == 2 && shared.sharingCounters.stops == 1)
    }

    // claims: SHARE-RESTART
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s7AfterADelayedStopTheNextSubscriberRegistersAgain() async throws {
        let clock = ManualClock()
        let log = ListenerLog()
        let sink = Locked<BroadcastSink<Int, Never>?>(nil)
        let shared = Self.listener(log, sink, started: .whileSubscribed(stopAfter: .seconds(1), clock: clock))
        shared.subscribe().cancel()
        try await withDeadline("the stop timer asleep") { await clock.waitForSleepers(1) }
        clock.advance(by: .seconds(1))
        try await waitUntil("the delayed stop") { log.unregisters == 1 }
        let later = shared.subscribe()
        // The timer's task performed the stop and may still hold the role of
        // starting and stopping runs: then it, not subscribe(), registers.
        // `registers` counts a register as its body starts: wait for the body
        // (which stores the new sink) to finish too.
        try await waitUntil("registered again") { log.registers == 2 && log.isOutside }
        #expect(log.events == [.register, .unregister, .register])
        sink.value!.send(7)
        #expect(pollAll(later) == [7])
        try await waitUntil("no timer left") { shared.sharingCounters.liveTimerTasks == 0 }
    }

    // claims: SHARE-REPLAY-CARRIES
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s7TheReplayWindowCarriesOverAcrossRuns() {
        let log = ListenerLog()
        let sink = Locked<BroadcastSink<Int, Never>?>(nil)
        let runs = Locked(0)
        let shared = BroadcastSequence<Int, Never>(replay: 2, started: .whileSubscribed()) { newSink in
            let run = runs.withLock { $0 += 1; return $0 }
            log.record(.register) {
                sink.value = newSink
                if run == 2 { newSink.send(10) }
            }
            return { log.record(.unregister) {} }
        }
        let first = shared.subscribe()
        for element in [1, 2, 3] { sink.value!.send(element) }
        #expect(pollAll(first) == [1, 2, 3])
        first.cancel()
        #expect(log.events == [.register, .unregister])
        let second = shared.subscribe()
        #expect(log.events == [.register, .unregister, .register])
        #expect(pollAll(second) == [2, 3, 10], "the replay window of the first run, then the second run's element")
    }
}
