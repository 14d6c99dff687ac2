import Foundation
import Logging
import Synchronization

/// The hub most people write first: a lock around a dictionary of
/// `AsyncStream` continuations, yielding to each under the lock.
///
/// Kept faithful to that pattern (including the yields under the lock), with
/// the fairness fixes a careful author adds: `.dropped` yields are counted, so
/// gaps are reported, and `onTermination` removes the entry. AsyncStream has
/// no `.bounded`: that policy gets `.unbounded` (the eviction watchdog still
/// applies). It LISTENs from start-up: it has no subscriber-driven start.
public final class LockStreamHub: FeedHub {
    public let name = "lock-stream"
    public let listening = ListenState(false)
    private let loop: ListenLoop
    private let subscribers = Mutex<[UUID: Entry]>([:])

    struct Entry: Sendable {
        let continuation: AsyncStream<FeedEvent>.Continuation
        let counters: Counters
        let policy: FeedQuery.Policy
    }

    public final class Counters: Sendable {
        let dropped = Atomic<Int>(0)
        let held = Atomic<Int>(0)
    }

    public init(target: PostgresTarget, sequence: Sequencer, logger: Logger) {
        loop = ListenLoop(target: target, listening: listening, sequence: sequence, logger: logger)
    }

    public func run() async {
        await loop.run { event in self.publish(event) }
    }

    func publish(_ event: FeedEvent) {
        subscribers.withLock { subscribers in
            for entry in subscribers.values {
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

    public func subscribe(_ query: FeedQuery) -> Subscription {
        let policy: AsyncStream<FeedEvent>.Continuation.BufferingPolicy =
            switch query.policy {
            case .newest: .bufferingNewest(query.capacity)
            case .oldest: .bufferingOldest(query.capacity)
            case .bounded, .unbounded: .unbounded
            }
        let (stream, continuation) = AsyncStream.makeStream(of: FeedEvent.self, bufferingPolicy: policy)
        let id = UUID()
        let counters = Counters()
        continuation.onTermination = { [weak self] _ in
            _ = self?.subscribers.withLock { $0.removeValue(forKey: id) }
        }
        subscribers.withLock { $0[id] = Entry(continuation: continuation, counters: counters, policy: query.policy) }
        return Subscription(stream: stream, continuation: continuation, counters: counters)
    }

    public var count: Int { subscribers.withLock { $0.count } }

    public func watchOnline(_ body: @Sendable (Int) async throws -> Void) async throws {
        while true {
            try await body(count)
            try await Task.sleep(for: .seconds(1))
        }
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

        public struct AsyncIterator: AsyncIteratorProtocol {
            var base: AsyncStream<FeedEvent>.AsyncIterator
            let counters: Counters
            public mutating func next() async -> FeedEvent? {
                guard let event = await base.next() else { return nil }
                counters.held.add(-1, ordering: .relaxed)
                return event
            }
        }
    }
}
