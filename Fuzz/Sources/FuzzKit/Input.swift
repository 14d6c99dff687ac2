import AsyncBroadcast

/// Reads the fuzz input one byte at a time; reads past the end give 0.
public struct ByteReader {
    let bytes: [UInt8]
    public private(set) var offset = 0

    public init(_ data: UnsafePointer<UInt8>, _ size: Int) {
        bytes = Array(UnsafeBufferPointer(start: data, count: size))
    }

    public init(_ bytes: [UInt8]) { self.bytes = bytes }

    public var isAtEnd: Bool { offset >= bytes.count }

    /// The input's length in bytes.
    public var count: Int { bytes.count }

    public mutating func byte() -> Int {
        guard offset < bytes.count else { return 0 }
        defer { offset += 1 }
        return Int(bytes[offset])
    }

    /// A value in `0..<n` (n > 0).
    public mutating func below(_ n: Int) -> Int { byte() % n }
}

/// Capacities around the power-of-two boundaries of the buffers: the
/// locked ring starts at min(n, 16, 128 bytes' worth) rounded up to a power
/// of two and doubles; the lock-free ring's first segment is min(n, 64,
/// 128 bytes' worth: 16 `Int`s) and doubles.
public let capacityTable = [0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129]
public let replayTable = [0, 0, 1, 2, 3, 4, 5, 8, 16, 17, 64, 65]

/// One byte: bits 0-1 the kind, bits 2-6 the capacity (from `capacityTable`).
/// `.bounded(0)` is invalid, so bounded capacities are at least 1.
public func decodePolicy(_ byte: Int) -> BroadcastBufferingPolicy {
    let capacity = capacityTable[(byte >> 2 & 31) % capacityTable.count]
    switch byte & 3 {
    case 0: return .unbounded
    case 1: return .bufferingOldest(capacity)
    case 2: return .bufferingNewest(capacity)
    default: return .bounded(Swift.max(capacity, 1))
    }
}

public func describe(_ policy: BroadcastBufferingPolicy) -> String {
    switch policy {
    case .unbounded: return ".unbounded"
    case .bufferingOldest(let n): return ".bufferingOldest(\(n))"
    case .bufferingNewest(let n): return ".bufferingNewest(\(n))"
    case .bounded(let n): return ".bounded(\(n))"
    }
}

public func describe(_ result: BroadcastSendResult) -> String {
    (result.isFinished
        ? "finished(d\(result.delivered),x\(result.dropped))"
        : "delivered \(result.delivered), dropped \(result.dropped)")
        + (result.evicted == 0 ? "" : ", evicted \(result.evicted)")
}

/// The error type of the fuzzed sequences.
public struct FuzzError: Error, Equatable {
    public let code: Int
    public init(code: Int) { self.code = code }
}

/// Counts live `Payload`s, to prove that nothing leaks and that cancelled
/// or dropped buffers are freed. The targets are single-threaded.
nonisolated(unsafe) public var livePayloads = 0

/// The element type: a class, so its lifetime is observable.
public final class Payload: Sendable {
    public let id: Int
    public init(_ id: Int) {
        self.id = id
        livePayloads += 1
    }
    deinit { livePayloads -= 1 }
}
