import AsyncBroadcast

/// One connection's view of a hub: the events in order, and how far behind it is.
public protocol FeedSubscription: AsyncSequence, Sendable where Element == FeedEvent, Failure == Never {
    /// Elements this connection's policy dropped so far: a `gap` frame reports each increase.
    var droppedCount: Int { get }
    /// Elements held for this connection, unread: its lag.
    var bufferedCount: Int { get }
    /// Ends the subscription; the hub forgets it.
    func cancel()
    /// Waits while nothing is ready, then appends up to `limit` events, in
    /// order, to `buffer` and returns how many; 0 once the subscription
    /// ended. The connection writes what it gets with one flush, so each hub
    /// takes as many as its API lets it take without waiting again.
    ///
    /// ```swift
    /// var iterator = subscription.makeAsyncIterator()
    /// while await subscription.next(upTo: 64, from: &iterator, into: &batch, isolation: #isolation) > 0 { ... }
    /// ```
    ///
    /// `isolation`: the caller's, kept while it waits where the hub's API
    /// allows, so a pump on its connection's event loop stays there.
    func next(upTo limit: Int, from iterator: inout AsyncIterator, into buffer: inout [FeedEvent],
              isolation: isolated (any Actor)?) async -> Int
    associatedtype Reader: FeedBatchReader = DroppedCountReader<Self>
    /// The pump's reader: the hub's drops in place (`.lagged`), as well as its API tells them.
    func makeReader() -> Reader
    /// Returns once the topic's listener is in place (its LISTEN succeeded):
    /// from then on nothing published to the topic is missed.
    func waitUntilReady(listener: TopicListener, topic: String) async
    /// The hub ended this subscription because its client was too slow.
    var isEvicted: Bool { get }
}

extension FeedSubscription where Reader == DroppedCountReader<Self> {
    public func makeReader() -> DroppedCountReader<Self> { DroppedCountReader(self) }
}

extension FeedSubscription {
    /// The hub keeps no listener state: wait on the topic's LISTEN in the shared table.
    public func waitUntilReady(listener: TopicListener, topic: String) async {
        await listener.waitUntilListening(topic)
    }
    public var isEvicted: Bool { false }
}

/// The keyed fan-out behind `/feed?topic=NAME`. The server is generic over
/// it, so the three hubs run behind the same routes, the same connection
/// code and the same LISTENs (``TopicListener``), and differ only in how
/// one event reaches the many connections of its topic, and in when a
/// topic's LISTEN starts and stops.
public protocol FeedHub: Sendable {
    associatedtype Subscription: FeedSubscription
    /// `broadcast`, `lock-stream` or `actor-channel`.
    var name: String { get }
    /// The topics' LISTENs: a connection's `ready` waits for its topic's.
    var listener: TopicListener { get }
    /// Registers a subscriber to `query.topic` now: every event the hub
    /// publishes to that topic after this returns reaches it (or is counted
    /// as dropped by its policy).
    func subscribe(_ query: FeedQuery) async -> Subscription
    /// Topics live now: with a subscriber, or (broadcast) within the 5 s
    /// after their last left.
    func topicCount() async -> Int
    /// Connections of this process subscribed to `topic`.
    func subscriberCount(of topic: String) async -> Int
    /// Ends every subscription and stops every LISTEN, returning once the
    /// LISTEN connection has nothing left to do. Called after the server stopped.
    func shutdown() async
    /// The hub itself counts drops and evicts slow clients (as each send
    /// finds them): the connection runs no watchdog.
    var evictsSlowClients: Bool { get }
    /// Returns once the hub evicted `subscription` (only a hub that
    /// ``evictsSlowClients``); throws `CancellationError` when cancelled first.
    func waitUntilEvicted(_ subscription: Subscription, topic: String) async throws
}

extension FeedHub {
    public var evictsSlowClients: Bool { false }

    public func waitUntilEvicted(_ subscription: Subscription, topic: String) async throws {
        try await BroadcastPromise<Void, Never>().value  // never: the watchdog evicts
    }

    /// Calls `body` with this process's connection count on `topic` when it
    /// changes, at most once a second, until the task is cancelled.
    public func watchOnline(topic: String, _ body: @Sendable (Int) async throws -> Void) async throws {
        var last = -1
        while true {
            let count = await subscriberCount(of: topic)
            if count != last {
                try await body(count)
                last = count
            }
            try await Task.sleep(for: .seconds(1))
        }
    }
}

/// What a connection's pump takes from its subscription: an event, or how
/// many events its policy dropped at that point (a `gap` frame).
public enum FeedItem: Sendable {
    case event(FeedEvent)
    case lagged(Int)
}

/// Reads a subscription in batches, each with its drops in place.
public protocol FeedBatchReader {
    /// Waits while nothing is ready, then appends up to `limit` items, in
    /// order, to `buffer` and returns how many events it took (0: ended).
    mutating func next(upTo limit: Int, into buffer: inout [FeedItem], isolation: isolated (any Actor)?) async -> Int
}

/// The reader of a hub without lag in-band: before a batch, the growth of
/// `droppedCount` since the previous one (the drops were older than what it
/// holds for `.bufferingNewest`, newer for `.bufferingOldest`: the position
/// is approximate, the count exact).
public struct DroppedCountReader<Subscription: FeedSubscription>: FeedBatchReader {
    let subscription: Subscription
    var iterator: Subscription.AsyncIterator
    var events: [FeedEvent] = []
    var reported = 0

    public init(_ subscription: Subscription) {
        self.subscription = subscription
        iterator = subscription.makeAsyncIterator()
    }

    public mutating func next(upTo limit: Int, into buffer: inout [FeedItem], isolation: isolated (any Actor)?) async -> Int {
        events.removeAll(keepingCapacity: true)
        let count = await subscription.next(upTo: limit, from: &iterator, into: &events, isolation: isolation)
        guard count > 0 else { return 0 }
        let dropped = subscription.droppedCount
        if dropped > reported {
            buffer.append(.lagged(dropped - reported))
            reported = dropped
        }
        for event in events { buffer.append(.event(event)) }
        return count
    }
}
