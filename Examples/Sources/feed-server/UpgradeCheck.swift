import Foundation
import HummingbirdCore
import NIOHTTP1

/// Which WebSocket upgrade requests are refused, and the answer each gets,
/// decided by the ``ConnectionGuard`` before NIO's upgrade handler sees them.
///
/// Without it, the refusals were made by others, with no reason: NIO's
/// `NIOTypedWebSocketServerUpgrader` throws on a missing `Sec-WebSocket-Key`
/// or a `Sec-WebSocket-Version` other than 13 and hummingbird-websocket
/// 2.8.1 then closes the connection without a byte; a route that refuses
/// (a bad policy) or a path that is not a WebSocket got an empty 400
/// (`HTTP1WebSocketUpgradeChannel.writeFailedUpgrade`). Here each gets its
/// status and a one-line reason. A request that passes meets nothing in NIO
/// or the route that refuses it.
///
/// ```swift
/// UpgradeCheck.refusal(head, path: "/feed") { parameters in nil }  // nil: upgrade
/// ```
enum UpgradeCheck {
    /// The handshake's rules (RFC 6455 §4.2.1), then `path`, then `route`
    /// (the query's reason to refuse, if any). Nil: let it upgrade.
    static func refusal(
        _ head: HTTPRequestHead, path: String, route: ([(String, String)]) -> String?
    ) -> Refusal? {
        guard head.method == .GET else {
            return Refusal(status: .badRequest, reason: "a WebSocket upgrade is a GET request, not \(head.method.rawValue)")
        }
        guard head.version.major == 1 && head.version.minor >= 1 else {
            return Refusal(status: .badRequest, reason: "a WebSocket upgrade needs HTTP/1.1")
        }
        let connection = head.headers[canonicalForm: "connection"].map { $0.lowercased() }
        guard connection.contains("upgrade") else {
            return Refusal(status: .badRequest, reason: "Upgrade: websocket without Connection: Upgrade")
        }
        let versions = head.headers[canonicalForm: "sec-websocket-version"]
        guard versions == ["13"] else {
            let got = versions.isEmpty ? "no Sec-WebSocket-Version" : "Sec-WebSocket-Version \(versions.joined(separator: ", "))"
            // RFC 6455 §4.4: the versions the server speaks, in the answer.
            return Refusal(status: .upgradeRequired, reason: "\(got): this server speaks WebSocket version 13",
                           headers: [("Sec-WebSocket-Version", "13")])
        }
        let keys = head.headers["Sec-WebSocket-Key"]
        guard keys.count == 1 else {
            return Refusal(status: .badRequest, reason: keys.isEmpty ? "Sec-WebSocket-Key is missing" : "more than one Sec-WebSocket-Key")
        }
        guard let nonce = Data(base64Encoded: keys[0].trimmingCharacters(in: .whitespaces)), nonce.count == 16 else {
            return Refusal(status: .badRequest, reason: "Sec-WebSocket-Key must be 16 bytes in base64")
        }
        let uri = URI(head.uri)
        guard uri.path == path else {
            return Refusal(status: .badRequest, reason: "\(uri.path) is not a WebSocket: only \(path) upgrades")
        }
        if let reason = route(uri.queryParameters.map { (String($0.key), String($0.value)) }) {
            return Refusal(status: .badRequest, reason: reason)
        }
        return nil
    }
}
