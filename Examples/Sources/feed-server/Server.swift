import Dispatch
import FeedKit
import Foundation
import Hummingbird
import HummingbirdCore
import HummingbirdWebSocket
import Logging
import NIOConcurrencyHelpers
import NIOCore
import Prometheus
import ServiceLifecycle
import Synchronization

struct ServerSettings: Sendable {
    var host: String
    var port: Int
    var sendBufferBytes: Int
    var target: PostgresTarget
    var logger: Logger
    var feed: FeedLimits
    var http: HTTPLimits
    var maxConnections: Int
    var publishConnections: Int
    /// `--publish-timeout`: a `POST /publish` is answered within it (503 past it).
    var publishTimeout: Duration = .seconds(5)
    var shutdownTimeout: Duration
    /// The registry the process bootstrapped swift-metrics with; nil: `--no-metrics` (no `/metrics`).
    var metrics: PrometheusCollectorRegistry?
    /// `--batch-writes`: a batch's frames written with one flush, below
    /// hummingbird-websocket's writer (``FeedFrameWriter``). Off by default:
    /// see "The write path" in Examples/README.md.
    var batchWrites = false
}

/// The request context. Hummingbird's `WebSocketHandlerReference` is a box
/// that its router fills with the request context itself
/// (hummingbird-websocket 2.8.1, `WebSocketRouter.swift`, `ws(_:shouldUpgrade:onUpgrade:)`:
/// `context.webSocket.handler.withLockedValue { $0 = .init(context: context, handler: handler) }`),
/// and nothing ever empties it: box → context → box is a cycle, and every
/// upgraded connection leaked its context and everything it held (with the
/// channel this context used to keep, 4-6 KB each). Here the context holds
/// the box through a slot that the WebSocket handler empties as it starts,
/// which breaks the cycle. The slot also hands the connection's channel to
/// the WebSocket handler, for the batched writes (``FeedFrameWriter``), and
/// lets go of it there too (the socket options are set at accept, in
/// ``GuardedChannel``).
struct FeedRequestContext: RequestContext, WebSocketRequestContext {
    var coreContext: CoreRequestContextStorage
    let slot: WebSocketSlot

    init(source: ApplicationRequestContextSource) {
        coreContext = .init(source: source)
        slot = WebSocketSlot(channel: source.channel)
    }

    var webSocket: WebSocketHandlerReference<Self> { slot.reference.withLockedValue { $0 } ?? .init() }
}

final class WebSocketSlot: Sendable {
    let reference = NIOLockedValueBox<WebSocketHandlerReference<FeedRequestContext>?>(.init())
    private let channel: NIOLockedValueBox<(any Channel)?>

    init(channel: any Channel) { self.channel = NIOLockedValueBox(channel) }

    /// Drops the box (and with it the cycle) and the channel, returning the
    /// channel; called once the upgrade has happened.
    func empty() -> (any Channel)? {
        reference.withLockedValue { $0 = nil }
        return channel.withLockedValue { channel in
            defer { channel = nil }
            return channel
        }
    }
}

/// A client error with the reason as one line of plain text (400 unless said).
struct BadRequest: HTTPResponseError {
    let reason: String
    var status: HTTPResponse.Status = .badRequest
    func response(from request: Request, context: some RequestContext) throws -> Response {
        plainText(reason, status: status)
    }
}

func plainText(_ text: String, status: HTTPResponse.Status = .ok, contentType: String = "text/plain; charset=utf-8", close: Bool = false) -> Response {
    var headers: HTTPFields = [.contentType: contentType]
    // The connection guard closes the connection once this is written (so a
    // refused body is not read to its end).
    if close { headers[.connection] = "close" }
    return Response(status: status, headers: headers, body: .init(byteBuffer: ByteBuffer(string: text + (text.hasSuffix("\n") ? "" : "\n"))))
}

func feedQuery(_ request: Request, maximumCapacity: Int) throws -> FeedQuery {
    do {
        return try FeedQuery(parameters: request.uri.queryParameters.map { (String($0.key), String($0.value)) },
                             maximumCapacity: maximumCapacity)
    } catch {
        throw BadRequest(reason: error.reason)
    }
}

func serve<Hub: FeedHub>(hub: Hub, stats: ServerStats, _ settings: ServerSettings) async throws {
    let logger = settings.logger
    let publisher = Publisher(target: settings.target, size: settings.publishConnections,
                              timeout: settings.publishTimeout, logger: logger)
    let live = LiveConnections(sendTimeout: settings.feed.sendTimeout)
    let connection = FeedConnection(hub: hub, stats: stats, limits: settings.feed, live: live)
    let registry = ConnectionRegistry(maximum: settings.maxConnections)
    let maximumCapacity = settings.feed.maximumCapacity
    let router = Router(context: FeedRequestContext.self)
    router.get("/") { _, _ in
        plainText(LivePage.html, contentType: "text/html; charset=utf-8")
    }
    router.head("/") { _, _ in
        plainText(LivePage.html, contentType: "text/html; charset=utf-8")
    }
    router.get("/stats") { _, _ in
        plainText(stats.json(hub: hub.name, listeningTopics: hub.listener.listeningCount, topics: await hub.topicCount(),
                             connections: registry.count),
                  contentType: "application/json")
    }
    if let prometheus = settings.metrics {
        router.get("/metrics") { _, _ in
            stats.scraped(topics: await hub.topicCount())
            return Response(
                status: .ok, headers: [.contentType: "text/plain; version=0.0.4; charset=utf-8"],
                body: .init(byteBuffer: ByteBuffer(bytes: prometheus.emitToBuffer())))
        }
    }
    router.post("/publish") { request, _ -> Response in
        let topic: String
        do {
            topic = try FeedTopic.from(parameters: request.uri.queryParameters.map { (String($0.key), String($0.value)) })
        } catch {
            return plainText((error as? BadFeedQuery)?.reason ?? "bad topic", status: .badRequest, close: true)
        }
        // The limit is on the bytes received: a declared length over it is
        // refused unread, and reading stops at the first byte over it.
        if let declared = request.headers[.contentLength].flatMap({ Int($0) }), declared > PublishBody.maximumBytes {
            return plainText(PublishBody.tooLarge(declared, exact: true).reason, status: .badRequest, close: true)
        }
        var body = ByteBuffer()
        for try await chunk in request.body {
            guard body.readableBytes + chunk.readableBytes <= PublishBody.maximumBytes else {
                return plainText(PublishBody.tooLarge(PublishBody.maximumBytes + 1, exact: false).reason, status: .badRequest, close: true)
            }
            body.writeImmutableBuffer(chunk)
        }
        let payload: String
        switch PublishBody.validate(body.readableBytesView) {
        case .success(let text): payload = text
        case .failure(let bad): return plainText(bad.reason, status: .badRequest)
        }
        do {
            try await publisher.publish(payload, to: topic)
        } catch let error as Publisher.Failure {
            switch error {
            case .rejected(let reason):
                return plainText("PostgreSQL refused the message: \(reason)", status: .badRequest)
            case .unavailable:
                return plainText("PostgreSQL is unavailable, try again", status: .serviceUnavailable)
            }
        }
        return plainText("published")
    }
    // Bad input is refused here, before the upgrade, so the server never
    // reaches the library's trap for `.bounded(0)`. A plain GET gets the
    // 400 with its reason; an upgrade request was refused with its reason
    // already by the connection guard (`checkUpgrade` below), as
    // hummingbird-websocket 2.8.1 writes a refusal from here as an empty 400.
    router.ws("/feed") { request, _ in
        _ = try feedQuery(request, maximumCapacity: maximumCapacity)
        // A plain GET would otherwise fill the handler box of a connection that never upgrades.
        guard request.headers[.upgrade]?.lowercased() == "websocket" else {
            throw BadRequest(reason: "/feed is a WebSocket: send Upgrade: websocket", status: .upgradeRequired)
        }
        return .upgrade([:])
    } onUpgrade: { inbound, outbound, context in
        let channel = context.requestContext.slot.empty()
        let batchChannel = settings.batchWrites ? channel : nil
        let query = try feedQuery(context.request, maximumCapacity: maximumCapacity)
        try await connection.serve(query: query, inbound: inbound, outbound: outbound, channel: batchChannel, socket: channel,
                                   logger: context.logger)
    }
    let wsConfiguration = WebSocketServerConfiguration(
        maxFrameSize: 1 << 16, closeTimeout: .seconds(3), validateUTF8: true)
    let webSocketResponder = router.buildResponder()
    let http = settings.http
    let sendBufferBytes = settings.sendBufferBytes
    let server = HTTPServerBuilder { responder in
        GuardedChannel(
            inner: HTTP1WebSocketUpgradeChannel(
                responder: responder, webSocketResponder: webSocketResponder,
                configuration: .init(http1: .init(), ws: wsConfiguration)),
            limits: http, registry: registry, sendBufferBytes: sendBufferBytes,
            checkUpgrade: { head in
                // What the /feed route checks, answered with its reason (NIO's upgrader would not).
                UpgradeCheck.refusal(head, path: "/feed") { parameters in
                    do throws(BadFeedQuery) {
                        _ = try FeedQuery(parameters: parameters, maximumCapacity: maximumCapacity)
                    } catch { return error.reason }
                    return nil
                }
            })
    }
    let app = Application(
        router: router,
        server: server,
        configuration: .init(address: .hostname(settings.host, port: settings.port), serverName: "feed-server"),
        logger: logger
    )
    let drain = ShutdownDrain(
        hub: hub, publisher: publisher, live: live, registry: registry,
        timeout: settings.shutdownTimeout, logger: logger)
    // SIGTERM: the last service is shut down first, each once the one after
    // it has returned: the drain (it needs both PostgreSQL clients), then
    // Hummingbird's graceful shutdown, then the hub and its LISTEN
    // connection, then the publish pool (Services.swift).
    let services = ServiceGroup(configuration: .init(
        services: [
            .init(service: PostgresPublisherService(publisher: publisher)),
            .init(service: FeedHubService(hub: hub)),
            .init(service: app),
            .init(service: drain),
        ],
        gracefulShutdownSignals: [.sigterm, .sigint],
        logger: logger))
    try await services.run()
}

/// What SIGTERM does before Hummingbird closes the connections, and the bound on all of it.
///
/// 1. A timer: `timeout - 2 s` after SIGTERM (at least 1 s, at most the
///    timeout), PostgreSQL's part ends (the publishes in flight fail with 503,
///    the LISTEN connection is closed) and every connection still open is
///    closed, whatever its client does (one that neither reads nor answers
///    the close frame would otherwise hold the process forever). PostgreSQL
///    calls cannot be cancelled, and a stopped or partitioned PostgreSQL never
///    answers them: closing their connections (a local act) is what ends them.
///    Every later step is then local.
/// 2. A barrier NOTIFY through the publisher, awaited on the LISTEN: every
///    publish answered 200 before SIGTERM is then in the hub.
/// 3. Up to a third of the timeout for steps 2 and 3: every connection writes
///    those messages (a connection whose socket is full, or that has nothing
///    left, is not waited for).
/// Then Hummingbird's graceful shutdown sends each WebSocket a close frame.
/// Last, should any step still run at the timeout, the process exits there
/// (status 1, logged): the timeout holds whatever was missed.
struct ShutdownDrain<Hub: FeedHub>: Service {
    let hub: Hub
    let publisher: Publisher
    let live: LiveConnections
    let registry: ConnectionRegistry
    let timeout: Duration
    let logger: Logger

    func run() async throws {
        do { try await gracefulShutdown() } catch { return }
        let started = ContinuousClock.now
        let registry = self.registry
        let logger = self.logger
        let forceAfter = min(timeout, max(.seconds(1), timeout - .seconds(2)))
        let publisher = self.publisher
        let listener = hub.listener
        Task.detached {
            try? await Task.sleep(for: forceAfter)
            await publisher.shutdown()  // first, so that a publish in flight is answered 503 if it can be
            await listener.abort()
            let closed = registry.closeAll()
            if closed > 0 { logger.notice("shutdown: closed \(closed) connection(s) still open after \(forceAfter)") }
        }
        let timeout = self.timeout
        // On a thread of its own: it must fire even if something holds every task.
        DispatchQueue.global().asyncAfter(deadline: .now() + .nanoseconds(Int(timeout.components.seconds * 1_000_000_000
                                                                                + timeout.components.attoseconds / 1_000_000_000))) {
            logger.error("shutdown: still running at the shutdown timeout (\(timeout)): exiting now")
            exit(1)
        }
        let drainLimit = timeout / 3
        // One barrier on any LISTENed topic covers them all: the one LISTEN
        // connection gets every channel's notifications in commit order.
        let barriers = hub.listener.barriers
        if let topic = hub.listener.anyListeningTopic {
            let (payload, arrived) = barriers.make()
            // `within` waits for its body to end: the publish ends by its own
            // deadline, the wait for the barrier at its cancellation.
            let came = await within(drainLimit) {
                do { try await publisher.publish(payload, to: topic, within: drainLimit) } catch { return false }
                return (try? await arrived.value) != nil
            }
            barriers.forget(payload)
            if !came { logger.notice("shutdown: the barrier did not come back within \(drainLimit): not waiting for it") }
        }
        let targets = live.targets()
        while live.behind(targets) > 0 && ContinuousClock.now - started < drainLimit {
            try? await Task.sleep(for: .milliseconds(20))
        }
        let behind = live.behind(targets)
        logger.info("shutdown: drained in \(ContinuousClock.now - started)\(behind > 0 ? ", \(behind) connection(s) could not take the last messages" : "")")
    }

    /// `body`'s result, or false after `limit`.
    private func within(_ limit: Duration, _ body: @escaping @Sendable () async -> Bool) async -> Bool {
        await withTaskGroup(of: Bool.self) { group in
            group.addTask { await body() }
            group.addTask { try? await Task.sleep(for: limit); return false }
            let first = await group.next() ?? false
            group.cancelAll()
            return first
        }
    }
}
