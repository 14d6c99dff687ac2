// Clock, payloads, counters and the per-consumer tally shared by every peer.
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif
import Synchronization

/// Monotonic nanoseconds.
@inline(__always)
public func nowNanos() -> UInt64 {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return UInt64(ts.tv_sec) &* 1_000_000_000 &+ UInt64(ts.tv_nsec)
}

// MARK: Payloads

/// An element type the workloads can send: built from an index, checked by `key`.
public protocol Payload: Sendable {
    static func make(_ index: Int) -> Self
    var key: Int { get }
}

extension Int: Payload {
    @inline(__always) public static func make(_ index: Int) -> Int { index }
    @inline(__always) public var key: Int { self }
}

/// A class payload: every delivery retains and releases it.
public final class RefPayload: Payload {
    public let key: Int
    init(key: Int) { self.key = key }
    public static func make(_ index: Int) -> RefPayload { RefPayload(key: index) }
}

/// A 64-byte struct payload (eight words).
public struct Payload64: Payload {
    public var key: Int
    public var a: Int, b: Int, c: Int, d: Int, e: Int, f: Int, g: Int
    @inline(__always)
    public static func make(_ index: Int) -> Payload64 {
        Payload64(key: index, a: index, b: 1, c: 2, d: 3, e: 4, f: 5, g: 6)
    }
}

// MARK: Policies

/// The buffering policy a workload asks every peer for.
public enum Policy: Sendable, Equatable {
    case unbounded
    case newest(Int)
    case bounded(Int)
}

// MARK: Synchronisation helpers (not on the measured path)

/// Counts down; `wait()` returns when it reaches zero.
public final class Latch: Sendable {
    private struct State {
        var remaining: Int
        var waiter: CheckedContinuation<Void, Never>?
    }
    private let state: Mutex<State>

    public init(_ count: Int) { state = Mutex(State(remaining: count, waiter: nil)) }

    public func arrive() {
        let waiter = state.withLock { s -> CheckedContinuation<Void, Never>? in
            s.remaining -= 1
            if s.remaining <= 0, let w = s.waiter {
                s.waiter = nil
                return w
            }
            return nil
        }
        waiter?.resume()
    }

    public func wait() async {
        await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
            let now = state.withLock { s -> Bool in
                if s.remaining <= 0 { return true }
                s.waiter = c
                return false
            }
            if now { c.resume() }
        }
    }
}

public final class Flag: Sendable {
    private let value = Atomic<Bool>(false)
    public init() {}
    @inline(__always) public var isSet: Bool { value.load(ordering: .acquiring) }
    public func set() { value.store(true, ordering: .releasing) }
}

public final class Counter: Sendable {
    private let value = Atomic<Int>(0)
    public init() {}
    @inline(__always) public var current: Int { value.load(ordering: .acquiring) }
    @inline(__always) public func increment() { value.wrappingAdd(1, ordering: .acquiringAndReleasing) }
    /// Adds one and returns the new value.
    @inline(__always) public func next() -> Int { value.wrappingAdd(1, ordering: .acquiringAndReleasing).newValue }
}

// MARK: Results

/// What one consumer saw.
public struct Tally: Sendable {
    public var count = 0
    public var sum = 0
    public var last = -1
    public var inOrder = true
    public var end: UInt64 = 0
    public var dropped: Int? = nil

    public init() {}

    @inline(__always)
    public mutating func add(_ key: Int) {
        count &+= 1
        sum &+= key
        if key <= last { inOrder = false }
        last = key
    }
}

/// What the harness checks a run against.
public enum Expectation: Sendable {
    /// Lossless: exactly `count` elements with keys 0..<count; `ordered` for one producer.
    case all(count: Int, ordered: Bool)
    /// Lossy (`bufferingNewest`): in order, no more than `count`, ends with the
    /// last key, and (when the peer reports drops) received + dropped == count.
    case newest(count: Int)

    public func check(_ t: Tally) -> String? {
        switch self {
        case let .all(count, ordered):
            let sum = count * (count - 1) / 2
            if t.count != count || t.sum != sum {
                return "count \(t.count)/\(count), sum \(t.sum)/\(sum)"
            }
            if ordered && !t.inOrder { return "out of order" }
        case let .newest(count):
            if !t.inOrder { return "out of order" }
            if t.count > count || t.count == 0 { return "count \(t.count) of \(count)" }
            if t.last != count - 1 { return "last \(t.last), expected \(count - 1)" }
            if let d = t.dropped, d + t.count != count {
                return "received \(t.count) + dropped \(d) != \(count)"
            }
        }
        return nil
    }
}

/// One measured run.
public struct RunResult: Sendable {
    /// Elapsed nanoseconds of the measured part.
    public var nanos: UInt64
    /// Units the time is divided by (deliveries, or subscribe/cancel cycles).
    public var units: Int
    /// Allocations during the measured part (nil when not counted).
    public var mallocs: Int?
    /// nil when the run delivered what it should.
    public var error: String?
    /// Latency samples (ns) for the wake-up workload.
    public var latencies: [UInt64] = []
    /// Fraction of sends that reached the subscribers (lossy policies).
    public var receivedFraction: Double = 1
    /// Throughput runs: from the first send until the last producer's last
    /// send returned (the consumers may still be reading).
    public var producerNanos: UInt64? = nil

    public var nanosPerUnit: Double { Double(nanos) / Double(max(units, 1)) }
}

/// Optional allocation counting, provided by the front end (MallocInterposer).
public struct AllocMeter: Sendable {
    public var start: @Sendable () -> Void
    public var stop: @Sendable () -> Int
    public init(start: @escaping @Sendable () -> Void, stop: @escaping @Sendable () -> Int) {
        self.start = start
        self.stop = stop
    }
}

func checkAll(_ tallies: [Tally], _ expectation: Expectation) -> String? {
    for (i, t) in tallies.enumerated() {
        if let e = expectation.check(t) { return "subscriber \(i): \(e)" }
    }
    return nil
}

// MARK: Watchdog

/// A plain thread (not a task: it must work even if the cooperative pool is
/// stuck) that ends the process with status 3 if one run takes longer than
/// `limit` seconds: a run that never completes is a wrong result too.
public final class Watchdog: Sendable {
    private struct State {
        var label = "start-up"
        var since = nowNanos()
    }
    private let state = Mutex(State())
    private let limitNanos: UInt64

    public init(limitSeconds: Int) {
        limitNanos = UInt64(limitSeconds) * 1_000_000_000
    }

    public func beat(_ label: String) {
        state.withLock { s in
            s.label = label
            s.since = nowNanos()
        }
    }

    public func start() {
        let unmanaged = Unmanaged.passRetained(self)
        var thread = pthread_t()
        pthread_create(&thread, nil, { raw in
            #if canImport(Darwin)
            let watchdog = Unmanaged<Watchdog>.fromOpaque(raw).takeUnretainedValue()
            #else
            let watchdog = Unmanaged<Watchdog>.fromOpaque(raw!).takeUnretainedValue()
            #endif
            watchdog.loop()
        }, unmanaged.toOpaque())
        pthread_detach(thread)
    }

    private func loop() -> Never {
        while true {
            sleep(1)
            let (label, since) = state.withLock { ($0.label, $0.since) }
            if nowNanos() &- since > limitNanos {
                log("HUNG: \(label) did not finish within \(limitNanos / 1_000_000_000) s")
                _exit(3)
            }
        }
    }
}
