import AsyncBroadcast
import Logging

/// The hub built on AsyncBroadcast: one `BroadcastTopics`, whose
/// asynchronous listener form LISTENs on a topic's channel while the topic
/// has clients. Everything a connection needs beyond its frames comes from
/// the library:
///
/// - `stopAfter: .seconds(5)`: a topic's LISTEN starts with its first
///   client and ends 5 s after its last left (a reload does not UNLISTEN);
///   a process with no client holds no database connection. The take-down
///   awaits the LISTEN loop's end (UNLISTEN sent), and the library starts
///   the topic's next LISTEN only after it: two loops of one topic never
///   overlap, and shutdown awaits `listenersStopped()`.
/// - Readiness: the loop calls `sink.ready()` once LISTEN succeeded; a
///   connection's `ready` frame waits on `upstreamReady()`.
/// - `replay: 1`: a new client first gets its topic's last message, with its
///   `seq`. A `resync` is sent `replayable: false`: it reaches the clients
///   there now and is never replayed to a new one.
/// - Each connection subscribes with its own policy and an eviction limit
///   (``eviction(for:)``): a slow client drops (or is evicted at the send
///   that finds it over its limit), nobody else waits for it. Drops are
///   counted from each send's result, as they happen.
/// - The pump reads the subscription's events in batches: a `.lagged(n)`
///   sits exactly where its drops were, and becomes a `gap` frame there.
/// - A subscribe racing its topic's last cancel, or the end of the 5 s, is
///   never left on a topic that is going away (the library's guarantee).
public final class BroadcastHub: FeedHub {
    public let name = "broadcast"
    public let listener: TopicListener
    public let topics: BroadcastTopics<String, FeedEvent, Never>
    public let limits: FeedLimits
    /// Wakes a connection whose subscription a send evicted.
    public let evictionNotices = EvictionNotices()

    public init(listener: TopicListener, limits: FeedLimits, stats: ServerStats) {
        self.listener = listener
        self.limits = limits
        let notices = evictionNotices
        topics = BroadcastTopics(replay: 1, stopAfter: .seconds(5)) { topic, sink in
            // The topic's first subscriber arrived (or came back after a stop).
            let loop = Task {
                await listener.listen(topic: topic, onListening: { sink.ready() }) { event in
                    let result = sink.send(event, replayable: event.isMessage)
                    if result.dropped > 0 { stats.add(.dropped, result.dropped) }
                    if result.evicted > 0 { notices.evicted(topic: topic) }
                }
            }
            // 5 s after the last subscriber left: cancelling the loop leaves
            // `listen(on:)`, which sends UNLISTEN; the library waits for it.
            return {
                loop.cancel()
                await loop.value
            }
        }
    }

    /// The eviction limit of a connection with `query`'s policy.
    ///
    /// - `bounded(n)`: more than n - 1 unread at every send for 10 s (it has
    ///   held n or more all that time), or more than the ceiling at once;
    /// - `unbounded`: more than the ceiling (`--max-capacity`, the messages
    ///   of the largest kind that fit `--queue-bytes`);
    /// - `newest`, `oldest`: never: their capacity is within the ceiling.
    public func eviction(for query: FeedQuery) -> BroadcastEviction {
        if FaultInjection.neverEvict { return .never }
        let ceiling = Swift.max(limits.maximumCapacity, 1)
        switch query.policy {
        case .bounded:
            return .limits(hard: Swift.max(ceiling, query.capacity), soft: query.capacity - 1 < 1 ? 1 : query.capacity - 1,
                           for: FeedConnection<BroadcastHub>.evictionDelay)
        case .unbounded:
            return .hardLimit(ceiling)
        case .newest, .oldest:
            return .never
        }
    }

    public func subscribe(_ query: FeedQuery) -> BroadcastSequence<FeedEvent, Never>.Subscription {
        topics.subscribe(to: query.topic, bufferingPolicy: query.bufferingPolicy, eviction: eviction(for: query))
    }

    public func topicCount() -> Int { topics.topicCount }
    public func subscriberCount(of topic: String) -> Int { topics.subscriberCount(of: topic) }
    public var evictsSlowClients: Bool { true }

    public func waitUntilEvicted(_ subscription: Subscription, topic: String) async throws {
        try await evictionNotices.wait(for: subscription, topic: topic)
    }

    public func shutdown() async {
        // Finishing stops every topic's listener; the take-downs await their loops (UNLISTEN).
        topics.finish()
        await topics.listenersStopped()
        await listener.waitUntilStopped()
    }
}

extension BroadcastSequence.Subscription: FeedSubscription where Element == FeedEvent, Failure == Never {
    /// The library's batch read: everything already buffered, up to `limit`, in one call.
    public func next(upTo limit: Int, from iterator: inout AsyncIterator, into buffer: inout [FeedEvent],
                     isolation: isolated (any Actor)?) async -> Int {
        await iterator.next(upTo: limit, into: &buffer, isolation: isolation)
    }

    public func makeReader() -> EventsReader { EventsReader(self) }

    public func waitUntilReady(listener: TopicListener, topic: String) async {
        _ = try? await upstreamReady()
    }
}

/// The broadcast hub's reader: the subscription's events view, in batches,
/// `.lagged(n)` exactly where its policy dropped.
public struct EventsReader: FeedBatchReader {
    var iterator: BroadcastSequence<FeedEvent, Never>.Subscription.Events.AsyncIterator
    var events: [BroadcastEvent<FeedEvent>] = []

    init(_ subscription: BroadcastSequence<FeedEvent, Never>.Subscription) {
        iterator = subscription.events.makeAsyncIterator()
    }

    public mutating func next(upTo limit: Int, into buffer: inout [FeedItem], isolation: isolated (any Actor)?) async -> Int {
        events.removeAll(keepingCapacity: true)
        guard await iterator.next(upTo: limit, into: &events, isolation: isolation) > 0 else { return 0 }
        var taken = 0
        for event in events {
            switch event {
            case .element(let element):
                buffer.append(.event(element))
                taken += 1
            case .lagged(let count):
                buffer.append(.lagged(count))
            }
        }
        // A batch of only a `.lagged` (its elements not yet there) is still a batch.
        return Swift.max(taken, 1)
    }
}
