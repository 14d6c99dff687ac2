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
/// - the pump waits until the topic's listener is in place, writes `ready`
///   (and to a client that came back with `since`, what it missed:
///   ``RecoveryPhase``), then the events in batches: each time, what the
///   subscription holds (up to ``batchLimit``, waiting only while it holds
///   nothing), with a `gap` (carrying the drops so far) where the hub's
///   reader puts them, written with one flush (``FeedFrameWriter``);
/// - `online` frames, at most once a second, once `ready` is out;
/// - for a hub that does not evict by itself (the two hand-written ones),
///   the watchdog: it counts drops into `/stats` as they happen (not only
///   when the pump writes), closes a `bounded` or `unbounded` connection
///   whose unread messages pass the byte budget (`FeedLimits.queueBytes`),
///   and a `.bounded(n)` one that has held n or more unread for
///   ``evictionDelay``; either is closed with 1013. `newest` and `oldest`
///   need no byte check: their capacity is capped so that a full queue of
///   the largest messages fits the budget. The broadcast hub needs none:
///   the library ends the subscription at the send that finds it over its
///   limit (``BroadcastHub/eviction(for:)``), the pump's reader then ends,
///   and the connection closes with 1013 the same way.
///
/// And a parked wait for the process's sweeper (``LiveConnections``), which
/// closes with 1013 a connection that has not taken what was sent to it for
/// `--send-timeout`, whether or not anything is published: a client that
/// stopped reading on a quiet topic is not kept forever.
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
    ///
    /// With the connection's `channel`, the pump writes each batch of frames
    /// with one flush (``FeedFrameWriter``); without it, one frame at a time
    /// through `outbound`, as hummingbird-websocket writes. `socket` is the
    /// connection's channel whichever way it writes: its writability tells
    /// the sweeper whether the client takes what was sent (``LiveConnections``),
    /// and the frame-by-frame path paces the recovery's pages on its event loop.
    public func serve(query: FeedQuery, inbound: WebSocketInboundStream, outbound: WebSocketOutboundWriter,
                      channel: (any Channel)? = nil, socket: (any Channel)? = nil, logger: Logger) async throws {
        // The topic's numbering, held for as long as this connection lives,
        // so that its `seq` and byte total are the ones its messages carry.
        let topic = query.topic
        // A new topic is refused at the process's cap (`--max-topics`), before anything exists for it.
        guard let sequence = hub.listener.sequencers.admit(topic) else {
            let reason = "too many topics: this server takes \(hub.listener.sequencers.maximumTopics) (--max-topics); try again later"
            logger.info("refusing topic \(topic): \(reason)")
            try? await outbound.close(Self.closeCodeEvicted, reason: reason)
            return
        }
        defer { hub.listener.sequencers.release(topic) }
        let progress = ConnectionProgress(at: sequence.totalBytes)
        let subscription = await hub.subscribe(query)
        stats.add(.subscribers)
        stats.add(.connectionsTotal)
        let drops = DropCounter(stats: stats)
        let entry = live.insert(progress, sequence: sequence, socket: socket) { subscription.bufferedCount }
        let hubCountsDrops = hub.evictsSlowClients
        defer {
            live.remove(entry)
            // A hub that evicts by itself counted every drop at its sends.
            if !hubCountsDrops || FaultInjection.countDropsTwice { drops.sync(subscription.droppedCount) }
            subscription.cancel()
            stats.add(.subscribers, -1)
        }
        let hub = self.hub
        let stats = self.stats
        let limits = self.limits
        let writer = await FrameSink(channel: channel, outbound: outbound, socket: socket, progress: progress, logger: logger)
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
            // With the batch writer, the pump runs on the connection's event
            // loop: a wake-up is one job there, and a batch is written and
            // flushed in place (no hop from the concurrency pool to the loop).
            let loop = writer.batch.map { EventLoopActor($0.channel.eventLoop) }
            group.addTask {
                await Self.pump(subscription, topic: topic, hub: hub, stats: stats, drops: drops, progress: progress,
                                writer: writer, readySent: readySent, pageBytes: max(1, limits.queueBytes / 4),
                                recovery: RecoveryPhase(request: query.recovery, sequence: sequence), isolation: loop)
                // The hub ended the subscription: its client was too slow.
                if subscription.isEvicted { return .evicted(Self.evictionReason(query, limits: limits)) }
                return .ended
            }
            group.addTask {
                guard (try? await readySent.value) != nil else { return .ended }
                try? await hub.watchOnline(topic: topic) { count in
                    try await outbound.write(.custom(.init(fin: true, opcode: .text, data: ControlFrame.online(count: count))))
                }
                return .ended
            }
            // The sweeper found the pump stuck in a write for `--send-timeout`.
            group.addTask {
                guard let reason = try? await progress.stalled.value else { return .ended }
                return .evicted(reason)
            }
            if hub.evictsSlowClients {
                // The library evicts at a send; this wakes the connection
                // even while its pump is stuck writing to the client.
                group.addTask {
                    do { try await hub.waitUntilEvicted(subscription, topic: topic) } catch { return .ended }
                    return .evicted(Self.evictionReason(query, limits: limits))
                }
            } else {
                group.addTask {
                    await Self.watch(subscription, query: query, limits: limits, sequence: sequence,
                                     progress: progress, drops: drops)
                }
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
            // waited for beyond 5 s: then the channel is closed.
            let closed = BroadcastPromise<Void, Never>()
            let closing = Task {
                try? await writer.close(Self.closeCodeEvicted, reason: reason)
                closed.succeed()
            }
            if FaultInjection.keepEvictedOpen {
                _ = try? await closed.value
                return
            }
            let inTime = await withTaskGroup(of: Bool.self) { group in
                group.addTask { (try? await closed.value) != nil }
                group.addTask {
                    try? await Task.sleep(for: .seconds(5))
                    return false
                }
                let first = await group.next() ?? false
                group.cancelAll()
                return first
            }
            closing.cancel()
            if !inTime { await writer.abort() }
        }
    }

    /// Events the pump takes from its subscription at most at once, and so
    /// frames it writes with one flush (plus a `gap`): 64 messages of the
    /// largest kind are about 1 MiB, held in the batch instead of the
    /// subscription while they are written.
    public static var batchLimit: Int { 64 }

    static func pump(
        _ subscription: Hub.Subscription, topic: String, hub: Hub, stats: ServerStats, drops: DropCounter,
        progress: ConnectionProgress, writer: FrameSink, readySent: BroadcastPromise<Void, Never>,
        pageBytes: Int, recovery: RecoveryPhase, isolation: isolated (any Actor)?
    ) async {
        var writer = writer
        do {
            // `ready` promises that nothing published from now on is missed:
            // the subscription already exists, so only its topic's LISTEN is left.
            await subscription.waitUntilReady(listener: hub.listener, topic: topic)
            try Task.checkCancellation()
            // `ready`, then what a client that came back with `since` missed
            // (Recovery.swift): live messages up to `recovered` were among it.
            // A page at a time, each written before the next is read: a
            // client that stopped reading holds one page, not the window.
            var plan = recovery.plan(pageLimit: Self.batchLimit, pageBytes: pageBytes)
            progress.writing()
            try await writer.write(plan.frames)
            while let next = plan.next {
                try await writer.pace()
                plan = recovery.page(after: next, through: plan.through, pageLimit: Self.batchLimit, pageBytes: pageBytes)
                progress.writing()
                try await writer.write(plan.frames)
            }
            progress.wrote()
            let recovered = plan.through
            readySent.succeed()
            // The hub counts its own drops at each send; the others' are synced here.
            let syncsDrops = !hub.evictsSlowClients
            var droppedSoFar = 0
            var reader = subscription.makeReader()
            var items: [FeedItem] = []
            var frames: [ByteBuffer] = []
            items.reserveCapacity(Self.batchLimit + 1)
            frames.reserveCapacity(Self.batchLimit + 1)
            // Each batch: what the subscription holds now (waiting only while
            // it holds nothing), written with one flush.
            while await reader.next(upTo: Self.batchLimit, into: &items, isolation: isolation) > 0 {
                progress.busy.store(true, ordering: .relaxed)
                var end: Int?
                var messages = 0
                for item in items {
                    if case .event(.message(let message)) = item { end = message.end }
                }
                if let end { progress.received.max(end) }
                for item in items {
                    switch item {
                    case .lagged(let count):
                        // The total so far: a client that misses a gap frame still learns it.
                        droppedSoFar += count
                        if !FaultInjection.skipGapFrames { frames.append(ControlFrame.gap(dropped: droppedSoFar)) }
                        if syncsDrops { drops.sync(droppedSoFar) }
                    case .event(.message(let message)):
                        // Already sent from the history window.
                        if message.seq <= recovered { continue }
                        frames.append(message.frame)
                        messages += 1
                    case .event(.resync):
                        frames.append(ControlFrame.resync)
                    }
                }
                if !frames.isEmpty {
                    progress.writing()
                    stats.add(.writes, try await writer.write(frames))
                    progress.wrote()
                    for item in items {
                        if case .event(.message(let message)) = item, message.seq > recovered {
                            stats.observeFanOut(of: message)
                        }
                    }
                }
                if let end { progress.written.max(end) }
                stats.add(.delivered, messages)
                progress.busy.store(false, ordering: .relaxed)
                items.removeAll(keepingCapacity: true)
                frames.removeAll(keepingCapacity: true)
            }
        } catch {
            // The socket closed or the connection is ending: nothing to report.
        }
    }

    /// The close reason of a connection its hub evicted.
    static func evictionReason(_ query: FeedQuery, limits: FeedLimits) -> String {
        switch query.policy {
        case .bounded:
            "too slow: \(query.capacity) unread for 10 s, or more than \(Swift.max(limits.maximumCapacity, query.capacity)) unread"
        default:
            "too slow: more than \(limits.maximumCapacity) unread"
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

/// Where the pump's frames go: a batch with one flush through
/// ``FeedFrameWriter``, or (without the channel) frame by frame through
/// hummingbird-websocket's writer.
struct FrameSink: Sendable {
    var batch: FeedFrameWriter?
    let outbound: WebSocketOutboundWriter
    let socket: (any Channel)?
    /// Told of each frame taken on the frame-by-frame path, so that a long
    /// batch to a client that reads slowly is not taken for a stalled one.
    let progress: ConnectionProgress?

    init(channel: (any Channel)?, outbound: WebSocketOutboundWriter, socket: (any Channel)? = nil,
         progress: ConnectionProgress? = nil, logger: Logger) async {
        self.outbound = outbound
        self.socket = socket
        self.progress = progress
        guard let channel else {
            batch = nil
            return
        }
        do {
            batch = try await FeedFrameWriter.install(on: channel)
        } catch {
            // The channel closed before the pipeline could take the gate.
            logger.debug("frame-by-frame writes: \(error)")
            batch = nil
        }
    }

    /// Sends a close frame behind everything written so far; with the batch
    /// writer, returns once it is in the socket (``FeedFrameWriter/close(code:reason:)``).
    func close(_ code: WebSocketErrorCode, reason: String) async throws {
        if let batch {
            try await batch.close(code: code, reason: reason)
        } else {
            try await outbound.close(code, reason: reason)
        }
    }

    /// Closes the channel of a client that did not take its close frame in
    /// time. Without the batch writer, hummingbird-websocket's close, once
    /// cancelled, leaves its handshake to end the connection.
    func abort() async {
        guard let batch else { return }
        try? await batch.channel.close()
    }

    /// Returns once the frames written so far have reached the channel, so
    /// that the next write waits if they made it unwritable (a client that is
    /// not reading): hummingbird-websocket's writer takes frames as fast as
    /// they come until the event loop has written them and turned the
    /// channel's writability off, so without this a client that stopped
    /// reading would be handed a whole recovery window. The batch writer
    /// needs nothing: it waits for its previous batch to reach the socket.
    func pace() async throws {
        guard batch == nil, let socket else { return }
        // Runs after the loop's tasks that write those frames.
        try await socket.eventLoop.submit {}.get()
    }

    /// Writes `frames` in order and returns how many flushes that took.
    @discardableResult
    mutating func write(_ frames: [ByteBuffer], isolation: isolated (any Actor)? = #isolation) async throws -> Int {
        if batch != nil {
            try await batch!.write(frames)
            return 1
        }
        for frame in frames {
            try await outbound.write(.custom(WebSocketFrame(fin: true, opcode: .text, data: frame)))
            progress?.writing()  // the write goes on, and the client takes it
        }
        return frames.count
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
    /// When the write in progress started (``monotonicNanoseconds()``); 0: none.
    let writingSince = Synchronization.Atomic<UInt64>(0)
    /// When the last write completed (``monotonicNanoseconds()``).
    let wroteAt = Synchronization.Atomic<UInt64>(monotonicNanoseconds())
    /// The sweeper's own: since when it has found the channel unwritable at every look; 0: writable.
    let unwritableSince = Synchronization.Atomic<UInt64>(0)
    /// Resolved by the sweeper, with the close reason, when the client has not taken what was sent in time.
    let stalled = BroadcastPromise<String, Never>()

    /// A write starts (or the next page of one that goes on).
    func writing() { writingSince.store(monotonicNanoseconds(), ordering: .relaxed) }
    func wrote() {
        writingSince.store(0, ordering: .relaxed)
        wroteAt.store(monotonicNanoseconds(), ordering: .relaxed)
    }

    /// The sweeper's test, at `now`: the pump has been in one write for
    /// over `limit` ns, or the channel (its pending writes over NIO's high
    /// watermark) has been unwritable at every look for over `limit` with no
    /// write completed meanwhile: what was handed to NIO is not being taken,
    /// though the pump has nothing more to write (a quiet topic).
    func isStalled(now: UInt64, limit: UInt64, writable: Bool) -> Bool {
        // `now` was read before these loads: a write that started or ended
        // after it has a later stamp, and must count as 0 s old, not (wrapping)
        // as 584 years (that closed a reading client as "too slow").
        func age(_ stamp: UInt64) -> UInt64 { now > stamp ? now - stamp : 0 }
        let since = writingSince.load(ordering: .relaxed)
        if since != 0 && age(since) > limit { return true }
        if writable {
            unwritableSince.store(0, ordering: .relaxed)
            return false
        }
        let unwritable = unwritableSince.load(ordering: .relaxed)
        guard unwritable != 0 else {
            unwritableSince.store(now, ordering: .relaxed)
            return false
        }
        return age(unwritable) > limit && age(wroteAt.load(ordering: .relaxed)) > limit
    }

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
        let socket: (any Channel)?
        let buffered: @Sendable () -> Int
    }
    private let entries = NIOLockedValueBox<[Int: Entry]>([:])
    private let nextID = Synchronization.Atomic<Int>(0)
    /// `--send-timeout`: a connection whose pump has been in one write this
    /// long is closed with 1013 (nil: never).
    public let sendTimeout: Duration?

    /// With a `sendTimeout`, one task (for the whole process, not one per
    /// connection) looks at every connection's write in progress, every
    /// quarter of the timeout (at most every second): a client that stopped
    /// reading is closed within 1.25 × the timeout, whether or not its topic
    /// has anything new, with no timer per connection. The task ends when
    /// this object is gone.
    public init(sendTimeout: Duration? = nil) {
        self.sendTimeout = sendTimeout
        guard let sendTimeout, sendTimeout > .zero else { return }
        let period = min(sendTimeout / 4, .seconds(1))
        let limit = UInt64(sendTimeout.components.seconds) * 1_000_000_000 + UInt64(sendTimeout.components.attoseconds / 1_000_000_000)
        let seconds = Double(sendTimeout.components.seconds) + Double(sendTimeout.components.attoseconds) / 1e18
        let reason = "too slow: nothing taken for \(seconds == seconds.rounded() ? String(Int(seconds)) : String(seconds)) s (--send-timeout)"
        Task.detached { [weak self] in
            while (try? await Task.sleep(for: period)) != nil {
                guard let self else { return }
                self.sweep(limit: limit, reason: reason)
            }
        }
    }

    /// Resolves the `stalled` promise of every connection that has not taken
    /// what was sent to it for `limit` ns (``ConnectionProgress/isStalled(now:limit:writable:)``).
    func sweep(limit: UInt64, reason: String) {
        let now = monotonicNanoseconds()
        let entries = entries.withLockedValue { $0.values.map { ($0.progress, $0.socket) } }
        // `isWritable` is an atomic load in NIO (thread-safe `Channel` API).
        let stalled = entries.compactMap { progress, socket in
            progress.isStalled(now: now, limit: limit, writable: socket?.isWritable ?? true) ? progress : nil
        }
        // After the lock: resuming the waiter is not done under it.
        for progress in stalled { progress.stalled.succeed(reason) }
    }

    func insert(_ progress: ConnectionProgress, sequence: Sequencer, socket: (any Channel)? = nil,
                buffered: @escaping @Sendable () -> Int) -> Int {
        let id = nextID.add(1, ordering: .relaxed).newValue
        entries.withLockedValue { $0[id] = Entry(progress: progress, sequence: sequence, socket: socket, buffered: buffered) }
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
