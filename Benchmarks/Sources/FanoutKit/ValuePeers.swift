// The peers for the current-value workloads (value-read, value-update):
// BroadcastValue and the designs it is compared with. OpenCombine's
// CurrentValueSubject (synchronous sinks) is driven separately, in
// ValueWorkloads.swift.
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif
import AsyncBroadcast
@preconcurrency import OpenCombine
import Synchronization

/// A current value that can be read without suspending.
protocol ValueReader: Sendable {
    static var name: String { get }
    init(_ initial: Int)
    func read() -> Int
}

/// A current value that subscribers follow (conflated: a subscriber that
/// falls behind gets the newest value, not a backlog). A new subscriber
/// starts with the current value.
protocol ValuePeer: Sendable {
    associatedtype Stream: AsyncSequence, Sendable where Stream.Element == Int, Stream.Failure == Never
    static var name: String { get }
    init(_ initial: Int)
    func subscribe() async -> Stream
    func send(_ value: Int) async
}

// MARK: BroadcastValue

struct BroadcastValuePeer: ValueReader, ValuePeer {
    static var name: String { "BroadcastValue" }

    let value: BroadcastValue<Int, Never>

    init(_ initial: Int) { value = BroadcastValue(initial) }

    @inline(__always) func read() -> Int { value.value }
    func subscribe() async -> BroadcastValue<Int, Never>.Subscription { value.subscribe() }
    @inline(__always) func send(_ newValue: Int) async { value.send(newValue) }
}

// MARK: The usual hand-written design

/// A `Mutex` around the current value and `[id: AsyncStream.Continuation]`,
/// each stream `.bufferingNewest(1)` (conflation by the stream): `subscribe`
/// registers and yields the current value, `send` stores and yields to each
/// under the lock, `onTermination` removes. `read` is its getter.
final class LockValuePeer: ValueReader, ValuePeer {
    static var name: String { "lock+AsyncStream(newest 1)" }

    struct State {
        var current: Int
        var nextID = 0
        var continuations: [Int: AsyncStream<Int>.Continuation] = [:]
    }
    let state: Mutex<State>

    init(_ initial: Int) { state = Mutex(State(current: initial)) }

    @inline(__always) func read() -> Int { state.withLock { $0.current } }

    func subscribe() async -> AsyncStream<Int> {
        let (stream, continuation) = AsyncStream.makeStream(of: Int.self, bufferingPolicy: .bufferingNewest(1))
        let id = state.withLock { s -> Int in
            let id = s.nextID
            s.nextID += 1
            s.continuations[id] = continuation
            continuation.yield(s.current)
            return id
        }
        continuation.onTermination = { [weak self] _ in
            _ = self?.state.withLock { $0.continuations.removeValue(forKey: id) }
        }
        return stream
    }

    @inline(__always) func send(_ newValue: Int) async {
        state.withLock { s in
            s.current = newValue
            for continuation in s.continuations.values { continuation.yield(newValue) }
        }
    }
}

/// The same dictionary and current value in an actor: `send` is `await actor.send`.
actor ActorValuePeer: ValuePeer {
    static var name: String { "actor+AsyncStream(newest 1)" }

    var current: Int
    var nextID = 0
    var continuations: [Int: AsyncStream<Int>.Continuation] = [:]

    init(_ initial: Int) { current = initial }

    func read() -> Int { current }

    func subscribe() -> AsyncStream<Int> {
        let (stream, continuation) = AsyncStream.makeStream(of: Int.self, bufferingPolicy: .bufferingNewest(1))
        let id = nextID
        nextID += 1
        continuations[id] = continuation
        continuation.yield(current)
        continuation.onTermination = { [weak self] _ in
            Task { await self?.remove(id) }
        }
        return stream
    }

    func remove(_ id: Int) { continuations.removeValue(forKey: id) }

    func send(_ newValue: Int) {
        current = newValue
        for continuation in continuations.values { continuation.yield(newValue) }
    }
}

// MARK: Plain locked values (value-read only)

/// A stored value behind a `pthread_mutex_t` (what NIOLock is on Linux).
final class PthreadValuePeer: ValueReader, @unchecked Sendable {
    static var name: String { "pthread_mutex (NIOLock-like)" }

    let mutex: UnsafeMutablePointer<pthread_mutex_t>
    var stored: Int

    init(_ initial: Int) {
        mutex = .allocate(capacity: 1)
        mutex.initialize(to: pthread_mutex_t())
        pthread_mutex_init(mutex, nil)
        stored = initial
    }

    deinit {
        pthread_mutex_destroy(mutex)
        mutex.deallocate()
    }

    @inline(__always) func read() -> Int {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return stored
    }
}

/// OpenCombine's `CurrentValueSubject.value` (a lock inside).
final class CombineValueReader: ValueReader, @unchecked Sendable {
    static var name: String { CombineValueName.name }
    let subject: CurrentValueSubject<Int, Never>
    init(_ initial: Int) { subject = CurrentValueSubject(initial) }
    @inline(__always) func read() -> Int { subject.value }
}

enum CombineValueName {
    static let name = "OpenCombine CurrentValueSubject"
}
