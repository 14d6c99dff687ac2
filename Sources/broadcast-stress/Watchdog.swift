import AsyncBroadcastTestSupport

/// Enforces the per-round deadline from a raw OS thread (the cooperative
/// pool may be the thing that is stuck).
///
/// Everything a round waits for registers an *activity* with a closure that
/// describes its current state. If the round outlives its deadline, the
/// watchdog prints the failure (seed, parameters, every activity still
/// registered), the summary line counting this round as failed, and ends the
/// process with status 1: hung tasks can never be awaited or cancelled.
final class Watchdog: Sendable {
    struct Round {
        var number: Int
        var header: [String]
        var deadlineAt: Double
        var deadline: Double
        var sequenceState: @Sendable () -> String
    }

    private struct State {
        var round: Round?
        var activities: [Int: @Sendable () -> String] = [:]
        var nextID = 0
        var passed = 0
        var failed = 0
        var started = false
    }

    private let state = Locked(State())

    func start() {
        let alreadyStarted = state.withLock { state -> Bool in
            defer { state.started = true }
            return state.started
        }
        guard !alreadyStarted else { return }
        spawnThread { [self] in
            while true {
                usleepSeconds(0.1)
                check()
            }
        }
    }

    func setTotals(passed: Int, failed: Int) {
        state.withLock {
            $0.passed = passed; $0.failed = failed
        }
    }

    func beginRound(_ round: Round) {
        state.withLock {
            $0.round = round; $0.activities.removeAll()
        }
    }

    func endRound() {
        state.withLock {
            $0.round = nil; $0.activities.removeAll()
        }
    }

    /// Registers something the round waits for; returns its token.
    func register(_ describe: @escaping @Sendable () -> String) -> Int {
        state.withLock { state in
            let id = state.nextID
            state.nextID += 1
            state.activities[id] = describe
            return id
        }
    }

    func unregister(_ token: Int) {
        _ = state.withLock { $0.activities.removeValue(forKey: token) }
    }

    private func check() {
        let snapshot = state.withLock { state -> (Round, [(Int, @Sendable () -> String)], Int, Int)? in
            guard let round = state.round, monotonicSeconds() > round.deadlineAt else { return nil }
            return (round, state.activities.sorted { $0.key < $1.key }, state.passed, state.failed)
        }
        guard let (round, activities, passed, failed) = snapshot else { return }
        // Describe outside the lock: the closures take other locks.
        var lines = round.header
        lines.append("  invariant broken: liveness: every subscriber, emitter and finisher task ends within the deadline (\(formatSeconds(round.deadline)))")
        lines.append("  still waiting (\(activities.count)):")
        for (_, describe) in activities { lines.append("    - " + describe()) }
        lines.append("  sequence: " + round.sequenceState())
        for line in lines { say(line) }
        say("\(passed) passed, \(failed + 1) failed")
        say("hung round: exiting (hung tasks cannot be cancelled)")
        terminate(status: 1)
    }
}

let watchdog = Watchdog()

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

func usleepSeconds(_ seconds: Double) {
    usleep(useconds_t(seconds * 1_000_000))
}
