import AsyncBroadcast
import AsyncBroadcastTestSupport

// The plan of a sharing round: a shared `BroadcastSequence` fed by an
// upstream task or a callback listener (see SharingRound.swift).

/// What feeds the shared sequence.
enum SharingSourceKind: String, Sendable, CaseIterable {
    /// `BroadcastSequence(upstream:)`.
    case upstream
    /// `AsyncSequence.broadcast()`: each start iterates the same upstream value again.
    case broadcast
    /// `BroadcastSequence(register:)` with a listener that sends from its own threads.
    case listener
}

/// The `started:` argument.
enum SharingStartKind: Sendable, Equatable, CustomStringConvertible {
    case eagerly
    case lazily
    case whileSubscribedZero
    /// On the continuous clock: real time decides whether a subscriber
    /// arrives before the stop.
    case whileSubscribedDelay(milliseconds: Int)
    /// On a `ManualClock` that a driver thread advances.
    case whileSubscribedManual

    var isWhileSubscribed: Bool {
        switch self {
        case .eagerly, .lazily: return false
        default: return true
        }
    }

    /// Starts at the first counted subscriber (not in init).
    var startsAtFirstSubscriber: Bool { self != .eagerly }

    var description: String {
        switch self {
        case .eagerly: return "eagerly"
        case .lazily: return "lazily"
        case .whileSubscribedZero: return "whileSubscribed(.zero)"
        case .whileSubscribedDelay(let ms): return "whileSubscribed(\(ms)ms)"
        case .whileSubscribedManual: return "whileSubscribed(1s, ManualClock)"
        }
    }
}

/// What a run does once it has produced its elements.
enum RunEnding: Sendable, Equatable {
    /// Waits until it is stopped (an idle connection): only a stop ends it.
    case park
    /// Ends: the sequence finishes, if the run is still current.
    case end
    /// Throws (upstream) / `finish(throwing:)` (listener).
    case fail
}

/// What a listener does after its unregister closure was called.
enum LateListenerAction: Sendable, Equatable {
    case none
    /// `sink.send`: must deliver nothing and report `isFinished`.
    case send
    /// `sink.finish()`: must be ignored.
    case finish
    /// `sink.finish(throwing:)`: must be ignored (no subscriber may see the error).
    case finishThrowing
}

/// How the round ends the sequence, unless it finished by itself before.
enum SharingEnd: String, Sendable, CaseIterable {
    case finish, finishThrowing, release
}

/// Error codes: the kind of end is the millions digit, the run id the rest,
/// so a subscriber's error names who threw it.
enum SharingCode {
    /// The round's `finish(throwing:)`.
    static let explicit = 1_000_000
    /// An upstream run that throws by itself.
    static func upstreamFailed(_ run: Int) -> Int { 2_000_000 + run }
    /// A listener's own `finish(throwing:)`.
    static func listenerFailed(_ run: Int) -> Int { 3_000_000 + run }
    /// A cancelled upstream that throws: a stopped run's end counts for nothing.
    static func afterCancel(_ run: Int) -> Int { 4_000_000 + run }
    /// A listener's `finish(throwing:)` after its unregister: ignored.
    static func afterUnregister(_ run: Int) -> Int { 5_000_000 + run }

    static func isStale(_ code: Int) -> Bool { code >= 4_000_000 }

    static func describe(_ code: Int) -> String {
        switch code / 1_000_000 {
        case 1: return "StressError(\(code): the round's finish(throwing:))"
        case 2: return "StressError(\(code): upstream run \(code % 1_000_000) threw by itself)"
        case 3: return "StressError(\(code): listener \(code % 1_000_000) finished by itself with an error)"
        case 4: return "StressError(\(code): upstream run \(code % 1_000_000) threw after it was cancelled)"
        case 5: return "StressError(\(code): listener \(code % 1_000_000) called finish(throwing:) after its unregister)"
        default: return "StressError(\(code))"
        }
    }
}

/// One run's behaviour, derived from the round seed and the run id (the
/// id is its start order, so a replay gives the same runs the same plans).
struct SharingRunPlan: Sendable {
    let length: Int
    let ending: RunEnding
    /// `Task.yield()` before every `yieldEvery`-th element (0: never).
    let yieldEvery: Int
    /// Upstream: elements still yielded after the cancellation is seen,
    /// before honouring it (tagged stale: never delivered).
    let cancelLag: Int
    /// Upstream: ends a cancelled iteration by throwing rather than returning nil.
    let throwWhenCancelled: Bool
    /// Listener: sends made synchronously inside `register`.
    let syncSends: Int
    /// Listener: calls `sink.finish()` inside `register`, after the sync sends.
    let finishInRegister: Bool
    let lateAction: LateListenerAction
    /// The late action runs inside the unregister closure (else on a listener thread).
    let lateInUnregister: Bool
    /// `sched_yield` calls inside register/unregister: widens the window in
    /// which an overlapping call would be seen.
    let callbackSpins: Int
}

struct SharingRoundPlan: Sendable {
    let seed: UInt64
    let source: SharingSourceKind
    let start: SharingStartKind
    let defaultPolicy: BroadcastBufferingPolicy
    let replay: Int
    let withObjects: Bool
    let runLengthMax: Int
    /// Pace: elements a run produces at once, then per tick of the round
    /// (long runs are cut by the pace, not by their length).
    let burst: Int
    let perTick: Int
    /// Chance that a run ends (or fails) by itself after its elements.
    let selfEndChance: Double
    let cancelLagMax: Int
    let listenerThreads: Int
    let lateActionChance: Double
    let waves: Int
    let waveSize: Int
    let readMax: Int
    /// Chance that a wave starts before the previous one is gone.
    let overlapChance: Double
    /// Subscribers that read until the end, never cancelled.
    let livesThrough: Int
    let livesThroughWave: Int
    let lateSubscribers: Int
    let end: SharingEnd
    /// The round ends the sequence at this wave; nil: after the churn.
    let endWave: Int?
    let observer: Bool

    static func generate(seed: UInt64, options: Options) -> SharingRoundPlan {
        var rng = SplitMix64(seed: seed)
        let source = rng.pick(SharingSourceKind.allCases)
        let start: SharingStartKind
        switch rng.weighted([12, 14, 34, 15, 25]) {
        case 0: start = .eagerly
        case 1: start = .lazily
        case 2: start = .whileSubscribedZero
        case 3: start = .whileSubscribedDelay(milliseconds: 1)
        default: start = .whileSubscribedManual
        }
        let defaultPolicy = rng.pick(sharingPolicies(&rng))
        let waves = rng.int(in: 2...14)
        let livesThrough = rng.chance(0.8) ? rng.int(in: 1...4) : 0
        // whileSubscribed: a subscriber that lives through keeps the run up,
        // so it joins late to leave room for restarts.
        let livesThroughWave = start.isWhileSubscribed ? rng.int(in: (waves / 2)...waves) : rng.int(in: 0...waves)
        return SharingRoundPlan(
            seed: seed, source: source, start: start, defaultPolicy: defaultPolicy,
            replay: rng.chance(0.5) ? 0 : rng.int(in: 1...4), withObjects: rng.chance(0.5),
            runLengthMax: rng.pick([4, 64, 1000, 100_000]),
            burst: rng.pick([0, 1, 8, 64]), perTick: rng.pick([1, 2, 8]),
            selfEndChance: start.isWhileSubscribed ? rng.pick([0, 0, 0.05, 0.2]) : rng.pick([0, 0.3, 0.6]),
            cancelLagMax: rng.int(in: 0...3),
            listenerThreads: options.producers.map { min($0, 4) } ?? rng.int(in: 1...3),
            lateActionChance: rng.pick([0, 0.3, 0.8]),
            waves: waves, waveSize: options.subscribers ?? rng.int(in: 1...24), readMax: rng.pick([0, 3, 16, 64]),
            overlapChance: rng.pick([0, 0.3, 0.7]),
            livesThrough: livesThrough, livesThroughWave: livesThroughWave,
            lateSubscribers: rng.int(in: 0...3),
            end: rng.pick(SharingEnd.allCases),
            endWave: rng.chance(0.3) ? rng.int(in: 1...(waves - 1)) : nil,
            observer: rng.chance(0.85))
    }

    /// The plan of run `id` (ids count from 1 in start order).
    func run(_ id: Int) -> SharingRunPlan {
        var rng = SplitMix64(seed: seed ^ (UInt64(id) &* 0x9E37_79B9_7F4A_7C15) ^ 0x5_4A21)
        let ending: RunEnding = rng.chance(selfEndChance) ? (rng.chance(0.5) ? .end : .fail) : .park
        let late: LateListenerAction = rng.chance(lateActionChance) ? rng.pick([.send, .send, .finish, .finishThrowing]) : .none
        return SharingRunPlan(
            length: rng.chance(0.2) ? rng.int(in: 1...runLengthMax) : rng.int(in: max(1, runLengthMax / 4)...runLengthMax), ending: ending, yieldEvery: rng.pick([0, 1, 4, 16]),
            cancelLag: rng.int(in: 0...cancelLagMax), throwWhenCancelled: rng.chance(0.5),
            syncSends: rng.chance(0.5) ? 0 : rng.int(in: 1...3),
            finishInRegister: rng.chance(0.02) && ending != .park,
            lateAction: late, lateInUnregister: rng.chance(0.5), callbackSpins: rng.pick([0, 0, 4, 32]))
    }

    var summary: String {
        "sharing: \(source) \(start), policy \(defaultPolicy), replay \(replay), waves \(waves)x\(waveSize) (read <= \(readMax), overlap \(overlapChance)), "
            + "lives-through \(livesThrough) from wave \(livesThroughWave), end \(end) \(endWave.map { "at wave \($0)" } ?? "after the churn")"
    }

    var details: [String] {
        [
            "BroadcastSequence<SharedItem, StressError>, payload objects \(withObjects), observer \(observer), late subscribers \(lateSubscribers)",
            "runs: length 1...\(runLengthMax), burst \(burst) then \(perTick) per tick, self-end chance \(selfEndChance), cancel lag <= \(cancelLagMax)"
                + (source == .listener ? ", \(listenerThreads) listener thread(s), late-action chance \(lateActionChance)" : ""),
        ]
    }
}

/// The policies subscribers pick from: every kind, with small capacities.
func sharingPolicies(_ rng: inout SplitMix64) -> [BroadcastBufferingPolicy] {
    [.unbounded, .bounded(rng.int(in: 1...3)), .bufferingNewest(rng.int(in: 0...4)), .bufferingOldest(rng.int(in: 0...4))]
}
