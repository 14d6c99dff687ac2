import AsyncBroadcast
import NIOConcurrencyHelpers

/// Tells a connection that the library evicted its subscription, while its
/// pump may be stuck in a write to a client that stopped reading.
///
/// The library ends a subscriber at the send that finds it over its limit
/// and counts it in that send's `evicted`; a reader waiting in `next` is
/// woken, but a pump blocked on a full socket is not reading. So the topic's
/// send, when its result says `evicted > 0`, looks at that topic's waiting
/// connections and wakes the evicted ones: a parked wait per connection, no
/// timer, and a scan of one topic's connections only on a send that evicted.
public final class EvictionNotices: Sendable {
    private struct Entry: Sendable {
        let subscription: BroadcastSequence<FeedEvent, Never>.Subscription
        let notice: BroadcastPromise<Void, Never>
    }
    private let table = NIOLockedValueBox<[String: [ObjectIdentifier: Entry]]>([:])

    public init() {}

    /// Returns once `subscription` (of `topic`) has been evicted; throws
    /// `CancellationError` if the task is cancelled first.
    public func wait(for subscription: BroadcastSequence<FeedEvent, Never>.Subscription, topic: String) async throws {
        let id = ObjectIdentifier(subscription)
        let notice = BroadcastPromise<Void, Never>()
        table.withLockedValue { $0[topic, default: [:]][id] = Entry(subscription: subscription, notice: notice) }
        defer {
            table.withLockedValue { table in
                table[topic]?[id] = nil
                if table[topic]?.isEmpty == true { table[topic] = nil }
            }
        }
        // Evicted before the entry was in the table: `evicted(topic:)` ran
        // its scan before our insert (under the same lock), after the
        // library had set `isEvicted`, so this load sees it.
        if subscription.isEvicted { return }
        try await notice.value
    }

    /// A send to `topic` evicted someone: wake the waits of the evicted.
    public func evicted(topic: String) {
        let evicted = table.withLockedValue { table in
            (table[topic] ?? [:]).values.filter { $0.subscription.isEvicted }.map(\.notice)
        }
        for notice in evicted { notice.succeed() }
    }
}
