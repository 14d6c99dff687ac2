import AsyncBroadcast
import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import PostgresNIO
import Synchronization

/// Where the server finds PostgreSQL: parsed from `postgres://USER[:PASSWORD]@HOST:PORT/DB`.
public struct PostgresTarget: Sendable {
    public var host: String
    public var port: Int
    public var user: String
    public var password: String?
    public var database: String
    /// The channels of this server's topics there (`--channel-prefix`).
    public var namespace = ChannelNamespace.default

    public init(url: String) throws(BadFeedQuery) {
        guard url.hasPrefix("postgres://") || url.hasPrefix("postgresql://") else {
            throw BadFeedQuery("--postgres must look like postgres://USER@HOST:PORT/DB")
        }
        var rest = Substring(url.drop(while: { $0 != "/" }).dropFirst(2))
        var credentials: Substring = "postgres"
        if let at = rest.lastIndex(of: "@") {
            credentials = rest[..<at]
            rest = rest[rest.index(after: at)...]
        }
        let parts = credentials.split(separator: ":", maxSplits: 1)
        user = String(parts[0])
        password = parts.count > 1 ? String(parts[1]) : nil
        let slash = rest.firstIndex(of: "/") ?? rest.endIndex
        let hostPort = rest[..<slash]
        database = slash < rest.endIndex ? String(rest[rest.index(after: slash)...]) : user
        if database.isEmpty { database = user }
        if let colon = hostPort.lastIndex(of: ":"), let port = Int(hostPort[hostPort.index(after: colon)...]) {
            host = String(hostPort[..<colon])
            self.port = port
        } else {
            host = String(hostPort)
            port = 5432
        }
        if host.isEmpty { host = "127.0.0.1" }
    }

    /// One connection's configuration; `applicationName` shows in `pg_stat_activity`.
    public func configuration(applicationName: String) -> PostgresConnection.Configuration {
        var configuration = PostgresConnection.Configuration(
            host: host, port: port, username: user, password: password, database: database, tls: .disable)
        configuration.options.additionalStartupParameters = [("application_name", applicationName)]
        configuration.options.connectTimeout = .seconds(2)
        return configuration
    }
}

/// One topic's `seq` (per server process, from 1, never reused while the
/// topic has a client or a LISTEN: ``Sequencers``), and the running total of
/// its messages' bytes (``FeedMessage/end``); its ``epoch`` names this
/// numbering, and its ``history`` keeps its recent messages for recovery.
public final class Sequencer: Sendable {
    private let last = Synchronization.Atomic<Int>(0)
    private let bytes = Synchronization.Atomic<Int>(0)
    /// Random, new for each numbering (each time the topic comes back, and in
    /// each process), below 2^53 so that JavaScript reads it exactly.
    public let epoch: Int
    public let history: History
    public init(history: History = History(limits: .off), epoch: Int = Sequencer.newEpoch()) {
        self.history = history
        self.epoch = epoch
    }
    public static func newEpoch() -> Int { Int.random(in: 1...(1 << 53) - 1) }
    public func next() -> Int { last.add(1, ordering: .relaxed).newValue }
    /// Adds a message's bytes to the running total and returns the new total (the message's `end`).
    public func advance(by n: Int) -> Int { bytes.add(n, ordering: .relaxed).newValue }
    /// The running total of bytes so far.
    public var totalBytes: Int { bytes.load(ordering: .relaxed) }
}

/// A barrier on the feed: a NOTIFY with a payload no client can publish
/// (it starts with U+0001, which `POST /publish` refuses). PostgreSQL delivers
/// a listener its notifications in commit order, so once the LISTEN loop has
/// seen a barrier sent after some publish returned, it has delivered that
/// publish's message too. Shutdown uses it: every message answered 200
/// before SIGTERM is in the hub before the connections are closed.
public final class Barriers: Sendable {
    public static let prefix = "\u{1}barrier "
    private let waiting = NIOLockedValueBox<[String: BroadcastPromise<Void, Never>]>([:])
    private let counter = Synchronization.Atomic<Int>(0)

    public init() {}

    /// A new barrier's payload, registered as awaited.
    public func make() -> (payload: String, arrived: BroadcastPromise<Void, Never>) {
        let payload = Self.prefix + "\(ProcessInfo.processInfo.processIdentifier) \(counter.add(1, ordering: .relaxed).newValue)"
        let promise = BroadcastPromise<Void, Never>()
        waiting.withLockedValue { $0[payload] = promise }
        return (payload, promise)
    }

    /// Called by the LISTEN loop for every barrier it sees (other processes' are ignored).
    func arrived(_ payload: String) {
        waiting.withLockedValue { $0.removeValue(forKey: payload) }?.succeed()
    }

    public func forget(_ payload: String) {
        _ = waiting.withLockedValue { $0.removeValue(forKey: payload) }
    }
}

/// `POST /publish`: a bounded pool of connections (`application_name`
/// `feed-server-publish`), at most `size` of them open or opening at once.
///
/// Every pool decision is made on the actor before any `await`, so
/// re-entrancy cannot open more than `size` connections: a publish that finds
/// no idle connection and no free slot waits for one (a connection handed
/// over, or a slot freed). A connect that fails fails the publishes waiting
/// behind it too (they would have dialled the same dead database). A
/// statement that PostgreSQL refuses leaves its connection in the pool; a
/// connection that broke is closed, and only that one.
///
/// A publish ends within `timeout` (or its own `within`), whatever
/// PostgreSQL does: waiting for a connection, connecting and the statement
/// share that deadline. PostgresNIO's query cannot be cancelled and waits as
/// long as a stopped or partitioned PostgreSQL does not answer, so at the
/// deadline the connection is closed, which fails the query at once.
/// ``shutdown()`` closes the connections of the publishes in flight the same way.
public actor Publisher {
    private let target: PostgresTarget
    private let logger: Logger
    public nonisolated let size: Int
    /// The deadline of one publish, from its call.
    public nonisolated let timeout: Duration
    private var idle: [PostgresConnection] = []
    /// Connections running a statement now: closed by ``shutdown()``.
    private var busy: [ObjectIdentifier: PostgresConnection] = [:]
    /// Connections open or being opened: never more than `size`.
    private var open = 0
    private var waiters: [(id: Int, continuation: CheckedContinuation<Lease, Never>)] = []
    private var nextWaiter = 0
    private var connectionID = 0
    private var closing = false

    enum Lease {
        case connection(PostgresConnection)
        /// A slot is free: dial.
        case dial
        case failed(String)
        case timedOut
    }

    public init(target: PostgresTarget, size: Int = 4, timeout: Duration = .seconds(5), logger: Logger) {
        self.target = target
        self.size = max(1, size)
        self.timeout = timeout
        self.logger = logger
    }

    public enum Failure: Error {
        /// The database is unreachable, or no connection came free in time: 503.
        case unavailable(String)
        /// PostgreSQL refused the statement (the connection is fine): the payload's fault.
        case rejected(String)
    }

    /// Returns once `pg_notify` has run. `channel` is a topic: validated by
    /// the caller, and bound as a parameter anyway. Throws `.unavailable`
    /// once `limit` (default ``timeout``) has passed: the statement may still
    /// have run (PostgreSQL did not say), as with any timeout.
    public func publish(_ payload: String, to channel: String = FeedTopic.default,
                        within limit: Duration? = nil) async throws(Failure) {
        let limit = limit ?? timeout
        let deadline = ContinuousClock.now + limit
        let connection = try await acquire(until: deadline, limit: limit)
        let key = ObjectIdentifier(connection)
        busy[key] = connection
        let logger = self.logger
        let timer = Task {
            guard (try? await Task.sleep(until: deadline, clock: .continuous)) != nil else { return }
            logger.notice("publish: PostgreSQL did not answer within \(limit): closing that connection")
            try? await connection.close()
        }
        defer { timer.cancel() }
        do {
            // The topic's channel in this server's namespace, never the client's name itself.
            try await connection.query("SELECT pg_notify(\(target.namespace.channel(for: channel)), \(payload))", logger: logger)
            timer.cancel()  // before the connection goes back to the pool
            release(connection, healthy: true)
        } catch let error as PSQLError where error.code == .server {
            // The server answered with an error: the connection itself is fine.
            timer.cancel()
            release(connection, healthy: true)
            throw .rejected(error.serverInfo?[.message] ?? "refused by PostgreSQL")
        } catch {
            release(connection, healthy: false)
            if closing { throw .unavailable("shutting down") }
            if ContinuousClock.now >= deadline { throw .unavailable("PostgreSQL did not answer within \(limit)") }
            throw .unavailable(String(describing: error))
        }
    }

    /// Closes every connection, those of the publishes in flight too (they
    /// fail at once, 503: PostgreSQL may never answer them); publishes fail
    /// from now on. Called again, it closes what is left.
    public func shutdown() async {
        closing = true
        for waiter in waiters { waiter.continuation.resume(returning: .failed("shutting down")) }
        waiters.removeAll()
        let idle = self.idle
        self.idle.removeAll()
        open -= idle.count
        // Each close is local (PostgresNIO closes the socket), so none waits for PostgreSQL.
        for connection in idle + busy.values { try? await connection.close() }
    }

    private func acquire(until deadline: ContinuousClock.Instant, limit: Duration) async throws(Failure) -> PostgresConnection {
        while true {
            if closing { throw .unavailable("shutting down") }
            if let connection = idle.popLast() {
                if connection.isClosed { discard(connection); continue }
                return connection
            }
            let left = deadline - ContinuousClock.now
            guard left > .zero else { throw .unavailable("no database connection within \(limit)") }
            if open < size {
                open += 1  // taken before the await: a re-entrant publish sees it
                connectionID += 1
                let id = connectionID
                var configuration = target.configuration(applicationName: "feed-server-publish")
                // The connect's own limit (2 s), or what is left of the deadline.
                let leftNanoseconds = left.components.seconds * 1_000_000_000 + left.components.attoseconds / 1_000_000_000
                configuration.options.connectTimeout = min(
                    configuration.options.connectTimeout, .nanoseconds(max(1_000_000, leftNanoseconds)))
                do {
                    let connection = try await PostgresConnection.connect(
                        configuration: configuration, id: id, logger: logger)
                    if closing {
                        open -= 1
                        try? await connection.close()
                        throw Failure.unavailable("shutting down")
                    }
                    return connection
                } catch let failure as Failure {
                    throw failure
                } catch {
                    open -= 1
                    let reason = String(describing: error)
                    // Those waiting would dial the same dead database: they fail with this one.
                    let waiting = waiters
                    waiters.removeAll()
                    for waiter in waiting { waiter.continuation.resume(returning: .failed(reason)) }
                    throw .unavailable(reason)
                }
            }
            switch await wait(until: deadline) {
            case .connection(let connection): return connection
            case .dial: continue
            case .failed(let reason): throw .unavailable(reason)
            case .timedOut: throw .unavailable("no database connection came free within \(limit)")
            }
        }
    }

    private func wait(until deadline: ContinuousClock.Instant) async -> Lease {
        nextWaiter += 1
        let id = nextWaiter
        let timer = Task { [weak self] in
            guard (try? await Task.sleep(until: deadline, clock: .continuous)) != nil else { return }
            await self?.expire(id)
        }
        defer { timer.cancel() }
        return await withCheckedContinuation { continuation in
            waiters.append((id, continuation))
        }
    }

    private func expire(_ id: Int) {
        guard let index = waiters.firstIndex(where: { $0.id == id }) else { return }
        waiters.remove(at: index).continuation.resume(returning: .timedOut)
    }

    private func release(_ connection: PostgresConnection, healthy: Bool) {
        busy[ObjectIdentifier(connection)] = nil
        guard healthy, !connection.isClosed, !closing else {
            discard(connection)
            return
        }
        if !waiters.isEmpty {
            waiters.removeFirst().continuation.resume(returning: .connection(connection))
        } else {
            idle.append(connection)
        }
    }

    /// Closes one connection (only this one) and frees its slot for a waiter to dial.
    private func discard(_ connection: PostgresConnection) {
        open -= 1
        Task { try? await connection.close() }  // holds it until closed, as PostgresNIO requires
        if !waiters.isEmpty {
            waiters.removeFirst().continuation.resume(returning: .dial)
        }
    }
}
