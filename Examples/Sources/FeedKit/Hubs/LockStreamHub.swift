import Foundation
import Logging
import Synchronization

/// The hub most people write first: a lock around a dictionary of topics,
/// each a dictionary of `AsyncStream` continuations, yielding to each under
/// the lock.
///
/// Kept faithful to that pattern (including the yields under the lock), with
/// the fairness fixes a careful author adds: `.dropped` yields are counted, so
/// gaps are reported, and `onTermination` removes the entry. AsyncStream has
/// no `.bounded`: that policy gets `.unbounded` (the eviction watchdog still
/// applies). A topic LISTENs from its first subscriber and UNLISTENs when its
/// last leaves, at once (no delay: writing one is where such hubs get their
/// races; this one keeps the common race instead, see ``subscribe(_:)``).
public final class LockStreamHub: FeedHub {
    public let name = "lock-stream"
    public let listener: TopicListener
    private let rooms = Mutex<[String: Room]>([:])

    struct Room: Sendable {
        var entries: [UUID: Entry] = [:]
        let loop: Task<Void, Never>
    }

    struct Entry: Sendable {
        let continuation: AsyncStream<FeedEvent>.Continuation
        let counters: Counters
        let policy: FeedQuery.Policy
    }

    public final class Counters: Sendable {
        let dropped = Atomic<Int>(0)
        let held = Atomic<Int>(0)
    }

    public init(listener: TopicListener) {
        self.listener = listener
    }

    func publish(_ event: FeedEvent, to topic: String) {
        rooms.withLock { rooms in
            for entry in rooms[topic]?.entries.values ?? [:].values {
                switch entry.continuation.yield(event) {
                case .enqueued:
                    entry.counters.held.add(1, ordering: .relaxed)
                case .dropped:
                    // Newest: an old one went out, this one came in. Oldest: this one was refused.
                    entry.counters.dropped.add(1, ordering: .relaxed)
                case .terminated:
                    break
                @unknown default:
                    break
                }
            }
        }
    }

    /// The first subscriber of a topic starts its LISTEN loop; the last one
    /// to leave cancels it. A LISTEN restarted at once after a stop is in
    /// place again only when its loop gets there: until then the new
    /// subscriber's `ready` waits for it (so nothing is lost here; the
    /// hand-written race is in the old loop's UNLISTEN, which the listener
    /// counts per loop).
    public func subscribe(_ query: FeedQuery) -> Subscription {
        let policy: AsyncStream<FeedEvent>.Continuation.BufferingPolicy =
            switch query.policy {
            case .newest: .bufferingNewest(query.capacity)
            case .oldest: .bufferingOldest(query.capacity)
            case .bounded, .unbounded: .unbounded
            }
        let (stream, continuation) = AsyncStream.makeStream(of: FeedEvent.self, bufferingPolicy: policy)
        let id = UUID()
        let topic = query.topic
        let counters = Counters()
        continuation.onTermination = { [weak self] _ in
            guard let self else { return }
            let stopped: Task<Void, Never>? = rooms.withLock { rooms in
                guard var room = rooms[topic], room.entries.removeValue(forKey: id) != nil else { return nil }
                if room.entries.isEmpty {
                    rooms[topic] = nil
                    return room.loop
                }
                rooms[topic] = room
                return nil
            }
            stopped?.cancel()
        }
        let listener = self.listener
        rooms.withLock { rooms in
            if rooms[topic] == nil {
                let loop = Task {
                    await listener.listen(topic: topic) { event in self.publish(event, to: topic) }
                }
                rooms[topic] = Room(loop: loop)
            }
            rooms[topic]!.entries[id] = Entry(continuation: continuation, counters: counters, policy: query.policy)
        }
        return Subscription(stream: stream, continuation: continuation, counters: counters)
    }

    public func topicCount() -> Int { rooms.withLock { $0.count } }
    public func subscriberCount(of topic: String) -> Int { rooms.withLock { $0[topic]?.entries.count ?? 0 } }

    public func shutdown() async {
        let continuations = rooms.withLock { rooms in rooms.values.flatMap { $0.entries.values.map(\.continuation) } }
        for continuation in continuations { continuation.finish() }  // each removes itself, the last its loop
        await listener.waitUntilStopped()
    }

    public struct Subscription: FeedSubscription {
        let stream: AsyncStream<FeedEvent>
        let continuation: AsyncStream<FeedEvent>.Continuation
        let counters: Counters

        public var droppedCount: Int { counters.dropped.load(ordering: .relaxed) }
        public var bufferedCount: Int { Swift.max(0, counters.held.load(ordering: .relaxed)) }
        public func cancel() { continuation.finish() }

        public func makeAsyncIterator() -> AsyncIterator {
            AsyncIterator(base: stream.makeAsyncIterator(), counters: counters)
        }

        /// AsyncStream has no batch read, so this takes one element at a
        /// time: the first as it comes, then more only while `held` says one
        /// is buffered. `held` is raised after a yield enqueued and lowered
        /// after `next()` returned, so it never counts more than the stream
        /// holds, and those `next()` calls return without waiting (each still
        /// takes the stream's lock and makes a continuation).
        public func next(upTo limit: Int, from iterator: inout AsyncIterator, into buffer: inout [FeedEvent],
                         isolation: isolated (any Actor)?) async -> Int {
            guard let first = await iterator.next(isolation: isolation) else { return 0 }
            buffer.append(first)
            var taken = 1
            while taken < limit, counters.held.load(ordering: .relaxed) > 0, let event = await iterator.next(isolation: isolation) {
                buffer.append(event)
                taken += 1
            }
            return taken
        }

        public struct AsyncIterator: AsyncIteratorProtocol {
            var base: AsyncStream<FeedEvent>.AsyncIterator
            let counters: Counters
            public mutating func next() async -> FeedEvent? {
                await next(isolation: nil)
            }

            public mutating func next(isolation actor: isolated (any Actor)?) async -> FeedEvent? {
                guard let event = await base.next(isolation: actor) else { return nil }
                counters.held.add(-1, ordering: .relaxed)
                return event
            }
        }
    }
}
