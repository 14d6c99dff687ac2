// The peers: AsyncBroadcast and the designs it is compared with, written here
// from their published descriptions. OpenCombine (synchronous) is driven
// separately, in CombineWorkloads.swift.
import AsyncAlgorithms
import AsyncBroadcast
import Synchronization

/// An asynchronous 1-to-N broadcaster: subscribe consumers, then send.
public protocol AsyncPeer<Element>: Sendable {
    associatedtype Element: Payload
    associatedtype Stream: AsyncSequence, Sendable where Stream.Element == Element, Stream.Failure == Never

    static var name: String { get }
    /// nil if the peer cannot do `policy`.
    static func supports(_ policy: Policy) -> Bool

    init(policy: Policy)
    /// Registers one subscriber (for `share`, registration happens at
    /// `makeAsyncIterator()`, which the consumer does before it says it is ready).
    func subscribe() async -> Stream
    func send(_ element: Element) async
    func finish() async
    /// One subscribe-then-cancel cycle, the peer's idiomatic way.
    func churnOnce() async
    /// Live subscribers (nil if the peer cannot tell).
    func subscriberCount() async -> Int?
    /// Elements this subscriber's policy dropped, if the peer reports it.
    func dropped(_ stream: Stream) -> Int?
}

extension AsyncPeer {
    public static func supports(_ policy: Policy) -> Bool {
        if case .bounded = policy { return false }
        return true
    }
    public func dropped(_ stream: Stream) -> Int? { nil }
}

// MARK: AsyncBroadcast

public struct BroadcastPeer<Element: Payload>: AsyncPeer {
    public static var name: String { "AsyncBroadcast" }
    public static func supports(_ policy: Policy) -> Bool { true }

    let sequence: BroadcastSequence<Element, Never>

    public init(policy: Policy) {
        switch policy {
        case .unbounded: sequence = BroadcastSequence(bufferingPolicy: .unbounded)
        case .newest(let n): sequence = BroadcastSequence(bufferingPolicy: .bufferingNewest(n))
        case .bounded(let n): sequence = BroadcastSequence(bufferingPolicy: .bounded(n))
        }
    }

    public func subscribe() async -> BroadcastSequence<Element, Never>.Subscription { sequence.subscribe() }
    @inline(__always) public func send(_ element: Element) async { sequence.send(element) }
    @inline(__always) public func emit(_ element: Element) async { _ = try? await sequence.emit(element) }
    @inline(__always) public func send(contentsOf elements: ArraySlice<Element>) { sequence.send(contentsOf: elements) }
    public func finish() async { sequence.finish() }
    public func churnOnce() async {
        let s = sequence.subscribe()
        s.cancel()
    }
    public func subscriberCount() async -> Int? { sequence.subscriberCount }
    public func dropped(_ stream: BroadcastSequence<Element, Never>.Subscription) -> Int? { stream.droppedCount }
}

// MARK: A lock around a dictionary of AsyncStream continuations

extension Policy {
    func streamPolicy<E>(_: E.Type) -> AsyncStream<E>.Continuation.BufferingPolicy {
        switch self {
        case .unbounded: return .unbounded
        case .newest(let n): return .bufferingNewest(n)
        case .bounded: fatalError("AsyncStream has no backpressure")
        }
    }
}

/// The common hand-written design: `makeStream()` registers a continuation in
/// a locked dictionary, `onTermination` removes it, `send` yields to each
/// (under the lock, so concurrent sends keep one order), `finish` finishes all.
public final class LockStreamPeer<Element: Payload>: AsyncPeer {
    public static var name: String { "lock+AsyncStream" }

    struct State {
        var nextID = 0
        var continuations: [Int: AsyncStream<Element>.Continuation] = [:]
        var finished = false
    }
    let state = Mutex(State())
    let policy: AsyncStream<Element>.Continuation.BufferingPolicy

    public init(policy: Policy) { self.policy = policy.streamPolicy(Element.self) }

    public func makeStream() -> AsyncStream<Element> {
        let (stream, continuation) = AsyncStream.makeStream(of: Element.self, bufferingPolicy: policy)
        let id = state.withLock { s -> Int? in
            if s.finished { return nil }
            let id = s.nextID
            s.nextID += 1
            s.continuations[id] = continuation
            return id
        }
        guard let id else {
            continuation.finish()
            return stream
        }
        continuation.onTermination = { [weak self] _ in self?.remove(id) }
        return stream
    }

    func remove(_ id: Int) {
        _ = state.withLock { $0.continuations.removeValue(forKey: id) }
    }

    public func subscribe() async -> AsyncStream<Element> { makeStream() }

    @inline(__always)
    public func send(_ element: Element) async { yield(element) }

    @inline(__always)
    public func yield(_ element: Element) {
        state.withLock { s in
            for continuation in s.continuations.values { continuation.yield(element) }
        }
    }

    public func finish() async {
        let all = state.withLock { s -> [AsyncStream<Element>.Continuation] in
            s.finished = true
            defer { s.continuations.removeAll() }
            return Array(s.continuations.values)
        }
        for continuation in all { continuation.finish() }  // outside the lock: onTermination takes it
    }

    public func churnOnce() async {
        var stream: AsyncStream<Element>? = makeStream()
        _ = stream
        stream = nil  // releasing the stream cancels it: onTermination removes the entry
    }

    public func subscriberCount() async -> Int? { state.withLock { $0.continuations.count } }
}

// MARK: An actor holding the same dictionary

public actor ActorStreamPeer<Element: Payload>: AsyncPeer {
    public static var name: String { "actor+AsyncStream" }

    var nextID = 0
    var continuations: [Int: AsyncStream<Element>.Continuation] = [:]
    var finished = false
    let policy: AsyncStream<Element>.Continuation.BufferingPolicy

    public init(policy: Policy) { self.policy = policy.streamPolicy(Element.self) }

    public func makeStream() -> AsyncStream<Element> {
        let (stream, continuation) = AsyncStream.makeStream(of: Element.self, bufferingPolicy: policy)
        if finished {
            continuation.finish()
            return stream
        }
        let id = nextID
        nextID += 1
        continuations[id] = continuation
        continuation.onTermination = { [weak self] _ in
            Task { await self?.remove(id) }
        }
        return stream
    }

    func remove(_ id: Int) { continuations.removeValue(forKey: id) }

    public func subscribe() async -> AsyncStream<Element> { makeStream() }

    public func send(_ element: Element) {
        for continuation in continuations.values { continuation.yield(element) }
    }

    public func finish() {
        finished = true
        let all = continuations.values
        continuations.removeAll()
        for continuation in all { continuation.finish() }
    }

    public func churnOnce() {
        var stream: AsyncStream<Element>? = makeStream()
        _ = stream
        stream = nil
    }

    public func subscriberCount() -> Int? { continuations.count }
}

// MARK: swift-async-algorithms share()

/// `share(bufferingPolicy:)` over an `AsyncStream` that the producer yields to.
public struct SharePeer<Element: Payload>: AsyncPeer {
    public static var name: String { "share()" }

    let continuation: AsyncStream<Element>.Continuation
    let shared: AnyShared<Element>

    public init(policy: Policy) {
        let (stream, continuation) = AsyncStream.makeStream(of: Element.self, bufferingPolicy: .unbounded)
        self.continuation = continuation
        switch policy {
        case .unbounded: shared = AnyShared(base: stream.share(bufferingPolicy: .unbounded))
        case .newest(let n): shared = AnyShared(base: stream.share(bufferingPolicy: .bufferingLatest(n)))
        case .bounded: fatalError("no backpressure from an AsyncStream source")
        }
    }

    public func subscribe() async -> AnyShared<Element> { shared }
    @inline(__always) public func send(_ element: Element) async { continuation.yield(element) }
    public func finish() async { continuation.finish() }
    public func churnOnce() async {
        // A side registers when its iterator is made and leaves when it is released.
        var iterator: AnyShared<Element>.AsyncIterator? = shared.makeAsyncIterator()
        _ = iterator
        iterator = nil
    }
    public func subscriberCount() async -> Int? { nil }
}

/// Names the opaque `some AsyncSequence & Sendable` that `share()` returns.
public struct AnyShared<Element: Sendable>: AsyncSequence, Sendable {
    let base: any AsyncSequence<Element, Never> & Sendable

    public struct AsyncIterator: AsyncIteratorProtocol {
        var base: any AsyncIteratorProtocol<Element, Never>
        public mutating func next() async -> Element? {
            await base.next(isolation: nil)
        }
        public mutating func next(isolation actor: isolated (any Actor)?) async -> Element? {
            await base.next(isolation: actor)
        }
    }

    public func makeAsyncIterator() -> AsyncIterator { AsyncIterator(base: base.makeAsyncIterator()) }
}

// MARK: Plain AsyncStream (N = 1 only)

public struct PlainStreamPeer<Element: Payload>: AsyncPeer {
    public static var name: String { "AsyncStream (1:1)" }

    let stream: AsyncStream<Element>
    let continuation: AsyncStream<Element>.Continuation

    public init(policy: Policy) {
        (stream, continuation) = AsyncStream.makeStream(of: Element.self, bufferingPolicy: policy.streamPolicy(Element.self))
    }

    public func subscribe() async -> AsyncStream<Element> { stream }
    @inline(__always) public func send(_ element: Element) async { continuation.yield(element) }
    public func finish() async { continuation.finish() }
    public func churnOnce() async {}
    public func subscriberCount() async -> Int? { nil }
}
