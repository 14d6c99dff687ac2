import AsyncBroadcast
import Logging

/// The hub built on AsyncBroadcast: the feed is one `BroadcastSequence` fed
/// by the LISTEN loop through `init(register:)`.
///
/// - `.whileSubscribed(stopAfter: .seconds(5))`: no database connection
///   before the first client; the LISTEN connection closes 5 s after the last
///   client left (a reload does not reconnect).
/// - `replay: 1`: a new client first gets the last message, with its `seq`.
/// - Each connection subscribes with its own policy: one slow client drops
///   (or is evicted), nobody else waits for it.
public final class BroadcastHub: FeedHub {
    public let name = "broadcast"
    public let listening = ListenState(false)
    public let feed: BroadcastSequence<FeedEvent, Never>

    public init(target: PostgresTarget, sequence: Sequencer, logger: Logger) {
        let loop = ListenLoop(target: target, listening: listening, sequence: sequence, logger: logger)
        feed = BroadcastSequence(replay: 1, started: .whileSubscribed(stopAfter: .seconds(5))) { sink in
            // `register`: the first subscriber arrived (or came back after a stop).
            let task = Task { await loop.run { event in sink.send(event) } }
            // Unregister: 5 s after the last subscriber left. Cancelling the
            // loop leaves `listen(on:)`, which sends UNLISTEN, then closes.
            return { task.cancel() }
        }
    }

    public func subscribe(_ query: FeedQuery) -> BroadcastSequence<FeedEvent, Never>.Subscription {
        feed.subscribe(bufferingPolicy: query.bufferingPolicy)
    }

    public func watchOnline(_ body: @Sendable (Int) async throws -> Void) async throws {
        // Conflated: after the 1 s pause the next value is the current count.
        for await count in feed.subscriberCounts {
            try await body(count)
            try await Task.sleep(for: .seconds(1))
        }
    }

    public func run() async {}
}

extension BroadcastSequence.Subscription: FeedSubscription where Element == FeedEvent, Failure == Never {}
