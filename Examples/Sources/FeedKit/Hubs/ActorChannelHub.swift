import AsyncAlgorithms
import Foundation
import Logging

/// The hub of Hummingbird's websocket-chat example, with rooms: an actor
/// holding, per topic, an `AsyncChannel` per connection, sending to each in
/// turn.
///
/// `AsyncChannel.send` waits until that connection's reader takes the
/// element, so one slow connection holds up its topic's loop for everyone
/// behind it (and, as the actor is shared, every other topic's sends wait
/// for the actor), and the notifications queue up in front of the hub.
/// Nothing is ever dropped, so there are no gaps to report. A topic LISTENs
/// from its first subscriber and UNLISTENs when its last leaves.
public final class ActorChannelHub: FeedHub {
    public let name = "actor-channel"
    public let listener: TopicListener
    private let rooms: Rooms

    actor Rooms {
        struct Room {
            var channels: [UUID: AsyncChannel<FeedEvent>] = [:]
            let loop: Task<Void, Never>
        }
        var rooms: [String: Room] = [:]
        let listener: TopicListener

        init(listener: TopicListener) { self.listener = listener }

        func add(_ id: UUID, _ channel: AsyncChannel<FeedEvent>, to topic: String) {
            if rooms[topic] == nil {
                let listener = self.listener
                let loop = Task {
                    await listener.listen(topic: topic) { event in await self.send(event, to: topic) }
                }
                rooms[topic] = Room(loop: loop)
            }
            rooms[topic]!.channels[id] = channel
        }

        func remove(_ id: UUID, from topic: String) {
            guard rooms[topic]?.channels.removeValue(forKey: id) != nil else { return }
            if rooms[topic]!.channels.isEmpty {
                rooms.removeValue(forKey: topic)?.loop.cancel()
            }
        }

        func count(of topic: String) -> Int { rooms[topic]?.channels.count ?? 0 }
        var topicCount: Int { rooms.count }

        func send(_ event: FeedEvent, to topic: String) async {
            for channel in rooms[topic]?.channels.values ?? [:].values {
                await channel.send(event)
            }
        }

        func finishAll() {
            for room in rooms.values {
                for channel in room.channels.values { channel.finish() }
                room.loop.cancel()
            }
            rooms.removeAll()
        }
    }

    public init(listener: TopicListener) {
        self.listener = listener
        rooms = Rooms(listener: listener)
    }

    public func subscribe(_ query: FeedQuery) async -> Subscription {
        let channel = AsyncChannel<FeedEvent>()
        let id = UUID()
        let topic = query.topic
        await rooms.add(id, channel, to: topic)
        return Subscription(channel: channel, remove: { [rooms] in
            channel.finish()
            Task { await rooms.remove(id, from: topic) }
        })
    }

    public func topicCount() async -> Int { await rooms.topicCount }
    public func subscriberCount(of topic: String) async -> Int { await rooms.count(of: topic) }

    public func shutdown() async {
        await rooms.finishAll()
        await listener.waitUntilStopped()
    }

    public struct Subscription: FeedSubscription {
        let channel: AsyncChannel<FeedEvent>
        let remove: @Sendable () -> Void
        public var droppedCount: Int { 0 }
        public var bufferedCount: Int { 0 }
        public func cancel() { remove() }
        public func makeAsyncIterator() -> AsyncChannel<FeedEvent>.AsyncIterator { channel.makeAsyncIterator() }
        /// One event: an `AsyncChannel` holds nothing (each `send` waits for
        /// its reader), so there is never a second one ready to take.
        public func next(upTo limit: Int, from iterator: inout AsyncIterator, into buffer: inout [FeedEvent],
                         isolation: isolated (any Actor)?) async -> Int {
            guard let event = await iterator.next(isolation: isolation) else { return 0 }
            buffer.append(event)
            return 1
        }
    }
}
