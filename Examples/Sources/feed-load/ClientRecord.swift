import FeedKit
import Foundation
import Synchronization

/// Counts the ramp and the drain wait on, shared by a run's clients.
final class RunCounters: Sendable {
    let ready = Atomic<Int>(0)
    let complete = Atomic<Int>(0)
    let failed = Atomic<Int>(0)
    let stop = Atomic<Bool>(false)
    /// Publishing is over: slow clients stop pausing and read what is left, gap frames included.
    let catchUp = Atomic<Bool>(false)
    /// Frames the slow clients have read, so the catch-up can tell when they are done.
    let slowFrames = Atomic<Int>(0)
}

/// What one client saw. Written only by that client's task (or thread) and
/// read after it ended, which orders the reads after the writes.
final class ClientRecord: @unchecked Sendable {
    let counters: RunCounters
    let expected: Int
    let server: Int
    let isSlow: Bool
    let run: Int
    /// The topic's number (its name: ``LoadOptions/topicName(_:)``).
    let topic: Int
    let clock = ContinuousClock()
    var started: ContinuousClock.Instant
    var connectTime: Duration?
    var nextExpected = 0
    var received = 0
    var skipped = 0
    var outOfOrder = 0
    /// Messages of another topic: never allowed.
    var foreign = 0
    var lastSeq = 0
    var seqViolations = 0
    var gaps = 0
    var dropped = 0
    var maxOnline = 0
    var resyncs = 0
    var viaCount: [Int]
    var latenciesMicros: [Int32] = []
    var lastReceive: ContinuousClock.Instant?
    var error: String?
    var closeCode: Int?
    /// `--reconnect`: this client leaves once it has half its messages and comes back with `since`.
    var reconnects = false
    /// Set when it has half: the reader closes the first connection.
    var leaving = false
    var reconnected = false
    /// The last `ready` frame's `epoch` and `seq`.
    var epoch = 0
    var readySeq = 0
    var readies = 0
    /// `recovered` frames, and the messages they covered (`to - from + 1`).
    var recoveredFrames = 0
    var recoveredMessages = 0
    /// Between a returning client's `ready` and its `recovered`: the messages
    /// come from the server's window, and their latency is not a live one.
    var recovering = false

    init(server: Int, servers: Int, isSlow: Bool, run: Int, expected: Int, topic: Int, counters: RunCounters) {
        self.topic = topic
        self.counters = counters
        self.expected = expected
        self.server = server
        self.isSlow = isSlow
        self.run = run
        self.viaCount = Array(repeating: 0, count: servers)
        self.started = clock.now
        latenciesMicros.reserveCapacity(isSlow ? 0 : expected)
    }

    /// Handles one text frame. Our frames have fixed prefixes, so a prefix
    /// test tells their type; the numbers are read in place, without a JSON
    /// decoder, so that a thousand clients cost the load tool little.
    func handle(_ text: String) {
        if isSlow { counters.slowFrames.add(1, ordering: .relaxed) }
        var text = text
        text.withUTF8 { bytes in
            if bytes.starts(with: Prefix.message) {
                guard let seq = intAfter(Prefix.seq, in: bytes) else { error = "message without seq"; return }
                if seq <= lastSeq { seqViolations += 1 }
                lastSeq = seq
                // Only this run's messages count: a replayed message from an earlier run is skipped.
                guard intAfter(Prefix.run, in: bytes) == run, let n = intAfter(Prefix.k, in: bytes) else { return }
                guard intAfter(Prefix.topic, in: bytes) == topic else { foreign += 1; return }
                let now = clock.now
                lastReceive = now
                received += 1
                if received == expected && !isSlow { counters.complete.add(1, ordering: .relaxed) }
                if reconnects && !reconnected && received >= expected / 2 { leaving = true }
                if n == nextExpected { nextExpected += 1 }
                else if n > nextExpected { skipped += n - nextExpected; nextExpected = n + 1 }
                else { outOfOrder += 1 }
                if let via = intAfter(Prefix.via, in: bytes), via >= 0, via < viaCount.count { viaCount[via] += 1 }
                if !isSlow && !recovering, let sentMicros = intAfter(Prefix.us, in: bytes) {
                    latenciesMicros.append(Int32(clamping: wallMicros() - sentMicros))
                }
            } else if bytes.starts(with: Prefix.gap) {
                gaps += 1
                // The frame carries the subscription's drop count so far.
                dropped = max(dropped, intAfter(Prefix.dropped, in: bytes) ?? 0)
            } else if bytes.starts(with: Prefix.online) {
                maxOnline = max(maxOnline, intAfter(Prefix.count, in: bytes) ?? 0)
            } else if bytes.starts(with: Prefix.ready) {
                readies += 1
                epoch = intAfter(Prefix.epoch, in: bytes) ?? 0
                readySeq = intAfter(Prefix.seq, in: bytes) ?? 0
                recovering = reconnected
                if connectTime == nil {
                    connectTime = clock.now - started
                    counters.ready.add(1, ordering: .relaxed)
                }
            } else if bytes.starts(with: Prefix.resync) {
                resyncs += 1
                recovering = false
            } else if bytes.starts(with: Prefix.recovered) {
                recoveredFrames += 1
                recovering = false
                if let from = intAfter(Prefix.from, in: bytes), let to = intAfter(Prefix.to, in: bytes) {
                    recoveredMessages += to - from + 1
                }
            }
        }
    }

    var isReady: Bool { connectTime != nil }

    func fail(_ message: String) {
        if error == nil { error = message }
        counters.failed.add(1, ordering: .relaxed)
    }

    enum Prefix {
        static let message = Array(#"{"type":"message""#.utf8)
        static let gap = Array(#"{"type":"gap""#.utf8)
        static let online = Array(#"{"type":"online""#.utf8)
        static let ready = Array(#"{"type":"ready""#.utf8)
        static let resync = Array(#"{"type":"resync""#.utf8)
        static let recovered = Array(#"{"type":"recovered""#.utf8)
        static let epoch = Array(#""epoch":"#.utf8)
        static let from = Array(#""from":"#.utf8)
        static let to = Array(#""to":"#.utf8)
        static let seq = Array(#""seq":"#.utf8)
        static let dropped = Array(#""dropped":"#.utf8)
        static let count = Array(#""count":"#.utf8)
        // Inside the body, a JSON string: its quotes are escaped.
        static let run = Array(#"\"run\":"#.utf8)
        static let k = Array(#"\"k\":"#.utf8)
        static let topic = Array(#"\"topic\":"#.utf8)
        static let via = Array(#"\"via\":"#.utf8)
        static let us = Array(#"\"us\":"#.utf8)
    }
}

/// The integer that follows the first `marker` in `bytes`.
func intAfter(_ marker: [UInt8], in bytes: UnsafeBufferPointer<UInt8>) -> Int? {
    guard bytes.count >= marker.count else { return nil }
    var i = 0
    let last = bytes.count - marker.count
    outer: while i <= last {
        for j in 0..<marker.count where bytes[i + j] != marker[j] {
            i += 1
            continue outer
        }
        var k = i + marker.count
        var value = 0
        var digits = 0
        var negative = false
        if k < bytes.count, bytes[k] == UInt8(ascii: "-") { negative = true; k += 1 }
        while k < bytes.count, bytes[k] >= 48, bytes[k] <= 57 {
            value = value &* 10 &+ Int(bytes[k] - 48)
            k += 1
            digits += 1
        }
        return digits > 0 ? (negative ? -value : value) : nil
    }
    return nil
}

func wallMicros() -> Int {
    var now = timespec()
    clock_gettime(CLOCK_REALTIME, &now)
    return now.tv_sec * 1_000_000 + now.tv_nsec / 1000
}
