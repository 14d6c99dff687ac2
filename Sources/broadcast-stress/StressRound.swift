import AsyncBroadcastTestSupport

/// What a round exercises.
enum RoundKind: String, Sendable, CaseIterable {
    case sequence, value, promise, sharing, litmus, topics
    /// Sequence rounds with 1,000-4,000 subscribers joining and leaving while
    /// producers send. Not in the default mix (a round takes seconds under
    /// ThreadSanitizer); ask for it with `--kinds`.
    case largeN = "large-n"
    /// BroadcastTopics' v5 surface: events, eviction, cancelled subscribes,
    /// finish(topic:) racing subscribes, listeners (LifecycleRound).
    case lifecycle

    /// Share of rounds: sequence rounds keep most of the time.
    var weight: Int {
        switch self {
        case .sequence: return 57
        case .value: return 13
        case .promise: return 8
        case .sharing: return 14
        case .litmus: return 8
        case .topics: return 10
        case .largeN: return 0
        case .lifecycle: return 9
        }
    }

    /// The share when `--kinds` names this kind: large-N rounds, left out of
    /// the default mix, get a real share once asked for.
    var requestedWeight: Int { self == .largeN ? 20 : weight }

    /// The kind of round `seed` runs. Drawn from its own stream, so a
    /// sequence round's plan (from the same seed) is what it always was;
    /// with `--kinds`, a seed whose kind is excluded draws again among the
    /// allowed ones (so `--round-seed` replays need the same `--kinds`).
    /// When `--kinds` names large-n, every draw is among the allowed kinds
    /// with their requested weights: large-n's natural weight is 0, so
    /// drawing it naturally first would never pick it beside other kinds.
    static func of(seed: UInt64, allowed: [RoundKind]?) -> RoundKind {
        var rng = SplitMix64(seed: seed ^ 0xB10A_DCA5_7000_0001)
        let all = RoundKind.allCases
        let natural = all[rng.weighted(all.map(\.weight))]
        guard let allowed, !allowed.isEmpty else { return natural }
        if allowed.contains(natural) && !allowed.contains(.largeN) { return natural }
        return allowed[rng.weighted(allowed.map(\.requestedWeight))]
    }
}

/// One round's plan, of any kind.
enum StressRound: Sendable {
    case sequence(RoundPlan)
    case value(ValueRoundPlan)
    case promise(PromiseRoundPlan)
    case sharing(SharingRoundPlan)
    case litmus(LitmusRoundPlan)
    case topics(TopicsRoundPlan)
    case largeN(RoundPlan)
    case lifecycle(LifecycleRoundPlan)

    static func generate(seed: UInt64, options: Options) -> StressRound {
        switch RoundKind.of(seed: seed, allowed: options.kinds) {
        case .sequence: return .sequence(RoundPlan.generate(seed: seed, options: options))
        case .value: return .value(ValueRoundPlan.generate(seed: seed, options: options))
        case .promise: return .promise(PromiseRoundPlan.generate(seed: seed, options: options))
        case .sharing: return .sharing(SharingRoundPlan.generate(seed: seed, options: options))
        case .litmus: return .litmus(LitmusRoundPlan.generate(seed: seed, options: options))
        case .topics: return .topics(TopicsRoundPlan.generate(seed: seed, options: options))
        case .largeN:
            var large = options
            var rng = SplitMix64(seed: seed ^ 0x1A26_E000_0000_0001)
            large.subscribers = options.subscribers ?? rng.int(in: 1_000...4_000)
            return .largeN(RoundPlan.generate(seed: seed, options: large))
        case .lifecycle: return .lifecycle(LifecycleRoundPlan.generate(seed: seed, options: options))
        }
    }

    var kind: RoundKind {
        switch self {
        case .sequence: return .sequence
        case .value: return .value
        case .promise: return .promise
        case .sharing: return .sharing
        case .litmus: return .litmus
        case .topics: return .topics
        case .largeN: return .largeN
        case .lifecycle: return .lifecycle
        }
    }

    var summary: String {
        switch self {
        case .sequence(let plan): return plan.summary
        case .value(let plan): return plan.summary
        case .promise(let plan): return plan.summary
        case .sharing(let plan): return plan.summary
        case .litmus(let plan): return plan.summary
        case .topics(let plan): return plan.summary
        case .largeN(let plan): return plan.summary
        case .lifecycle(let plan): return plan.summary
        }
    }

    var details: [String] {
        switch self {
        case .sequence(let plan): return plan.details
        case .value(let plan): return plan.details
        case .promise(let plan): return plan.details
        case .sharing(let plan): return plan.details
        case .litmus(let plan): return plan.details
        case .topics(let plan): return plan.details
        case .largeN(let plan): return plan.details
        case .lifecycle(let plan): return plan.details
        }
    }
}

extension RoundRunner {
    static func run(_ round: StressRound, header: [String], options: Options) async -> RoundReport {
        switch round {
        case .sequence(let plan), .largeN(let plan):
            return await run(plan, header: header, options: options)
        case .value(let plan):
            if plan.equatable {
                return await ValueRoundRunner<EqValue>.run(plan, header: header, options: options)
            }
            return await ValueRoundRunner<PlainValue>.run(plan, header: header, options: options)
        case .promise(let plan):
            return await PromiseRoundRunner.run(plan, header: header, options: options)
        case .sharing(let plan):
            guard #available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *) else {
                fatalError("sharing rounds need AsyncSequence.Failure (macOS 15 / iOS 18 or later); run with --kinds sequence,value,promise")
            }
            return await SharingRoundRunner.run(plan, header: header, options: options)
        case .litmus(let plan):
            return await LitmusRoundRunner.run(plan, header: header, options: options)
        case .topics(let plan):
            return await TopicsRoundRunner.run(plan, header: header, options: options)
        case .lifecycle(let plan):
            return await LifecycleRoundRunner.run(plan, header: header, options: options)
        }
    }
}
