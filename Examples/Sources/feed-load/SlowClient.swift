import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A slow reader on a plain blocking socket with a small receive buffer:
/// 10 messages a second while the publisher runs, then as fast as it can, so
/// that it reaches the `gap` frames queued behind its backlog. HummingbirdWSClient cannot set `SO_RCVBUF`, and
/// without a small one the kernel absorbs megabytes, so the server's policy
/// never sees the client fall behind.
///
/// Server frames are unmasked; the few frames this client sends (pong,
/// close) are masked, as RFC 6455 requires of a client.
struct SlowClient: Sendable {
    let host: String
    let port: Int
    let path: String
    let record: ClientRecord
    let receiveBuffer: Int32 = 4096
    let pause: useconds_t = 100_000

    /// Runs on its own thread until `shouldStop` or the server closes.
    func run(shouldStop: @escaping @Sendable () -> Bool) {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { record.fail("socket: \(errno)"); return }
        defer { close(fd) }
        var size = receiveBuffer
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, socklen_t(MemoryLayout<Int32>.size))
        var timeout = timeval(tv_sec: 1, tv_usec: 0)  // so a stop is noticed while idle
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        inet_pton(AF_INET, host, &address.sin_addr)
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard connected == 0 else { record.fail("connect: \(errno)"); return }
        let key = Data((0..<16).map { _ in UInt8.random(in: 0...255) }).base64EncodedString()
        let request = "GET \(path) HTTP/1.1\r\nHost: \(host):\(port)\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: \(key)\r\nSec-WebSocket-Version: 13\r\n\r\n"
        guard sendAll(fd, Array(request.utf8)) else { record.fail("handshake send"); return }
        var reader = Reader(fd: fd, shouldStop: shouldStop)
        guard let head = reader.readHead(), head.hasPrefix("HTTP/1.1 101") else {
            record.fail("handshake refused")
            return
        }
        while !shouldStop() {
            guard let (opcode, payload) = reader.readFrame() else { break }
            switch opcode {
            case 0x1:
                record.handle(String(decoding: payload, as: UTF8.self))
                if payload.starts(with: ClientRecord.Prefix.message) && !record.counters.catchUp.load(ordering: .relaxed) { usleep(pause) }
            case 0x8:
                if payload.count >= 2 { record.closeCode = Int(payload[0]) << 8 | Int(payload[1]) }
                _ = sendAll(fd, maskedFrame(opcode: 0x8, payload: Array(payload.prefix(2))))
                return
            case 0x9:
                _ = sendAll(fd, maskedFrame(opcode: 0xA, payload: payload))
            default:
                continue
            }
        }
        _ = sendAll(fd, maskedFrame(opcode: 0x8, payload: [0x03, 0xE8]))
    }

    struct Reader {
        let fd: Int32
        let shouldStop: @Sendable () -> Bool
        var buffer: [UInt8] = []
        var start = 0

        mutating func fill(_ count: Int) -> Bool {
            while buffer.count - start < count {
                if shouldStop() { return false }
                var chunk = [UInt8](repeating: 0, count: 1024)
                let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, 1024, 0) }
                if n == 0 { return false }
                if n < 0 {
                    if errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR { continue }
                    return false
                }
                if start > 0 { buffer.removeFirst(start); start = 0 }
                buffer.append(contentsOf: chunk[0..<n])
            }
            return true
        }

        mutating func take(_ count: Int) -> ArraySlice<UInt8> {
            defer { start += count }
            return buffer[start..<(start + count)]
        }

        mutating func readHead() -> String? {
            while true {
                if let end = buffer[start...].firstRange(of: [13, 10, 13, 10]) {
                    let head = String(decoding: buffer[start..<end.lowerBound], as: UTF8.self)
                    start = end.upperBound
                    return head
                }
                guard fill(buffer.count - start + 1) else { return nil }
            }
        }

        mutating func readFrame() -> (UInt8, [UInt8])? {
            guard fill(2) else { return nil }
            let header = take(2)
            let opcode = header[header.startIndex] & 0x0F
            var length = Int(header[header.startIndex + 1] & 0x7F)
            if length == 126 {
                guard fill(2) else { return nil }
                length = take(2).reduce(0) { $0 << 8 | Int($1) }
            } else if length == 127 {
                guard fill(8) else { return nil }
                length = take(8).reduce(0) { $0 << 8 | Int($1) }
            }
            guard fill(length) else { return nil }
            return (opcode, Array(take(length)))
        }
    }

    func maskedFrame(opcode: UInt8, payload: [UInt8]) -> [UInt8] {
        let mask = (0..<4).map { _ in UInt8.random(in: 0...255) }
        var frame: [UInt8] = [0x80 | opcode, 0x80 | UInt8(payload.count)]
        frame += mask
        frame += payload.enumerated().map { $0.element ^ mask[$0.offset % 4] }
        return frame
    }

    func sendAll(_ fd: Int32, _ bytes: [UInt8]) -> Bool {
        var offset = 0
        while offset < bytes.count {
            let n = bytes[offset...].withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if n <= 0 { return false }
            offset += n
        }
        return true
    }
}
