import AsyncBroadcast
import HummingbirdWebSocket
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOWebSocket
import Synchronization

/// One WebSocket connection of `/feed`, the same for every hub.
///
/// Four tasks, and the first to end ends the connection:
/// - the reader takes the client's messages (it has no reason to send any)
///   through hummingbird-websocket's message assembly, so a continuation
///   without a start is closed with 1002 and invalid UTF-8 text with 1007,
///   and a client's close is seen at once;
/// - the pump waits for the LISTEN, writes `ready`, then each event, with a
///   `gap` (carrying the subscription's `droppedCount`) before it whenever
///   that count grew;
/// - `online` frames, at most once a second, once `ready` is out;
/// - the watchdog: it counts drops into `/stats` as they happen (not only when
///   the pump writes), closes a `bounded` or `unbounded` connection whose
///   unread messages pass the byte budget (`FeedLimits.queueBytes`), and a
///   `.bounded(n)` one that has held n or more unread for ``evictionDelay``;
///   either is closed with 1013. `newest` and `oldest` need no byte check:
///   their capacity is capped so that a full queue of the largest messages
///   fits the budget.
public struct FeedConnection<Hub: FeedHub>: Sendable {
    public let hub: Hub
    public let stats: ServerStats
    public let limits: FeedLimits
    public let live: LiveConnections

    /// A `.bounded(n)` client that has held n or more unread for this long is
    /// closed with 1013 (try again later). A listener's `send` never waits,
    /// so `.bounded` would otherwise grow without limit behind a stalled socket.
    public static var evictionDelay: Duration { .seconds(10) }
    /// How often the byte budget of a `bounded` or `unbounded` connection is checked.
    public static var budgetCheckPeriod: Duration { .milliseconds(250) }
    public static var closeCodeEvicted: WebSocketErrorCode { .unknown(1013) }
    /// The largest message a client may send (it has no reason to send any): 1009 beyond.
    public static var maximumInboundMessage: Int { 4096 }

    public init(hub: Hub, stats: ServerStats, limits: FeedLimits, live: LiveConnections) {
        self.hub = hub
        self.stats = stats
        self.limits = limits
        self.live = live
    }

    enum End: Sendable {
        case ended
        case evicted(String)
        case failed(any Error)
    }

    /// Serves the connection until it ends. Throws what the client did wrong
    /// (a protocol error from the reader), so hummingbird-websocket closes
    /// with its code (1002, 1007, 1009).
    public func serve(query: FeedQuery, inbound: WebSocketInboundStream, outbound: WebSocketOutboundWriter, logger: Logger) async throws {
        // The topic's numbering, held for as long as this connection lives,
        // so that its `seq` and byte total are the ones its messages carry.
        let topic = query.topic
        let sequence = hub.listener.sequencers.retain(topic)
        defer { hub.listener.sequencers.release(topic) }
        let progress = ConnectionProgress(at: sequence.totalBytes)
        let subscription = await hub.subscribe(query)
        stats.add(.subscribers)
        stats.add(.connectionsTotal)
        let drops = DropCounter(stats: stats)
        let entry = live.insert(progress, sequence: sequence) { subscription.bufferedCount }
        defer {
            live.remove(entry)
            drops.sync(subscription.droppedCount)
            subscription.cancel()
            stats.add(.subscribers, -1)
        }
        let hub = self.hub
        let stats = self.stats
        let limits = self.limits
        // `ready` is the connection's first frame: the other writers wait for it.
        let readySent = BroadcastPromise<Void, Never>()
        let end = await withTaskGroup(of: End.self) { group in
            group.addTask {
                do {
                    for try await _ in inbound.messages(maxSize: Self.maximumInboundMessage) {}
                    return .ended
                } catch {
                    return .failed(error)
                }
            }
            group.addTask {
                await Self.pump(subscription, topic: topic, hub: hub, stats: stats, drops: drops, progress: progress,
                                outbound: outbound, readySent: readySent)
                return .ended
            }
            group.addTask {
                guard (try? await readySent.value) != nil else { return .ended }
                try? await hub.watchOnline(topic: topic) { count in
                    try await outbound.write(.custom(.init(fin: true, opcode: .text, data: ControlFrame.online(count: count))))
                }
                return .ended
            }
            group.addTask {
                await Self.watch(subscription, query: query, limits: limits, sequence: sequence,
                                 progress: progress, drops: drops)
            }
            let end = await group.next() ?? .ended
            // Cancelling the pump also cancels a write stuck on a full socket.
            group.cancelAll()
            return end
        }
        switch end {
        case .ended:
            return
        case .failed(let error):
            throw error
        case .evicted(let reason):
            stats.add(.evicted)
            logger.info("closing a slow client (\(query.policy), capacity \(query.capacity)): \(reason)")
            // The close frame queues behind what the socket already holds: a
            // client that reads again gets it. One that never does is not
            // waited for beyond 5 s; returning closes the channel.
            let closed = BroadcastPromise<Void, Never>()
            let closing = Task {
                try? await outbound.close(Self.closeCodeEvicted, reason: reason)
                closed.succeed()
            }
            await withTaskGroup(of: Void.self) { group in
                group.addTask { _ = try? await closed.value }
                group.addTask { try? await Task.sleep(for: .seconds(5)) }
                await group.next()
                group.cancelAll()
            }
            closing.cancel()
        }
    }

    static func write(_ frame: ByteBuffer, to outbound: WebSocketOutboundWriter) async throws {
        try await outbound.write(.custom(WebSocketFrame(fin: true, opcode: .text, data: frame)))
    }

    static func pump(
        _ subscription: Hub.Subscription, topic: String, hub: Hub, stats: ServerStats, drops: DropCounter,
        progress: ConnectionProgress, outbound: WebSocketOutboundWriter, readySent: BroadcastPromise<Void, Never>
    ) async {
        do {
            // `ready` promises that nothing published from now on is missed:
            // the subscription already exists, so only its topic's LISTEN is left.
            await hub.listener.waitUntilListening(topic)
            try Task.checkCancellation()
            try await write(ControlFrame.ready, to: outbound)
            readySent.succeed()
            var reported = 0
            var first = true
            for await event in subscription {
                progress.busy.store(true, ordering: .relaxed)
                if case .message(let message) = event { progress.received.max(message.end) }
                let dropped = subscription.droppedCount
                if dropped > reported {
                    // `dropped` is the subscription's count so far: a client
                    // that misses a gap frame still learns the total.
                    if !FaultInjection.skipGapFrames {
                        try await write(ControlFrame.gap(dropped: dropped), to: outbound)
                    }
                    drops.sync(dropped)
                    reported = dropped
                }
                switch event {
                case .message(let message):
                    try await write(message.frame, to: outbound)
                    progress.written.max(message.end)
                    stats.add(.delivered)
                    stats.observeFanOut(of: message)
                case .resync:
                    // A replayed resync tells a new client nothing.
                    if !first { try await write(ControlFrame.resync, to: outbound) }
                }
                progress.busy.store(false, ordering: .relaxed)
                first = false
            }
        } catch {
            // The socket closed or the connection is ending: nothing to report.
        }
    }

    /// Returns `.evicted` when the connection must be closed; runs until cancelled otherwise.
    static func watch(
        _ subscription: Hub.Subscription, query: FeedQuery, limits: FeedLimits, sequence: Sequencer,
        progress: ConnectionProgress, drops: DropCounter
    ) async -> End {
        let clock = ContinuousClock()
        // Only these two can outgrow the budget: the others' capacity is capped.
        let checksBytes = query.policy == .bounded || query.policy == .unbounded
        let evicts = !FaultInjection.neverEvict
        let period = checksBytes ? budgetCheckPeriod : .seconds(1)
        var fullSince: ContinuousClock.Instant?
        var lastSecond = clock.now
        while !Task.isCancelled {
            do { try await Task.sleep(for: period) } catch { return .ended }
            let now = clock.now
            // Once a second: the drops, and the `.bounded` stall (as before the byte budget).
            let secondTick = now - lastSecond >= .seconds(1)
            if secondTick {
                drops.sync(subscription.droppedCount)
                lastSecond = now
            }
            if evicts && checksBytes {
                // Every message after the last one the pump took is held for
                // this connection (these policies never drop): exact, and no
                // single reading of `bufferedCount` is trusted.
                let held = sequence.totalBytes - progress.received.load(ordering: .relaxed)
                if held > limits.queueBytes {
                    return .evicted("too slow: \(held) bytes unread, over the \(limits.queueBytes)-byte budget")
                }
            }
            if evicts && query.policy == .bounded && secondTick {
                // Held `capacity` or more without a break for `evictionDelay`.
                if subscription.bufferedCount >= query.capacity {
                    let since = fullSince ?? now
                    fullSince = since
                    if now - since >= evictionDelay {
                        return .evicted("too slow: \(query.capacity) unread for 10 s")
                    }
                } else {
                    fullSince = nil
                }
            }
        }
        return .ended
    }
}

/// How far one connection's pump has got, in the feed's running byte total
/// (``FeedMessage/end``): `received` is the last message it took from the
/// subscription, `written` the last it wrote to the socket; `busy` while it
/// holds one.
public final class ConnectionProgress: Sendable {
    let received: Synchronization.Atomic<Int>
    let written: Synchronization.Atomic<Int>
    let busy = Synchronization.Atomic<Bool>(false)

    init(at total: Int) {
        received = Synchronization.Atomic(total)
        written = Synchronization.Atomic(total)
    }
}

extension Synchronization.Atomic where Value == Int {
    /// Raises the value to `value` if it is lower (one writer here, so no lost updates matter).
    func max(_ value: Int) {
        if load(ordering: .relaxed) < value { store(value, ordering: .relaxed) }
    }
}

/// Adds a subscription's drops to `/stats` once each, from whichever task sees them first.
final class DropCounter: Sendable {
    let stats: ServerStats
    let reported = Synchronization.Atomic<Int>(0)

    init(stats: ServerStats) { self.stats = stats }

    func sync(_ dropped: Int) {
        var old = reported.load(ordering: .relaxed)
        while dropped > old {
            let (exchanged, original) = reported.compareExchange(expected: old, desired: dropped, ordering: .relaxed)
            if exchanged {
                stats.add(.dropped, dropped - old)
                return
            }
            old = original
        }
    }
}

/// The connections of this process, for the drain at shutdown.
///
/// (Locks here are NIO's, on pthread mutexes: `Synchronization.Mutex` waits
/// on a futex on Linux, which ThreadSanitizer does not see, so it reports
/// every contended `withLock` as a race.)
public final class LiveConnections: Sendable {
    struct Entry: Sendable {
        let progress: ConnectionProgress
        let sequence: Sequencer
        let buffered: @Sendable () -> Int
    }
    private let entries = NIOLockedValueBox<[Int: Entry]>([:])
    private let nextID = Synchronization.Atomic<Int>(0)

    public init() {}

    func insert(_ progress: ConnectionProgress, sequence: Sequencer, buffered: @escaping @Sendable () -> Int) -> Int {
        let id = nextID.add(1, ordering: .relaxed).newValue
        entries.withLockedValue { $0[id] = Entry(progress: progress, sequence: sequence, buffered: buffered) }
        return id
    }

    func remove(_ id: Int) {
        _ = entries.withLockedValue { $0.removeValue(forKey: id) }
    }

    public var count: Int { entries.withLockedValue { $0.count } }

    /// Each connection's target: its topic's running byte total now (taken
    /// when the shutdown barrier came back).
    public func targets() -> [Int: Int] {
        entries.withLockedValue { $0.mapValues { $0.sequence.totalBytes } }
    }

    /// Connections that have not yet written every message up to their
    /// target, and still have something to write: a drained one (nothing
    /// buffered, nothing in hand) counts as done even if its policy dropped
    /// the last messages.
    public func behind(_ targets: [Int: Int]) -> Int {
        let entries = entries.withLockedValue { $0 }
        return entries.count { id, entry in
            guard let total = targets[id] else { return false }
            return entry.progress.written.load(ordering: .relaxed) < total
                && (entry.progress.busy.load(ordering: .relaxed) || entry.buffered() > 0)
        }
    }
}
