/// One connection's view of a hub: the events in order, and how far behind it is.
public protocol FeedSubscription: AsyncSequence, Sendable where Element == FeedEvent, Failure == Never {
    /// Elements this connection's policy dropped so far: a `gap` frame reports each increase.
    var droppedCount: Int { get }
    /// Elements held for this connection, unread: its lag.
    var bufferedCount: Int { get }
    /// Ends the subscription; the hub forgets it.
    func cancel()
}

/// The fan-out behind `/feed`. The server is generic over it, so the three
/// hubs run behind the same routes, the same connection code and the same
/// LISTEN loop, and differ only in how one event reaches many connections.
public protocol FeedHub: Sendable {
    associatedtype Subscription: FeedSubscription
    /// `broadcast`, `lock-stream` or `actor-channel`.
    var name: String { get }
    /// True while the LISTEN is in place: `ready` waits for it.
    var listening: ListenState { get }
    /// Registers a subscriber for `query` now: every event the hub publishes
    /// after this returns reaches it (or is counted as dropped by its policy).
    func subscribe(_ query: FeedQuery) async -> Subscription
    /// Calls `body` with this process's connection count as it changes, at
    /// most once a second, until the task is cancelled.
    func watchOnline(_ body: @Sendable (Int) async throws -> Void) async throws
    /// What the hub runs for the server's lifetime (the hand-written hubs
    /// LISTEN from start-up; the broadcast hub starts nothing here: its
    /// sequence starts and stops the LISTEN with its subscribers).
    func run() async
    /// Ends every subscription and closes the hub's database connections,
    /// returning once they are closed. Called after the server stopped.
    func shutdown() async
}

extension FeedHub {
    public func shutdown() async {}
}
