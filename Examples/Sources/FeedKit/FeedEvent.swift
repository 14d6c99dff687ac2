import Foundation
import NIOCore

/// One thing the feed carries to every connection.
///
/// A message's frame is encoded once, when the notification arrives, and the
/// same bytes (a `ByteBuffer` shares its storage) are written to every
/// connection: the per-connection cost is the write, not JSON encoding.
public enum FeedEvent: Sendable {
    case message(FeedMessage)
    /// The LISTEN connection came back after an outage: notifications sent
    /// while it was down are lost, so clients should fetch their state again.
    case resync

    /// A message (kept for replay), not an out-of-band `resync`.
    public var isMessage: Bool {
        if case .message = self { return true }
        return false
    }
}

public struct FeedMessage: Sendable {
    /// Per server process, from 1, in the order the notifications arrived.
    public let seq: Int
    /// Epoch milliseconds: the publisher's `sent` if the payload carries one,
    /// else when this process received the notification.
    public let sent: Int64
    /// `{"type":"message","seq":S,"sent":T,"body":"..."}`, encoded once. The
    /// payload is kept only here (no second copy as a `String`): what a
    /// connection's backlog costs is this buffer.
    public let frame: ByteBuffer
    /// This process's running total of ``bytes`` up to and including this
    /// message (``Sequencer/advance(by:)``). A connection that has taken the
    /// message with `end` E while the total is T holds at most T - E bytes:
    /// that is how the per-connection budget is measured without trusting a
    /// single reading of `bufferedCount`.
    public var end: Int = 0
    /// When this process received the notification (``monotonicNanoseconds()``):
    /// where `feed_fanout_latency_seconds` starts.
    public let received: UInt64

    /// What holding this message costs: the frame's storage and a fixed
    /// allowance for the storage object, the event and its buffer slot.
    public var bytes: Int { frame.capacity + Self.overheadBytes }
    public static let overheadBytes = 160

    /// The largest ``bytes`` a message can have: a payload of
    /// ``PublishBody/maximumBytes`` whose every byte is escaped in two (`"`,
    /// backslash, tab, LF, CR; other control characters are refused by
    /// `POST /publish`), inside the largest header (`seq` and `sent` of 20
    /// characters each), in the storage NIO allocates for it (a power of two:
    /// 16,384 bytes). The `capacity` ceiling is the budget divided by this.
    public static let largestBytes = largestFrameCapacity + overheadBytes
    public static let largestFrameCapacity = 1 << (Int.bitWidth - (largestFrameBytes - 1).leadingZeroBitCount)
    public static let largestFrameBytes =
        #"{"type":"message","seq":,"sent":,"body":""}"#.utf8.count + 20 + 20 + 2 * PublishBody.maximumBytes

    public init(seq: Int, payload: String, receivedAt now: Int64 = epochMilliseconds()) {
        received = monotonicNanoseconds()  // first: decoding the payload's `sent` is part of the latency
        self.seq = seq
        self.sent = Self.publisherTimestamp(in: payload) ?? now
        self.frame = ByteBuffer(string: #"{"type":"message","seq":\#(seq),"sent":\#(sent),"body":\#(jsonString(payload))}"#)
    }

    /// The payload's own `sent`, when the payload is a JSON object that has a
    /// numeric one: the load tool stamps it, so latency is measured end to end.
    static func publisherTimestamp(in payload: String) -> Int64? {
        // JSONDecoder, not JSONSerialization: the latter turns `true` into 1.
        struct Stamp: Decodable { let sent: Double }
        guard payload.first == "{",
              let sent = try? JSONDecoder().decode(Stamp.self, from: Data(payload.utf8)).sent,
              sent.isFinite, abs(sent) < 1e15
        else { return nil }
        return Int64(sent)
    }
}

/// The frames that are not messages.
public enum ControlFrame {
    public static let ready = ByteBuffer(string: #"{"type":"ready"}"#)
    public static let resync = ByteBuffer(string: #"{"type":"resync"}"#)
    public static func gap(dropped: Int) -> ByteBuffer { ByteBuffer(string: #"{"type":"gap","dropped":\#(dropped)}"#) }
    public static func online(count: Int) -> ByteBuffer { ByteBuffer(string: #"{"type":"online","count":\#(count)}"#) }
}

public func epochMilliseconds() -> Int64 {
    var now = timespec()
    clock_gettime(CLOCK_REALTIME, &now)
    return Int64(now.tv_sec) * 1000 + Int64(now.tv_nsec) / 1_000_000
}

/// `s` as a JSON string literal, quotes included.
public func jsonString(_ s: String) -> String {
    var out = "\""
    out.reserveCapacity(s.utf8.count + 2)
    for scalar in s.unicodeScalars {
        switch scalar {
        case "\"": out += "\\\""
        case "\\": out += "\\\\"
        case "\n": out += "\\n"
        case "\r": out += "\\r"
        case "\t": out += "\\t"
        case _ where scalar.value < 0x20:
            out += "\\u" + String(repeating: "0", count: 4 - String(scalar.value, radix: 16).count) + String(scalar.value, radix: 16)
        default: out.unicodeScalars.append(scalar)
        }
    }
    return out + "\""
}
