import AsyncBroadcast
import Logging

/// The hub built on AsyncBroadcast: one `BroadcastTopics`, whose listener
/// form LISTENs on a topic's channel while the topic has clients.
///
/// - `stopAfter: .seconds(5)`: a topic's LISTEN starts with its first
///   client and ends 5 s after its last left (a reload does not UNLISTEN);
///   a process with no client holds no database connection.
/// - `replay: 1`: a new client first gets its topic's last message, with its `seq`.
/// - Each connection subscribes with its own policy: one slow client drops
///   (or is evicted), nobody else waits for it.
/// - A subscribe racing its topic's last cancel, or the end of the 5 s, is
///   never left on a topic that is going away (the library's guarantee).
public final class BroadcastHub: FeedHub {
    public let name = "broadcast"
    public let listener: TopicListener
    public let topics: BroadcastTopics<String, FeedEvent, Never>

    public init(listener: TopicListener) {
        self.listener = listener
        topics = BroadcastTopics(replay: 1, stopAfter: .seconds(5)) { topic, sink in
            // `register`: the topic's first subscriber arrived (or came back after a stop).
            let task = Task { await listener.listen(topic: topic) { event in sink.send(event) } }
            // Unregister: 5 s after the last subscriber left. Cancelling the
            // loop leaves `listen(on:)`, which sends UNLISTEN.
            return { task.cancel() }
        }
    }

    public func subscribe(_ query: FeedQuery) -> BroadcastSequence<FeedEvent, Never>.Subscription {
        topics.subscribe(to: query.topic, bufferingPolicy: query.bufferingPolicy)
    }

    public func topicCount() -> Int { topics.topicCount }
    public func subscriberCount(of topic: String) -> Int { topics.subscriberCount(of: topic) }

    public func shutdown() async {
        // Finishing stops every topic's listener: the loops are cancelled and UNLISTEN.
        topics.finish()
        await listener.waitUntilStopped()
    }
}

extension BroadcastSequence.Subscription: FeedSubscription where Element == FeedEvent, Failure == Never {
    /// The library's batch read: everything already buffered, up to `limit`, in one call.
    public func next(upTo limit: Int, from iterator: inout AsyncIterator, into buffer: inout [FeedEvent]) async -> Int {
        await iterator.next(upTo: limit, into: &buffer)
    }
}
