import AsyncBroadcast
import Logging
import Synchronization

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
    /// The running LISTEN loop, so that `shutdown` can wait for it to close its connection.
    private let running = RunningLoop()

    final class RunningLoop: Sendable {
        let task = Mutex<Task<Void, Never>?>(nil)
    }

    public init(target: PostgresTarget, sequence: Sequencer, logger: Logger) {
        let loop = ListenLoop(target: target, listening: listening, sequence: sequence, logger: logger)
        let running = self.running
        feed = BroadcastSequence(replay: 1, started: .whileSubscribed(stopAfter: .seconds(5))) { sink in
            // `register`: the first subscriber arrived (or came back after a stop).
            let previous = running.task.withLock { $0 }
            let task = Task {
                await previous?.value  // a stopped loop closes its connection first
                await loop.run { event in sink.send(event) }
            }
            running.task.withLock { $0 = task }
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

    public func shutdown() async {
        // Finishing stops the upstream: the loop's task is cancelled, leaves
        // LISTEN and closes its connection.
        feed.finish()
        await running.task.withLock({ $0 })?.value
    }
}

extension BroadcastSequence.Subscription: FeedSubscription where Element == FeedEvent, Failure == Never {}
