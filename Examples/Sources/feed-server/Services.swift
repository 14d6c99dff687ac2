import FeedKit
import ServiceLifecycle

// The PostgreSQL clients as services of the server's `ServiceGroup`
// (`serve` in Server.swift). The group shuts its services down one at a
// time, last listed first, each once the previous one has returned:
//
//     [PostgresPublisherService, FeedHubService, Application, ShutdownDrain]
//
// so on SIGTERM the drain runs first (it needs both clients: its barrier
// goes out through the publisher and comes back on the LISTEN connection),
// then Hummingbird closes the connections, then the hub stops every topic
// and its LISTEN connection closes, and the publish pool closes last.

/// The publish pool (``Publisher``): open until every other service has
/// stopped, then closed.
struct PostgresPublisherService: Service {
    let publisher: Publisher

    func run() async throws {
        // Returns on graceful shutdown, or throws on cancellation: either way, close.
        try? await gracefulShutdown()
        await publisher.shutdown()
    }
}

/// The hub and its ``TopicListener`` (the one LISTEN connection): once the
/// server has closed its connections, every topic is finished, its LISTEN
/// loop UNLISTENs and ends, and the connection is closed.
struct FeedHubService<Hub: FeedHub>: Service {
    let hub: Hub

    func run() async throws {
        try? await gracefulShutdown()
        await hub.shutdown()
        await hub.listener.closed()
    }
}
