@_spi(Testing) import AsyncBroadcast
import FuzzKit

// The reference model of `BroadcastTopics` (plain arrays and flags, written
// for clarity), from the contract in BroadcastTopics' doc comments,
// KeyedFanOut.md and Semantics.md ("Keyed fan-out"). Every subscriber is
// `.unbounded`, so nothing is ever dropped or evicted.
//
// - A topic is live from its first subscriber until its last one leaves;
//   with a listener, until its run has stopped: at once for
//   `stopAfter: .zero`, else when the stop timer (`stopAfter` after the last
//   subscriber left) fires, unless a subscriber came back first (same run,
//   no new `register`). A send to a live topic reaches its subscribers and
//   its replay window (also while it lingers without subscribers); to a
//   topic that is not live it reaches nobody and keeps nothing.
// - `finish(topic:)` and the listener's `sink.finish()` end the topic's
//   subscribers (they drain what they hold, then end), drop its replay
//   window and stop its run now. `finish()` does that to every topic, and
//   later subscribers end at once, later sends report `isFinished`.
// - An unregister closure may subscribe to its own topic and send to it
//   (`InnerAction`): on a topic whose last subscriber left (the stop), the
//   subscriber lands on the same, still live topic (replay kept) and the
//   run starts again once the unregister has returned; on a finished topic
//   it starts a new one, whose `register` waits for that unregister to
//   return; after `finish()` it ends at once and the send reports
//   `isFinished`.

final class SubscriberModel {
    let name: String
    let topic: Int
    var queue: [Int]
    /// Ended by `finish(topic:)`, `sink.finish()` or `finish()`: drains, then `.end`.
    var ended = false
    init(name: String, topic: Int, queue: [Int]) {
        self.name = name
        self.topic = topic
        self.queue = queue
    }
}

enum ReadResult: Equatable, CustomStringConvertible {
    case element(Int)
    case empty
    case end
    var description: String {
        switch self {
        case .element(let id): return "#\(id)"
        case .empty: return "empty"
        case .end: return "end"
        }
    }
}

struct TopicModel {
    var live = false
    /// Its current subscribers, in subscribe order.
    var subscribers: [SubscriberModel] = []
    var replay: [Int] = []
    /// Its listener's run has registered and not been unregistered.
    var running = false
    /// When its stop timer fires (a run with no subscriber, `stopAfter` > 0).
    var stopDeadline: Int? = nil
    /// The next unregister makes an inner subscribe and send.
    var armed = false
    var innerSerial = 0
    /// Its next stop timer's unregister blocks until the driver releases it.
    var holdArmed = false
    /// Its unregister is running, blocked on a stop timer's thread: the
    /// topic is still live (a subscriber lands on it), its run stopping.
    var held = false
    /// The held unregister is `finish(topic:)`'s (on a task of its own):
    /// the topic's generation is finished and retiring, a new one waits.
    var heldFinished = false
    var log: [ListenerEvent] = []
}

final class TopicsModel {
    let topicCount: Int
    let replayCount: Int
    /// nil: the plain form; else the listener form's `stopAfter` in seconds.
    let stopAfter: Int?
    var topics: [TopicModel]
    var finishedAll = false
    var now = 0
    /// Inner subscribers made since the driver last picked them up.
    var newInner: [SubscriberModel] = []

    init(topicCount: Int, replay: Int, stopAfter: Int?) {
        self.topicCount = topicCount
        self.replayCount = replay
        self.stopAfter = stopAfter
        topics = Array(repeating: TopicModel(), count: topicCount)
    }

    var isListener: Bool { stopAfter != nil }

    // MARK: Queries

    func subscriberCount(of topic: Int) -> Int {
        topics[topic].live ? topics[topic].subscribers.count : 0
    }

    var liveTopicCount: Int { topics.filter(\.live).count }

    var pendingTimers: Int { topics.filter { $0.stopDeadline != nil }.count }

    // MARK: Subscribing

    func subscribe(to topic: Int, name: String) -> SubscriberModel {
        if finishedAll {
            let s = SubscriberModel(name: name, topic: topic, queue: [])
            s.ended = true
            return s
        }
        if !topics[topic].live {
            topics[topic].live = true
            topics[topic].replay = []
        }
        let s = SubscriberModel(name: name, topic: topic, queue: topics[topic].replay)
        topics[topic].subscribers.append(s)
        topics[topic].stopDeadline = nil  // a pending stop timer is cancelled
        return s
    }

    /// A subscribe from a cancelled task: it never makes a topic live. On a
    /// live topic it gets the replay window, then ends; else it ends at
    /// once. It never registers (no `register`, no count).
    func subscribeCancelled(to topic: Int, name: String) -> SubscriberModel {
        let queue = !finishedAll && topics[topic].live ? topics[topic].replay : []
        let s = SubscriberModel(name: name, topic: topic, queue: queue)
        s.ended = true
        return s
    }

    /// After a driver-level operation: a live topic with subscribers and no
    /// run registers (the subscriber's own thread, before subscribe returns).
    func startRuns() {
        guard isListener else { return }
        for t in 0..<topicCount where topics[t].live && !topics[t].subscribers.isEmpty && !topics[t].running && !topics[t].held {
            start(t)
        }
    }

    func start(_ t: Int) {
        topics[t].running = true
        topics[t].log.append(.register)
    }

    /// `cancel()` or the release of a registered subscriber.
    func leave(_ s: SubscriberModel) {
        let t = s.topic
        guard !s.ended, let index = topics[t].subscribers.firstIndex(where: { $0 === s }) else { return }
        topics[t].subscribers.remove(at: index)
        s.ended = true
        s.queue = []
        guard topics[t].subscribers.isEmpty else { return }
        switch stopAfter {
        case nil:
            retire(t)
        case 0?:
            stop(t, finished: false)
        case let delay?:
            topics[t].stopDeadline = now + delay
        }
    }

    func retire(_ t: Int) {
        topics[t].live = false
        topics[t].replay = []
    }

    /// Runs topic `t`'s unregister (with its inner action), then retires the
    /// topic or starts its run again.
    func stop(_ t: Int, finished: Bool) {
        beginStop(t)
        endStop(t, finished: finished)
    }

    func beginStop(_ t: Int) {
        precondition(topics[t].running, "the model stops a run that is not running")
        topics[t].running = false
        topics[t].stopDeadline = nil
    }

    /// The unregister (after its hold, if any) and what follows it.
    func endStop(_ t: Int, finished: Bool) {
        topics[t].held = false
        topics[t].heldFinished = false
        if finished {
            for s in topics[t].subscribers { s.ended = true }
            topics[t].subscribers = []
            retire(t)
        }
        var inner: InnerAction? = nil
        if topics[t].armed {
            topics[t].armed = false
            let serial = topics[t].innerSerial
            topics[t].innerSerial += 1
            let name = Listener.innerName(topic: t, serial: serial)
            let id = Listener.innerID(topic: t, serial: serial)
            let s = subscribe(to: t, name: name)
            newInner.append(s)
            inner = InnerAction(name: name, id: id, sent: send(id, to: t))
        }
        topics[t].log.append(.unregister(inner: inner))
        if topics[t].subscribers.isEmpty {
            retire(t)
        } else {
            start(t)
        }
    }

    // MARK: Producing

    func send(_ id: Int, to t: Int) -> BroadcastSendResult {
        if finishedAll { return BroadcastSendResult(isFinished: true) }
        guard topics[t].live else { return BroadcastSendResult() }
        for s in topics[t].subscribers { s.queue.append(id) }
        if replayCount > 0 {
            topics[t].replay.append(id)
            if topics[t].replay.count > replayCount { topics[t].replay.removeFirst() }
        }
        return BroadcastSendResult(delivered: topics[t].subscribers.count)
    }

    func poll(_ s: SubscriberModel) -> ReadResult {
        if !s.queue.isEmpty { return .element(s.queue.removeFirst()) }
        return s.ended ? .end : .empty
    }

    // MARK: Finishing

    /// `finish(topic:)`, or the listener's `sink.finish()` on a running topic.
    func finish(topic t: Int) {
        guard topics[t].live else { return }
        if topics[t].running {
            stop(t, finished: true)
        } else {
            for s in topics[t].subscribers { s.ended = true }
            topics[t].subscribers = []
            topics[t].stopDeadline = nil
            retire(t)
        }
    }

    func finishAll() {
        guard !finishedAll else { return }
        finishedAll = true
        for t in 0..<topicCount where topics[t].live {
            if topics[t].running {
                stop(t, finished: true)
            } else {
                for s in topics[t].subscribers { s.ended = true }
                topics[t].subscribers = []
                topics[t].stopDeadline = nil
            }
            retire(t)
        }
    }

    // MARK: Time

    /// The stop timers that `advance` fires (each on its own thread).
    func advance(by seconds: Int) {
        now += seconds
        for t in 0..<topicCount {
            if let deadline = topics[t].stopDeadline, deadline <= now {
                if topics[t].holdArmed {
                    topics[t].holdArmed = false
                    beginStop(t)
                    topics[t].held = true
                } else {
                    stop(t, finished: false)
                }
            }
        }
    }

    /// `finish(topic:)` on a task of its own, its unregister held: the
    /// subscribers end and the topic goes at once; a subscriber meanwhile
    /// starts a new topic whose `register` waits for the release.
    func beginHeldFinish(_ t: Int) {
        beginStop(t)
        for s in topics[t].subscribers { s.ended = true }
        topics[t].subscribers = []
        retire(t)
        topics[t].held = true
        topics[t].heldFinished = true
    }

    /// What `topicsCounters` shows.
    var counters: TopicsCounters {
        let retiring = topics.filter(\.heldFinished)
        return TopicsCounters(live: liveTopicCount, retiring: retiring.count,
                              blockedStarts: retiring.filter(\.live).count)
    }

    var anyHold: Bool { topics.contains { $0.held || $0.holdArmed } }

    /// The driver lets every held unregister go on.
    func releaseHolds() {
        for t in 0..<topicCount where topics[t].held { endStop(t, finished: false) }
    }

    func dump() -> String {
        var out = "model: now \(now)s, finishedAll \(finishedAll), live topics \(liveTopicCount)\n"
        for (t, m) in topics.enumerated() {
            out += "  topic \(t): live \(m.live), subscribers \(m.subscribers.map { "\($0.name)\($0.queue)" }), replay \(m.replay)"
            if isListener {
                out += ", running \(m.running), held \(m.held)\(m.heldFinished ? " (finish)" : ""), holdArmed \(m.holdArmed), stopDeadline \(m.stopDeadline.map(String.init) ?? "-"), armed \(m.armed), log \(m.log)"
            }
            out += "\n"
        }
        return out
    }
}
