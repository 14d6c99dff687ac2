import FeedKit
import Hummingbird
import HummingbirdWebSocket
import Logging
import NIOCore

struct ServerSettings: Sendable {
    var host: String
    var port: Int
    var sendBufferBytes: Int
    var target: PostgresTarget
    var logger: Logger
}

/// A request context that keeps the connection's channel, so the WebSocket
/// handler can set the socket's send buffer.
struct FeedRequestContext: RequestContext, WebSocketRequestContext {
    var coreContext: CoreRequestContextStorage
    let webSocket: WebSocketHandlerReference<Self>
    let channel: any Channel

    init(source: ApplicationRequestContextSource) {
        coreContext = .init(source: source)
        webSocket = .init()
        channel = source.channel
    }
}

/// `400 Bad Request` with the reason as one line of plain text.
struct BadRequest: HTTPResponseError {
    let reason: String
    var status: HTTPResponse.Status { .badRequest }
    func response(from request: Request, context: some RequestContext) throws -> Response {
        plainText(reason, status: .badRequest)
    }
}

func plainText(_ text: String, status: HTTPResponse.Status = .ok, contentType: String = "text/plain; charset=utf-8") -> Response {
    Response(status: status, headers: [.contentType: contentType], body: .init(byteBuffer: ByteBuffer(string: text + (text.hasSuffix("\n") ? "" : "\n"))))
}

func feedQuery(_ request: Request) throws -> FeedQuery {
    do {
        return try FeedQuery(parameters: request.uri.queryParameters.map { (String($0.key), String($0.value)) })
    } catch {
        throw BadRequest(reason: error.reason)
    }
}

func serve<Hub: FeedHub>(hub: Hub, _ settings: ServerSettings) async throws {
    let stats = ServerStats()
    let publisher = Publisher(target: settings.target, logger: settings.logger)
    let connection = FeedConnection(hub: hub, stats: stats)
    let router = Router(context: FeedRequestContext.self)

    router.get("/") { _, _ in
        plainText(LivePage.html, contentType: "text/html; charset=utf-8")
    }
    router.get("/stats") { _, _ in
        plainText(stats.json(hub: hub.name, listening: hub.listening.value), contentType: "application/json")
    }
    router.post("/publish") { request, _ -> Response in
        var request = request
        let body = try await request.collectBody(upTo: 8192)
        let payload = String(buffer: body)
        // PostgreSQL refuses NOTIFY payloads of 8000 bytes or more.
        guard payload.utf8.count < 8000 else { throw BadRequest(reason: "payload is \(payload.utf8.count) bytes: NOTIFY takes fewer than 8000") }
        do {
            try await publisher.publish(payload)
        } catch {
            return plainText("PostgreSQL is unavailable, try again", status: .serviceUnavailable)
        }
        return plainText("published")
    }
    // Bad input is refused here, before the upgrade, so the server never
    // reaches the library's trap for `.bounded(0)`. A refused upgrade falls
    // through to the plain route, which throws the same 400.
    router.ws("/feed") { request, _ in
        _ = try feedQuery(request)
        return .upgrade([:])
    } onUpgrade: { inbound, outbound, context in
        let query = try feedQuery(context.request)
        let channel = context.requestContext.channel
        // Small kernel and NIO buffers: a slow client's backlog then sits in
        // its subscription, where its policy (drop or evict) deals with it,
        // instead of in megabytes of socket buffers the policy cannot see.
        let bytes = max(4096, settings.sendBufferBytes)
        _ = try? await channel.setOption(ChannelOptions.socketOption(.so_sndbuf), value: bytes).get()
        _ = try? await channel.setOption(ChannelOptions.writeBufferWaterMark, value: .init(low: bytes / 4, high: bytes / 2)).get()
        await connection.serve(query: query, inbound: inbound, outbound: outbound, logger: context.logger)
    }

    let app = Application(
        router: router,
        server: .http1WebSocketUpgrade(webSocketRouter: router, configuration: .init(ws: .init(maxFrameSize: 1 << 16))),
        configuration: .init(address: .hostname(settings.host, port: settings.port), serverName: "feed-server"),
        logger: settings.logger
    )
    // The server's life is the application's: the hub's own task (if any)
    // is cancelled when the application stops.
    try await withThrowingTaskGroup(of: Bool.self) { group in
        group.addTask { await hub.run(); return false }
        group.addTask { try await app.runService(); return true }
        while let applicationEnded = try await group.next() {
            if applicationEnded { group.cancelAll(); break }
        }
    }
    await hub.shutdown()
    await publisher.shutdown()
}
