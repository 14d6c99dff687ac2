import ArgumentParser
import FeedKit
import Hummingbird
import HummingbirdWebSocket
import Logging

@main
struct FeedServer: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "feed-server",
        abstract: "A WebSocket fan-out of PostgreSQL NOTIFYs on channel 'feed'.",
        discussion: """
        Routes: GET /feed?policy=newest|oldest|bounded|unbounded&capacity=N (WebSocket), \
        POST /publish, GET /stats, GET / (a live page).
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

    func run() async throws {
        var logger = Logger(label: "feed-server")
        logger.logLevel = Logger.Level(rawValue: logLevel) ?? .info
        let target: PostgresTarget
        do { target = try PostgresTarget(url: postgres) } catch { throw ValidationError(error.reason) }
        if !FaultInjection.fault.isEmpty {
            logger.warning("FEED_SERVER_FAULT=\(FaultInjection.fault): a deliberate fault is on; this server is wrong on purpose")
        }
        let sequence = Sequencer()
        let settings = ServerSettings(host: host, port: port, sendBufferBytes: sendBufferBytes, target: target, logger: logger)
        switch hub {
        case .broadcast:
            try await serve(hub: BroadcastHub(target: target, sequence: sequence, logger: logger), settings)
        case .lockStream:
            try await serve(hub: LockStreamHub(target: target, sequence: sequence, logger: logger), settings)
        case .actorChannel:
            try await serve(hub: ActorChannelHub(target: target, sequence: sequence, logger: logger), settings)
        }
    }
}
