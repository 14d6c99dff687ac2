import AsyncBroadcastTestSupport

/// Everything about a `BroadcastValue` round that the seed decides.
///
/// Writers and the order the checker knows:
/// - `.updates`: every write is an `update` whose body takes the next
///   sequence number (and a log position) under the value's own lock, so the
///   commit order is exactly the seq order; updates race each other inside
///   the library.
/// - `.serialized`: `send`s and `update`s, each under one harness lock that
///   also takes the seq: the order is known exactly, and equal `send`s of the
///   current value are possible.
/// - `.racing`: `send`s (seq taken before the call, outside any lock) race
///   `update`s: the commit order is not known, so the checker verifies that
///   one order explains everything that was observed (see ValueChecker).
enum ValueWriteMode: Sendable, Equatable, CustomStringConvertible {
    case updates, serialized, racing

    var description: String {
        switch self {
        case .updates: return "updates"
        case .serialized: return "serialized"
        case .racing: return "racing"
        }
    }

    /// The checker knows the exact commit order.
    var isExact: Bool { self != .racing }
}

enum ValueOpKind: Int, Sendable, CaseIterable, CustomStringConvertible {
    /// `send` of a fresh value.
    case sendFresh
    /// `send` of a copy of the current value (`.serialized` only: the harness knows it).
    case sendEqual
    /// `update` whose body gives the value a fresh seq, in place or by assignment.
    case updateFresh
    /// `update` whose body leaves the value untouched.
    case updateNoop
    /// `update` whose body assigns a copy of the current value.
    case updateCopy
    /// `update` whose body writes a fresh seq, then throws.
    case updateThrowing
    /// `update` whose body throws before touching the value (`Equatable` only).
    case updateThrowingUnchanged
    /// Reads `value`.
    case read

    var description: String {
        switch self {
        case .sendFresh: return "send"
        case .sendEqual: return "send(equal)"
        case .updateFresh: return "update"
        case .updateNoop: return "update(no-op)"
        case .updateCopy: return "update(equal copy)"
        case .updateThrowing: return "update(throws after writing)"
        case .updateThrowingUnchanged: return "update(throws, unchanged)"
        case .read: return "value"
        }
    }

    /// Writes a fresh seq.
    var isFresh: Bool { self == .sendFresh || self == .updateFresh || self == .updateThrowing }
    var isUpdate: Bool { self != .sendFresh && self != .sendEqual && self != .read }
}

enum ValueChaosAction: Sendable {
    case join(subscriber: Int)
    case joinInConsumer(subscriber: Int)
    case joinInCancelledTask(subscriber: Int)
    case cancelSubscription(subscriber: Int)
    case cancelTask(subscriber: Int)
    case finish(finisher: Int)
}

struct ValueProducerPlan: Sendable {
    let id: Int
    /// A raw pthread (every `BroadcastValue` writer API is synchronous).
    let onThread: Bool
    let opCount: Int
    /// Weight of each `ValueOpKind` (by raw value).
    let weights: [Int]
    let yieldEvery: Int
    let seed: UInt64
    var actions: [Int: [ValueChaosAction]] = [:]
}

enum ValueJoinPlan: Sendable, Equatable {
    /// `subscribe()` before any writer starts.
    case beforeWriting
    /// `subscribe()` by a producer, between two of its operations.
    case late(Spot)
    /// A consumer task started by a producer subscribes itself with `makeAsyncIterator()`.
    case inConsumer(Spot)
    /// A task started by a producer cancels itself, then subscribes: not
    /// registered, it yields the current value once, then ends.
    case inCancelledTask(Spot, viaSubscribe: Bool)
}

struct ValueSubscriberPlan: Sendable {
    let id: Int
    let join: ValueJoinPlan
    let leave: LeavePlan
    let slowness: Slowness

    var livesThrough: Bool {
        if case .inCancelledTask = join { return false }
        return leave == .stay
    }
    var joinsBeforeWriting: Bool { join == .beforeWriting }
}

struct ValueRoundPlan: Sendable {
    let seed: UInt64
    let equatable: Bool
    let mode: ValueWriteMode
    let payload: ValuePayloadKind
    let producers: [ValueProducerPlan]
    let subscribers: [ValueSubscriberPlan]
    let finishMode: FinishMode
    let finishers: [FinisherPlan]
    /// Equal writes (or, non-Equatable, one same-content write) made once every
    /// subscriber that stays has caught up and parked, before finish.
    let probeWrites: Int

    var totalOps: Int { producers.reduce(0) { $0 + $1.opCount } }

    static func generate(seed: UInt64, options: Options) -> ValueRoundPlan {
        var rng = SplitMix64(seed: seed)
        let equatable = rng.chance(0.5)
        let mode = [ValueWriteMode.updates, .serialized, .racing][rng.weighted([35, 30, 35])]
        let payload = rng.pick(ValuePayloadKind.allCases)
        let producerCount = options.producers ?? rng.int(in: 1...6)
        let subscriberCount =
            options.subscribers
            ?? {
                switch rng.weighted([50, 35, 15]) {
                case 0: return rng.int(in: 1...6)
                case 1: return rng.int(in: 7...20)
                default: return rng.int(in: 21...48)
                }
            }()

        // Each change wakes every parked subscriber: cap changes x subscribers.
        let opsMax = [40, 300, 1500][rng.weighted([50, 35, 15])]
        let opsBudget = max(40, 60_000 / (subscriberCount + 1))
        var opCounts = (0..<producerCount).map { _ in rng.int(in: 0...opsMax) }
        let requested = opCounts.reduce(0, +)
        if requested > opsBudget { opCounts = opCounts.map { $0 * opsBudget / requested } }
        if opCounts.allSatisfy({ $0 == 0 }) && rng.chance(0.9) { opCounts[0] = rng.int(in: 1...20) }

        func allowed(_ kind: ValueOpKind) -> Bool {
            switch kind {
            case .sendFresh: return mode != .updates
            case .sendEqual: return mode == .serialized
            case .updateThrowingUnchanged: return equatable
            default: return true
            }
        }
        var producers: [ValueProducerPlan] = (0..<producerCount).map { id in
            let weights = ValueOpKind.allCases.map { kind -> Int in
                guard allowed(kind) else { return 0 }
                switch kind {
                case .sendFresh, .updateFresh: return rng.pick([0, 10, 30, 60])
                case .read: return rng.pick([0, 5, 20])
                default: return rng.pick([0, 0, 3, 10, 25])
                }
            }
            let fallback = mode == .updates ? ValueOpKind.updateFresh : .sendFresh
            var fixed = weights
            if weights[ValueOpKind.sendFresh.rawValue] + weights[ValueOpKind.updateFresh.rawValue] == 0 {
                fixed[fallback.rawValue] = 10
            }
            return ValueProducerPlan(
                id: id, onThread: rng.chance(0.3), opCount: opCounts[id], weights: fixed,
                yieldEvery: rng.chance(0.5) ? rng.int(in: 1...16) : 0, seed: rng.fork())
        }
        let active = producers.filter { $0.opCount > 0 }.map(\.id)
        func randomSpot(producer fixed: Int? = nil, after: Int = -1) -> Spot? {
            let producer = fixed ?? (active.isEmpty ? nil : rng.pick(active))
            guard let producer else { return nil }
            let count = producers[producer].opCount
            guard after + 1 < count else { return nil }
            return Spot(producer: producer, op: rng.int(in: (after + 1)...(count - 1)))
        }
        func attach(_ action: ValueChaosAction, at spot: Spot) {
            producers[spot.producer].actions[spot.op, default: []].append(action)
        }

        var subscribers: [ValueSubscriberPlan] = []
        for id in 0..<subscriberCount {
            var join = ValueJoinPlan.beforeWriting
            // Subscriber 0 always joins before writing and stays: the round
            // always has a reference for the terminal event.
            if id > 0 {
                switch rng.weighted([45, 25, 18, 12]) {
                case 1: if let spot = randomSpot() { join = .late(spot) }
                case 2: if let spot = randomSpot() { join = .inConsumer(spot) }
                case 3: if let spot = randomSpot() { join = .inCancelledTask(spot, viaSubscribe: rng.chance(0.5)) }
                default: break
                }
            }
            let joinSpot: Spot?
            switch join {
            case .beforeWriting: joinSpot = nil
            case .late(let spot), .inConsumer(let spot), .inCancelledTask(let spot, _): joinSpot = spot
            }
            func externalSpot() -> Spot? {
                if let joinSpot { return randomSpot(producer: joinSpot.producer, after: joinSpot.op) }
                return randomSpot()
            }
            // Conflation: subscribers see few values, so leave early.
            let after = rng.chance(0.5) ? rng.int(in: 0...3) : rng.int(in: 0...40)
            var leave = LeavePlan.stay
            if id > 0 {
                switch rng.weighted([50, 9, 9, 8, 11, 13]) {
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
            }
            if case .inConsumer = join, case .cancelAfter(let n) = leave { leave = .dropIteratorAfter(n) }
            if case .inCancelledTask = join { leave = .stay }  // it ends by itself after one value
            let slowness: Slowness
            switch rng.weighted([45, 30, 25]) {
            case 1: slowness = .yielding(every: rng.int(in: 1...4))
            case 2: slowness = .sleeping(every: rng.int(in: 1...8), micros: rng.int(in: 20...400), maxSleeps: 30)
            default: slowness = .fast
            }
            subscribers.append(ValueSubscriberPlan(id: id, join: join, leave: leave, slowness: slowness))
            switch join {
            case .beforeWriting: break
            case .late(let spot): attach(.join(subscriber: id), at: spot)
            case .inConsumer(let spot): attach(.joinInConsumer(subscriber: id), at: spot)
            case .inCancelledTask(let spot, _): attach(.joinInCancelledTask(subscriber: id), at: spot)
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
        let probeWrites = rng.int(in: 1...4)
        return ValueRoundPlan(
            seed: seed, equatable: equatable, mode: mode, payload: payload, producers: producers,
            subscribers: subscribers, finishMode: finishMode, finishers: finishers,
            probeWrites: probeWrites)
    }

    // MARK: Description

    var summary: String {
        let threads = producers.filter(\.onThread).count
        let late = subscribers.filter {
            if case .late = $0.join { return true }; return false
        }.count
        let inConsumer = subscribers.filter {
            if case .inConsumer = $0.join { return true }; return false
        }.count
        let cancelled = subscribers.filter {
            if case .inCancelledTask = $0.join { return true }; return false
        }.count
        let leaving = subscribers.filter { $0.leave != .stay }.count
        let finish = finishers.map(\.kind.description).joined(separator: ",")
        return "value(\(equatable ? EqValue.typeName : PlainValue.typeName), \(mode)) P=\(producers.count) (\(threads) thread) "
            + "ops=\(totalOps) S=\(subscribers.count) (\(late) late, \(inConsumer) in-consumer, \(cancelled) in-cancelled-task, \(leaving) leave) "
            + "payload=\(payload) finish=\(finishMode)\(finish.isEmpty ? "" : "[\(finish)]")"
    }

    var details: [String] {
        var lines: [String] = []
        lines.append("BroadcastValue<\(equatable ? "EqValue" : "PlainValue"), StressError>, writers \(mode), payload \(payload), finish mode \(finishMode), probe writes \(probeWrites)")
        for producer in producers {
            let mix = ValueOpKind.allCases.filter { producer.weights[$0.rawValue] > 0 }
                .map { "\($0)=\(producer.weights[$0.rawValue])" }.joined(separator: " ")
            let actions = producer.actions.keys.sorted().map { op in
                "\(op):"
                    + producer.actions[op]!.map { action -> String in
                        switch action {
                        case .join(let id): return "join s\(id)"
                        case .joinInConsumer(let id): return "start s\(id)"
                        case .joinInCancelledTask(let id): return "start cancelled s\(id)"
                        case .cancelSubscription(let id): return "cancel() s\(id)"
                        case .cancelTask(let id): return "cancel task s\(id)"
                        case .finish(let id): return "finisher \(id)"
                        }
                    }.joined(separator: "+")
            }.joined(separator: " ")
            lines.append(
                "producer \(producer.id): \(producer.onThread ? "thread" : "task") ops=\(producer.opCount) [\(mix)] "
                    + "yieldEvery=\(producer.yieldEvery)\(actions.isEmpty ? "" : " actions[\(actions)]")")
        }
        for subscriber in subscribers {
            lines.append("subscriber \(subscriber.id): \(describe(subscriber))")
        }
        for finisher in finishers {
            lines.append("finisher \(finisher.id): \(finisher.kind) at \(finisher.at.map(String.init(describing:)) ?? "end of writing")\(finisher.spawned ? " (own task)" : " (inline)")")
        }
        return lines
    }

    func describe(_ subscriber: ValueSubscriberPlan) -> String {
        let join: String
        switch subscriber.join {
        case .beforeWriting: join = "before writing"
        case .late(let spot): join = "joins \(spot)"
        case .inConsumer(let spot): join = "joins in consumer \(spot)"
        case .inCancelledTask(let spot, let viaSubscribe):
            join = "joins in an already cancelled task \(spot) via \(viaSubscribe ? "subscribe()" : "makeAsyncIterator()")"
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
        return "\(join), \(leave), \(slow)"
    }
}
