import ArgumentParser
import FeedKit
import Foundation
import Hummingbird
import HummingbirdWebSocket
import Logging
import Metrics
import Prometheus

@main
struct FeedServer: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "feed-server",
        abstract: "A WebSocket fan-out of PostgreSQL NOTIFYs, one channel per topic.",
        discussion: """
        Routes: GET /feed?topic=NAME&policy=newest|oldest|bounded|unbounded&capacity=N (WebSocket), \
        POST /publish?topic=NAME, GET /stats, GET /metrics (Prometheus), GET / (a live page). Topics: [a-z0-9_-]{1,48}, default 'feed'.
        """)

    enum Hub: String, ExpressibleByArgument, CaseIterable {
        case broadcast, lockStream = "lock-stream", actorChannel = "actor-channel"
    }

    @Option(help: "The port to listen on (127.0.0.1 unless --host).")
    var port: Int = 8080

    @Option(help: "The address to bind.")
    var host: String = "127.0.0.1"

    @Option(help: "postgres://USER[:PASSWORD]@HOST:PORT/DB")
    var postgres: String

    @Option(help: "The fan-out: broadcast (AsyncBroadcast), lock-stream or actor-channel (hand-written, for comparison).")
    var hub: Hub = .broadcast

    @Option(name: .customLong("sndbuf"), help: "SO_SNDBUF of each WebSocket connection, in bytes: the library's policy, not the kernel, absorbs a slow client.")
    var sendBufferBytes: Int = 32 * 1024

    @Option(help: "Log level: trace, debug, info, notice, warning, error, critical.")
    var logLevel: String = "info"

    // Limits: what a client sees when it hits each is in Examples/README.md, "Limits and hardening".
    @Option(help: "Bytes of messages one WebSocket connection may hold unread; over it, it is closed with 1013.")
    var queueBytes: Int = FeedLimits.defaultQueueBytes
    @Option(help: "The largest capacity a client may ask for (400 above it). Default and maximum: queue-bytes / the largest message's bytes.")
    var maxCapacity: Int?
    @Option(help: "Open connections (HTTP and WebSocket) this process takes; more are answered 503. Default: 10000, or the open-file limit less 128 if lower.")
    var maxConnections: Int?
    @Option(help: "Seconds from a connection's start (or its previous response) to a complete request head: 408, or a silent close when idle.")
    var headerTimeout: Double = 10
    @Option(help: "Seconds from a request's head to the end of its body: 408.")
    var bodyTimeout: Double = 10
    @Option(help: "Database connections for POST /publish (a bounded pool).")
    var publishConnections: Int = 4
    @Option(help: "Seconds a POST /publish may take, waiting for a connection and for PostgreSQL included: 503 past it.")
    var publishTimeout: Double = 5
    @Option(help: "Seconds from SIGTERM to exit, whatever the clients do.")
    var shutdownTimeout: Double = 10
    @Option(help: "Messages kept per topic for clients that reconnect with since= (0: no history).")
    var historyMessages: Int = HistoryLimits.defaultMessages
    @Option(help: "Seconds a message stays recoverable (0: no history).")
    var historySeconds: Double = Double(HistoryLimits.defaultSeconds)
    @Option(help: "Bytes all topics' recovery windows hold together; over it, the oldest messages go first. Default: 1/128 of the machine's memory, 32 MiB to 1 GiB.")
    var historyBytes: Int?
    @Option(help: "Live topics (with a connection, or a LISTEN in its 5 s after the last) this process takes; a connection to a new one beyond is closed with 1013.")
    var maxTopics: Int = Sequencers.defaultMaximumTopics
    @Option(help: "Seconds a connection's write may take (a client that stopped reading) before it is closed with 1013, published or not.")
    var sendTimeout: Double = Double(FeedLimits.defaultSendTimeout.components.seconds)
    @Option(help: "PostgreSQL channels are PREFIX.TOPIC: 1 to 14 of a-z, 0-9 and _. Servers that share a feed share a prefix.")
    var channelPrefix: String = ChannelNamespace.defaultPrefix
    @Flag(help: "Write each batch of frames with one flush, below hummingbird-websocket's writer (experimental: see the README).")
    var batchWrites = false

    @Flag(inversion: .prefixedNo, help: "Serve GET /metrics (Prometheus text format); --no-metrics: no route, no metrics kept.")
    var metrics = true

    func run() async throws {
        var logger = Logger(label: "feed-server")
        logger.logLevel = Logger.Level(rawValue: logLevel) ?? .info
        var target: PostgresTarget
        do { target = try PostgresTarget(url: postgres) } catch { throw ValidationError(error.reason) }
        do { target.namespace = try ChannelNamespace(prefix: channelPrefix) } catch { throw ValidationError(error.reason) }
        if !FaultInjection.fault.isEmpty {
            logger.warning("FEED_SERVER_FAULT=\(FaultInjection.fault): a deliberate fault is on; this server is wrong on purpose")
        }
        let ceiling = FeedLimits.ceiling(queueBytes: queueBytes)
        guard ceiling >= 1 else {
            throw ValidationError("--queue-bytes \(queueBytes) cannot hold one message of the largest size (\(FeedMessage.largestBytes) bytes)")
        }
        if let maxCapacity, !(1...ceiling).contains(maxCapacity) {
            throw ValidationError("--max-capacity must be 1...\(ceiling): --queue-bytes \(queueBytes) / \(FeedMessage.largestBytes) bytes, the largest message")
        }
        for (name, value) in [("--header-timeout", headerTimeout), ("--body-timeout", bodyTimeout), ("--shutdown-timeout", shutdownTimeout),
                              ("--publish-timeout", publishTimeout)]
        where !(value > 0 && value <= 3600) {
            throw ValidationError("\(name) must be above 0 and at most 3600 seconds")
        }
        guard publishConnections >= 1 else { throw ValidationError("--publish-connections must be at least 1") }
        guard (0...100_000).contains(historyMessages), historySeconds >= 0 && historySeconds <= 86_400 else {
            throw ValidationError("--history-messages must be 0...100000 and --history-seconds 0...86400")
        }
        let history = HistoryLimits(messages: historyMessages, maximumAge: .nanoseconds(Int64(historySeconds * 1e9)))
        let historyCap = historyBytes ?? HistoryBudget.defaultLimit(physicalMemory: ProcessInfo.processInfo.physicalMemory)
        guard historyCap >= 0 else { throw ValidationError("--history-bytes must be at least 0") }
        guard maxTopics >= 1 else { throw ValidationError("--max-topics must be at least 1") }
        guard sendTimeout > 0 && sendTimeout <= 3600 else { throw ValidationError("--send-timeout must be above 0 and at most 3600 seconds") }
        let files = Self.raiseFileLimit()
        let connectionLimit = maxConnections ?? min(10_000, max(64, files - 128))
        guard connectionLimit >= 1 else { throw ValidationError("--max-connections must be at least 1") }
        if connectionLimit > files - 64 {
            logger.warning("--max-connections \(connectionLimit) is close to the open-file limit \(files): accept may hit it (NIO then backs off)")
        }
        logger.info("limits: \(connectionLimit) connections (open files \(files)), queue \(queueBytes) bytes, capacity ≤ \(maxCapacity ?? ceiling)")
        var settings = ServerSettings(
            host: host, port: port, sendBufferBytes: sendBufferBytes, target: target, logger: logger,
            feed: FeedLimits(queueBytes: queueBytes, maximumCapacity: maxCapacity,
                             sendTimeout: .nanoseconds(Int64(sendTimeout * 1e9))),
            http: HTTPLimits(headerTimeout: .nanoseconds(Int64(headerTimeout * 1e9)), bodyTimeout: .nanoseconds(Int64(bodyTimeout * 1e9))),
            maxConnections: connectionLimit, publishConnections: publishConnections,
            shutdownTimeout: .nanoseconds(Int64(shutdownTimeout * 1e9)), metrics: nil)
        var registry: PrometheusCollectorRegistry?
        if metrics {
            // Once per process, before anything creates a metric.
            let prometheus = PrometheusCollectorRegistry()
            var factory = PrometheusMetricsFactory(registry: prometheus)
            factory.durationHistogramBuckets[FeedMetrics.Name.fanOutLatency] = FeedMetrics.fanOutBuckets
            MetricsSystem.bootstrap(factory)
            registry = prometheus
        }
        settings.metrics = registry
        settings.batchWrites = batchWrites
        settings.publishTimeout = .nanoseconds(Int64(publishTimeout * 1e9))
        logger.info("history: \(history.isEnabled ? "\(history.messages) messages or \(historySeconds) s per topic, \(historyCap) bytes in all" : "off"); at most \(maxTopics) topics, on channels \(target.namespace.prefix).TOPIC; send timeout \(sendTimeout) s")
        let listener = TopicListener(target: target, logger: logger, history: history,
                                     historyBudget: HistoryBudget(limit: historyCap), maximumTopics: maxTopics)
        // After the bootstrap, so the metrics are Prometheus'.
        let stats = ServerStats(metrics: registry == nil ? nil : FeedMetrics(), sequencers: listener.sequencers)
        switch hub {
        case .broadcast: try await serve(hub: BroadcastHub(listener: listener, limits: settings.feed, stats: stats), stats: stats, settings)
        case .lockStream: try await serve(hub: LockStreamHub(listener: listener), stats: stats, settings)
        case .actorChannel: try await serve(hub: ActorChannelHub(listener: listener), stats: stats, settings)
        }
    }

    /// Raises the soft open-file limit to the hard one (as Go's runtime does)
    /// and returns it: every connection is a file.
    static func raiseFileLimit() -> Int {
        var limit = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return 1024 }
        if limit.rlim_cur < limit.rlim_max {
            var raised = limit
            raised.rlim_cur = limit.rlim_max
            if setrlimit(Int32(RLIMIT_NOFILE.rawValue), &raised) == 0 { limit = raised }
        }
        return Int(clamping: limit.rlim_cur)
    }
}
