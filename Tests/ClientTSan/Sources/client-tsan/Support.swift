import AsyncBroadcast
import Foundation
import Synchronization

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

// MARK: - Time and waiting

/// Monotonic seconds.
func now() -> Double {
    Double(DispatchTime.now().uptimeNanoseconds) / 1e9
}

/// How long a single wait for a condition may take before it counts as a
/// failure. Generous for TSan on a loaded 2-core machine; it only turns a
/// lost wake-up into a message instead of a hang.
let stepDeadline: Double = 20

/// Yields the task until `condition` holds; false if `seconds` pass first.
func waitUntil(within seconds: Double = stepDeadline, _ condition: () -> Bool) async -> Bool {
    let end = now() + seconds
    while !condition() {
        if now() > end { return false }
        await Task.yield()
    }
    return true
}

/// Spins the calling thread until `condition` holds; false if `seconds` pass.
func spinUntil(within seconds: Double = stepDeadline, _ condition: () -> Bool) -> Bool {
    let end = now() + seconds
    var spins = 0
    while !condition() {
        spins += 1
        if spins & 63 == 0 {
            if now() > end { return false }
            sched_yield()
        }
    }
    return true
}

/// Runs `body` on a new OS thread (not the cooperative pool) and waits for it.
///
/// The wait polls a flag rather than awaiting a continuation that the thread
/// resumes: a continuation resumed from another thread is exactly what this
/// tool exists to catch in the library (swiftlang/swift#57803), so the
/// harness itself never does it. The flag's store and load order everything
/// the body did before whatever the caller does after.
func onThread(_ body: @escaping @Sendable () -> Void) async {
    let done = Flag()
    let thread = Thread {
        body()
        done.set()
    }
    thread.start()
    var polls = 0
    while !done.isSet {
        polls += 1
        if polls < 64 || Task.isCancelled {
            await Task.yield()
        } else {
            try? await Task.sleep(nanoseconds: 50_000)
        }
    }
}

/// Starts `body` on a new OS thread; the returned task ends when it does.
func startThread(_ body: @escaping @Sendable () -> Void) -> Task<Void, Never> {
    Task.detached { await onThread(body) }
}

// MARK: - Random

struct SplitMix64: RandomNumberGenerator, Sendable {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
    mutating func below(_ n: Int) -> Int { n <= 1 ? 0 : Int(next() % UInt64(n)) }
    mutating func chance(_ percent: Int) -> Bool { below(100) < percent }
    /// A fresh generator for a child (a task or thread of its own).
    mutating func split() -> SplitMix64 { SplitMix64(seed: next()) }
}

/// Burns a few cycles: shifts where a send lands relative to a consumer
/// that is about to park.
@inline(never)
func busyWait(_ spins: Int) {
    var x = 0
    for i in 0..<spins { x &+= i }
    blackHole(x)
}

@inline(never)
func blackHole(_ x: Int) { if x == -1 { print("") } }

// MARK: - Shared state

final class Counter: Sendable {
    private let atomic = Atomic<Int>(0)
    init(_ value: Int = 0) { atomic.store(value, ordering: .sequentiallyConsistent) }
    @discardableResult
    func increment(by delta: Int = 1) -> Int { atomic.add(delta, ordering: .sequentiallyConsistent).newValue }
    var value: Int { atomic.load(ordering: .sequentiallyConsistent) }
    func store(_ value: Int) { atomic.store(value, ordering: .sequentiallyConsistent) }
}

final class Flag: Sendable {
    private let atomic = Atomic<Bool>(false)
    func set() { atomic.store(true, ordering: .sequentiallyConsistent) }
    var isSet: Bool { atomic.load(ordering: .sequentiallyConsistent) }
}

/// A value behind an `NSLock`, a pthread mutex that ThreadSanitizer
/// understands. Synchronization's `Mutex` is not used here: on Linux its
/// contended path runs inside the uninstrumented runtime, so two threads
/// meeting in `withLock` are reported as a race on the protected value.
final class Locked<Value: Sendable>: @unchecked Sendable {
    private let lock = NSLock()
    private var value: Value

    init(_ value: Value) { self.value = value }

    func withLock<Result>(_ body: (inout Value) -> Result) -> Result {
        lock.lock()
        defer { lock.unlock() }
        return body(&value)
    }
}

/// The failures of one scenario run (the first few messages are kept).
final class Failures: Sendable {
    private let messages = Locked<[String]>([])
    private let total = Atomic<Int>(0)

    func record(_ message: String) {
        total.add(1, ordering: .relaxed)
        messages.withLock { if $0.count < 10 { $0.append(message) } }
    }

    func check(_ condition: Bool, _ message: @autoclosure () -> String) {
        if !condition { record(message()) }
    }

    var count: Int { total.load(ordering: .relaxed) }
    var first: [String] { messages.withLock { $0 } }
}

// MARK: - Payload

/// A class element, so that delivering it across threads also hands over a
/// reference (retain/release) and its fields (read by the consumer).
final class Payload: Sendable {
    static let live = Counter()

    let source: Int
    let index: Int
    let tag: Int

    init(source: Int, index: Int) {
        self.source = source
        self.index = index
        self.tag = Payload.tag(source, index)
        Payload.live.increment()
    }

    deinit { Payload.live.increment(by: -1) }

    static func tag(_ source: Int, _ index: Int) -> Int { (source &* 1_000_003) ^ (index &* 7919) ^ 0x5A5A }
    var isIntact: Bool { tag == Payload.tag(source, index) }
}

struct Boom: Error, Equatable { let code: Int }

// MARK: - Consumers

/// What a consumer saw.
struct ConsumerResult: Sendable {
    var received = 0
    var receivedPerSource: [Int]
    var lastIndex: [Int]
    var indices: [Int] = []  // only when asked to keep them
    var problems: [String] = []
    var thrown: Boom?
    var threwTwice = false

    init(sources: Int) {
        receivedPerSource = Array(repeating: 0, count: sources)
        lastIndex = Array(repeating: -1, count: sources)
    }

    mutating func take(_ payload: Payload, lossless: Bool, keep: Bool) {
        received += 1
        if keep { indices.append(payload.index) }
        guard payload.isIntact, payload.source >= 0, payload.source < lastIndex.count else {
            if problems.count < 3 { problems.append("payload (\(payload.source), \(payload.index)) is corrupt") }
            return
        }
        let last = lastIndex[payload.source]
        if payload.index <= last || (lossless && payload.index != last + 1) {
            if problems.count < 3 {
                problems.append("source \(payload.source): got index \(payload.index) after \(last)\(lossless ? " (lossless policy)" : "")")
            }
        }
        lastIndex[payload.source] = payload.index
        receivedPerSource[payload.source] += 1
    }
}

/// Reads `subscription` with `for try await` until it ends; after an error,
/// checks that the next call returns nil.
func consume<Failure: Error>(
    _ subscription: BroadcastSequence<Payload, Failure>.Subscription,
    sources: Int,
    lossless: Bool,
    keep: Bool = false,
    progress: Counter? = nil,
    slow: Int = 0,
    rng: SplitMix64 = SplitMix64(seed: 1)
) async -> ConsumerResult {
    var result = ConsumerResult(sources: sources)
    var rng = rng
    do {
        for try await payload in subscription {
            result.take(payload, lossless: lossless, keep: keep)
            progress?.increment()
            if slow > 0, rng.below(100) < slow { await Task.yield() }
        }
    } catch {
        result.thrown = error as? Boom
        if result.thrown == nil { result.problems.append("threw \(error), not a Boom") }
        var iterator = subscription.makeAsyncIterator()
        do {
            if let extra = try await iterator.next() {
                result.problems.append("an element (\(extra.source), \(extra.index)) after the error")
            }
        } catch {
            result.threwTwice = true
        }
    }
    return result
}

/// Reads the sequence itself with `for await` (a subscriber that joins when
/// the loop starts).
func consumeSequence<Failure: Error>(
    _ sequence: BroadcastSequence<Payload, Failure>,
    sources: Int
) async -> ConsumerResult {
    var result = ConsumerResult(sources: sources)
    do {
        for try await payload in sequence {
            result.take(payload, lossless: false, keep: false)
        }
    } catch {
        result.thrown = error as? Boom
    }
    return result
}

extension BroadcastBufferingPolicy {
    /// Whether `send` never drops for this policy.
    var isLossless: Bool {
        switch self {
        case .unbounded, .bounded: return true
        case .bufferingOldest, .bufferingNewest: return false
        }
    }

    var name: String {
        switch self {
        case .unbounded: return ".unbounded"
        case .bufferingOldest(let n): return ".bufferingOldest(\(n))"
        case .bufferingNewest(let n): return ".bufferingNewest(\(n))"
        case .bounded(let n): return ".bounded(\(n))"
        }
    }
}

let everyPolicy: [BroadcastBufferingPolicy] = [
    .unbounded, .bufferingOldest(0), .bufferingOldest(1), .bufferingOldest(8),
    .bufferingNewest(0), .bufferingNewest(1), .bufferingNewest(8), .bounded(1), .bounded(4),
]
