import Hummingbird
import HummingbirdCore
import HummingbirdWebSocket
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1
import Synchronization

/// The HTTP limits of one connection, before it becomes a WebSocket.
struct HTTPLimits: Sendable {
    /// From the connection's start, or the end of its previous response, to
    /// a complete request head: trickled headers and idle connections end here.
    var headerTimeout: TimeAmount
    /// From a request's head to its end: a trickled body ends here.
    var bodyTimeout: TimeAmount
    /// After a response that closes the connection (a refusal, a client
    /// error), how long the server still reads and discards what the client
    /// sends before closing, so that the response is not lost to a reset.
    var lingerTimeout: TimeAmount = .seconds(2)
}

/// A request the ``ConnectionGuard`` answers itself, then closes: its
/// status, the reason (one line, the body) and any more headers.
struct Refusal: Sendable {
    var status: HTTPResponseStatus
    var reason: String
    var headers: [(String, String)] = []
}

/// Every open TCP connection of the server, counted at accept, so that
/// connections over `--max-connections` are answered 503, and so that a
/// shutdown can close those that do not close themselves.
final class ConnectionRegistry: Sendable {
    let maximum: Int
    private let channels = NIOLockedValueBox<[ObjectIdentifier: Entry]>([:])

    struct Entry: Sendable {
        let channel: any Channel
        /// Set when the guard answered and closed the connection itself.
        let ended: GuardEnded
    }

    init(maximum: Int) { self.maximum = maximum }

    /// Connections over the maximum that are answered 503; beyond these,
    /// a connection is closed at once without an answer. The file limit is
    /// kept out of reach: swift-nio's accept back-off does not stop a
    /// listening socket from spinning at EMFILE (see README, "Limits").
    static let answeredOverflow = 64

    enum Admission { case accepted, refused, dropped }

    /// Registers the channel until it closes, and says how to treat it.
    func open(_ channel: any Channel) -> (admission: Admission, ended: GuardEnded) {
        let key = ObjectIdentifier(channel)
        let ended = GuardEnded()
        let count = channels.withLockedValue { channels in
            channels[key] = Entry(channel: channel, ended: ended)
            return channels.count
        }
        channel.closeFuture.whenComplete { [self] _ in
            _ = channels.withLockedValue { $0.removeValue(forKey: key) }
        }
        let admission: Admission =
            count <= maximum ? .accepted : count <= maximum + Self.answeredOverflow ? .refused : .dropped
        return (admission, ended)
    }

    func ended(_ channel: any Channel) -> GuardEnded? {
        channels.withLockedValue { $0[ObjectIdentifier(channel)]?.ended }
    }

    var count: Int { channels.withLockedValue { $0.count } }

    /// Closes every connection still open; returns how many there were.
    @discardableResult
    func closeAll() -> Int {
        let open = channels.withLockedValue { $0.values.map(\.channel) }
        for channel in open { channel.close(promise: nil) }
        return open.count
    }
}

/// Whether the ``ConnectionGuard`` ended a connection (refused, malformed,
/// timed out). Hummingbird then logs the upgrade that never happened as an
/// error ("Error handling upgrade result", hummingbird-websocket 2.8.1,
/// `HTTP1WebSocketUpgradeChannel.handle(value:logger:)`): one line per
/// refused connection would let a client flood the log, so that one line is
/// dropped for these connections (the guard logs them at debug).
final class GuardEnded: Sendable {
    let value = Synchronization.Atomic<Bool>(false)
}

struct DroppingGuardedUpgradeErrors: LogHandler {
    var base: any LogHandler
    let ended: GuardEnded

    func log(level: Logger.Level, message: Logger.Message, metadata: Logger.Metadata?,
             source: String, file: String, function: String, line: UInt) {
        if ended.value.load(ordering: .relaxed) && message.description == "Error handling upgrade result" { return }
        base.log(level: level, message: message, metadata: metadata, source: source, file: file, function: function, line: line)
    }

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { base[metadataKey: key] }
        set { base[metadataKey: key] = newValue }
    }
    var metadata: Logger.Metadata {
        get { base.metadata }
        set { base.metadata = newValue }
    }
    var logLevel: Logger.Level {
        get { base.logLevel }
        set { base.logLevel = newValue }
    }
}

/// Hummingbird's HTTP/1 + WebSocket child channel with the connection limits
/// around it: the connection count (503 beyond `--max-connections`), the
/// socket's send buffer, and a ``ConnectionGuard`` in the HTTP pipeline.
struct GuardedChannel: ServerChildChannel {
    typealias Value = HTTP1WebSocketUpgradeChannel.Value
    typealias UpgradeHandler = NIOTypedHTTPServerUpgradeHandler<HTTP1WebSocketUpgradeChannel.UpgradeResult>

    let inner: HTTP1WebSocketUpgradeChannel
    let limits: HTTPLimits
    let registry: ConnectionRegistry
    let sendBufferBytes: Int
    /// Whether a request that asks for a WebSocket is refused, and how (``UpgradeCheck``).
    let checkUpgrade: @Sendable (HTTPRequestHead) -> Refusal?

    func setup(channel: any Channel, logger: Logger) -> EventLoopFuture<Value> {
        let (admission, ended) = registry.open(channel)
        if admission == .dropped {
            ended.value.store(true, ordering: .relaxed)
            channel.close(promise: nil)
        }
        // Small kernel and NIO buffers: a slow client's backlog then sits in
        // its subscription, where its policy (drop or evict) deals with it,
        // instead of in megabytes of socket buffers the policy cannot see.
        // Set here, on every connection, rather than from the WebSocket
        // handler through a channel kept in the request context.
        if let options = channel.syncOptions {
            let bytes = max(4096, sendBufferBytes)
            try? options.setOption(ChannelOptions.socketOption(.so_sndbuf), value: bytes)
            try? options.setOption(ChannelOptions.writeBufferWaterMark, value: .init(low: bytes / 4, high: bytes / 2))
        }
        let limits = self.limits
        let maximum = registry.maximum
        let checkUpgrade = self.checkUpgrade
        return inner.setup(channel: channel, logger: logger).flatMapThrowing { value in
            let refusal = admission == .accepted ? nil : "too many connections: this server takes at most \(maximum) (--max-connections)"
            let guardHandler = ConnectionGuard(limits: limits, refusal: refusal, ended: ended, logger: logger,
                                               checkUpgrade: checkUpgrade)
            let upgrade = try channel.pipeline.syncOperations.handler(type: UpgradeHandler.self)
            try channel.pipeline.syncOperations.addHandler(guardHandler, position: .before(upgrade))
            try channel.pipeline.syncOperations.addHandler(MaskedFramesOnly(), position: .first)
            return value
        }
    }

    func handle(value: Value, logger: Logger) async {
        var logger = logger
        if let ended = registry.ended(value.channel) {
            logger.handler = DroppingGuardedUpgradeErrors(base: logger.handler, ended: ended)
        }
        await inner.handle(value: value, logger: logger)
    }
}

/// Sits after NIO's HTTP request decoder, before Hummingbird's upgrade handler.
///
/// - A request head must be complete within `headerTimeout` of the
///   connection's start (or of the previous response's end), and its body
///   within `bodyTimeout` of the head: otherwise 408 with the reason, or a
///   silent close for an idle keep-alive connection that already had its
///   answers.
/// - A malformed request (what NIO's parser refuses: a bad request line, an
///   unknown method, a header over the decoder's limits, Content-Length with
///   Transfer-Encoding, an HTTP/2 preface) gets 400 with the reason, and the
///   connection is closed. Hummingbird turns NIO's own handler for this off
///   (hummingbird-websocket 2.8.1, `HTTP1WebSocketUpgradeChannel.setup`:
///   `upgradeConfiguration.enableErrorHandling = false`), and its own
///   handling only covers requests after the first one, so before this
///   handler a malformed first request got no answer, and the connection,
///   with NIO's decoder in its error state, stayed open reading.
/// - Over the connection limit: 503 with the reason at once, then close.
/// - A response with `Connection: close` closes the connection once written
///   (after a short linger), so a refused oversized body is not read to its end.
/// - A request to upgrade to a WebSocket is checked first (``UpgradeCheck``):
///   NIO's upgrader and hummingbird-websocket answer the refusals they make
///   with an empty 400, or not at all. A refused one gets its status and
///   reason here; one that passes makes the handler leave the pipeline,
///   before NIO's upgrade handler removes the HTTP decoder (which forwards
///   raw bytes past this point). Any other `Upgrade` (`h2c`) is taken off the
///   request, which is then served as HTTP/1.1 (RFC 9110 §7.8 lets a server
///   ignore it): NIO's upgrade handler, finding no upgrader for it, left the
///   connection without an answer.
/// - A refusal (a parse error, a refused upgrade) that comes while a request
///   read in full is still being handled waits for that request's answer:
///   the request ran (a publish reached PostgreSQL), so its client must get
///   its answer, then the refusal, then the close. Nothing read after the
///   refusal is passed on.
final class ConnectionGuard: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias InboundOut = HTTPServerRequestPart
    typealias OutboundIn = HTTPServerResponsePart
    typealias OutboundOut = HTTPServerResponsePart

    let limits: HTTPLimits
    let refusal: String?
    let ended: GuardEnded
    let logger: Logger
    let checkUpgrade: @Sendable (HTTPRequestHead) -> Refusal?
    private var started = false
    /// Between a request's head and its end.
    private var reading = false
    /// Requests whose response has not ended yet.
    private var unanswered = 0
    /// Requests read to their end (passed on whole: their handler runs).
    private var completed = 0
    /// A response's head is written and its end not yet.
    private var responding = false
    /// Responses ended.
    private var served = 0
    private var closeAfterResponse = false
    private var closing = false
    /// A refusal that waits for the answers of the requests before it.
    private var deferred: Refusal?
    private var timer: Scheduled<Void>?

    init(limits: HTTPLimits, refusal: String?, ended: GuardEnded, logger: Logger,
         checkUpgrade: @escaping @Sendable (HTTPRequestHead) -> Refusal? = { _ in nil }) {
        self.limits = limits
        self.refusal = refusal
        self.ended = ended
        self.logger = logger
        self.checkUpgrade = checkUpgrade
    }

    func handlerAdded(context: ChannelHandlerContext) {
        if context.channel.isActive { start(context: context) }
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        timer?.cancel()
        timer = nil
    }

    func channelActive(context: ChannelHandlerContext) {
        start(context: context)
        context.fireChannelActive()
    }

    private func start(context: ChannelHandlerContext) {
        guard !started else { return }
        started = true
        if let refusal {
            respondAndClose(context: context, status: .serviceUnavailable, reason: refusal, extra: [("Retry-After", "1")])
        } else {
            arm(context: context, limits.headerTimeout) { [unowned self] context in
                if self.served == 0 {
                    self.respondAndClose(context: context, status: .requestTimeout,
                                         reason: "request head not received within \(Self.seconds(self.limits.headerTimeout)) s")
                } else {
                    self.ended.value.store(true, ordering: .relaxed)
                    context.close(promise: nil)  // an idle keep-alive connection
                }
            }
        }
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        // Answered or refused already: what follows is discarded.
        if closing || refusal != nil || deferred != nil { return }
        let part = unwrapInboundIn(data)
        switch part {
        case .head(var head):
            reading = true
            unanswered += 1
            cancelTimer()
            let upgrades = head.headers[canonicalForm: "upgrade"]
            if upgrades.contains(where: { $0.lowercased() == "websocket" }) {
                if let refused = checkUpgrade(head) {
                    refuse(context: context, refused)
                    return
                }
                // NIO's upgrade handler takes it from here: it removes the
                // decoder, and raw bytes (not request parts) then flow past this point.
                context.fireChannelRead(data)
                context.pipeline.syncOperations.removeHandler(context: context, promise: nil)
                return
            }
            arm(context: context, limits.bodyTimeout) { [unowned self] context in
                self.respondAndClose(context: context, status: .requestTimeout,
                                     reason: "request body not received within \(Self.seconds(self.limits.bodyTimeout)) s")
            }
            if !upgrades.isEmpty {  // another protocol (h2c): served as HTTP/1.1
                head.headers.remove(name: "upgrade")
                head.headers.remove(name: "http2-settings")
                let connection = head.headers[canonicalForm: "connection"].filter {
                    !["upgrade", "http2-settings"].contains($0.lowercased())
                }
                head.headers.remove(name: "connection")
                if !connection.isEmpty { head.headers.add(name: "Connection", value: connection.joined(separator: ", ")) }
                context.fireChannelRead(wrapInboundOut(.head(head)))
                return
            }
        case .body:
            break
        case .end:
            reading = false
            completed += 1
            cancelTimer()
        }
        context.fireChannelRead(data)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        guard let parseError = error as? HTTPParserError else {
            context.fireErrorCaught(error)
            return
        }
        // Not passed on: the connection ends here, with an answer.
        refuse(context: context, Refusal(status: .badRequest, reason: "malformed HTTP request: \(parseError)"))
    }

    /// Answers `refusal` and closes: at once, or, while a request read in
    /// full (or a response under way) has not had its answer, right after
    /// that answer. The handler of such a request is never cut short: each
    /// of the server's handlers ends within its own limits (a publish within
    /// `--publish-timeout`), and a shutdown closes the connection anyway.
    private func refuse(context: ChannelHandlerContext, _ refusal: Refusal) {
        guard !closing, deferred == nil else { return }
        ended.value.store(true, ordering: .relaxed)
        if completed > served || responding {
            logger.debug("refusing after the answer in progress: \(refusal.status.code) \(refusal.reason)")
            deferred = refusal
            cancelTimer()
            return
        }
        respondAndClose(context: context, status: refusal.status, reason: refusal.reason, extra: refusal.headers)
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        let part = unwrapOutboundIn(data)
        switch part {
        case .head(let head):
            if head.status.code >= 200 { responding = true }
            if head.headers[canonicalForm: "connection"].contains(where: { $0.lowercased() == "close" }) {
                closeAfterResponse = true
            }
            context.write(data, promise: promise)
        case .body:
            context.write(data, promise: promise)
        case .end:
            responding = false
            unanswered = max(0, unanswered - 1)
            served += 1
            if closeAfterResponse {
                context.writeAndFlush(data, promise: promise)
                linger(context: context)
            } else if let refusal = deferred, completed <= served {
                // The last request that ran has its answer: the refusal follows it.
                context.write(data, promise: promise)
                deferred = nil
                respondAndClose(context: context, status: refusal.status, reason: refusal.reason, extra: refusal.headers)
            } else if deferred != nil {
                context.write(data, promise: promise)
            } else {
                context.write(data, promise: promise)
                if !reading && unanswered == 0 && !closing {
                    arm(context: context, limits.headerTimeout) { context in context.close(promise: nil) }
                }
            }
        }
    }

    /// Writes a complete response with `reason` as its body (if no other
    /// response is under way), then closes after a linger.
    private func respondAndClose(
        context: ChannelHandlerContext, status: HTTPResponseStatus, reason: String, extra: [(String, String)] = []
    ) {
        guard !closing else { return }
        ended.value.store(true, ordering: .relaxed)
        logger.debug("answering \(status.code) and closing: \(reason)")
        if !responding {
            let body = ByteBuffer(string: reason + "\n")
            var headers = HTTPHeaders([
                ("Connection", "close"), ("Content-Type", "text/plain; charset=utf-8"),
                ("Content-Length", String(body.readableBytes)),
            ])
            headers.add(contentsOf: extra)
            context.write(wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: status, headers: headers))), promise: nil)
            context.write(wrapOutboundOut(.body(.byteBuffer(body))), promise: nil)
            context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil)
        }
        linger(context: context)
    }

    /// Closes our side for writing, keeps discarding what the client sends
    /// for `lingerTimeout`, then closes: closing with unread input would
    /// reset the connection and could destroy the response on its way.
    private func linger(context: ChannelHandlerContext) {
        guard !closing else { return }
        closing = true
        cancelTimer()
        context.close(mode: .output, promise: nil)
        timer = context.eventLoop.assumeIsolated().scheduleTask(in: limits.lingerTimeout) {
            context.close(promise: nil)
        }
    }

    private func arm(context: ChannelHandlerContext, _ delay: TimeAmount, _ body: @escaping (ChannelHandlerContext) -> Void) {
        cancelTimer()
        timer = context.eventLoop.assumeIsolated().scheduleTask(in: delay) { [weak self] in
            guard let self, !self.closing else { return }
            self.timer = nil
            body(context)
        }
    }

    private func cancelTimer() {
        timer?.cancel()
        timer = nil
    }

    func channelInactive(context: ChannelHandlerContext) {
        cancelTimer()
        context.fireChannelInactive()
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let event = event as? ChannelEvent, event == .inputClosed, closing {
            context.close(promise: nil)  // the client read the answer and went: done lingering
            return
        }
        context.fireUserInboundEventTriggered(event)
    }

    static func seconds(_ amount: TimeAmount) -> String {
        let s = Double(amount.nanoseconds) / 1e9
        return s == s.rounded() ? String(Int(s)) : String(s)
    }
}

/// RFC 6455 §5.1: a server must close the connection on an unmasked client
/// frame. Neither swift-nio's `WebSocketFrameDecoder` nor hummingbird's
/// WSCore (swift-websocket 1.6.2, `WebSocketInboundStream.swift`,
/// `next()`: text, binary and continuation frames are taken whatever their
/// `maskKey`) checks it, so this handler does, on the raw bytes, at the head
/// of the pipeline. It does nothing until the server writes its 101 response;
/// from then on it follows the frame headers, and on the first one without
/// the mask bit it writes a close frame with 1002 and closes.
///
/// (A client that sends frames before it has read the 101, which RFC 6455
/// forbids, can make it lose its place in the stream: then it checks the
/// wrong bytes, which can only close that same client's connection.)
final class MaskedFramesOnly: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private enum State {
        case http
        /// Reading a frame header: the bytes of it so far.
        case header([UInt8])
        /// Skipping a payload: bytes left.
        case payload(UInt64)
        case failed
    }
    private var state = State.http

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        if case .http = state {
            let bytes = unwrapOutboundIn(data)
            if bytes.readableBytesView.starts(with: "HTTP/1.1 101".utf8) { state = .header([]) }
        }
        context.write(data, promise: promise)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch state {
        case .http:
            context.fireChannelRead(data)
        case .failed:
            return
        case .header, .payload:
            let bytes = unwrapInboundIn(data)
            if follow(bytes.readableBytesView) {
                context.fireChannelRead(data)
            } else {
                state = .failed
                // Close frame, code 1002 (protocol error), unmasked as a server's are.
                var close = context.channel.allocator.buffer(capacity: 4)
                close.writeBytes([0x88, 0x02, 0x03, 0xEA])
                context.writeAndFlush(wrapOutboundOut(close)).assumeIsolated().whenComplete { _ in
                    context.close(promise: nil)
                }
            }
        }
    }

    /// Follows the frames in `bytes`; false at a header without the mask bit.
    private func follow(_ bytes: ByteBufferView) -> Bool {
        var index = bytes.startIndex
        while index < bytes.endIndex {
            switch state {
            case .payload(let left):
                let available = UInt64(bytes.endIndex - index)
                if available < left {
                    state = .payload(left - available)
                    return true
                }
                index += Int(left)
                state = .header([])
            case .header(var header):
                header.append(bytes[index])
                index += 1
                if header.count == 2 && header[1] & 0x80 == 0 { return false }
                let lengthBytes = header.count < 2 ? 0 : [0, 2, 8][header[1] & 0x7F == 126 ? 1 : header[1] & 0x7F == 127 ? 2 : 0]
                let needed = 2 + lengthBytes + 4
                if header.count < needed {
                    state = .header(header)
                    continue
                }
                var length = UInt64(header[1] & 0x7F)
                if lengthBytes > 0 {
                    length = header[2..<(2 + lengthBytes)].reduce(0) { $0 << 8 | UInt64($1) }
                }
                state = length == 0 ? .header([]) : .payload(length)
            case .http, .failed:
                return true
            }
        }
        return true
    }
}
