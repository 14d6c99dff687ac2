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
    /// while await subscription.next(upTo: 64, from: &iterator, into: &batch) > 0 { ... }
    /// ```
    func next(upTo limit: Int, from iterator: inout AsyncIterator, into buffer: inout [FeedEvent]) async -> Int
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
}

extension FeedHub {
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
