import Testing
@_spi(Testing) @testable import AsyncBroadcast

/// No path takes a sequence lock while holding a topic shard's lock: a send
/// to one topic would then hold up every topic of its shard. The internal
/// checks trap on any such acquisition (`ShardLock`, `SequenceGate`), so the
/// whole suite checks it; this test drives every registry path that asks a
/// generation something (a last subscriber leaving, a subscribe racing it,
/// `finish(topic:)`, a listener's stop and restart, `finish()`) in a child
/// process and expects it to exit cleanly.
@Suite(.enabled(if: internalChecksEnabled, "needs ASYNCBROADCAST_INTERNAL_CHECKS=1"))
struct LockNestingTests {
    // claims: TOPIC-NO-WAIT-UNDER-SHARD
    @Test func noRegistryPathTakesASequenceLockWhileHoldingAShardLock() async {
        await #expect(processExitsWith: .success) {
            startExitTestWatchdog(exitingWith: 1)
            // Without a listener: the last subscriber leaving retires the topic.
            let topics = BroadcastTopics<String, Int, Never>(replay: 1)
            for round in 0..<200 {
                let topic = "t\(round % 5)"
                let first = topics.subscribe(to: topic)
                let second = topics.subscribe(to: topic)
                _ = topics.send(round, to: topic)
                first.cancel()
                if round % 3 == 0 { topics.finish(topic: topic) }
                second.cancel()
            }
            precondition(topics.topicCount == 0, "a topic stayed live")
            // With a listener: retiring generations, blocked starts, restarts.
            let listened = BroadcastTopics<String, Int, Never>(register: { _, sink in
                _ = sink
                return {}
            })
            for round in 0..<200 {
                let topic = "l\(round % 3)"
                let subscriber = listened.subscribe(to: topic)
                if round % 4 == 0 { listened.finish(topic: topic) }
                subscriber.cancel()
            }
            listened.finish()
            topics.finish()
        }
    }

    /// The check itself: a sequence lock taken with a shard lock held traps
    /// with its message (uncontended: whether it would wait is not the point).
    @Test func theCheckTrapsOnASequenceLockTakenUnderAShardLock() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            startExitTestWatchdog(exitingWith: 0)
            let shard = ShardLock()
            let gate = SequenceGate()
            shard.withLock { gate.withLock { () } }
        }
        expectMessage(result, "a sequence lock taken while holding a topic shard's lock")
    }

    /// A shard lock released before the sequence lock is taken is fine.
    @Test func aSequenceLockAfterTheShardLockIsReleasedDoesNotTrap() async {
        await #expect(processExitsWith: .success) {
            startExitTestWatchdog(exitingWith: 1)
            let shard = ShardLock()
            let gate = SequenceGate()
            shard.withLock { () }
            gate.withLock { () }
            gate.lock()
            gate.unlock()
        }
    }
}
