@_spi(Testing) import AsyncBroadcast
import AsyncBroadcastTestSupport

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

// Lifecycle rounds: the v5 surface of `BroadcastTopics` under real threads.
// A few topics (1-4) with replay; producer threads send items stamped with a
// sequence number per topic; subscriber tasks read `events` with every
// policy, lossy ones too, and hard and soft eviction limits, some slowly:
// - stayers read until their stream ends (a finish(topic:), an eviction, or
//   the round's finish()), then join again;
// - joiners subscribe, read what is there, pause, `cancel()` (or release)
//   and read the events stream to its end;
// - a task that is cancelled keeps subscribing, to a topic with no real
//   subscriber when there is one (the subscribe-unlock hook sleeps 100 µs
//   inside such a subscribe, widening the window a cancelled subscribe
//   would leave open);
// - a closer thread (half the rounds) calls finish(topic:) now and then,
//   and some subscribes finish their own topic from inside their
//   subscribe(to:) (the subscribe-unlock hook: between its registration and
//   its return, where the race with finish(topic:) is);
// - half the rounds feed each topic from a listener (`register` or `listen`,
//   some slow), which calls `sink.ready()`; subscribers sometimes wait in
//   `upstreamReady()`.
// The round ends with finish() once producers, closer and joiners are done.
//
// Checked (LifecycleChecker.swift):
// - Σ `.lagged` == `droppedCount` once a subscriber's events stream has
//   ended, whatever ended it (eviction, cancel(), finish(topic:), finish());
//   every `.lagged(n)` has n > 0;
// - eviction: a subscriber with no limit is never evicted; a lossy
//   subscriber whose capacity is within its hard limit is never evicted by
//   it (also when replay over-filled it past the limit), nor by a soft limit
//   it can never be over; a hard-limited subscriber never holds more than its
//   limit (or the replay it started with, if more): `bufferedCount`, sampled
//   before every read;
// - nothing missed after subscribe(to:) returns: a stayer notes the topic's
//   next sequence number right after the return; every item stamped from
//   then on (each producer's, in its order) reaches it, unless it ended
//   first by eviction or by a finish(topic:) (then it received a prefix of
//   each producer's items) or its policy dropped them (counted in
//   `droppedCount`);
// - a stream never ends without a reason: a subscriber whose own
//   subscribe(to:) finished its topic (from the hook) and saw no other
//   finish(topic:) of it must not end before the round's finish();
// - no listener: a real subscriber never receives an item sent while no real
//   subscriber of its topic existed (none subscribed, none subscribing): a
//   send to a topic that is not live keeps nothing, also while a cancelled
//   subscribe runs;
// - a subscribe from a cancelled task gives the replay window, then the end,
//   at once; items arrive on their topic, each producer's in order.
// A hang (a reader, `upstreamReady()`, a listener) fails through the watchdog.

struct LifeItem: Sendable {
    let topic: Int
    /// A producer (0...), or a listener (-1).
    let source: Int
    /// The topic's sequence number (-1 for a listener's item).
    let seq: Int
}

struct LifecycleRoundPlan: Sendable {
    enum Listener: String, Sendable {
        case none, register
        case slowRegister = "slow register"
        case listen
        case slowListen = "slow listen"
    }

    let seed: UInt64
    let topics: Int
    let replay: Int
    let listener: Listener
    let producers: Int
    let itemsPerProducer: Int
    let stayers: Int
    let joiners: Int
    let joinsPerJoiner: Int
    let closer: Bool
    /// Chance that a subscribe finishes its own topic from inside.
    let raceFinish: Double
    let cancelledSubscribes: Bool
    /// Chance that a stayer pauses after an event (a slow reader).
    let slowReader: Double

    static func generate(seed: UInt64, options: Options) -> LifecycleRoundPlan {
        var rng = SplitMix64(seed: seed)
        return LifecycleRoundPlan(
            seed: seed, topics: rng.pick([1, 1, 2, 3, 4]), replay: rng.pick([0, 2, 4, 4, 6]),
            listener: rng.pick([.none, .none, .none, .none, .register, .slowRegister, .listen, .slowListen]),
            producers: options.producers.map { min($0, 3) } ?? rng.int(in: 1...3),
            itemsPerProducer: rng.int(in: 300...2_000),
            stayers: options.subscribers.map { min($0, 8) } ?? rng.int(in: 1...6),
            joiners: rng.int(in: 1...5), joinsPerJoiner: rng.int(in: 5...40),
            closer: rng.chance(0.5), raceFinish: rng.pick([0, 0.05, 0.2]),
            cancelledSubscribes: rng.chance(0.75), slowReader: rng.pick([0, 0.02, 0.1]))
    }

    var summary: String {
        "lifecycle: \(topics) topic(s), replay \(replay), listener \(listener.rawValue), producers \(producers)×\(itemsPerProducer), "
            + "stayers \(stayers), joiners \(joiners)×\(joinsPerJoiner), closer \(closer), race finish \(raceFinish), "
            + "cancelled subscribes \(cancelledSubscribes), slow reads \(slowReader)"
    }

    var details: [String] { ["BroadcastTopics<Int, LifeItem, Never>, events, eviction, finish(topic:), cancelled subscribes"] }
}

/// The test's own view of one topic.
struct LifeTopicTrack {
    /// The next item's sequence number.
    var nextSeq = 0
    /// Real subscribers that exist (counted before `subscribe(to:)`, until
    /// they have left; an evicted one is never uncounted: its removal runs
    /// after the send that evicted it, on the producer's thread).
    var live = 0
    /// Real subscribes begun.
    var epoch = 0
    var finishesStarted = 0
    var finishesDone = 0
    /// Items sent while no real subscriber existed or was subscribing.
    var unwatched: Set<Int> = []
}

/// Everything shared by the round's threads and tasks.
final class LifecycleWorld: Sendable {
    typealias Topics = BroadcastTopics<Int, LifeItem, Never>

    let plan: LifecycleRoundPlan
    let tracks: [Locked<LifeTopicTrack>]
    /// Each topic's current listener sink, with its registration's number.
    let sinks = Locked<[Int: (Int, BroadcastSink<LifeItem, Never>)]>([:])
    let registrations = Locked(0)
    /// What real subscribers received, per topic (checked at the end).
    let pendingUnwatched = Locked<[(Int, [Int])]>([])
    let problems = Locked<[(String, String)]>([])
    let stays = Locked<[StayRecord]>([])
    /// Every producer's items, in order: (topic, seq).
    let sent: [Locked<[(Int, Int)]>]
    let finishStarted = Locked(false)
    let received = Locked(0)
    let cancelledSubscribes = Locked(0)
    let evictions = Locked(0)
    /// A subscribe's own finish(topic:) from the hook: whether no other
    /// finish of the topic was in flight, and how many had begun.
    let raced = Locked(0)

    init(_ plan: LifecycleRoundPlan) {
        self.plan = plan
        tracks = (0..<plan.topics).map { _ in Locked(LifeTopicTrack()) }
        sent = (0..<plan.producers).map { _ in Locked([]) }
    }

    /// A listener's registration: its sink feeds the producers' listener
    /// items; it says ready at once. Returns its unregister.
    func listening(_ topic: Int, _ sink: BroadcastSink<LifeItem, Never>) -> @Sendable () -> Void {
        let id = registrations.withLock {
            $0 += 1; return $0
        }
        sinks.withLock { $0[topic] = (id, sink) }
        sink.ready()
        return { [self] in sinks.withLock { if $0[topic]?.0 == id { $0[topic] = nil } } }
    }

    func report(_ invariant: String, _ detail: String) {
        problems.withLock { $0.append((invariant, detail)) }
    }

    func finishTopic(_ topics: Topics, _ topic: Int) {
        tracks[topic].withLock { $0.finishesStarted += 1 }
        topics.finish(topic: topic)
        tracks[topic].withLock { $0.finishesDone += 1 }
    }
}

/// A subscribe that finishes its own topic from the subscribe-unlock hook
/// (between its registration and its return), once.
final class RaceFinish: Sendable {
    let topic: Int
    /// After its finish returned: (finishes begun, no other one in flight).
    let after = Locked<(started: Int, alone: Bool)?>(nil)
    init(topic: Int) { self.topic = topic }

    @TaskLocal static var current: RaceFinish?
}

/// The topics object, weakly: the hook must not keep it alive.
final class WeakTopics: Sendable {
    private let box = Locked<Weak>(Weak())
    struct Weak { weak var topics: LifecycleWorld.Topics? }
    func set(_ topics: LifecycleWorld.Topics) { box.withLock { $0.topics = topics } }
    var topics: LifecycleWorld.Topics? { box.withLock { $0.topics } }
}

enum LifecycleRoundRunner {
    typealias Topics = LifecycleWorld.Topics

    static func run(_ plan: LifecycleRoundPlan, header: [String], options: Options) async -> RoundReport {
        let start = monotonicSeconds()
        let world = LifecycleWorld(plan)
        var topics: Topics? = makeTopics(plan, world)
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
        await exercise(topics!, world)
        holder.value = nil
        topics = nil
        _ = topics
        let freedBy = monotonicSeconds() + 2
        while weakTopics != nil, monotonicSeconds() < freedBy { usleepSeconds(0.0005) }
        if weakTopics != nil { world.report("freed", "the released topics were not freed") }
        LifecycleChecker.checkStays(world)

        var out = ViolationList()
        for (invariant, detail) in world.problems.value { out.add(invariant, detail) }
        Coverage.add("lifecycle cancelled subscribes", world.cancelledSubscribes.value)
        Coverage.add("lifecycle raced finishes", world.raced.value)
        Coverage.add("lifecycle unwatched sends", world.tracks.reduce(0) { $0 + $1.value.unwatched.count })
        Coverage.add("lifecycle evictions", world.evictions.value)
        return RoundReport(
            violations: out.all, duration: monotonicSeconds() - start,
            ops: plan.producers * plan.itemsPerProducer + plan.joiners * plan.joinsPerJoiner,
            delivered: 0, received: world.received.value)
    }

    static func makeTopics(_ plan: LifecycleRoundPlan, _ world: LifecycleWorld) -> Topics {
        let topics: Topics
        guard #available(macOS 13, iOS 16, tvOS 16, watchOS 9, *) else {
            fatalError("lifecycle rounds need Duration (macOS 13 / iOS 16 or later)")
        }
        switch plan.listener {
        case .none:
            topics = Topics(replay: plan.replay)
        case .register, .slowRegister:
            let slow = plan.listener == .slowRegister
            topics = Topics(
                replay: plan.replay,
                register: { topic, sink in
                    if slow { usleepSeconds(0.0005) }  // on the subscriber's thread, inside its subscribe(to:)
                    return world.listening(topic, sink)
                })
        case .listen, .slowListen:
            let slow = plan.listener == .slowListen
            topics = Topics(
                replay: plan.replay,
                listen: { topic, sink in
                    if slow { try? await Task.sleep(nanoseconds: 300_000) }
                    let stop = world.listening(topic, sink)
                    return { stop() }
                })
        }
        let weak = WeakTopics()
        weak.set(topics)
        topics._runAfterSubscribeUnlocks {
            if Task.isCancelled {
                // A cancelled subscribe: widen the window between its lock
                // and its return (where a generation made for it, under the
                // fault, takes sends into its replay window).
                if world.plan.cancelledSubscribes { usleepSeconds(0.0001) }
                return
            }
            guard let race = RaceFinish.current, race.after.value == nil, let topics = weak.topics else { return }
            let before = world.tracks[race.topic].withLock { ($0.finishesStarted, $0.finishesDone) }
            world.finishTopic(topics, race.topic)
            let after = world.tracks[race.topic].withLock { $0.finishesStarted }
            // Alone: no other finish of the topic in flight when it began,
            // and none begun while it ran.
            race.after.value = (after, before.0 == before.1 && after == before.0 + 1)
        }
        return topics
    }

    static func exercise(_ topics: Topics, _ world: LifecycleWorld) async {
        let plan = world.plan
        let producersDone = Locked(0)
        // The producers start once every subscriber task has (bounded: a
        // pool thread may be slow to come), and pause now and then: the
        // subscribers come and go while they send.
        let started = Locked(0)
        let everyone = plan.stayers + plan.joiners
        for producer in 0..<plan.producers {
            spawnThread {
                let waitUntil = monotonicSeconds() + 1
                while started.value < everyone && monotonicSeconds() < waitUntil { sched_yield() }
                var rng = SplitMix64(seed: plan.seed &+ UInt64(producer) &* 0x9E37_79B9)
                var log: [(Int, Int)] = []
                log.reserveCapacity(plan.itemsPerProducer)
                for _ in 0..<plan.itemsPerProducer {
                    let topic = rng.int(in: 0...(plan.topics - 1))
                    let batch = rng.chance(0.1)
                    let (seq, watchedBefore) = world.tracks[topic].withLock { track in
                        let seq = track.nextSeq
                        track.nextSeq += batch ? 2 : 1
                        return (seq, track.live > 0 ? -1 : track.epoch)
                    }
                    if batch {
                        topics.send(
                            contentsOf: [
                                LifeItem(topic: topic, source: producer, seq: seq),
                                LifeItem(topic: topic, source: producer, seq: seq + 1),
                            ], to: topic)
                        log.append((topic, seq))
                        log.append((topic, seq + 1))
                    } else {
                        topics.send(LifeItem(topic: topic, source: producer, seq: seq), to: topic)
                        log.append((topic, seq))
                    }
                    if watchedBefore >= 0 {
                        // No real subscriber before the send; none began
                        // subscribing during it: nobody may ever get it.
                        world.tracks[topic].withLock { track in
                            if track.epoch == watchedBefore {
                                track.unwatched.insert(seq)
                                if batch { track.unwatched.insert(seq + 1) }
                            }
                        }
                    }
                    if plan.listener != .none && rng.chance(0.03), let sink = world.sinks.withLock({ $0[topic]?.1 }) {
                        sink.send(LifeItem(topic: topic, source: -1, seq: -1))
                    }
                    if rng.chance(0.01) { usleepSeconds(0.00005) } else if rng.chance(0.2) { sched_yield() }
                }
                world.sent[producer].value = log
                producersDone.withLock { $0 += 1 }
            }
        }
        let closerDone = Locked(!plan.closer)
        if plan.closer {
            spawnThread {
                var rng = SplitMix64(seed: plan.seed ^ 0xC105_E000)
                while producersDone.value < plan.producers {
                    world.finishTopic(topics, rng.int(in: 0...(plan.topics - 1)))
                    usleepSeconds(Double(rng.int(in: 100...1_000)) / 1_000_000)
                }
                closerDone.value = true
            }
        }

        let stayersRunning = Locked(0)
        let joinersRunning = Locked(0)
        let activity = watchdog.register {
            "lifecycle round: \(stayersRunning.value) stayer(s), \(joinersRunning.value) joiner(s) running, producers done \(producersDone.value)/\(plan.producers), finish() begun \(world.finishStarted.value)"
        }
        defer { watchdog.unregister(activity) }
        await withTaskGroup(of: Void.self) { group in
            for stayer in 0..<plan.stayers {
                group.addTask {
                    started.withLock { $0 += 1 }
                    stayersRunning.withLock { $0 += 1 }
                    defer { stayersRunning.withLock { $0 -= 1 } }
                    var rng = SplitMix64(seed: plan.seed ^ (UInt64(stayer) &+ 1) &* 0x5747)
                    while !world.finishStarted.value {
                        await stay(topics, world, rng: &rng)
                    }
                }
            }
            // The joiners and the cancelled subscriber, then the round's end.
            group.addTask {
                await withTaskGroup(of: Void.self) { inner in
                    for joiner in 0..<plan.joiners {
                        inner.addTask {
                            started.withLock { $0 += 1 }
                            joinersRunning.withLock { $0 += 1 }
                            defer { joinersRunning.withLock { $0 -= 1 } }
                            var rng = SplitMix64(seed: plan.seed ^ (UInt64(joiner) &+ 1) &* 0x1017)
                            for _ in 0..<plan.joinsPerJoiner { await joinAndLeave(topics, world, rng: &rng) }
                        }
                    }
                    if plan.cancelledSubscribes {
                        inner.addTask {
                            withUnsafeCurrentTask { $0?.cancel() }
                            var rng = SplitMix64(seed: plan.seed ^ 0xCA2C_E11E)
                            while producersDone.value < plan.producers {
                                // A topic with no real subscriber if there is
                                // one: there a subscribe must not create a
                                // generation.
                                let idle = (0..<plan.topics).filter { world.tracks[$0].value.live == 0 }
                                let topic = idle.isEmpty ? rng.int(in: 0...(plan.topics - 1)) : rng.pick(idle)
                                cancelledSubscribe(topics, world, topic: topic)
                                if rng.chance(0.5) { sched_yield() }
                            }
                        }
                    }
                }
                while producersDone.value < plan.producers || !closerDone.value { usleepSeconds(0.0005) }
                world.finishStarted.value = true
                topics.finish()
            }
        }
    }

    // MARK: Subscribers

    struct Choice {
        let policy: BroadcastBufferingPolicy
        let eviction: BroadcastEviction
        let hard: Int?
        let soft: Int?
        var capacity: Int? {
            switch policy {
            case .bufferingNewest(let n), .bufferingOldest(let n): return n
            default: return nil
            }
        }
        var neverDrops: Bool { capacity == nil }
        var description: String { "\(policy), hard \(hard.map(String.init) ?? "-"), soft \(soft.map(String.init) ?? "-")" }
    }

    static func choose(_ rng: inout SplitMix64, replay: Int) -> Choice {
        let policy: BroadcastBufferingPolicy = rng.pick([
            .unbounded, .bounded(rng.int(in: 1...4)), .bufferingNewest(rng.int(in: 1...3)), .bufferingOldest(rng.int(in: 1...3)),
        ])
        guard #available(macOS 13, iOS 16, tvOS 16, watchOS 9, *) else { return Choice(policy: policy, eviction: .never, hard: nil, soft: nil) }
        // Limits around the replay window (up to 6): half of them within
        // it, so that replay over-fills those subscribers past them.
        let hard = rng.chance(0.5) ? rng.int(in: 1...max(1, replay)) : rng.int(in: 3...12)
        let soft = rng.int(in: 1...6)
        let softFor = Duration.microseconds(rng.int(in: 200...3_000))
        switch rng.int(in: 0...9) {
        case 0...3: return Choice(policy: policy, eviction: .never, hard: nil, soft: nil)
        case 4...6: return Choice(policy: policy, eviction: .hardLimit(hard), hard: hard, soft: nil)
        case 7...8: return Choice(policy: policy, eviction: .softLimit(soft, for: softFor), hard: nil, soft: soft)
        default:
            let bothHard = max(hard, soft)
            return Choice(policy: policy, eviction: .limits(hard: bothHard, soft: soft, for: softFor), hard: bothHard, soft: soft)
        }
    }

    /// A real subscribe, counted in its topic's track first.
    static func subscribeReal(
        _ topics: Topics, _ world: LifecycleWorld, topic: Int, _ choice: Choice,
        race: RaceFinish?
    ) -> (Topics.Subscription, finishesDoneBefore: Int, firstAfterReturn: Int) {
        let finishesDoneBefore = world.tracks[topic].withLock { track in
            track.live += 1
            track.epoch += 1
            return track.finishesDone
        }
        let subscription = RaceFinish.$current.withValue(race) {
            topics.subscribe(to: topic, bufferingPolicy: choice.policy, eviction: choice.eviction)
        }
        let firstAfterReturn = world.tracks[topic].withLock { $0.nextSeq }
        return (subscription, finishesDoneBefore, firstAfterReturn)
    }

    /// Reads until the stream ends, then joins again (until finish()).
    static func stay(_ topics: Topics, _ world: LifecycleWorld, rng: inout SplitMix64) async {
        let plan = world.plan
        let topic = rng.int(in: 0...(plan.topics - 1))
        let choice = choose(&rng, replay: plan.replay)
        let race = rng.chance(plan.raceFinish) ? RaceFinish(topic: topic) : nil
        let (subscription, finishesDoneBefore, firstAfterReturn) = subscribeReal(topics, world, topic: topic, choice, race: race)
        let ownFinish = race?.after.value
        if ownFinish != nil { world.raced.withLock { $0 += 1 } }
        var reading = LifecycleReading(topic: topic, choice: choice, initial: subscription.bufferedCount, firstAfterReturn: firstAfterReturn)
        if plan.listener != .none && rng.chance(0.3) {
            // Must return (the watchdog catches a hang): the listener says
            // ready, or the subscriber ends.
            _ = try? await subscription.upstreamReady()
        }
        var iterator = subscription.events.makeAsyncIterator()
        var batch: [BroadcastEvent<LifeItem>] = []
        while true {
            reading.checkHeld(subscription, world)
            if rng.chance(0.2) {
                batch.removeAll(keepingCapacity: true)
                if await iterator.next(upTo: rng.int(in: 1...8), into: &batch) == 0 { break }
                for event in batch { reading.take(event, world) }
            } else {
                guard let event = await iterator.next() else { break }
                reading.take(event, world)
            }
            if plan.slowReader > 0 && rng.chance(plan.slowReader) { usleepSeconds(Double(rng.int(in: 50...500)) / 1_000_000) }
        }
        let finishBegun = world.finishStarted.value
        let evicted = subscription.isEvicted
        let finishesNow = world.tracks[topic].withLock { $0.finishesStarted }
        reading.checkEnd(subscription, world, how: finishBegun ? "finish() or an earlier cause" : "finish(topic:) or eviction")
        if !evicted && !finishBegun, let ownFinish, ownFinish.alone, finishesNow == ownFinish.started {
            world.report(
                "no missed send: subscribe(to:) racing finish(topic:)",
                "topic \(topic), \(choice.description): its stream ended before finish(), unevicted, and the only finish(topic:) of its topic since it subscribed was the one that ran inside its subscribe(to:), before the return")
        }
        let complete = !evicted && finishBegun && finishesNow == finishesDoneBefore
        world.stays.withLock {
            $0.append(
                StayRecord(
                    topic: topic, description: choice.description, neverDrops: choice.neverDrops,
                    firstAfterReturn: firstAfterReturn, received: reading.received,
                    dropped: subscription.droppedCount, evicted: evicted, complete: complete))
        }
        finishUnwatched(reading, world)
        world.received.withLock { $0 += reading.count }
        // Gone: its stream ended (finish(topic:) retired its generation
        // first), unless it was evicted (its removal may still be running).
        if !evicted { world.tracks[topic].withLock { $0.live -= 1 } }
    }

    /// Subscribes, reads what is there, pauses, leaves (cancel() and reads
    /// to the end, or release).
    static func joinAndLeave(_ topics: Topics, _ world: LifecycleWorld, rng: inout SplitMix64) async {
        let plan = world.plan
        let topic = rng.int(in: 0...(plan.topics - 1))
        let choice = choose(&rng, replay: plan.replay)
        let race = rng.chance(plan.raceFinish) ? RaceFinish(topic: topic) : nil
        // Held only here: a release below lets go of the last reference.
        var subscription: Topics.Subscription? = subscribeReal(topics, world, topic: topic, choice, race: race).0
        let firstAfterReturn = world.tracks[topic].withLock { $0.nextSeq }
        if race?.after.value != nil { world.raced.withLock { $0 += 1 } }
        var reading = LifecycleReading(topic: topic, choice: choice, initial: subscription!.bufferedCount, firstAfterReturn: firstAfterReturn)
        var iterator: Topics.Subscription.Events.AsyncIterator? = subscription!.events.makeAsyncIterator()
        let wanted = rng.int(in: 0...30)
        // Reads only what it holds: next() never waits for a send here.
        while reading.count < wanted, subscription!.bufferedCount > 0 {
            reading.checkHeld(subscription!, world)
            guard let event = await iterator!.next() else { break }
            reading.take(event, world)
        }
        // Let drops pile up, for the end to report.
        if rng.chance(0.5) { usleepSeconds(Double(rng.int(in: 20...300)) / 1_000_000) }
        let evicted: Bool
        // Released only without limits: an eviction at the same moment
        // would leave its removal running on the producer's thread.
        if rng.chance(0.7) || choice.hard != nil || choice.soft != nil {
            subscription!.cancel()
            while let event = await iterator!.next() { reading.take(event, world) }
            reading.checkEnd(subscription!, world, how: "cancel()")
            evicted = subscription!.isEvicted
        } else {
            evicted = false
            iterator = nil
            subscription = nil
        }
        _ = (subscription, iterator)
        finishUnwatched(reading, world)
        world.received.withLock { $0 += reading.count }
        if !evicted { world.tracks[topic].withLock { $0.live -= 1 } }
    }

    /// Records what a real subscriber received for the check of items sent
    /// while nobody watched (done at the end: the producer marks an item
    /// unwatched only after its send returned).
    static func finishUnwatched(_ reading: LifecycleReading, _ world: LifecycleWorld) {
        guard world.plan.listener == .none, !reading.seqs.isEmpty else { return }
        world.pendingUnwatched.withLock { $0.append((reading.topic, reading.seqs)) }
    }

    /// A subscribe from a cancelled task: the replay window, then the end, at once.
    static func cancelledSubscribe(_ topics: Topics, _ world: LifecycleWorld, topic: Int) {
        let subscription = topics.subscribe(to: topic)
        world.cancelledSubscribes.withLock { $0 += 1 }
        var polls = 0
        while true {
            polls += 1
            switch subscription.poll() {
            case .element(let item):
                if item.topic != topic { world.report("isolation", "a cancelled subscribe of topic \(topic) got an item of topic \(item.topic)") }
                if polls > world.plan.replay + 1 {
                    world.report("cancelled subscribe", "a subscribe from a cancelled task got more than the replay window (\(polls) polls)")
                    return
                }
                continue
            case .end, .failure:
                return
            case .empty:
                world.report("cancelled subscribe", "a subscribe from a cancelled task to topic \(topic) did not end at once (empty, not ended)")
                return
            }
        }
    }
}
