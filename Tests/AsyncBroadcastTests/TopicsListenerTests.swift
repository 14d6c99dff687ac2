import Foundation
import Testing
@_spi(Testing) @testable import AsyncBroadcast

/// `BroadcastTopics` fed by a listener per topic: `register(topic, sink)` at
/// a topic's first subscriber, its unregister `stopAfter` after the last one
/// left, never overlapping.
@Suite struct TopicsListenerTests {
    typealias Topics = BroadcastTopics<String, Int, Never>

    /// Per-topic logs of register/unregister calls, and the latest sink.
    final class Listeners: Sendable {
        private let logs = Locked<[String: ListenerLog]>([:])
        let sinks = Locked<[String: BroadcastSink<Int, Never>]>([:])
        /// Unregister closures wait while this is set (to hold a stop open).
        let holdUnregister = Locked(false)
        let unregistering = Locked(0)

        func log(_ topic: String) -> ListenerLog {
            logs.withLock { logs in
                if let log = logs[topic] { return log }
                let log = ListenerLog()
                logs[topic] = log
                return log
            }
        }

        var allLogs: [ListenerLog] { logs.withLock { Array($0.values) } }

        @Sendable func register(_ topic: String, _ sink: BroadcastSink<Int, Never>) -> @Sendable () -> Void {
            log(topic).record(.register) { sinks.withLock { $0[topic] = sink } }
            return {
                self.log(topic).record(.unregister) {
                    self.unregistering.withLock { $0 += 1 }
                    while self.holdUnregister.value { sched_yield() }
                    self.unregistering.withLock { $0 -= 1 }
                }
            }
        }
    }

    // claims: TOPIC-REGISTER-LIFECYCLE
    @available(macOS 13, iOS 16, tvOS 16, watchOS 9, *)
    @Test func aTopicRegistersAtItsFirstSubscriberAndUnregistersWhenItsLastLeaves() {
        let listeners = Listeners()
        let topics = Topics(register: listeners.register)
        let a1 = topics.subscribe(to: "a")
        let a2 = topics.subscribe(to: "a")
        #expect(listeners.log("a").events == [.register])
        #expect(listeners.sinks.value["a"]!.send(1) == BroadcastSendResult(delivered: 2))
        #expect(pollAll(a1) == [1])
        a1.cancel()
        #expect(listeners.log("a").events == [.register])
        a2.cancel()
        #expect(listeners.log("a").events == [.register, .unregister])
        #expect(topics.topicCount == 0)
        // A late callback from the unregistered listener reaches nobody.
        #expect(listeners.sinks.value["a"]!.send(2).delivered == 0)
        let again = topics.subscribe(to: "a")
        #expect(listeners.log("a").events == [.register, .unregister, .register])
        #expect(pollAll(again) == [])
    }

    /// A topic whose last subscriber left is finished as idle first and
    /// taken out of the registry after. A subscribe in between finds it
    /// finished; its run has stopped, so the new topic's `register` runs in
    /// that subscribe, on its thread. (Treated like a topic whose
    /// unregister may still run, it made the new topic wait, and the
    /// leaver's notice, finishing meanwhile, started it on the leaver's
    /// thread.) Each step waits for the previous one's flag, never for time.
    // claims: TOPIC-REGISTER-LIFECYCLE
    @available(macOS 13, iOS 16, tvOS 16, watchOS 9, *)
    @Test func aSubscribeWhileTheLastLeaveRetiresTheTopicRegistersOnItsOwnThread() async throws {
        let registerThreads = Locked<[Int]>([])
        let topics = Topics(register: { _, _ in
            registerThreads.withLock { $0.append(Lock.currentThreadID()) }
            return {}
        })
        let noticePaused = Locked(false)
        let noticeMayGo = Locked(false)
        let leaveReturned = Locked(false)
        topics._runBetweenNoticePhases { retiredAsIdle in
            // The leaver's notice, having finished the topic as idle.
            guard retiredAsIdle, !noticePaused.value else { return }
            noticePaused.value = true
            while !noticeMayGo.value { sched_yield() }
        }
        topics._runAfterSubscribeUnlocks {
            // The racing subscribe, past its shard lock: let the notice
            // finish, and wait until the leave has returned.
            guard noticePaused.value, !noticeMayGo.value else { return }
            noticeMayGo.value = true
            while !leaveReturned.value { sched_yield() }
        }
        let joinerThread = Locked(0)
        try await raceOnThreads(2, "a subscribe between an idle retirement and its removal") { role in
            if role == 0 {
                topics.subscribe(to: "a").cancel()
                leaveReturned.value = true
            } else {
                while !noticePaused.value { sched_yield() }
                joinerThread.value = Lock.currentThreadID()
                topics.subscribe(to: "a").cancel()
            }
        }
        let threads = registerThreads.value
        #expect(threads.count == 2)
        #expect(threads.last == joinerThread.value, "the second register ran on another thread than its subscribe's")
        #expect(topics.topicCount == 0)
    }

    // claims: TOPIC-LIVE-STOPAFTER, TOPIC-STOPAFTER-REPLAY-ONLY, TOPIC-REPLAY-WINDOW
    @available(macOS 13, iOS 16, tvOS 16, watchOS 9, *)
    @Test func aSubscriberThatComesBackWithinStopAfterKeepsTheSameListener() async throws {
        let clock = ManualClock()
        let listeners = Listeners()
        let topics = Topics(replay: 1, stopAfter: .seconds(5), clock: clock, register: listeners.register)
        topics.subscribe(to: "a").cancel()
        #expect(topics.topicCount == 1, "the topic is live during stopAfter")
        try await withDeadline("the stop timer asleep") { await clock.waitForSleepers(1) }
        // Sent during stopAfter: only the replay window keeps it.
        #expect(listeners.sinks.value["a"]!.send(7) == BroadcastSendResult())
        clock.advance(by: .seconds(4))
        let back = topics.subscribe(to: "a")
        #expect(pollAll(back) == [7], "the replay window did not live with the topic")
        try await waitUntil("the cancelled timer is gone") { clock.sleeperCount == 0 }
        clock.advance(by: .seconds(10))
        #expect(listeners.log("a").events == [.register], "the listener was restarted")
        back.cancel()
        try await withDeadline("the stop timer asleep again") { await clock.waitForSleepers(1) }
        clock.advance(by: .seconds(5))
        try await waitUntil("the delayed stop") { listeners.log("a").unregisters == 1 }
        try await waitUntil("the topic is gone") { topics.topicCount == 0 }
        let fresh = topics.subscribe(to: "a")
        #expect(pollAll(fresh) == [], "a topic that had gone came back with its replay window")
        #expect(listeners.log("a").events == [.register, .unregister, .register])
    }

    // claims: TOPIC-FINISH-ONE, TOPIC-REGISTER-ALTERNATE
    @available(macOS 13, iOS 16, tvOS 16, watchOS 9, *)
    @Test func finishingATopicUnregistersAtOnceAndARestartWaitsForTheUnregisterToReturn() async throws {
        let clock = ManualClock()
        let listeners = Listeners()
        let topics = Topics(stopAfter: .seconds(60), clock: clock, register: listeners.register)
        let old = topics.subscribe(to: "a")
        listeners.holdUnregister.value = true
        // finish(topic:) runs the unregister, which we hold open, on a
        // thread of its own (not a task: it would hold a cooperative pool
        // thread, two here, while it waits).
        let finished = Locked(false)
        Thread.detachNewThread {
            topics.finish(topic: "a")
            finished.value = true
        }
        try await waitUntil("the unregister is running") { listeners.unregistering.value == 1 }
        #expect(old.poll().isEnd)
        let fresh = topics.subscribe(to: "a")
        topics.send(1, to: "a")
        #expect(pollAll(fresh) == [1], "the new topic is live at once, for sends")
        #expect(listeners.log("a").events == [.register, .unregister], "register ran while the previous unregister was still running")
        listeners.holdUnregister.value = false
        try await waitUntil("finish(topic:) returns") { finished.value }
        try await waitUntil("the new topic's register") { listeners.log("a").registers == 2 }
        #expect(listeners.log("a").overlaps == 0)
        #expect(listeners.log("a").alternates(closed: false))
        listeners.sinks.value["a"]!.send(2)
        #expect(pollAll(fresh) == [2])
    }

    /// A generation whose start waits for the previous one's unregister,
    /// and whose subscribers all leave before it may start: once its
    /// stopAfter has passed it is idle and goes, though it never ran (found
    /// by the stress tool: it stayed live, with nobody to tell the registry).
    // claims: TOPIC-LIVE-STOPAFTER
    @available(macOS 13, iOS 16, tvOS 16, watchOS 9, *)
    @Test func aBlockedGenerationWhoseSubscribersLeftGoesAfterStopAfter() async throws {
        let clock = ManualClock()
        let listeners = Listeners()
        let topics = Topics(stopAfter: .seconds(5), clock: clock, register: listeners.register)
        _ = topics.subscribe(to: "a")
        listeners.holdUnregister.value = true
        let finished = Locked(false)
        Thread.detachNewThread {  // not a task: see the test above
            topics.finish(topic: "a")
            finished.value = true
        }
        try await waitUntil("the unregister is running") { listeners.unregistering.value == 1 }
        topics.subscribe(to: "a").cancel()  // a blocked generation, left at once: it lingers
        #expect(topics.topicsCounters == TopicsCounters(live: 1, retiring: 1, blockedStarts: 1))
        try await withDeadline("its stop timer asleep") { await clock.waitForSleepers(1) }
        clock.advance(by: .seconds(5))
        try await waitUntil("the blocked generation goes") { topics.topicCount == 0 }
        listeners.holdUnregister.value = false
        try await waitUntil("finish(topic:) returns") { finished.value }
        try await waitUntil("nothing left") { topics.topicsCounters == TopicsCounters() }
        #expect(listeners.log("a").events == [.register, .unregister], "a generation that never started registered")
    }

    // claims: TOPIC-REGISTER-LIFECYCLE
    @available(macOS 13, iOS 16, tvOS 16, watchOS 9, *)
    @Test func aListenerThatFinishesItsTopicEndsItsSubscribersAndTheNextSubscribeRegistersAgain() {
        let listeners = Listeners()
        let topics = Topics(register: listeners.register)
        let a = topics.subscribe(to: "a")
        let sink = listeners.sinks.value["a"]!
        sink.send(1)
        sink.finish()
        #expect(pollAll(a) == [1])
        #expect(a.poll().isEnd)
        #expect(listeners.log("a").events == [.register, .unregister])
        #expect(topics.send(2, to: "a").delivered == 0)
        let again = topics.subscribe(to: "a")
        #expect(listeners.log("a").events == [.register, .unregister, .register])
        listeners.sinks.value["a"]!.send(3)
        #expect(pollAll(again) == [3])
        again.cancel()
        #expect(topics.topicCount == 0)
    }

    // claims: TOPIC-REGISTER-LIFECYCLE
    @available(macOS 13, iOS 16, tvOS 16, watchOS 9, *)
    @Test func finishUnregistersEveryTopic() {
        let listeners = Listeners()
        let topics = Topics(register: listeners.register)
        let subscriptions = ["a", "b", "c"].map { topics.subscribe(to: $0) }
        topics.finish()
        for topic in ["a", "b", "c"] { #expect(listeners.log(topic).events == [.register, .unregister]) }
        for subscription in subscriptions { #expect(subscription.poll().isEnd) }
        _ = topics.subscribe(to: "a")
        #expect(listeners.log("a").events == [.register, .unregister], "a finished set of topics registered again")
    }

    /// Subscribers come and go on a few topics from several threads, while
    /// `finish(topic:)` closes them: each topic's register and unregister
    /// calls alternate and never overlap.
    // claims: TOPIC-REGISTER-ALTERNATE
    @available(macOS 13, iOS 16, tvOS 16, watchOS 9, *)
    @Test func aTopicsRegisterAndUnregisterNeverOverlap() async throws {
        let listeners = Listeners()
        let topics = Topics(register: listeners.register)
        let rounds = 3_000
        try await raceOnThreads(3, "subscribers and finish(topic:) on a few topics") { role in
            var rng = SplitMix64(seed: UInt64(role) &+ 17)
            for _ in 0..<rounds {
                let topic = "t\(rng.next() % 3)"
                if role == 2 && rng.next() % 4 == 0 {
                    topics.finish(topic: topic)
                } else {
                    topics.subscribe(to: topic).cancel()
                }
            }
        }
        for log in listeners.allLogs {
            #expect(log.overlaps == 0, "a topic's register and unregister overlapped")
            #expect(log.alternates(closed: true), "\(log.events.prefix(12))")
        }
        #expect(topics.topicCount == 0)
        #expect(topics.registry.shards.allSatisfy { shard in shard.lock.withLock { shard.retiring.isEmpty } })
    }

    /// A sink whose registration was stopped delivers nothing: not to the
    /// topic's next generation, not to its replay window. The new
    /// registration's sink does.
    // claims: TOPIC-STALE-SINK
    @available(macOS 13, iOS 16, tvOS 16, watchOS 9, *)
    @Test func aStoppedRegistrationsSinkDeliversNothing() {
        let listeners = Listeners()
        let topics = Topics(replay: 1, register: listeners.register)
        let first = topics.subscribe(to: "a")
        let stale = listeners.sinks.value["a"]!
        first.cancel()
        #expect(listeners.log("a").events == [.register, .unregister])
        let again = topics.subscribe(to: "a")
        #expect(listeners.log("a").events == [.register, .unregister, .register])
        #expect(stale.send(1).delivered == 0)
        #expect(pollAll(again) == [], "a stopped registration's sink reached the next generation")
        let late = topics.subscribe(to: "a")
        #expect(pollAll(late) == [], "a stopped registration's sink reached the replay window")
        #expect(listeners.sinks.value["a"]!.send(2).delivered == 2)
        #expect(pollAll(again) == [2])
        #expect(pollAll(late) == [2])
    }
}
