import AsyncBroadcast
import HummingbirdWebSocket
import Logging
import NIOCore
import NIOWebSocket
import Synchronization

/// One WebSocket connection of `/feed`, the same for every hub.
///
/// Four tasks, and the first to end ends the connection:
/// - the reader drains the inbound side, so a client's close is seen at once;
/// - the pump waits for the LISTEN, writes `ready`, then each event, with a
///   `gap` (carrying the subscription's `droppedCount`) before it whenever
///   that count grew;
/// - `online` frames, at most once a second, once `ready` is out;
/// - for `.bounded`, the eviction watchdog (see ``evictionDelay``); when it
///   fires, the others are cancelled and the connection is closed with 1013.
public struct FeedConnection<Hub: FeedHub>: Sendable {
    public let hub: Hub
    public let stats: ServerStats

    /// A `.bounded(n)` client that has held n or more unread for this long is
    /// closed with 1013 (try again later). A listener's `send` never waits,
    /// so `.bounded` would otherwise grow without limit behind a stalled socket.
    public static var evictionDelay: Duration { .seconds(10) }
    public static var closeCodeEvicted: WebSocketErrorCode { .unknown(1013) }

    public init(hub: Hub, stats: ServerStats) {
        self.hub = hub
        self.stats = stats
    }

    public func serve(query: FeedQuery, inbound: WebSocketInboundStream, outbound: WebSocketOutboundWriter, logger: Logger) async {
        let subscription = await hub.subscribe(query)
        stats.add(.subscribers)
        stats.add(.connectionsTotal)
        defer {
            subscription.cancel()
            stats.add(.subscribers, -1)
        }
        let hub = self.hub
        let stats = self.stats
        // `ready` is the connection's first frame: the other writers wait for it.
        let readySent = BroadcastPromise<Void, Never>()
        let evict = await withTaskGroup(of: Bool.self) { group in
            group.addTask {
                do { for try await _ in inbound {} } catch {}
                return false
            }
            group.addTask {
                await Self.pump(subscription, hub: hub, stats: stats, outbound: outbound, readySent: readySent)
                return false
            }
            group.addTask {
                guard (try? await readySent.value) != nil else { return false }
                try? await hub.watchOnline { count in
                    try await outbound.write(.custom(.init(fin: true, opcode: .text, data: ControlFrame.online(count: count))))
                }
                return false
            }
            if query.policy == .bounded && !FaultInjection.neverEvict {
                group.addTask { await Self.stalled(subscription, capacity: query.capacity) }
            }
            let evict = await group.next() ?? false
            // Cancelling the pump also cancels a write stuck on a full socket.
            group.cancelAll()
            return evict
        }
        if evict {
            stats.add(.evicted)
            logger.info("evicting a bounded client: \(query.capacity) unread for \(Self.evictionDelay)")
            // The close frame queues behind what the socket already holds: a
            // client that reads again gets it. One that never does is not
            // waited for beyond 5 s; returning closes the channel.
            let closed = BroadcastPromise<Void, Never>()
            let closing = Task {
                try? await outbound.close(Self.closeCodeEvicted, reason: "too slow: \(query.capacity) unread for 10 s")
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
        _ subscription: Hub.Subscription, hub: Hub, stats: ServerStats, outbound: WebSocketOutboundWriter,
        readySent: BroadcastPromise<Void, Never>
    ) async {
        do {
            // `ready` promises that nothing published from now on is missed:
            // the subscription already exists, so only the LISTEN is left.
            for await isListening in hub.listening where isListening { break }
            try Task.checkCancellation()
            try await write(ControlFrame.ready, to: outbound)
            readySent.succeed()
            var reported = 0
            var first = true
            for await event in subscription {
                let dropped = subscription.droppedCount
                if dropped > reported {
                    // `dropped` is the subscription's count so far: a client
                    // that misses a gap frame still learns the total.
                    if !FaultInjection.skipGapFrames {
                        try await write(ControlFrame.gap(dropped: dropped), to: outbound)
                    }
                    stats.add(.dropped, dropped - reported)
                    reported = dropped
                }
                switch event {
                case .message(let message):
                    try await write(message.frame, to: outbound)
                    stats.add(.delivered)
                case .resync:
                    // A replayed resync tells a new client nothing.
                    if !first { try await write(ControlFrame.resync, to: outbound) }
                }
                first = false
            }
        } catch {
            // The socket closed or the connection is ending: nothing to report.
        }
    }

    /// True once the subscription has held `capacity` or more unread for
    /// `evictionDelay` without a break; checked once a second.
    static func stalled(_ subscription: Hub.Subscription, capacity: Int) async -> Bool {
        let clock = ContinuousClock()
        var fullSince: ContinuousClock.Instant?
        while !Task.isCancelled {
            if subscription.bufferedCount >= capacity {
                let since = fullSince ?? clock.now
                fullSince = since
                if clock.now - since >= evictionDelay { return true }
            } else {
                fullSince = nil
            }
            do { try await Task.sleep(for: .seconds(1)) } catch { return false }
        }
        return false
    }
}
