// Keyed fan-out (`BroadcastTopics`) and the peers a user would otherwise
// write, each as a careful user writes it. The topics cells
// (TopicsWorkloads.swift) drive them.
//
// - AsyncBroadcast: `BroadcastTopics<Topic, Int, Never>`, used as documented.
// - lock+[Topic: BroadcastSequence]: a `Mutex` around a dictionary of
//   sequences. subscribe: get-or-create the topic's sequence under the lock,
//   `subscribe()` on it after releasing the lock (not calling into other code
//   while holding a lock); cancel: `cancel()`, then under the lock remove the
//   topic if it is still the same sequence and its `subscriberCount` is 0;
//   send: look up under the lock, send outside it. The race: a subscriber
//   that took the sequence from the dictionary but had not registered on it
//   yet when another subscriber's check saw 0 and removed it is left on a
//   sequence no later send reaches. (With `insideLock: true` the subscribe
//   happens under the dictionary lock, which closes that window; the churn
//   cell shows both.)
// - actor+AsyncStream: the Pioneer `AsyncPubSub` shape used for GraphQL
//   subscriptions: an actor holding `[Topic: [Int: AsyncStream.Continuation]]`;
//   `await subscribe(to:)` registers a continuation and returns its stream,
//   whose `onTermination` removes it in `Task { await actor.remove(...) }`
//   (the topic goes when its last continuation does); `await publish(_:to:)`
//   yields to each continuation of the topic.
// - OpenCombine dictionary: `[Topic: (PassthroughSubject, subscriber count)]`
//   behind a `Mutex`; subscribe: get-or-create and count under the lock and
//   `sink` there (PassthroughSubject cannot say how many subscribers it has,
//   so the user counts them, under the same lock); cancel: `cancel()`, then
//   under the lock count down and remove the topic at 0; send: look up under
//   the lock, `send` outside it. Delivery is a synchronous call on the
//   sender's thread: the "synchronous callback" bar.
@_spi(Testing) import AsyncBroadcast
@preconcurrency import OpenCombine
import Synchronization

enum TopicsPeerName {
    static let ours = "AsyncBroadcast"
    static let lockDict = "lock+[Topic: BroadcastSequence]"
    static let lockDictInside = "lock+[Topic: BroadcastSequence], subscribe inside the lock"
    static let actor = "actor+AsyncStream"
    static let combine = "OpenCombine dictionary"
}

// MARK: lock + [Topic: BroadcastSequence]

final class LockSequencesTopics<Topic: Hashable & Sendable>: Sendable {
    typealias Sequence = BroadcastSequence<Int, Never>
    /// What a subscriber keeps: its subscription and the sequence it is on
    /// (to remove that sequence, and only that one, when it is left empty).
    struct Handle: Sendable {
        let sequence: Sequence
        let subscription: Sequence.Subscription
    }

    let sequences = Mutex<[Topic: Sequence]>([:])
    let insideLock: Bool

    init(insideLock: Bool = false) { self.insideLock = insideLock }

    func subscribe(to topic: Topic) -> Handle {
        if insideLock {
            return sequences.withLock { d in
                let sequence: Sequence
                if let s = d[topic] {
                    sequence = s
                } else {
                    sequence = Sequence(bufferingPolicy: .unbounded)
                    d[topic] = sequence
                }
                return Handle(sequence: sequence, subscription: sequence.subscribe())
            }
        }
        let sequence = sequences.withLock { d -> Sequence in
            if let s = d[topic] { return s }
            let s = Sequence(bufferingPolicy: .unbounded)
            d[topic] = s
            return s
        }
        return Handle(sequence: sequence, subscription: sequence.subscribe())
    }

    func cancel(_ handle: Handle, of topic: Topic) {
        handle.subscription.cancel()
        sequences.withLock { d in
            if let s = d[topic], s === handle.sequence, s.subscriberCount == 0 {
                d[topic] = nil
            }
        }
    }

    @inline(__always)
    @discardableResult
    func send(_ element: Int, to topic: Topic) -> Int {
        guard let s = sequences.withLock({ $0[topic] }) else { return 0 }
        return s.send(element).delivered
    }

    var topicCount: Int { sequences.withLock { $0.count } }

    func finishAll() {
        let all = sequences.withLock { d -> [Sequence] in
            defer { d.removeAll() }
            return Array(d.values)
        }
        for s in all { s.finish() }
    }
}

// MARK: actor + AsyncStream (Pioneer's AsyncPubSub shape)

actor ActorStreamTopics<Topic: Hashable & Sendable> {
    var nextID = 0
    var topics: [Topic: [Int: AsyncStream<Int>.Continuation]] = [:]

    init() {}

    /// Registers a continuation for `topic`; its stream's termination
    /// (released, iteration cancelled or finished) removes it.
    func subscribe(to topic: Topic) -> (stream: AsyncStream<Int>, id: Int) {
        let (stream, continuation) = AsyncStream.makeStream(of: Int.self, bufferingPolicy: .unbounded)
        let id = nextID
        nextID += 1
        topics[topic, default: [:]][id] = continuation
        continuation.onTermination = { [weak self] _ in
            Task { await self?.remove(id, from: topic) }
        }
        return (stream, id)
    }

    func remove(_ id: Int, from topic: Topic) {
        topics[topic]?[id] = nil
        if topics[topic]?.isEmpty == true { topics[topic] = nil }
    }

    @discardableResult
    func publish(_ element: Int, to topic: Topic) -> Int {
        guard let continuations = topics[topic] else { return 0 }
        for continuation in continuations.values { continuation.yield(element) }
        return continuations.count
    }

    /// The checker's question (not a user operation): is subscriber `id`
    /// registered on `topic` now?
    func isRegistered(_ id: Int, on topic: Topic) -> Bool { topics[topic]?[id] != nil }

    var topicCount: Int { topics.count }

    func finishAll() {
        let all = topics.values.flatMap(\.values)
        topics.removeAll()
        for continuation in all { continuation.finish() }
    }
}

// MARK: OpenCombine dictionary

final class CombineTopics<Topic: Hashable & Sendable>: @unchecked Sendable {
    struct Entry {
        let subject: PassthroughSubject<Int, Never>
        var subscribers: Int
    }

    let entries = Mutex<[Topic: Entry]>([:])

    init() {}

    func subscribe(to topic: Topic, _ receive: @escaping (Int) -> Void) -> AnyCancellable {
        let box = entries.withLock { d -> UncheckedBox<AnyCancellable> in
            let subject: PassthroughSubject<Int, Never>
            if let e = d[topic] {
                subject = e.subject
                d[topic]!.subscribers += 1
            } else {
                subject = PassthroughSubject<Int, Never>()
                d[topic] = Entry(subject: subject, subscribers: 1)
            }
            return UncheckedBox(value: subject.sink(receiveValue: receive))
        }
        return box.value
    }

    func cancel(_ cancellable: AnyCancellable, of topic: Topic) {
        cancellable.cancel()
        entries.withLock { d in
            guard let e = d[topic] else { return }
            if e.subscribers <= 1 { d[topic] = nil } else { d[topic]!.subscribers -= 1 }
        }
    }

    @inline(__always)
    @discardableResult
    func send(_ element: Int, to topic: Topic) -> Bool {
        guard let subject = entries.withLock({ d in d[topic].map { UncheckedBox(value: $0.subject) } }) else { return false }
        subject.value.send(element)
        return true
    }

    var topicCount: Int { entries.withLock { $0.count } }

    func finishAll() {
        let all = entries.withLock { d -> [UncheckedBox<PassthroughSubject<Int, Never>>] in
            defer { d.removeAll() }
            return d.values.map { UncheckedBox(value: $0.subject) }
        }
        for s in all { s.value.send(completion: .finished) }
    }
}
