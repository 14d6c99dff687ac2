@_spi(Testing) import AsyncBroadcast
import AsyncBroadcastTestSupport

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

// Topics rounds: a `BroadcastTopics` whose few topics (1-12) come and go
// all the time. Producer threads send stamped items to random topics;
// subscriber tasks keep joining a random topic, reading a little and
// leaving (cancel() or release), so topics are created and dropped while
// others join them; a closer thread sometimes finishes a topic
// (`finish(topic:)`); half the rounds feed each topic from a listener
// (`register(topic, sink)`, stopped at once or 1 ms after the last
// subscriber left), whose callbacks also send. The round ends with
// `finish()` or by releasing the topics.
//
// Checked:
// - a subscriber that never drops (unbounded, bounded) sends a marker to
//   its topic right after `subscribe(to:)` returned, and must receive it,
//   unless its topic was finished in between (then it must see the end): a
//   subscribe that landed on a topic being dropped misses it;
// - every item a subscriber receives was sent to its topic; each producer's
//   items arrive in the order sent;
// - with a listener: a topic's register and unregister calls never overlap,
//   alternate, and each register is matched by one unregister by the end;
// - once every subscriber has left (and stopAfter has passed) no topic is
//   live, none is retiring, and the topics object is freed when released;
//   after `finish()`, subscribers end, later ones end at once and sends
//   report isFinished.
// A hang fails through the watchdog.

struct TopicItem: Sendable {
    let topic: Int
    /// A producer (0...), a listener (-1), or a subscriber's marker (-2 - subscriber).
    let source: Int
    let seq: Int
}

struct TopicsRoundPlan: Sendable {
    let seed: UInt64
    let topics: Int
    let listener: Bool
    let stopAfterMillisecond: Bool
    let replay: Int
    let producers: Int
    let itemsPerProducer: Int
    let subscribers: Int
    let joinsPerSubscriber: Int
    let closer: Bool
    let endByFinish: Bool

    static func generate(seed: UInt64, options: Options) -> TopicsRoundPlan {
        var rng = SplitMix64(seed: seed)
        return TopicsRoundPlan(
            seed: seed, topics: rng.pick([1, 2, 3, 5, 12]), listener: rng.chance(0.5),
            stopAfterMillisecond: rng.chance(0.5), replay: rng.pick([0, 0, 1, 3]),
            producers: options.producers.map { min($0, 4) } ?? rng.int(in: 1...4),
            itemsPerProducer: rng.int(in: 200...3_000),
            subscribers: options.subscribers.map { min($0, 24) } ?? rng.int(in: 2...16),
            joinsPerSubscriber: rng.int(in: 5...40), closer: rng.chance(0.5), endByFinish: rng.chance(0.5))
    }

    var summary: String {
        "topics: \(topics) topic(s), \(listener ? "listener (stop \(stopAfterMillisecond ? "after 1 ms" : "at once"))" : "no listener"), "
            + "replay \(replay), producers \(producers)×\(itemsPerProducer), subscribers \(subscribers)×\(joinsPerSubscriber) joins, "
            + "closer \(closer), end by \(endByFinish ? "finish()" : "release")"
    }

    var details: [String] { ["BroadcastTopics<Int, TopicItem, Never>"] }
}

/// Per-topic register/unregister calls, and how often each topic was finished.
final class TopicsLedger: Sendable {
    private struct State {
        var inside: [Int: Int] = [:]
        var overlaps: [Int: Int] = [:]
        var events: [Int: [Bool]] = [:]  // true: register
        var trail: [Int: [String]] = [:]
        /// `finish(topic:)` calls begun, and returned.
        var finishesStarted: [Int: Int] = [:]
        var finishesDone: [Int: Int] = [:]
        var sinks: [Int: BroadcastSink<TopicItem, Never>] = [:]
    }
    private let state = Locked(State())

    func record(_ topic: Int, register: Bool, _ sink: BroadcastSink<TopicItem, Never>) {
        let identity = sink.runIdentity
        let name = "\(register ? "register" : "unregister") of sequence \(String(UInt(bitPattern: identity.sequence.hashValue) % 100_000)) run \(identity.run)"
        state.withLock { state in
            if state.inside[topic, default: 0] > 0 { state.overlaps[topic, default: 0] += 1 }
            state.inside[topic, default: 0] += 1
            state.events[topic, default: []].append(register)
            state.trail[topic, default: []].append("begin " + name)
        }
        for _ in 0..<2 { sched_yield() }  // widen the window an overlap would show in
        state.withLock {
            $0.inside[topic, default: 0] -= 1
            $0.trail[topic, default: []].append("end " + name)
        }
    }

    func setSink(_ sink: BroadcastSink<TopicItem, Never>?, for topic: Int) {
        state.withLock { $0.sinks[topic] = sink }
    }
    func sink(_ topic: Int) -> BroadcastSink<TopicItem, Never>? { state.withLock { $0.sinks[topic] } }

    /// Around a `finish(topic:)` call.
    func finishing(_ topic: Int, _ body: () -> Void) {
        state.withLock { $0.finishesStarted[topic, default: 0] += 1 }
        body()
        state.withLock { $0.finishesDone[topic, default: 0] += 1 }
    }
    func finishesStarted(_ topic: Int) -> Int { state.withLock { $0.finishesStarted[topic, default: 0] } }
    func finishesDone(_ topic: Int) -> Int { state.withLock { $0.finishesDone[topic, default: 0] } }

    /// Violations of the listener rules, with `closed` (everything stopped).
    func listenerProblems(closed: Bool) -> [String] {
        state.withLock { state in
            var problems: [String] = []
            for (topic, count) in state.overlaps where count > 0 {
                problems.append("topic \(topic): register/unregister overlapped \(count) time(s)")
            }
            for (topic, events) in state.events {
                for (index, isRegister) in events.enumerated() where isRegister != (index % 2 == 0) {
                    problems.append(
                        "topic \(topic): call \(index) is \(isRegister ? "a register" : "an unregister") out of turn; calls: "
                            + (state.trail[topic] ?? []).suffix(12).joined(separator: "; "))
                    break
                }
                if closed && events.count % 2 != 0 { problems.append("topic \(topic): a register never unregistered") }
            }
            return problems
        }
    }
}

enum TopicsRoundRunner {
    typealias Topics = BroadcastTopics<Int, TopicItem, Never>

    static func run(_ plan: TopicsRoundPlan, header: [String], options: Options) async -> RoundReport {
        let start = monotonicSeconds()
        var out = ViolationList()
        let ledger = TopicsLedger()
        let problems = Locked<[(String, String)]>([])
        let report: @Sendable (String, String) -> Void = { invariant, detail in
            problems.withLock { $0.append((invariant, detail)) }
        }

        var topics: Topics? = makeTopics(plan, ledger)
        weak let weakTopics = topics
        let holder = Locked<Topics?>(topics)
        watchdog.beginRound(
            .init(
                number: 0, header: header, deadlineAt: start + options.deadline, deadline: options.deadline,
                sequenceState: {
                    guard let topics = holder.value else { return "topics released" }
                    let counters = topics.topicsCounters
                    return "live \(counters.live), retiring \(counters.retiring), blocked starts \(counters.blockedStarts)"
                }))
        defer { watchdog.endRound() }
        let received = await exercise(topics!, plan, ledger, report)
        // The end: finish() or release.
        if plan.endByFinish {
            let shared = topics!
            let last = shared.subscribe(to: 0)
            shared.finish()
            if !last.poll().isEnd { report("finish", "a subscriber did not end at finish()") }
            if !shared.subscribe(to: 1).poll().isEnd { report("finish", "a subscriber after finish() did not end at once") }
            if !shared.send(TopicItem(topic: 0, source: 0, seq: -1), to: 0).isFinished {
                report("finish", "a send after finish() did not report isFinished")
            }
        }
        holder.value = nil
        topics = nil
        _ = topics
        let freedBy = monotonicSeconds() + 2
        while weakTopics != nil, monotonicSeconds() < freedBy { usleepSeconds(0.0005) }
        if weakTopics != nil { report("freed", "the released topics were not freed") }
        if plan.listener {
            for problem in ledger.listenerProblems(closed: true) { report("listener, at the end", problem) }
        }

        for (invariant, detail) in problems.value { out.add(invariant, detail) }
        return RoundReport(
            violations: out.all, duration: monotonicSeconds() - start,
            ops: plan.producers * plan.itemsPerProducer + plan.subscribers * plan.joinsPerSubscriber,
            delivered: 0, received: received)
    }

    /// Producers, the closer and the subscribers, until all are done; then
    /// the checks of what must be left. Returns the items received.
    static func exercise(
        _ shared: Topics, _ plan: TopicsRoundPlan, _ ledger: TopicsLedger,
        _ report: @escaping @Sendable (String, String) -> Void
    ) async -> Int {
        let received = Locked(0)
        let producersDone = Locked(0)

        // Producers: threads sending stamped items to random topics.
        for producer in 0..<plan.producers {
            spawnThread {
                var rng = SplitMix64(seed: plan.seed &+ UInt64(producer) &* 0x9E37)
                for seq in 0..<plan.itemsPerProducer {
                    let topic = rng.int(in: 0...(plan.topics - 1))
                    if rng.chance(0.1) {
                        shared.send(
                            contentsOf: [
                                TopicItem(topic: topic, source: producer, seq: 2 * seq),
                                TopicItem(topic: topic, source: producer, seq: 2 * seq + 1),
                            ], to: topic)
                    } else {
                        shared.send(TopicItem(topic: topic, source: producer, seq: 2 * seq), to: topic)
                    }
                    if plan.listener && rng.chance(0.05), let sink = ledger.sink(topic) {
                        sink.send(TopicItem(topic: topic, source: -1, seq: 0))
                    }
                }
                producersDone.withLock { $0 += 1 }
            }
        }
        // The closer: finishes topics now and then, while the producers run.
        let closerDone = Locked(!plan.closer)
        if plan.closer {
            spawnThread {
                var rng = SplitMix64(seed: plan.seed ^ 0xC105E)
                while producersDone.value < plan.producers {
                    let topic = rng.int(in: 0...(plan.topics - 1))
                    ledger.finishing(topic) { shared.finish(topic: topic) }
                    usleepSeconds(Double(rng.int(in: 50...500)) / 1_000_000)
                }
                closerDone.value = true
            }
        }
        // Subscribers: tasks joining, reading and leaving random topics.
        let live = Locked(0)
        let activity = watchdog.register { "topics round: \(live.value) subscriber task(s) running, producers done \(producersDone.value)/\(plan.producers)" }
        await withTaskGroup(of: Void.self) { group in
            for subscriber in 0..<plan.subscribers {
                group.addTask {
                    live.withLock { $0 += 1 }
                    defer { live.withLock { $0 -= 1 } }
                    var rng = SplitMix64(seed: plan.seed ^ (UInt64(subscriber) &+ 1) &* 0xB5)
                    for join in 0..<plan.joinsPerSubscriber {
                        let topic = rng.int(in: 0...(plan.topics - 1))
                        await joinOnce(
                            shared, topic: topic, subscriber: subscriber, join: join, rng: &rng,
                            ledger: ledger, received: received, report: report)
                    }
                }
            }
        }
        watchdog.unregister(activity)
        while producersDone.value < plan.producers || !closerDone.value { usleepSeconds(0.0005) }

        // Every subscriber has left: no topic may stay live (after stopAfter).
        let settleBy = monotonicSeconds() + 2
        while shared.topicsCounters != TopicsCounters(), monotonicSeconds() < settleBy { usleepSeconds(0.0005) }
        let counters = shared.topicsCounters
        if counters != TopicsCounters() {
            report("nothing left", "every subscriber left 2 s ago, yet live \(counters.live), retiring \(counters.retiring), blocked starts \(counters.blockedStarts)")
        }
        if plan.listener {
            for problem in ledger.listenerProblems(closed: counters.live == 0) { report("listener", problem) }
        }

        return received.value
    }

    static func makeTopics(_ plan: TopicsRoundPlan, _ ledger: TopicsLedger) -> Topics {
        guard plan.listener else { return Topics(replay: plan.replay) }
        guard #available(macOS 13, iOS 16, tvOS 16, watchOS 9, *) else {
            fatalError("listener topics need Duration (macOS 13 / iOS 16 or later)")
        }
        return Topics(replay: plan.replay, stopAfter: plan.stopAfterMillisecond ? .milliseconds(1) : .zero) { topic, sink in
            ledger.record(topic, register: true, sink)
            ledger.setSink(sink, for: topic)
            return {
                ledger.setSink(nil, for: topic)
                ledger.record(topic, register: false, sink)
            }
        }
    }

    /// One join: subscribe, (marker), read a little, leave.
    static func joinOnce(
        _ topics: Topics, topic: Int, subscriber: Int, join: Int, rng: inout SplitMix64,
        ledger: TopicsLedger, received: Locked<Int>,
        report: @Sendable (String, String) -> Void
    ) async {
        let policy: BroadcastBufferingPolicy = rng.pick([
            .unbounded, .bounded(rng.int(in: 1...4)), .bufferingNewest(rng.int(in: 1...8)), .bufferingOldest(rng.int(in: 1...8)),
        ])
        let neverDrops: Bool
        switch policy {
        case .unbounded, .bounded: neverDrops = true
        default: neverDrops = false
        }
        // A finish of the topic that ends this subscriber retires its
        // generation after this subscribe: it had not returned before it.
        let finishesDoneBefore = ledger.finishesDone(topic)
        var subscription: Topics.Subscription? = topics.subscribe(to: topic, bufferingPolicy: policy)
        let marker = TopicItem(topic: topic, source: -2 - subscriber, seq: join)
        if neverDrops { topics.send(marker, to: topic) }
        var lastSeq: [Int: Int] = [:]
        var sawMarker = !neverDrops
        var ended = false
        var reads = 0
        let wanted = rng.int(in: 0...20)
        let giveUp = monotonicSeconds() + 5
        while !ended && (!sawMarker || reads < wanted) {
            switch subscription!.poll() {
            case .element(let item):
                reads += 1
                if item.topic != topic {
                    report("isolation", "a subscriber of topic \(topic) received an item sent to topic \(item.topic) (source \(item.source))")
                }
                if item.source == marker.source && item.seq == marker.seq { sawMarker = true }
                if item.source >= 0 {
                    if let previous = lastSeq[item.source], item.seq <= previous {
                        report("order", "producer \(item.source): item \(item.seq) after item \(previous) on topic \(topic)")
                    }
                    lastSeq[item.source] = item.seq
                }
            case .end:
                ended = true
            case .empty:
                if sawMarker { ended = true; break }  // read what there was
                // `send` is synchronous: the marker is in the buffer once it
                // returned, unless a finish(topic:) begun meanwhile retired
                // the topic first (then the end is on its way).
                if ledger.finishesStarted(topic) == finishesDoneBefore || monotonicSeconds() > giveUp {
                    report("no missed send", "subscriber \(subscriber), join \(join), topic \(topic), \(policy): its marker, sent right after subscribe(to:) returned, is not in its buffer (finish(topic:) calls begun since: \(ledger.finishesStarted(topic) - finishesDoneBefore))")
                    ended = true
                    break
                }
                await Task.yield()
            case .failure:
                report("no failure", "a subscription of a set of topics that never fails threw")
                ended = true
            }
        }
        if neverDrops && !sawMarker {
            // Ended without the marker: only a finish of its topic may do that.
            if ledger.finishesStarted(topic) == finishesDoneBefore {
                report("no missed send", "subscriber \(subscriber), join \(join), topic \(topic), \(policy): ended without its marker, and nobody finished the topic")
            }
        }
        received.withLock { $0 += reads }
        if rng.chance(0.5) { subscription!.cancel() } else { subscription = nil }
        _ = subscription
    }
}

extension BroadcastSequence.Subscription.PollResult {
    var isEnd: Bool {
        if case .end = self { return true }
        return false
    }
}
