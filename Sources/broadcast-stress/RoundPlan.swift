import AsyncBroadcast
import AsyncBroadcastTestSupport

/// A place in the run: just before `producer` starts its operation `op`.
struct Spot: Sendable, Equatable, CustomStringConvertible {
    let producer: Int
    let op: Int
    var description: String { "p\(producer)@\(op)" }
}

enum OpKind: Sendable, Equatable {
    case send
    case emit
    /// An `emit` in a child task that is cancelled, preferably while it waits.
    case cancellableEmit
}

/// Something a producer does just before one of its operations, so that
/// subscribers join and leave, and `finish` races, *during* sending.
enum ChaosAction: Sendable {
    case join(subscriber: Int)
    case joinInConsumer(subscriber: Int)
    case cancelSubscription(subscriber: Int)
    case cancelTask(subscriber: Int)
    case finish(finisher: Int)
}

struct ProducerPlan: Sendable {
    let id: Int
    /// A raw pthread that only `send`s (`send` never suspends).
    let onThread: Bool
    let opCount: Int
    /// Chance that an operation is an `emit` (task producers only).
    let emitChance: Double
    /// Chance that an `emit` is cancelled.
    let cancellableChance: Double
    let payload: PayloadKind
    /// Yield (or sched_yield) after every `yieldEvery` ops; 0 = never.
    let yieldEvery: Int
    /// Seeds the per-operation choices.
    let seed: UInt64
    var actions: [Int: [ChaosAction]] = [:]
}

enum PolicyChoice: Sendable, Equatable {
    /// `subscribe(bufferingPolicy: nil)`: the sequence's default.
    case sequenceDefault
    case explicit(BroadcastBufferingPolicy)
}

enum JoinPlan: Sendable, Equatable {
    /// Subscribed before any producer starts.
    case beforeSending
    /// `subscribe()` by a producer during sending.
    case late(Spot)
    /// A consumer task started during sending that subscribes itself with
    /// `sequence.makeAsyncIterator()`.
    case inConsumer(Spot)
}

enum LeavePlan: Sendable, Equatable {
    case stay
    /// The consumer calls `cancel()` after reading n elements.
    case cancelAfter(Int)
    /// The consumer releases its only iterator after reading n elements.
    case dropIteratorAfter(Int)
    /// The consumer cancels its own task after reading n elements.
    case cancelOwnTaskAfter(Int)
    /// A producer calls `cancel()` on the subscription.
    case externalCancel(Spot)
    /// A producer cancels the consumer's task, preferably while it is parked in `next()`.
    case externalTaskCancel(Spot)
}

enum Slowness: Sendable, Equatable {
    case fast
    case yielding(every: Int)
    case sleeping(every: Int, micros: Int, maxSleeps: Int)
}

struct SubscriberPlan: Sendable {
    let id: Int
    let policy: PolicyChoice
    let join: JoinPlan
    let leave: LeavePlan
    let slowness: Slowness
    /// The round's reference subscriber: unbounded, subscribed before sending,
    /// never leaves, fast. Its order is the global order.
    let isWitness: Bool

    var livesThrough: Bool { leave == .stay }
    var joinsBeforeSending: Bool { join == .beforeSending }
}

enum FinishKind: Sendable, Equatable, CustomStringConvertible {
    case normal
    case throwing(Int)
    var description: String {
        switch self {
        case .normal: return "finish()"
        case .throwing(let code): return "finish(throwing: \(code))"
        }
    }
}

struct FinisherPlan: Sendable {
    let id: Int
    let kind: FinishKind
    /// Where a producer runs it (racing mode); nil: after all producers.
    let at: Spot?
    /// Run in its own task (so it races the producer that started it).
    let spawned: Bool
}

enum FinishMode: Sendable, Equatable, CustomStringConvertible {
    /// Producers end, every steady subscriber catches up, then 1-3 finishers race.
    case afterProducers
    /// 1-3 finishers race each other and the senders.
    case racing
    /// Producers end, subscribers catch up and park, then the last reference
    /// to the sequence is dropped.
    case dropReference
    var description: String {
        switch self {
        case .afterProducers: return "after-producers"
        case .racing: return "racing"
        case .dropReference: return "drop-last-reference"
        }
    }
}

extension BroadcastBufferingPolicy {
    var short: String {
        switch self {
        case .unbounded: return "unbounded"
        case .bufferingOldest(let n): return "oldest(\(n))"
        case .bufferingNewest(let n): return "newest(\(n))"
        case .bounded(let n): return "bounded(\(n))"
        }
    }

    /// `.bufferingOldest` / `.bufferingNewest`: may drop.
    var mayDrop: Bool {
        switch self {
        case .unbounded, .bounded: return false
        case .bufferingOldest, .bufferingNewest: return true
        }
    }

    /// Every send counts this subscriber in `delivered` (never only in `dropped`).
    var alwaysCountsDelivered: Bool {
        switch self {
        case .unbounded, .bounded: return true
        case .bufferingNewest(let n): return n > 0
        case .bufferingOldest: return false
        }
    }
}

/// Everything about a round that the seed decides. Interleavings are not
/// decided (they depend on the scheduler); the same seed replays the same
/// producers, subscribers, actions and finish plan.
struct RoundPlan: Sendable {
    let seed: UInt64
    let defaultPolicy: BroadcastBufferingPolicy
    /// The sequence's `replay:`: late subscribers start with the last
    /// `replay` delivered elements, whatever their policy.
    let replay: Int
    let producers: [ProducerPlan]
    /// Index 0 is the witness; ids equal indices.
    let subscribers: [SubscriberPlan]
    let finishMode: FinishMode
    let finishers: [FinisherPlan]

    var totalOps: Int { producers.reduce(0) { $0 + $1.opCount } }

    func effectivePolicy(of subscriber: SubscriberPlan) -> BroadcastBufferingPolicy {
        switch subscriber.policy {
        case .sequenceDefault: return defaultPolicy
        case .explicit(let policy): return policy
        }
    }

    // MARK: Generation

    static func generate(seed: UInt64, options: Options) -> RoundPlan {
        var rng = SplitMix64(seed: seed)
        let capacities = [0, 1, 1, 2, 2, 3, 4, 8, 16, 64]
        func randomPolicy() -> BroadcastBufferingPolicy {
            switch rng.weighted([25, 20, 20, 25]) {
            case 0: return .unbounded
            case 1: return .bufferingOldest(rng.pick(capacities))
            case 2: return .bufferingNewest(rng.pick(capacities))
            default: return .bounded(max(1, rng.pick(capacities)))
            }
        }

        let producerCount = options.producers ?? rng.int(in: 1...8)
        let subscriberCount =
            options.subscribers
            ?? {
                switch rng.weighted([50, 30, 20]) {
                case 0: return rng.int(in: 1...8)
                case 1: return rng.int(in: 9...24)
                default: return rng.int(in: 25...64)
                }
            }()
        let defaultPolicy = randomPolicy()

        // Size: most rounds are short; deliveries are capped so that a
        // round stays far below the deadline under ThreadSanitizer.
        let opsMax = [60, 400, 2000][rng.weighted([50, 35, 15])]
        let opsBudget = max(40, 150_000 / (subscriberCount + 1))
        var opCounts = (0..<producerCount).map { _ in rng.int(in: 0...opsMax) }
        let requested = opCounts.reduce(0, +)
        if requested > opsBudget { opCounts = opCounts.map { $0 * opsBudget / requested } }
        if opCounts.allSatisfy({ $0 == 0 }) && rng.chance(0.9) { opCounts[0] = rng.int(in: 1...20) }

        var producers: [ProducerPlan] = (0..<producerCount).map { id in
            let onThread = rng.chance(0.2)
            let emitChance = onThread ? 0 : [0, 1, 0.5, 0.2][rng.weighted([25, 25, 35, 15])]
            return ProducerPlan(
                id: id,
                onThread: onThread,
                opCount: opCounts[id],
                emitChance: emitChance,
                cancellableChance: emitChance > 0 && rng.chance(0.5) ? [0.02, 0.05, 0.15][rng.int(in: 0...2)] : 0,
                payload: rng.pick(PayloadKind.allCases),
                yieldEvery: rng.chance(0.5) ? rng.int(in: 1...16) : 0,
                seed: rng.fork())
        }
        let active = producers.filter { $0.opCount > 0 }.map(\.id)
        func randomSpot(producer fixed: Int? = nil, after: Int = -1) -> Spot? {
            let producer = fixed ?? (active.isEmpty ? nil : rng.pick(active))
            guard let producer else { return nil }
            let count = producers[producer].opCount
            guard after + 1 < count else { return nil }
            return Spot(producer: producer, op: rng.int(in: (after + 1)...(count - 1)))
        }
        func attach(_ action: ChaosAction, at spot: Spot) {
            producers[spot.producer].actions[spot.op, default: []].append(action)
        }

        var subscribers = [
            SubscriberPlan(
                id: 0, policy: .explicit(.unbounded), join: .beforeSending,
                leave: .stay, slowness: .fast, isWitness: true)
        ]
        for id in 1...subscriberCount {
            var policy: PolicyChoice = rng.chance(0.1) ? .sequenceDefault : .explicit(randomPolicy())
            var join = JoinPlan.beforeSending
            switch rng.weighted([60, 30, 10]) {
            case 1: if let spot = randomSpot() { join = .late(spot) }
            case 2: if let spot = randomSpot() { join = .inConsumer(spot); policy = .sequenceDefault }
            default: break
            }
            let joinSpot: Spot?
            switch join {
            case .beforeSending: joinSpot = nil
            case .late(let spot), .inConsumer(let spot): joinSpot = spot
            }
            // An external action comes after the join in program order: the
            // joining producer, at a later op (or anyone, for early joiners).
            func externalSpot() -> Spot? {
                if let joinSpot { return randomSpot(producer: joinSpot.producer, after: joinSpot.op) }
                return randomSpot()
            }
            let after = rng.chance(0.3) ? rng.int(in: 0...3) : rng.int(in: 0...60)
            var leave = LeavePlan.stay
            switch rng.weighted([55, 8, 8, 7, 10, 12]) {
            case 1: leave = .cancelAfter(after)
            case 2: leave = .dropIteratorAfter(after)
            case 3: leave = .cancelOwnTaskAfter(after)
            case 4:
                if case .inConsumer = join {
                    if let spot = externalSpot() { leave = .externalTaskCancel(spot) }
                } else if let spot = externalSpot() {
                    leave = .externalCancel(spot)
                }
            case 5: if let spot = externalSpot() { leave = .externalTaskCancel(spot) }
            default: break
            }
            // A consumer that subscribed through `makeAsyncIterator()` holds
            // no `Subscription` to call `cancel()` on: it drops its iterator.
            if case .inConsumer = join, case .cancelAfter(let n) = leave { leave = .dropIteratorAfter(n) }
            let slowness: Slowness
            switch rng.weighted([50, 25, 25]) {
            case 1: slowness = .yielding(every: rng.int(in: 1...8))
            case 2: slowness = .sleeping(every: rng.int(in: 1...16), micros: rng.int(in: 20...500), maxSleeps: 30)
            default: slowness = .fast
            }
            subscribers.append(
                SubscriberPlan(
                    id: id, policy: policy, join: join, leave: leave,
                    slowness: slowness, isWitness: false))
            switch join {
            case .beforeSending: break
            case .late(let spot): attach(.join(subscriber: id), at: spot)
            case .inConsumer(let spot): attach(.joinInConsumer(subscriber: id), at: spot)
            }
            switch leave {
            case .externalCancel(let spot): attach(.cancelSubscription(subscriber: id), at: spot)
            case .externalTaskCancel(let spot): attach(.cancelTask(subscriber: id), at: spot)
            default: break
            }
        }

        var finishMode = [FinishMode.afterProducers, .racing, .dropReference][rng.weighted([40, 45, 15])]
        if active.isEmpty && finishMode == .racing { finishMode = .afterProducers }
        var finishers: [FinisherPlan] = []
        if finishMode != .dropReference {
            for id in 0..<rng.int(in: 1...3) {
                let kind: FinishKind = rng.chance(0.5) ? .normal : .throwing(100 + id)
                let spot = finishMode == .racing ? randomSpot() : nil
                let finisher = FinisherPlan(id: id, kind: kind, at: spot, spawned: spot == nil || rng.chance(0.5))
                finishers.append(finisher)
                if let spot { attach(.finish(finisher: id), at: spot) }
            }
        }
        // Drawn last, so the rest of a round's plan does not depend on it.
        let replay = [0, 1, 2, 3, 8, 64][rng.weighted([45, 15, 10, 10, 10, 10])]
        return RoundPlan(
            seed: seed, defaultPolicy: defaultPolicy, replay: replay, producers: producers,
            subscribers: subscribers, finishMode: finishMode, finishers: finishers)
    }

    // MARK: Description

    /// One line: the round's shape.
    var summary: String {
        let threads = producers.filter(\.onThread).count
        let emitters = producers.filter { $0.emitChance > 0 }.count
        let cancellers = producers.filter { $0.cancellableChance > 0 }.count
        let joins = subscribers.dropFirst()
        let late = joins.filter {
            if case .late = $0.join { return true }; return false
        }.count
        let inConsumer = joins.filter {
            if case .inConsumer = $0.join { return true }; return false
        }.count
        let leaving = joins.filter { !$0.livesThrough }.count
        let finish = finishers.map(\.kind.description).joined(separator: ",")
        return "P=\(producers.count) (\(threads) thread, \(emitters) emit, \(cancellers) cancel-emit) "
            + "ops=\(totalOps) S=\(subscribers.count - 1)+witness (\(late) late, \(inConsumer) in-consumer, \(leaving) leave) "
            + "default=\(defaultPolicy.short) replay=\(replay) finish=\(finishMode)\(finish.isEmpty ? "" : "[\(finish)]")"
    }

    /// Full parameters, one item a line, for failure reports.
    var details: [String] {
        var lines: [String] = []
        lines.append("default policy \(defaultPolicy.short), replay \(replay), finish mode \(finishMode)")
        for producer in producers {
            let actions = producer.actions.keys.sorted().map { op in
                "\(op):"
                    + producer.actions[op]!.map { action -> String in
                        switch action {
                        case .join(let id): return "join s\(id)"
                        case .joinInConsumer(let id): return "start s\(id)"
                        case .cancelSubscription(let id): return "cancel() s\(id)"
                        case .cancelTask(let id): return "cancel task s\(id)"
                        case .finish(let id): return "finisher \(id)"
                        }
                    }.joined(separator: "+")
            }.joined(separator: " ")
            lines.append(
                "producer \(producer.id): \(producer.onThread ? "thread" : "task") ops=\(producer.opCount) "
                    + "emit=\(producer.emitChance) cancel=\(producer.cancellableChance) payload=\(producer.payload) "
                    + "yieldEvery=\(producer.yieldEvery)\(actions.isEmpty ? "" : " actions[\(actions)]")")
        }
        for subscriber in subscribers {
            lines.append("subscriber \(subscriber.id): \(describe(subscriber))")
        }
        for finisher in finishers {
            lines.append("finisher \(finisher.id): \(finisher.kind) at \(finisher.at.map(String.init(describing:)) ?? "end of sending")\(finisher.spawned ? " (own task)" : " (inline)")")
        }
        return lines
    }

    func describe(_ subscriber: SubscriberPlan) -> String {
        if subscriber.isWitness { return "witness unbounded, before sending, stays, fast" }
        let policy: String
        switch subscriber.policy {
        case .sequenceDefault: policy = "default=\(defaultPolicy.short)"
        case .explicit(let explicit): policy = explicit.short
        }
        let join: String
        switch subscriber.join {
        case .beforeSending: join = "before sending"
        case .late(let spot): join = "joins \(spot)"
        case .inConsumer(let spot): join = "joins in consumer \(spot)"
        }
        let leave: String
        switch subscriber.leave {
        case .stay: leave = "stays"
        case .cancelAfter(let n): leave = "cancel() after \(n)"
        case .dropIteratorAfter(let n): leave = "drops iterator after \(n)"
        case .cancelOwnTaskAfter(let n): leave = "cancels own task after \(n)"
        case .externalCancel(let spot): leave = "cancel() by \(spot)"
        case .externalTaskCancel(let spot): leave = "task cancelled by \(spot)"
        }
        let slow: String
        switch subscriber.slowness {
        case .fast: slow = "fast"
        case .yielding(let every): slow = "yields every \(every)"
        case .sleeping(let every, let micros, _): slow = "sleeps \(micros)us every \(every)"
        }
        return "\(policy), \(join), \(leave), \(slow)"
    }
}
