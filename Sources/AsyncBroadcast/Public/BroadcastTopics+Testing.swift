// `@_spi(Testing)` entry points of `BroadcastTopics`, for the tests, the
// stress tool and the fuzz targets. Not part of the public contract.

/// What a `BroadcastTopics` holds now.
@_spi(Testing)
public struct TopicsCounters: Sendable, Equatable {
    /// Live topics (as `topicCount`).
    public var live = 0
    /// Finished generations whose listener has not finished unregistering.
    public var retiring = 0
    /// Topics whose next generation waits for a retiring one to stop.
    public var blockedStarts = 0

    public init(live: Int = 0, retiring: Int = 0, blockedStarts: Int = 0) {
        self.live = live
        self.retiring = retiring
        self.blockedStarts = blockedStarts
    }
}

extension BroadcastTopics {
    /// A snapshot of the registry, shard by shard.
    @_spi(Testing)
    public var topicsCounters: TopicsCounters {
        var counters = TopicsCounters()
        for shard in registry.shards {
            shard.lock.withLock {
                counters.live += shard.live.count
                for (topic, stopping) in shard.retiring {
                    counters.retiring += stopping.count
                    if shard.live[topic] != nil { counters.blockedStarts += 1 }
                }
            }
        }
        return counters
    }
}

extension BroadcastTopics {
    /// Runs `hook` inside every later `subscribe(to:)`, right after it has
    /// released its shard lock: a test's send, subscribe or `finish(topic:)`
    /// lands exactly in the window between the subscribe's registration and
    /// its return. Call it before the topics are shared.
    @_spi(Testing)
    public var _runningListenerCount: Int { registry.activity.runningCount }

    @_spi(Testing)
    public func _runAfterSubscribeUnlocks(_ hook: @escaping @Sendable () -> Void) {
        registry.afterSubscribeUnlock = hook
    }

    /// Runs `hook` inside every later notice of a topic's generation (its
    /// last subscriber left, its run stopped), after the notice has asked
    /// the generation whether it is idle and stopped and before it acts on
    /// the answers under the shard lock: a test's subscribe lands exactly
    /// there. `retiredAsIdle`: the notice has just finished the generation
    /// as idle. Call it before the topics are shared.
    @_spi(Testing)
    public func _runBetweenNoticePhases(_ hook: @escaping @Sendable (_ retiredAsIdle: Bool) -> Void) {
        registry.betweenNoticePhases = hook
    }
}

extension BroadcastSink {
    /// Which sequence (a topic's generation) and run this sink feeds.
    @_spi(Testing)
    public var runIdentity: (sequence: ObjectIdentifier, run: UInt64) { (ObjectIdentifier(storage), generation) }
}
