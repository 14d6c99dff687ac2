import Foundation
import Testing
@_spi(Testing) @testable import AsyncBroadcast
import AsyncBroadcastTestSupport

/// The defects an outside client found in the v5 surface: each test failed
/// on the code before its fix (and fails with the fault switch that puts the
/// old behaviour back: `scripts/test-faults.sh`).
@Suite struct CoreV6DefectTests {
    typealias Topics = BroadcastTopics<String, Int, Never>

    // MARK: Eviction: the hard limit asks what the send adds

    // claims: EVICT-LOSSY-NEVER-HARD
    @Test(arguments: [BroadcastBufferingPolicy.bufferingNewest(2), .bufferingOldest(2)])
    func aReplayOverfilledLossySubscriberIsNotEvictedByASendThatAddsNothing(policy: BroadcastBufferingPolicy) async throws {
        let sequence = BroadcastSequence(of: Int.self, replay: 10)
        for value in 1...10 { sequence.send(value) }
        let subscription = sequence.subscribe(bufferingPolicy: policy, eviction: .hardLimit(5))
        #expect(subscription.bufferedCount == 10, "replay fills past the policy's capacity")
        let result = sequence.send(11)
        #expect(result.evicted == 0, "the send added nothing: \(result)")
        #expect(result.dropped == 1, "a full lossy policy drops one: \(result)")
        #expect(!subscription.isEvicted)
        #expect(subscription.bufferedCount == 10)
        sequence.finish()
        let expected = policy == .bufferingOldest(2) ? Array(1...10) : Array(2...11)
        #expect(try await drain(subscription) == expected)
    }

    // claims: EVICT-LOSSY-NEVER-HARD
    @Test func aReplayOverfilledUnboundedSubscriberIsStillEvictedByTheSendThatGrowsIt() {
        let sequence = BroadcastSequence(of: Int.self, replay: 10)
        for value in 1...10 { sequence.send(value) }
        let subscription = sequence.subscribe(bufferingPolicy: .unbounded, eviction: .hardLimit(5))
        #expect(sequence.send(11) == BroadcastSendResult(evicted: 1))
        #expect(subscription.isEvicted)
    }

    // MARK: Lag: the last gap before the end

    // claims: EVENTS-LAGGED-SUM
    @Test(arguments: [BroadcastBufferingPolicy.bufferingNewest(2), .bufferingOldest(2)])
    func anEvictedLossySubscriberReportsItsLastGapBeforeTheEnd(policy: BroadcastBufferingPolicy) async throws {
        let clock = ManualClock()
        let sequence = BroadcastSequence(of: Int.self)
        let subscription = sequence.subscribe(bufferingPolicy: policy, eviction: .softLimit(1, for: .seconds(1)),
                                              clock: clock)
        for value in 1...4 { sequence.send(value) }  // holds 2, dropped 2, over the soft limit since the 2nd send
        #expect(subscription.droppedCount == 2)
        clock.advance(by: .seconds(1))
        #expect(sequence.send(5).evicted == 1)
        #expect(subscription.isEvicted)
        let events = try await withDeadline("the evicted events reader") { () -> [BroadcastEvent<Int>] in
            var result: [BroadcastEvent<Int>] = []
            for await event in subscription.events { result.append(event) }
            return result
        }
        #expect(events == [.lagged(2)], "what it held is discarded; the gap is reported before the end")
        #expect(lagSum(events) == subscription.droppedCount)
    }

    // claims: EVENTS-LAGGED-SUM
    @Test func aCancelledLossySubscriberReportsItsLastGapBeforeTheEnd() async throws {
        let sequence = BroadcastSequence(of: Int.self)
        let subscription = sequence.subscribe(bufferingPolicy: .bufferingNewest(1))
        for value in 1...3 { sequence.send(value) }
        subscription.cancel()
        var iterator = subscription.events.makeAsyncIterator()
        #expect(await iterator.next() == .lagged(2))
        #expect(await iterator.next() == nil)
        #expect(subscription.droppedCount == 2)
    }

    // claims: EVENTS-LAGGED-SUM
    @Test func aReaderWhoseTaskIsCancelledReportsItsLastGapBeforeTheEnd() async throws {
        let sequence = BroadcastSequence(of: Int.self)
        let subscription = sequence.subscribe(bufferingPolicy: .bufferingOldest(1))
        for value in 1...3 { sequence.send(value) }
        let events = await Task { () -> [BroadcastEvent<Int>] in
            withUnsafeCurrentTask { $0!.cancel() }
            var result: [BroadcastEvent<Int>] = []
            for await event in subscription.events { result.append(event) }
            return result
        }.value
        #expect(events == [.lagged(2)])
        #expect(subscription.droppedCount == 2)
        #expect(sequence.subscriberCount == 0)
    }

    // MARK: Topics: a cancelled subscribe never makes a topic live

    // claims: TOPIC-CANCELLED-NOT-LIVE
    @Test func aCancelledSubscribeLeavesNoWindowInWhichATopicKeepsSends() async {
        let topics = Topics(replay: 4)
        let inWindow = Locked<(BroadcastSendResult, Topics.Subscription)?>(nil)
        let ran = Locked(false)
        let liveInWindow = Locked(-1)
        topics._runAfterSubscribeUnlocks {
            // Once: in the cancelled subscribe's window, a send and a real
            // subscriber (whose own subscribe runs this hook again).
            guard !ran.withLock({ let was = $0; $0 = true; return was }) else { return }
            liveInWindow.value = topics.topicCount
            let sent = topics.send(1, to: "a")
            // Not from the cancelled task (this hook runs inside its call).
            inWindow.value = (sent, onPlainThread { topics.subscribe(to: "a") })
        }
        let cancelled = await Task {
            withUnsafeCurrentTask { $0!.cancel() }
            return topics.subscribe(to: "a")
        }.value
        #expect(cancelled.poll().isEnd)
        guard let (sent, real) = inWindow.value else {
            Issue.record("the hook did not run")
            return
        }
        #expect(liveInWindow.value == 0, "the cancelled subscribe made the topic live")
        #expect(sent == BroadcastSendResult(), "a send while no real subscriber existed must reach nobody")
        #expect(pollAll(real) == [], "the real subscriber started with an element sent before it subscribed")
        #expect(topics.send(2, to: "a") == BroadcastSendResult(delivered: 1))
        #expect(pollAll(real) == [2])
    }

    // MARK: Topics: a subscribe that completes after finish(topic:) lands on a live generation

    // claims: TOPIC-SUBSCRIBE-FINISH-RACE
    @Test func aFinishBetweenRegistrationAndReturnDoesNotEndTheNewSubscriber() async throws {
        let topics = Topics(replay: 1)
        let early = topics.subscribe(to: "a")
        topics.send(1, to: "a")
        let finished = Locked(false)
        topics._runAfterSubscribeUnlocks {
            guard !finished.value else { return }
            finished.value = true
            topics.finish(topic: "a")
        }
        let subscription = topics.subscribe(to: "a")
        #expect(finished.value)
        #expect(try await drain(early) == [1], "finish(topic:) ended the subscribers it found")
        #expect(topics.send(2, to: "a") == BroadcastSendResult(delivered: 1),
                "the subscribe returned after the finish: it must be on the live generation")
        #expect(pollAll(subscription) == [2])
        #expect(topics.subscriberCount(of: "a") == 1)
    }

    // claims: TOPIC-SUBSCRIBE-FINISH-RACE
    @Test func aFinishDuringTheListenersRegisterDoesNotEndTheNewSubscriber() async throws {
        let registrations = Locked(0)
        let topicsBox = Locked<Topics?>(nil)
        let topics = Topics(register: { topic, _ in
            // The first registration: the topic is finished while its
            // first subscriber's `subscribe(to:)` is still in `register`.
            if registrations.withLock({ $0 += 1; return $0 }) == 1 { topicsBox.value?.finish(topic: topic) }
            return {}
        })
        topicsBox.value = topics
        let subscription = topics.subscribe(to: "a")
        #expect(topics.send(1, to: "a") == BroadcastSendResult(delivered: 1))
        #expect(pollAll(subscription) == [1])
        #expect(!subscription.poll().isEnd, "the subscriber is live, not ended")
        topicsBox.value = nil
    }

    // MARK: Siblings a review found

    // claims: TOPIC-SUBSCRIBE-FINISH-RACE
    @Test func aRegisterThatFinishesItsOwnTopicEndsItsFirstSubscriberOnce() async throws {
        let registrations = Locked(0)
        let topics = Topics(register: { _, sink in
            registrations.withLock { $0 += 1 }
            sink.finish()  // e.g. a listener that refuses an unknown topic
            return {}
        })
        let subscription = try await onThread("subscribe(to:) with a register that finishes its topic") {
            topics.subscribe(to: "a")
        }
        #expect(registrations.value == 1, "the subscribe must not start the topic again and again")
        #expect(subscription.poll().isEnd, "the listener ended the topic: its subscriber ends")
    }

    // claims: TOPIC-LISTENERS-STOPPED
    @Test func aListenRunCountsFromTheMomentItsStartIsDecided() async throws {
        let listens = Locked(0)
        let topics = Topics(listen: { _, _ in
            listens.withLock { $0 += 1 }
            return {}
        })
        let subscription = topics.subscribe(to: "a")
        // The `listen` task may not have run yet; the run counts already,
        // so a `finish()` + `listenersStopped()` now waits for it.
        #expect(topics._runningListenerCount == 1)
        topics.finish()
        try await withDeadline("listenersStopped after finish") { await topics.listenersStopped() }
        #expect(listens.value == 1, "listenersStopped() returned before the decided listen had run")
        #expect(topics._runningListenerCount == 0)
        withExtendedLifetime(subscription) {}
    }

    // claims: TOPIC-CANCELLED-NOT-LIVE
    @Test func aTopicGenerationWithoutSubscribersKeepsNothing() {
        // The registry retires an emptied generation after the sequence
        // lock; until then (here: never, the observer does nothing) a send
        // must keep nothing for a subscriber that arrives in between.
        let storage = BroadcastStorage<Int, Never>(defaultPolicy: .unbounded, replay: 2, topicObserver: { _ in })
        let first = storage.subscribe(policy: .unbounded)
        #expect(storage.send(1).delivered == 1)
        first.cancel()
        #expect(storage.send(2) == BroadcastSendResult())
        [3, 4].withUnsafeBufferPointer { _ = storage.send(batch: $0) }
        let late = storage.subscribe(policy: .unbounded)
        var held: [Int] = []
        while case .element(let element) = late.poll() { held.append(element) }
        #expect(held == [1], "only what was sent while the topic had a subscriber")
    }

    /// Runs `body` on a thread of its own, outside any task, and waits.
    private func onPlainThread<T: Sendable>(_ body: @escaping @Sendable () -> T) -> T {
        let result = Locked<T?>(nil)
        let done = DispatchSemaphore(value: 0)
        Thread {
            result.value = body()
            done.signal()
        }.start()
        done.wait()
        return result.value!
    }

    private func lagSum(_ events: [BroadcastEvent<Int>]) -> Int {
        events.reduce(0) { total, event in
            if case .lagged(let n) = event { return total + n }
            return total
        }
    }
}
