import AsyncBroadcast
import Logging
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

/// Whether the feed's LISTEN is in place right now: a connection's `ready`
/// waits for it, so nothing published after `ready` can be missed.
public typealias ListenState = BroadcastValue<Bool, Never>

/// The LISTEN loop: one dedicated connection (`application_name`
/// `feed-server-listen`), reconnecting with capped backoff, numbering the
/// notifications as they arrive. It runs until its task is cancelled; the
/// hubs decide when that is.
public struct ListenLoop: Sendable {
    public static let channel = "feed"
    public static let applicationName = "feed-server-listen"

    let target: PostgresTarget
    let listening: ListenState
    let sequence: Sequencer
    let logger: Logger

    public init(target: PostgresTarget, listening: ListenState, sequence: Sequencer, logger: Logger) {
        self.target = target
        self.listening = listening
        self.sequence = sequence
        self.logger = logger
    }

    /// Runs until cancelled; `deliver` gets each event in order, one at a time.
    public func run(deliver: @Sendable (FeedEvent) async -> Void) async {
        var backoff: Duration = .milliseconds(250)
        var lostConnection = false
        var connectionID = 0
        defer { listening.send(false) }
        while !Task.isCancelled {
            connectionID += 1
            var connection: PostgresConnection?
            do {
                let opened = try await PostgresConnection.connect(
                    configuration: target.configuration(applicationName: Self.applicationName),
                    id: connectionID, logger: logger)
                connection = opened
                try await opened.listen(on: Self.channel) { notifications in
                    // `listen(on:)` calls us once LISTEN has succeeded.
                    listening.send(true)
                    backoff = .milliseconds(250)
                    if lostConnection {
                        lostConnection = false
                        logger.info("LISTEN is back: clients resync")
                        await deliver(.resync)
                    }
                    for try await notification in notifications {
                        await deliver(.message(FeedMessage(seq: sequence.next(), payload: notification.payload)))
                    }
                }
            } catch {
                if !Task.isCancelled { logger.warning("LISTEN connection failed: \(String(reflecting: error))") }
            }
            listening.send(false)
            try? await connection?.close()
            if Task.isCancelled { break }
            // Anything NOTIFYed from now until LISTEN works again is lost.
            lostConnection = true
            try? await Task.sleep(for: backoff)
            backoff = min(backoff * 2, .seconds(5))
        }
    }
}

/// `seq`: per server process, never reused when the LISTEN connection changes.
public final class Sequencer: Sendable {
    private let last = Atomic<Int>(0)
    public init() {}
    public func next() -> Int { last.add(1, ordering: .relaxed).newValue }
}

/// `POST /publish`: one connection of its own, used one request at a time,
/// so the order in which publishes return is the order PostgreSQL ran them.
public actor Publisher {
    private let target: PostgresTarget
    private let logger: Logger
    private var connection: PostgresConnection?
    private var connectionID = 0

    public init(target: PostgresTarget, logger: Logger) {
        self.target = target
        self.logger = logger
    }

    public enum Failure: Error { case unavailable(String) }

    /// Returns once `pg_notify` has run; throws `.unavailable` in an outage.
    public func publish(_ payload: String) async throws(Failure) {
        do {
            let connection = try await connected()
            try await connection.query("SELECT pg_notify(\(ListenLoop.channel), \(payload))", logger: logger)
        } catch {
            // Drop the connection: the next publish dials again.
            try? await self.connection?.close()
            self.connection = nil
            throw .unavailable(String(describing: error))
        }
    }

    /// Closes the connection; PostgresNIO requires it before release.
    public func shutdown() async {
        try? await connection?.close()
        connection = nil
    }

    private func connected() async throws -> PostgresConnection {
        if let connection, !connection.isClosed { return connection }
        connectionID += 1
        let opened = try await PostgresConnection.connect(
            configuration: target.configuration(applicationName: "feed-server-publish"),
            id: connectionID, logger: logger)
        connection = opened
        return opened
    }
}
