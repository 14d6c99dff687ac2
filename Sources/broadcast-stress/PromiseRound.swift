@_spi(Testing) import AsyncBroadcast
import AsyncBroadcastTestSupport

// Promise rounds: `BroadcastPromise<PromiseValue, StressError>`.
//
// 1. Churn: waves of waiters that are all cancelled (some from an already
//    cancelled task, some before they park, some while parked): each throws
//    CancellationError, and afterwards `waiterCount` is 0 and
//    `waiterSlotCapacity` has not grown with the cancelled waiters (at most
//    max(64, 2 x the most waiters ever alive at once), though the waves
//    together cancelled more than that).
// 2. Waiters: 1-10,000 waiters, some cancelled at random moments (while
//    others start, before or after they park): every cancelled one throws
//    CancellationError (the promise is not complete), and `waiterCount`
//    equals the waiters left, exactly.
// 3. Race: 1-6 completers (tasks and raw threads, released together) race
//    succeed/fail, while new waiters arrive (some from cancelled tasks) and
//    parked waiters are cancelled. Exactly one completion returns true; the
//    others return false; `result` is the winner's from then on.
// 4. Late waiters (half of them from already cancelled tasks) get the
//    winner's result at once.
// 5. Every waiter that was never cancelled gets the winner's result; one
//    cancelled in the race gets it or CancellationError; afterwards
//    `waiterCount` is 0 at once and the capacity is bounded.
// Some rounds never complete: every waiter is cancelled. Then the promise,
// released, is freed, and every payload (the winner's and the losers') is
// released. A hang anywhere fails through the watchdog.

struct PromiseValue: Sendable {
    let completer: Int
    let object: Payload?
}

enum WaiterOutcome: Sendable, Equatable, CustomStringConvertible {
    case value(completer: Int)
    case error(Int)
    case cancelled
    case other(String)

    var description: String {
        switch self {
        case .value(let completer): return "the value of completer \(completer)"
        case .error(let code): return "StressError(\(code))"
        case .cancelled: return "CancellationError"
        case .other(let text): return "unexpected \(text)"
        }
    }
}

enum CompletionKind: Sendable, Equatable {
    case succeed
    case fail(Int)
}

struct CompleterPlan: Sendable {
    let id: Int
    let onThread: Bool
    let kind: CompletionKind
    /// Spins after the start signal before completing.
    let spins: Int
}

enum ChurnCancel: Sendable, CaseIterable {
    case immediately, afterParked, mixed
}

struct PromiseRoundPlan: Sendable {
    let seed: UInt64
    let churnWaves: Int
    let churnWaveSize: Int
    let churnCancel: ChurnCancel
    let waiters: Int
    /// Chance that a phase-2 waiter is cancelled before the race.
    let cancelChance: Double
    /// Chance that a waiter runs in an already cancelled task.
    let preCancelledChance: Double
    let racingWaiters: Int
    let raceCancels: Int
    let lateWaiters: Int
    /// Empty: the promise is never completed.
    let completers: [CompleterPlan]
    let withObjects: Bool

    static func generate(seed: UInt64, options: Options) -> PromiseRoundPlan {
        var rng = SplitMix64(seed: seed)
        let churnWaveSize = rng.int(in: 1...64)
        let churnWaves = 6 + 128 / churnWaveSize
        let waiters =
            options.subscribers
            ?? {
                switch rng.weighted([35, 40, 20, 5]) {
                case 0: return rng.int(in: 1...16)
                case 1: return rng.int(in: 17...400)
                case 2: return rng.int(in: 401...3000)
                default: return rng.int(in: 3001...10_000)
                }
            }()
        let completerCount = rng.chance(0.1) ? 0 : (options.producers ?? rng.int(in: 1...6))
        let completers = (0..<completerCount).map { id in
            CompleterPlan(
                id: id, onThread: rng.chance(0.5), kind: rng.chance(0.5) ? .succeed : .fail(1000 + id),
                spins: rng.chance(0.5) ? 0 : rng.int(in: 1...200))
        }
        return PromiseRoundPlan(
            seed: seed, churnWaves: churnWaves, churnWaveSize: churnWaveSize, churnCancel: rng.pick(ChurnCancel.allCases),
            waiters: waiters, cancelChance: [0, 0.1, 0.3, 0.7][rng.int(in: 0...3)],
            preCancelledChance: [0, 0.05, 0.2][rng.int(in: 0...2)],
            racingWaiters: rng.int(in: 0...min(400, waiters)), raceCancels: rng.int(in: 0...min(200, waiters)),
            lateWaiters: rng.int(in: 0...64), completers: completers, withObjects: rng.chance(0.5))
    }

    var summary: String {
        let threads = completers.filter(\.onThread).count
        let kinds = completers.map { $0.kind == .succeed ? "succeed" : "fail" }.joined(separator: ",")
        return "promise: churn \(churnWaves)x\(churnWaveSize) (\(churnCancel)), waiters=\(waiters) (cancel \(cancelChance), pre-cancelled \(preCancelledChance)), "
            + "racing waiters \(racingWaiters), race cancels \(raceCancels), late \(lateWaiters), "
            + (completers.isEmpty ? "never completed" : "completers \(completers.count) (\(threads) thread) [\(kinds)]")
    }

    var details: [String] {
        ["BroadcastPromise<PromiseValue, StressError>, payload objects \(withObjects)"]
            + completers.map { "completer \($0.id): \($0.onThread ? "thread" : "task") \($0.kind == .succeed ? "succeed" : "fail") after \($0.spins) spins" }
    }
}

/// Live waiter tasks (started, `value` not yet returned): bounds the waiter table.
private final class WaiterCensus: Sendable {
    private struct State {
        var live = 0
        var maxLive = 0
    }
    private let state = Locked(State())

    func enter() {
        state.withLock {
            $0.live += 1; $0.maxLive = max($0.maxLive, $0.live)
        }
    }
    func leave() { state.withLock { $0.live -= 1 } }
    var live: Int { state.withLock { $0.live } }
    var maxLive: Int { state.withLock { $0.maxLive } }
}

enum PromiseRoundRunner {
    typealias Promise = BroadcastPromise<PromiseValue, StressError>

    private struct Waiter {
        let id: Int
        let phase: String
        let preCancelled: Bool
        let task: Task<WaiterOutcome, Never>
        var cancelled = false
    }

    static func run(_ plan: PromiseRoundPlan, header: [String], options: Options) async -> RoundReport {
        let start = monotonicSeconds()
        var out = ViolationList()
        var rng = SplitMix64(seed: plan.seed ^ 0x5EED)
        let census = WaiterCensus()
        var promise: Promise? = Promise()
        weak let weakPromise = promise
        let holder = Locked<Promise?>(promise)
        watchdog.beginRound(
            .init(
                number: 0, header: header, deadlineAt: start + options.deadline, deadline: options.deadline,
                sequenceState: {
                    guard let promise = holder.withLock({ $0 }) else { return "promise released" }
                    return "waiterCount \(promise.waiterCount), waiterSlotCapacity \(promise.waiterSlotCapacity), result \(promise.result.map(describe) ?? "nil"), live waiter tasks \(census.live)"
                }))
        defer { watchdog.endRound() }
        let phase = Locked("churn")
        _ = watchdog.register { "promise round, phase: \(phase.value)" }
        var nextID = 0

        func startWaiter(_ promise: Promise, phase: String, preCancelled: Bool) -> Waiter {
            let id = nextID
            nextID += 1
            census.enter()
            let task = Task { () -> WaiterOutcome in
                if preCancelled { withUnsafeCurrentTask { $0?.cancel() } }
                let outcome: WaiterOutcome
                do {
                    let value = try await promise.value
                    if let object = value.object, object.key != value.completer {
                        outcome = .other("value of completer \(value.completer) carrying the payload of \(object.key)")
                    } else {
                        outcome = .value(completer: value.completer)
                    }
                } catch let error as StressError {
                    outcome = .error(error.code)
                } catch is CancellationError {
                    outcome = .cancelled
                } catch {
                    outcome = .other("error \(error)")
                }
                census.leave()
                return outcome
            }
            return Waiter(id: id, phase: phase, preCancelled: preCancelled, task: task)
        }

        /// Polls until `waiterCount` reaches `baseline + expected` (or the
        /// timeout). The baseline is 0 unless an earlier check failed.
        func awaitWaiterCount(_ promise: Promise, _ expected: Int, baseline: Int, timeout: Double) async -> Bool {
            let deadline = monotonicSeconds() + timeout
            while promise.waiterCount != baseline + expected {
                if monotonicSeconds() > deadline { return false }
                try? await Task.sleep(nanoseconds: 200_000)
            }
            return true
        }

        func checkTable(_ promise: Promise, after what: String) async {
            let count = promise.waiterCount
            if count != 0 {
                var settled = count
                let deadline = monotonicSeconds() + 1
                while settled != 0 && monotonicSeconds() < deadline {
                    try? await Task.sleep(nanoseconds: 1_000_000)
                    settled = promise.waiterCount
                }
                out.add("waiterCount", "\(count) after \(what) (expected 0 at once; \(settled) a second later)")
            }
            let capacity = promise.waiterSlotCapacity
            let bound = max(64, 2 * census.maxLive)
            if capacity > bound {
                out.add("waiter table", "waiterSlotCapacity \(capacity) after \(what): at most \(census.maxLive) waiters were ever alive at once, so at most \(bound) (it must not grow with cancelled waiters)")
            }
        }

        // 1. Churn: every waiter cancelled.
        for wave in 0..<plan.churnWaves {
            phase.value = "churn wave \(wave) of \(plan.churnWaves)"
            let baseline = promise!.waiterCount  // 0 (checked after the churn)
            var waiters: [Waiter] = []
            let cancelAfterParked: Bool
            switch plan.churnCancel {
            case .immediately: cancelAfterParked = false
            case .afterParked: cancelAfterParked = true
            case .mixed: cancelAfterParked = wave % 2 == 0
            }
            for _ in 0..<plan.churnWaveSize {
                let waiter = startWaiter(promise!, phase: "churn", preCancelled: rng.chance(0.2))
                if !cancelAfterParked && rng.chance(0.5) { waiter.task.cancel() }
                waiters.append(waiter)
            }
            if cancelAfterParked {
                let expected = waiters.filter { !$0.preCancelled }.count
                _ = await awaitWaiterCount(promise!, expected, baseline: baseline, timeout: 0.2)
            }
            for waiter in waiters { waiter.task.cancel() }
            for waiter in waiters {
                let outcome = await waiter.task.value
                if outcome != .cancelled {
                    out.add("cancelled waiter", "churn wave \(wave): waiter \(waiter.id)\(waiter.preCancelled ? " (already cancelled task)" : "") got \(outcome), though the promise was not complete (expected CancellationError)")
                }
            }
        }
        phase.value = "after churn"
        await checkTable(promise!, after: "\(plan.churnWaves) waves of \(plan.churnWaveSize) cancelled waiters")
        let leakedAfterChurn = promise!.waiterCount  // 0 (checked just above)
        phase.value = "starting \(plan.waiters) waiters"

        // 2. Waiters, some cancelled before the race.
        var waiters: [Waiter] = []
        waiters.reserveCapacity(plan.waiters)
        for _ in 0..<plan.waiters {
            waiters.append(startWaiter(promise!, phase: "early", preCancelled: rng.chance(plan.preCancelledChance)))
            if rng.chance(plan.cancelChance) {
                let index = rng.int(in: max(0, waiters.count - 8)...(waiters.count - 1))
                waiters[index].task.cancel()
                waiters[index].cancelled = true
            }
            if rng.chance(0.01) { await Task.yield() }
        }
        let cancelledEarly = waiters.filter { $0.cancelled || $0.preCancelled }
        for waiter in cancelledEarly {
            let outcome = await waiter.task.value
            if outcome != .cancelled {
                out.add("cancelled waiter", "waiter \(waiter.id)\(waiter.preCancelled ? " (already cancelled task)" : "") got \(outcome), though it was cancelled before any completion (expected CancellationError)")
            }
        }
        let remaining = waiters.count - cancelledEarly.count
        phase.value = "waiting for \(remaining) waiters to park"
        // Waiters that stay in the table after they returned were reported
        // already: wait for the others to park.
        let leaked = leakedAfterChurn > 0 ? leakedAfterChurn + cancelledEarly.count : 0
        if !(await awaitWaiterCount(promise!, remaining, baseline: leaked, timeout: options.deadline * 0.3))
            || promise!.waiterCount != remaining
        {
            out.add("waiterCount", "\(promise!.waiterCount) with \(remaining) waiters parked (\(waiters.count) started, \(cancelledEarly.count) cancelled and returned)")
        }
        let capacity = promise!.waiterSlotCapacity
        if capacity > max(64, 2 * census.maxLive) || capacity < remaining {
            out.add("waiter table", "waiterSlotCapacity \(capacity) with \(remaining) waiters parked (at most \(census.maxLive) alive at once)")
        }
        Coverage.add("promise:waiters-cancelled-early", cancelledEarly.count)

        // 3. The race.
        phase.value = "completions racing"
        let go = Locked(false)
        let completions = Locked<[(id: Int, won: Bool, after: WaiterOutcome?)]>([])
        let completerTasks = plan.completers.map { completer in
            Task { [promise] in
                let token = watchdog.register { "completer \(completer.id) has not returned" }
                defer { watchdog.unregister(token) }
                let record: (Int, Bool, WaiterOutcome?)
                if completer.onThread {
                    record = await withCheckedContinuation { continuation in
                        spawnThread {
                            while !go.value { yieldThread() }
                            continuation.resume(returning: complete(promise!, completer, plan.withObjects, go))
                        }
                    }
                } else {
                    while !go.value { await Task.yield() }
                    record = complete(promise!, completer, plan.withObjects, go)
                }
                completions.withLock { $0.append(record) }
            }
        }
        for _ in 0..<8 { await Task.yield() }
        go.value = true
        var racing: [Waiter] = []
        let parked = waiters.indices.filter { !waiters[$0].cancelled && !waiters[$0].preCancelled }
        var raceCancelled = 0
        for index in 0..<max(plan.racingWaiters, plan.raceCancels) {
            if index < plan.racingWaiters {
                racing.append(startWaiter(promise!, phase: "racing", preCancelled: rng.chance(plan.preCancelledChance)))
            }
            if index < plan.raceCancels, !parked.isEmpty {
                let victim = rng.pick(parked)
                waiters[victim].task.cancel()
                if !waiters[victim].cancelled { raceCancelled += 1 }
                waiters[victim].cancelled = true
            }
        }
        for task in completerTasks { await task.value }

        // Exactly one completion wins.
        let records = completions.value.sorted { $0.id < $1.id }
        let winners = records.filter(\.won)
        var winner: WaiterOutcome?
        if !plan.completers.isEmpty {
            if winners.count != 1 {
                out.add("first completion wins", "\(winners.count) of \(records.count) completions returned true: \(records.map { "completer \($0.id) -> \($0.won)" }.joined(separator: ", "))")
            }
            if let first = winners.first {
                winner = plan.completers[first.id].kind == .succeed ? .value(completer: first.id) : .error(1000 + first.id)
            }
            if let winner {
                for record in records {
                    let after = record.after
                    if after != winner {
                        out.add("result", "completer \(record.id) read result \(after.map(\.description) ?? "nil") right after its own completion returned; the winner was \(winner)")
                    }
                }
                let now = promise!.result.map(outcome)
                if now != winner { out.add("result", "result is \(now.map(\.description) ?? "nil"), the winner was \(winner)") }
            }
        } else {
            if promise!.result != nil { out.add("result", "result is set, but nobody completed the promise") }
            for index in waiters.indices { waiters[index].task.cancel(); waiters[index].cancelled = true }
            for index in racing.indices { racing[index].task.cancel(); racing[index].cancelled = true }
        }

        // 4. Late waiters: the result at once, even from a cancelled task.
        var late: [Waiter] = []
        if winner != nil {
            for index in 0..<plan.lateWaiters {
                late.append(startWaiter(promise!, phase: "late", preCancelled: index % 2 == 1))
            }
        }

        // 5. Everyone.
        phase.value = "completed"
        let token = watchdog.register { "round: waiting for every waiter task (\(census.live) alive)" }
        var counts: [String: Int] = [:]
        for waiter in waiters + racing + late {
            let outcome = await waiter.task.value
            let cancelled = waiter.cancelled || waiter.preCancelled
            let expectation: String
            let ok: Bool
            if let winner {
                switch waiter.phase {
                case "late":
                    ok = outcome == winner
                    expectation = "\(winner) at once (it started after the promise was complete)"
                case "early" where !cancelled:
                    ok = outcome == winner
                    expectation = "\(winner) (never cancelled)"
                case "racing" where !cancelled:
                    ok = outcome == winner
                    expectation = "\(winner) (never cancelled)"
                default:
                    ok = outcome == winner || outcome == .cancelled
                    expectation = "\(winner) or CancellationError (cancelled while the completions raced)"
                }
            } else {
                ok = outcome == .cancelled
                expectation = "CancellationError (nobody completes the promise; every waiter is cancelled)"
            }
            counts["\(waiter.phase):\(outcome == .cancelled ? "cancelled" : "result")", default: 0] += 1
            if !ok {
                out.add("waiter result", "\(waiter.phase) waiter \(waiter.id)\(waiter.preCancelled ? " (already cancelled task)" : "")\(waiter.cancelled ? " (cancelled)" : "") got \(outcome); expected \(expectation)")
            }
        }
        watchdog.unregister(token)
        phase.value = "final checks"
        for (key, count) in counts { Coverage.add("promise:\(key)", count) }
        Coverage.add("promise:race-cancelled", raceCancelled)
        await checkTable(promise!, after: "every waiter returned")
        if let winner, promise!.result.map(outcome) != winner {
            out.add("result", "result changed to \(promise!.result.map(outcome).map(\.description) ?? "nil") after the waiters returned")
        }
        let total = plan.churnWaves * plan.churnWaveSize + waiters.count + racing.count + late.count

        // Release: the promise and every payload are freed.
        waiters.removeAll()
        racing.removeAll()
        late.removeAll()
        holder.withLock { $0 = nil }
        promise = nil
        if await settle({ weakPromise == nil ? 0 : 1 }) != 0 {
            out.add("leak", "the promise is still alive after every waiter returned and the round released it")
        }
        let live = await settle { LiveObjects.count.value }
        if live != 0 {
            out.add("leak", "\(live) payload objects still alive after the round released everything")
            LiveObjects.count.withLock { $0 = 0 }
        }
        Coverage.add(plan.completers.isEmpty ? "rounds:promise:never-completed" : "rounds:promise")
        return RoundReport(
            violations: out.all, duration: monotonicSeconds() - start, ops: plan.completers.count,
            delivered: plan.completers.count, received: total)
    }

    private static func complete(
        _ promise: Promise, _ completer: CompleterPlan, _ withObjects: Bool,
        _ go: Locked<Bool>
    ) -> (Int, Bool, WaiterOutcome?) {
        for _ in 0..<completer.spins where !go.value { break }  // a short, uneven delay
        let won: Bool
        switch completer.kind {
        case .succeed:
            won = promise.succeed(PromiseValue(completer: completer.id, object: withObjects ? Payload(key: completer.id) : nil))
        case .fail(let code):
            won = promise.fail(StressError(code: code))
        }
        return (completer.id, won, promise.result.map(outcome))
    }

    private static func outcome(_ result: Result<PromiseValue, StressError>) -> WaiterOutcome {
        switch result {
        case .success(let value): return .value(completer: value.completer)
        case .failure(let error): return .error(error.code)
        }
    }

    private static func describe(_ result: Result<PromiseValue, StressError>) -> String { outcome(result).description }

    private static func settle(_ value: () -> Int) async -> Int {
        let deadline = monotonicSeconds() + 1
        while true {
            let current = value()
            if current == 0 || monotonicSeconds() > deadline { return current }
            try? await Task.sleep(nanoseconds: 1_000_000)
        }
    }
}
