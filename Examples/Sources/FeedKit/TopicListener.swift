import AsyncBroadcast
import Logging
import NIOConcurrencyHelpers
import PostgresNIO
import Synchronization

/// Every topic's LISTEN, on one database connection per server process
/// (`application_name` `feed-server-listen`).
///
/// A hub calls ``listen(topic:deliver:)`` when a topic gains its first
/// client (the broadcast hub through `BroadcastTopics`' listener form);
/// that call LISTENs on the topic's channel, numbers the notifications with
/// the topic's ``Sequencer`` and hands them over in order until its task is
/// cancelled, which UNLISTENs. The connection is opened by the first LISTEN
/// and closed when the last one ends, so a process with no client holds no
/// database connection. When the connection breaks, every topic's LISTEN
/// comes back on a new one (capped backoff) and delivers `.resync` first:
/// what was NOTIFYed meanwhile is lost.
public final class TopicListener: Sendable {
    public static let applicationName = "feed-server-listen"

    /// The topics LISTENed now and the LISTEN loops running: a conflated
    /// value, so a connection can wait for its topic's LISTEN and shutdown
    /// for the loops to end.
    public struct Table: Sendable, Equatable {
        /// Topic → how many loops have its LISTEN in place (1, or briefly 2
        /// while a stopped topic's loop overlaps its restart).
        public var listened: [String: Int] = [:]
        /// LISTEN loops running, connected or not.
        public var running = 0
    }

    public let table = BroadcastValue<Table, Never>(Table())
    /// Each topic's `seq` and byte total, shared with its connections.
    public let sequencers: Sequencers
    /// The shutdown barriers in flight (see ``Barriers``).
    public let barriers = Barriers()
    private let connection: SharedConnection
    private let namespace: ChannelNamespace
    private let logger: Logger

    /// `history`: what each topic keeps for clients that reconnect (``History``);
    /// `historyBudget`: the cap on all topics' windows together;
    /// `maximumTopics`: live topics this process takes (``Sequencers/admit(_:)``).
    /// Each topic is LISTENed on its channel in `target.namespace`.
    public init(target: PostgresTarget, logger: Logger, history: HistoryLimits = HistoryLimits(),
                historyBudget: HistoryBudget? = nil, maximumTopics: Int = Sequencers.defaultMaximumTopics) {
        sequencers = Sequencers(history: history, budget: historyBudget, maximumTopics: maximumTopics)
        connection = SharedConnection(target: target, logger: logger)
        namespace = target.namespace
        self.logger = logger
    }

    /// Topics with their LISTEN in place (`/stats` `listeningTopics`).
    public var listeningCount: Int { table.value.listened.count }
    /// One topic with its LISTEN in place, if any: the shutdown barrier goes
    /// there (one connection delivers its notifications in commit order,
    /// whatever their channel).
    public var anyListeningTopic: String? { table.value.listened.keys.first }

    /// Returns once `topic` is LISTENed (or the task is cancelled).
    public func waitUntilListening(_ topic: String) async {
        for await table in table where table.listened[topic] != nil { return }
    }

    /// Returns once no LISTEN loop runs (after the hub stopped them all).
    public func waitUntilStopped() async {
        for await table in table where table.running == 0 { return }
    }

    /// Returns once every LISTEN connection closed so far has finished
    /// closing (after ``waitUntilStopped()``: then that is all of them).
    public func closed() async {
        await connection.closed()
    }

    /// For a shutdown that cannot wait any longer: closes the LISTEN
    /// connection and opens no other. PostgresNIO's LISTEN cannot be
    /// cancelled and waits as long as a stopped or partitioned PostgreSQL
    /// does not answer; the close (local) fails it at once, so every topic's
    /// loop can end. Loops not yet cancelled see an outage that does not end.
    public func abort() async {
        await connection.abort()
    }

    /// LISTENs on `topic` until the task is cancelled; `deliver` gets each
    /// event in order, one at a time. `onListening` runs each time LISTEN
    /// succeeds: first, and again after an outage.
    public func listen(topic: String, onListening: @Sendable () -> Void = {},
                       deliver: @Sendable (FeedEvent) async -> Void) async {
        let sequence = sequencers.retain(topic)
        table.update { $0.running += 1 }
        defer {
            table.update { $0.running -= 1 }
            sequencers.release(topic)
        }
        var backoff: Duration = .milliseconds(250)
        var lostConnection = false
        while !Task.isCancelled {
            var opened: PostgresConnection?
            do {
                let connection = try await self.connection.acquire()
                opened = connection
                try await connection.listen(on: namespace.channel(for: topic)) { notifications in
                    // `listen(on:)` calls us once LISTEN has succeeded.
                    mark(topic, listened: true)
                    onListening()
                    defer { mark(topic, listened: false) }
                    backoff = .milliseconds(250)
                    if lostConnection {
                        lostConnection = false
                        logger.info("LISTEN \(topic) is back: its clients resync")
                        sequence.history.markLost()
                        await deliver(.resync)
                    }
                    for try await notification in notifications {
                        if notification.payload.hasPrefix(Barriers.prefix) {
                            // A shutdown barrier (this process's or another's): not a message.
                            barriers.arrived(notification.payload)
                            continue
                        }
                        var message = FeedMessage(seq: sequence.next(), payload: notification.payload)
                        message.end = sequence.advance(by: message.bytes)
                        // Into the window before the hub: see ``RecoveryPhase``.
                        sequence.history.append(message)
                        await deliver(.message(message))
                    }
                }
            } catch {
                if !Task.isCancelled { logger.warning("LISTEN \(topic) failed: \(String(reflecting: error))") }
            }
            // Not cancelled: the connection broke (the sequence ended or threw).
            if let opened { await connection.release(opened, broken: !Task.isCancelled) }
            if Task.isCancelled { break }
            // Anything NOTIFYed from now until LISTEN works again is lost.
            lostConnection = true
            try? await Task.sleep(for: backoff)
            backoff = min(backoff * 2, .seconds(5))
        }
    }

    private func mark(_ topic: String, listened: Bool) {
        table.update { table in
            let count = (table.listened[topic] ?? 0) + (listened ? 1 : -1)
            table.listened[topic] = count > 0 ? count : nil
        }
    }
}

/// The LISTEN connection, shared by every topic's loop.
///
/// Every decision is made on the actor before an `await`: a connect in
/// flight is shared (re-entrant loops would otherwise each open one), and
/// only the loop that finds the connection it used still current closes it
/// when it broke.
actor SharedConnection {
    private let target: PostgresTarget
    private let logger: Logger
    private var current: PostgresConnection?
    private var connecting: Task<PostgresConnection, any Error>?
    private var users = 0
    private var nextID = 0
    /// Closes in flight: shutdown waits for them.
    private var closing: [Int: Task<Void, Never>] = [:]
    private var nextClose = 0
    /// Set by ``abort()``: no connection is handed out any more.
    private var aborted = false

    init(target: PostgresTarget, logger: Logger) {
        self.target = target
        self.logger = logger
    }

    func acquire() async throws -> PostgresConnection {
        users += 1
        do {
            return try await connection()
        } catch {
            users -= 1
            closeIfUnused()
            throw error
        }
    }

    func release(_ connection: PostgresConnection, broken: Bool) {
        users -= 1
        if broken, current === connection {
            current = nil
            close(connection)
        }
        closeIfUnused()
    }

    private func connection() async throws -> PostgresConnection {
        if aborted { throw CancellationError() }
        if let current {
            if !current.isClosed { return current }
            self.current = nil
            close(current)
        }
        if let connecting { return try await connecting.value }
        nextID += 1
        let id = nextID
        let target = self.target
        let logger = self.logger
        let task = Task {
            try await PostgresConnection.connect(
                configuration: target.configuration(applicationName: TopicListener.applicationName),
                id: id, logger: logger)
        }
        connecting = task
        let result = await task.result
        connecting = nil
        let connection = try result.get()
        if aborted {  // aborted during the connect
            close(connection)
            throw CancellationError()
        }
        current = connection
        closeIfUnused()  // every loop that wanted it may have been cancelled meanwhile
        return connection
    }

    func abort() {
        aborted = true
        if let current {
            self.current = nil
            close(current)
        }
    }

    private func closeIfUnused() {
        guard users == 0, let current else { return }
        self.current = nil
        close(current)
    }

    private func close(_ connection: PostgresConnection) {
        nextClose += 1
        let id = nextClose
        // Holds it until closed, as PostgresNIO requires.
        closing[id] = Task {
            try? await connection.close()
            self.closeEnded(id)
        }
    }

    private func closeEnded(_ id: Int) { closing[id] = nil }

    func closed() async {
        for task in Array(closing.values) { await task.value }
    }
}

/// Each topic's ``Sequencer``, kept while a connection or a LISTEN loop of
/// the topic holds it: a topic that has gone holds nothing, and its `seq`
/// starts again from 1 when it comes back.
///
/// The table is also the count of live topics (with a connection, or a
/// LISTEN loop still running: the broadcast hub keeps it 5 s after the last
/// client), and where their number is capped: a connection ``admit(_:)``s
/// its topic, which fails for a new topic when `maximumTopics` are live, in
/// the same locked step that would add it, so concurrent connections cannot
/// pass the cap between a check and an insert.
public final class Sequencers: Sendable {
    private let table = NIOLockedValueBox<[String: (sequencer: Sequencer, holders: Int)]>([:])
    /// Each new numbering's window.
    public let history: HistoryLimits
    /// The cap on every window's bytes together (nil: none).
    public let budget: HistoryBudget?
    /// Live topics this process takes (`--max-topics`).
    public let maximumTopics: Int
    private let refusedCount = Synchronization.Atomic<Int>(0)

    public static let defaultMaximumTopics = 2000

    public init(history: HistoryLimits = .off, budget: HistoryBudget? = nil, maximumTopics: Int = Sequencers.defaultMaximumTopics) {
        self.history = history
        self.budget = budget
        self.maximumTopics = max(1, maximumTopics)
    }

    /// Holds `topic`'s numbering, creating it if the topic is new: for the
    /// topic's LISTEN loop, which runs only for a topic a connection admitted.
    public func retain(_ topic: String) -> Sequencer {
        table.withLockedValue { table in retain(topic, in: &table) }
    }

    /// Holds `topic`'s numbering for a new connection; nil when the topic is
    /// new and ``maximumTopics`` are live (the connection is refused).
    public func admit(_ topic: String) -> Sequencer? {
        let sequencer = table.withLockedValue { table -> Sequencer? in
            if table[topic] == nil && table.count >= maximumTopics { return nil }
            return retain(topic, in: &table)
        }
        if sequencer == nil { refusedCount.add(1, ordering: .relaxed) }
        return sequencer
    }

    private func retain(_ topic: String, in table: inout [String: (sequencer: Sequencer, holders: Int)]) -> Sequencer {
        if let entry = table[topic] {
            table[topic] = (entry.sequencer, entry.holders + 1)
            return entry.sequencer
        }
        let sequencer = Sequencer(history: History(limits: history, budget: budget))
        table[topic] = (sequencer, 1)
        return sequencer
    }

    public func release(_ topic: String) {
        // The last holder's sequencer (and its window) is freed after the lock:
        // the window's deinit takes the budget's registry lock.
        let gone = table.withLockedValue { table -> Sequencer? in
            guard let entry = table[topic] else { return nil }
            table[topic] = entry.holders > 1 ? (entry.sequencer, entry.holders - 1) : nil
            return entry.holders > 1 ? nil : entry.sequencer
        }
        _ = gone
    }

    /// Live topics now.
    public var count: Int { table.withLockedValue { $0.count } }
    /// Connections refused so far because ``maximumTopics`` topics were live.
    public var refused: Int { refusedCount.load(ordering: .relaxed) }
}
