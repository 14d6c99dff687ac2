import Foundation
import Testing
@_spi(Testing) @testable import AsyncBroadcast

/// `BroadcastTopics`: keyed fan-out, topics that come and go.
@Suite struct TopicsTests {
    typealias Topics = BroadcastTopics<String, Int, Never>

    // MARK: Fan-out by topic

    // claims: TOPIC-AS-SEQUENCE
    @Test func aSendReachesTheSubscribersOfItsTopicOnly() {
        let topics = Topics()
        let a1 = topics.subscribe(to: "a")
        let a2 = topics.subscribe(to: "a", bufferingPolicy: .bufferingNewest(1))
        let b = topics.subscribe(to: "b")
        #expect(topics.send(1, to: "a") == BroadcastSendResult(delivered: 2))
        #expect(topics.send(2, to: "b") == BroadcastSendResult(delivered: 1))
        #expect(topics.send(3, to: "a") == BroadcastSendResult(delivered: 2, dropped: 1))
        #expect(pollAll(a1) == [1, 3])
        #expect(pollAll(a2) == [3])
        #expect(a2.droppedCount == 1)
        #expect(pollAll(b) == [2])
        #expect(topics.topicCount == 2)
        #expect(topics.subscriberCount(of: "a") == 2)
        #expect(topics.subscriberCount(of: "c") == 0)
    }

    // claims: TOPIC-NOT-LIVE-KEEPS-NOTHING
    @Test func aSendToATopicThatIsNotLiveDeliversNothingAndKeepsNothing() {
        let topics = Topics(replay: 4)
        #expect(topics.send(1, to: "a") == BroadcastSendResult())
        #expect(topics.send(contentsOf: [2, 3], to: "a") == BroadcastSendResult())
        #expect(topics.topicCount == 0)
        let late = topics.subscribe(to: "a")
        #expect(pollAll(late) == [], "a send to a topic that was not live was kept")
        topics.send(4, to: "a")
        #expect(pollAll(late) == [4])
    }

    // claims: TOPIC-REPLAY-WINDOW
    @Test func theReplayWindowLivesAndDiesWithTheTopic() {
        let topics = Topics(replay: 2)
        let first = topics.subscribe(to: "a")
        for i in 1...3 { topics.send(i, to: "a") }
        let second = topics.subscribe(to: "a")
        #expect(pollAll(second) == [2, 3])
        first.cancel()
        second.cancel()
        #expect(topics.topicCount == 0, "the topic outlived its last subscriber")
        let third = topics.subscribe(to: "a")
        #expect(pollAll(third) == [], "a new topic started with the old one's replay")
    }

    // claims: TOPIC-AS-SEQUENCE
    @Test func aBatchIsSentInOneStep() {
        let topics = Topics()
        let a = topics.subscribe(to: "a", bufferingPolicy: .bufferingOldest(3))
        #expect(topics.send(contentsOf: 1...5, to: "a") == BroadcastSendResult(delivered: 3, dropped: 2))
        #expect(pollAll(a) == [1, 2, 3])
    }

    // claims: TOPIC-AS-SEQUENCE
    @Test func emitWaitsForAFullBoundedSubscriberOfItsTopicOnly() async throws {
        let topics = Topics()
        let slow = topics.subscribe(to: "a", bufferingPolicy: .bounded(1))
        let other = topics.subscribe(to: "b", bufferingPolicy: .bounded(1))
        try await topics.emit(1, to: "a")
        try await topics.emit(1, to: "b")
        // "b" is full too, but an emit to "a" waits only for "a"'s subscribers.
        let emitter = Task { try await topics.emit(2, to: "a") }
        try await waitUntil("the emitter waits") {
            topics.registry.liveGeneration("a")?.waitingEmitterCount == 1
        }
        #expect(slow.poll().isElement(1))
        #expect(try await withDeadline("the emitter goes") { try await emitter.value } == BroadcastSendResult(delivered: 1))
        #expect(pollAll(slow) == [2])
        #expect(try await topics.emit(9, to: "c") == BroadcastSendResult(), "an emit to a topic that is not live")
        withExtendedLifetime(other) {}
    }

    // MARK: Topics come and go

    // claims: TOPIC-LIVE
    @Test func aTopicIsLiveFromItsFirstSubscriberUntilItsLastLeaves() async throws {
        let topics = Topics()
        #expect(topics.topicCount == 0)
        let first = topics.subscribe(to: "a")
        var second: Topics.Subscription? = topics.subscribe(to: "a")
        #expect(topics.topicCount == 1)
        first.cancel()
        #expect(topics.topicCount == 1)
        #expect(topics.subscriberCount(of: "a") == 1)
        second = nil  // released: it ends, and the topic with it
        #expect(second == nil)
        #expect(topics.topicCount == 0)
        #expect(topics.subscriberCount(of: "a") == 0)
        #expect(topics.send(1, to: "a").delivered == 0)
    }

    // claims: TOPIC-LIVE
    @Test func aTopicWhoseReaderEndsByCancellationGoes() async throws {
        let topics = Topics()
        let subscription = topics.subscribe(to: "a")
        let reader = Task { try await drain(subscription) }
        try await waitUntil("the reader waits") { subscription.isConsumerWaiting }
        reader.cancel()
        _ = try await reader.value
        #expect(topics.topicCount == 0)
    }

    // claims: TOPIC-GONE-FREED
    @Test func aTopicThatHasGoneHoldsNoMemory() {
        let topics = Topics(replay: 8)
        weak var generation: BroadcastStorage<Int, Never>?
        do {
            let subscription = topics.subscribe(to: "a")
            generation = topics.registry.liveGeneration("a")
            for i in 0..<8 { topics.send(i, to: "a") }
            #expect(generation != nil)
            subscription.cancel()
        }
        #expect(topics.topicCount == 0)
        #expect(generation == nil, "the topic's sequence (and its replay window) outlived it")
        #expect(topics.registry.shards.allSatisfy { shard in shard.lock.withLock { shard.live.isEmpty && shard.retiring.isEmpty } })
    }

    @Test func aSubscribeFromACancelledTaskDoesNotMakeTheTopicLive() async {
        let topics = Topics(replay: 2)
        let live = topics.subscribe(to: "a")
        topics.send(1, to: "a")
        let (onLive, onNew) = await Task {
            withUnsafeCurrentTask { $0!.cancel() }
            return (topics.subscribe(to: "a"), topics.subscribe(to: "b"))
        }.value
        #expect(pollAll(onLive) == [1], "the live topic's replay window, then the end")
        #expect(onLive.poll().isEnd)
        #expect(onNew.poll().isEnd)
        #expect(topics.topicCount == 1)
        #expect(topics.subscriberCount(of: "a") == 1)
        withExtendedLifetime(live) {}
    }

    // MARK: Finishing

    // claims: TOPIC-FINISH-ONE
    @Test func finishingATopicEndsItsSubscribersAndTheNextSubscribeStartsItAfresh() {
        let topics = Topics(replay: 1)
        let a = topics.subscribe(to: "a")
        let b = topics.subscribe(to: "b")
        topics.send(1, to: "a")
        topics.send(2, to: "a")
        topics.finish(topic: "a")
        #expect(pollAll(a) == [1, 2], "a closed topic's subscriber drains first")
        #expect(a.poll().isEnd)
        #expect(topics.topicCount == 1)
        #expect(topics.send(3, to: "a") == BroadcastSendResult())
        let again = topics.subscribe(to: "a")
        #expect(pollAll(again) == [], "the new topic has no replay from the closed one")
        topics.send(4, to: "a")
        #expect(pollAll(again) == [4])
        topics.send(5, to: "b")
        #expect(pollAll(b) == [5], "finishing one topic touched another")
        topics.finish(topic: "nobody")  // not live: nothing happens
    }

    // claims: TOPIC-FINISH-ALL
    @Test func finishEndsEveryTopicAndRefusesNewOnes() {
        let topics = Topics()
        let a = topics.subscribe(to: "a")
        let b = topics.subscribe(to: "b")
        topics.send(1, to: "a")
        topics.finish()
        #expect(topics.isFinished)
        #expect(pollAll(a) == [1])
        #expect(a.poll().isEnd)
        #expect(b.poll().isEnd)
        #expect(topics.topicCount == 0)
        #expect(topics.send(2, to: "a") == BroadcastSendResult(isFinished: true))
        let late = topics.subscribe(to: "a")
        #expect(late.poll().isEnd)
        #expect(topics.topicCount == 0)
    }

    // claims: TOPIC-FINISH-ALL
    @Test func finishThrowingEndsEveryTopicWithTheErrorAndLaterSubscribersGetIt() async throws {
        let topics = BroadcastTopics<String, Int, TestError>()
        let a = topics.subscribe(to: "a")
        topics.send(1, to: "a")
        topics.finish(throwing: TestError(code: 1))
        topics.finish(throwing: TestError(code: 2))  // the first call wins
        topics.finish()
        #expect(topics.isFinished)
        #expect(topics.send(2, to: "a") == BroadcastSendResult(isFinished: true))
        #expect(topics.topicCount == 0)
        var iterator = a.makeAsyncIterator()
        #expect(try await iterator.next() == 1)
        await #expect(throws: TestError(code: 1)) { try await iterator.next() }
        #expect(try await iterator.next() == nil)
        let late = topics.subscribe(to: "z")
        var lateIterator = late.makeAsyncIterator()
        await #expect(throws: TestError(code: 1)) { try await lateIterator.next() }
        #expect(try await lateIterator.next() == nil)
    }

    // claims: TOPIC-FINISH-ALL
    @Test func releasingTheTopicsFinishesThem() async throws {
        var topics: Topics? = Topics()
        let a = topics!.subscribe(to: "a")
        let reader = Task { try await drain(a) }
        try await waitUntil("the reader waits") { a.isConsumerWaiting }
        topics!.send(1, to: "a")
        topics = nil
        #expect(try await withDeadline("the reader ends") { try await reader.value } == [1])
    }

    // MARK: The race a dictionary of sequences has

    /// A subscribe that lands while the topic's last subscriber leaves must
    /// hear every later send: it is registered on a topic that stays live,
    /// or starts a new one, never on one being dropped.
    // claims: TOPIC-SUBSCRIBE-LEAVE-RACE
    @Test func aSubscribeRacingTheLastCancelMissesNothingSentAfterIt() async throws {
        let topics = Topics()
        let rounds = 20_000
        let missed = Locked(0)
        try await raceOnThreads(2, "subscribe against the last cancel, \(rounds) rounds") { role in
            // A few topics, alternating roles, so each thread both leaves and joins.
            for round in 0..<rounds {
                let topic = "t\(round % 3)"
                if (role + round) % 2 == 0 {
                    let leaving = topics.subscribe(to: topic)
                    leaving.cancel()
                } else {
                    let joining = topics.subscribe(to: topic)
                    let result = topics.send(round, to: topic)
                    // (The other thread may have sent to the same topic too.)
                    if !pollAll(joining).contains(round) { missed.withLock { $0 += 1 } }
                    if result.delivered == 0 { missed.withLock { $0 += 1 } }
                    joining.cancel()
                }
            }
        }
        #expect(missed.value == 0, "\(missed.value) sends after subscribe(to:) returned were missed")
        #expect(topics.topicCount == 0)
    }
}
