@_spi(Testing) import AsyncBroadcast
import AsyncBroadcastTestSupport
import FuzzKit
#if canImport(Glibc)
import Glibc
#endif

// The fake listener of the fuzzed `BroadcastTopics` (its
// `register(topic, sink)` and the unregister closures it returns) and the
// element type. Unregister closures run on the driver's thread (a last
// cancel with `stopAfter: .zero`, `finish(topic:)`, `sink.finish()`,
// `finish()`) or on a stop timer's thread (`stopAfter` > 0), so everything
// here is locked.

/// Live `TopicItem`s: items are released on the library's threads too (a
/// stop timer retiring a topic drops its replay window), hence the lock.
let liveItems = Locked(0)

/// The element type: a class, so a leaked or double-kept element shows, and
/// it names the topic it was sent to (a message must never reach another
/// topic's subscriber).
final class TopicItem: Sendable {
    let id: Int
    let topic: Int
    init(_ id: Int, topic: Int) {
        self.id = id
        self.topic = topic
        liveItems.withLock { $0 += 1 }
    }
    deinit { liveItems.withLock { $0 -= 1 } }
}

/// One entry of a topic's listener log.
enum ListenerEvent: Equatable, CustomStringConvertible {
    case register
    /// An unregister closure returned; `inner` is what it did inside (its
    /// subscribe's name and its send's result), if it was armed.
    case unregister(inner: InnerAction?)

    var description: String {
        switch self {
        case .register: return "register"
        case .unregister(nil): return "unregister"
        case .unregister(let inner?): return "unregister{\(inner)}"
        }
    }
}

/// What an armed unregister closure does before it returns: subscribes to
/// its own topic (the subscribe racing the topic's stop: `finish(topic:)`,
/// the stop timer, the last cancel) and sends that topic one element.
struct InnerAction: Equatable, CustomStringConvertible {
    let name: String
    let id: Int
    let sent: BroadcastSendResult

    var description: String { "\(name) = subscribe; send(#\(id)) -> \(describe(sent))" }
}

final class Listener: @unchecked Sendable {
    typealias Topics = BroadcastTopics<Int, TopicItem, Never>
    typealias Sink = BroadcastSink<TopicItem, Never>

    let topicCount: Int
    /// Per topic: what `register` and the unregister closures did, in order.
    let logs: Locked<[[ListenerEvent]]>
    /// Per topic: the sink of its latest `register`.
    let sinks: Locked<[Sink?]>
    /// Per topic: the next unregister subscribes and sends (set by the driver).
    let armed: Locked<[Bool]>
    /// Per topic: the next unregister that runs off the driver's thread (a
    /// stop timer's) blocks until the driver releases it (set by the driver).
    let holdArmed: Locked<[Bool]>
    /// Per topic: an unregister is blocked in its hold.
    let holding: Locked<[Bool]>
    /// Per topic: the driver lets the blocked unregister go on.
    let released: Locked<[Bool]>
    /// `finish(topic:)` calls running in a task of their own.
    let helpers = Locked(0)
    /// The thread that runs the program.
    let driverThread = pthread_self()
    /// Per topic: how many inner subscribes it made (names them).
    let innerSerial: Locked<[Int]>
    /// Inner subscriptions, by name, for the driver to pick up.
    let inner = Locked<[String: Topics.Subscription]>([:])
    /// Per topic: `register` or an unregister closure is running.
    let busy: Locked<[String?]>
    /// Contract violations seen inside the closures.
    let violations = Locked<[String]>([])
    /// The topics (weak: the closures must not keep them).
    weak var topics: Topics?

    init(topicCount: Int) {
        self.topicCount = topicCount
        logs = Locked(Array(repeating: [], count: topicCount))
        sinks = Locked(Array(repeating: nil, count: topicCount))
        armed = Locked(Array(repeating: false, count: topicCount))
        innerSerial = Locked(Array(repeating: 0, count: topicCount))
        holdArmed = Locked(Array(repeating: false, count: topicCount))
        holding = Locked(Array(repeating: false, count: topicCount))
        released = Locked(Array(repeating: false, count: topicCount))
        busy = Locked(Array(repeating: nil, count: topicCount))
    }

    /// The name and element id of topic `topic`'s `serial`-th inner action
    /// (the model makes the same).
    static func innerName(topic: Int, serial: Int) -> String { "u\(topic).\(serial)" }
    static func innerID(topic: Int, serial: Int) -> Int { 2_000_000 + topic * 100_000 + serial }

    private func enter(_ topic: Int, _ what: String) {
        let other: String? = busy.withLock { busy in
            defer { if busy[topic] == nil { busy[topic] = what } }
            return busy[topic]
        }
        if let other {
            violations.withLock { $0.append("topic \(topic): \(what) runs while its \(other) runs (they must never overlap)") }
        }
    }

    private func leave(_ topic: Int, _ what: String) {
        busy.withLock { busy in if busy[topic] == what { busy[topic] = nil } }
    }

    /// Blocks a stop timer's unregister while the driver subscribes to and
    /// sends to its topic (a real thread racing the stop).
    private func hold(_ topic: Int) {
        holding.withLock { $0[topic] = true }
        let start = ContinuousClock.now
        while !released.withLock({ $0[topic] }) {
            if ContinuousClock.now - start > .seconds(20) {
                violations.withLock { $0.append("topic \(topic): a held unregister was never released (a driver hang)") }
                break
            }
            usleep(20)
        }
        released.withLock { $0[topic] = false }
        holding.withLock { $0[topic] = false }
    }

    func register(_ topic: Int, _ sink: Sink) -> @Sendable () -> Void {
        enter(topic, "register")
        logs.withLock { $0[topic].append(.register) }
        sinks.withLock { $0[topic] = sink }
        leave(topic, "register")
        let once = Locked(false)
        return { [self] in
            if once.withLock({ ran in defer { ran = true }; return ran }) {
                violations.withLock { $0.append("topic \(topic): an unregister closure ran twice") }
                return
            }
            enter(topic, "unregister")
            if pthread_equal(pthread_self(), driverThread) == 0,
               holdArmed.withLock({ armed in defer { armed[topic] = false }; return armed[topic] }) {
                hold(topic)
            }
            var action: InnerAction? = nil
            let isArmed = armed.withLock { armed in defer { armed[topic] = false }; return armed[topic] }
            if isArmed, let topics {
                let serial = innerSerial.withLock { s in defer { s[topic] += 1 }; return s[topic] }
                let name = Self.innerName(topic: topic, serial: serial)
                let id = Self.innerID(topic: topic, serial: serial)
                let subscription = topics.subscribe(to: topic)
                inner.withLock { $0[name] = subscription }
                let sent = topics.send(TopicItem(id, topic: topic), to: topic)
                action = InnerAction(name: name, id: id, sent: sent)
            }
            // Logged when it returns: a `register` that starts inside it shows
            // before it (and as a violation).
            logs.withLock { $0[topic].append(.unregister(inner: action)) }
            leave(topic, "unregister")
        }
    }
}
