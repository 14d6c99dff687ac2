import Foundation

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Flushes stdout (and every other stream), so that the log is complete even
/// when ThreadSanitizer or the watchdog ends the process.
func flushOutput() { fflush(nil) }

struct Options: Sendable {
    var seconds: Double = 40
    var rounds: Int?
    var scale = 1
    var seed = UInt64(DispatchTime.now().uptimeNanoseconds) ^ UInt64(getpid())
    var watchdog: Double = 90
    var only: String?
    var verbose = false

    static let usage = """
        usage: client-tsan [--seconds S] [--rounds N] [--scale K] [--seed N] [--watchdog S] [--only NAME] [--verbose]
          Repeats rounds of every scenario until S seconds have passed (default 40; at least one round),
          or exactly N rounds. --scale multiplies each scenario's iterations (default 1).
          A scenario that has not finished after --watchdog seconds (default 90) fails the run.
          The last line is "<passed> passed, <failed> failed"; the exit status is 0 iff nothing failed.
        """

    static func parse(_ arguments: [String]) -> Options {
        var options = Options()
        var rest = arguments.dropFirst()
        func fail(_ message: String) -> Never {
            FileHandle.standardError.write(Data("client-tsan: \(message)\n\(usage)\n".utf8))
            exit(2)
        }
        func value<T: LosslessStringConvertible>(_ flag: String) -> T {
            guard let text = rest.popFirst(), let value = T(text) else { fail("\(flag) needs a \(T.self) value") }
            return value
        }
        while let argument = rest.popFirst() {
            switch argument {
            case "--seconds": options.seconds = value(argument)
            case "--rounds": options.rounds = value(argument) as Int
            case "--scale": options.scale = value(argument)
            case "--seed": options.seed = value(argument)
            case "--watchdog": options.watchdog = value(argument)
            case "--only": options.only = value(argument) as String
            case "--verbose": options.verbose = true
            case "-h", "--help": print(usage); exit(0)
            default: fail("unknown argument \(argument)")
            }
        }
        return options
    }
}

struct Scenario: Sendable {
    let name: String
    let run: @Sendable (_ seed: UInt64, _ failures: Failures, _ scale: Int) async -> Void
}

let scenarios: [Scenario] = [
    Scenario(name: "send-fan-out", run: { await sendFanOut(seed: $0, failures: $1, scale: $2) }),
    Scenario(name: "ping-pong-thread", run: { await pingPongWakes(seed: $0, failures: $1, scale: $2, fromThread: true) }),
    Scenario(name: "ping-pong-task", run: { await pingPongWakes(seed: $0, failures: $1, scale: $2, fromThread: false) }),
    Scenario(name: "emit-ping-pong", run: { await emitPingPong(seed: $0, failures: $1, scale: $2) }),
    Scenario(name: "emit-wakes-thread", run: { await emitWakesFromThread(seed: $0, failures: $1, scale: $2) }),
    Scenario(name: "cancelled-emitters", run: { await cancelledEmitters(seed: $0, failures: $1, scale: $2) }),
    Scenario(name: "cancel-racing-next", run: { await cancelRacingNext(seed: $0, failures: $1, scale: $2) }),
    Scenario(name: "task-cancellation", run: { await taskCancellation(seed: $0, failures: $1, scale: $2) }),
    Scenario(name: "finish-racing-sends", run: { await finishRacingSends(seed: $0, failures: $1, scale: $2) }),
    Scenario(name: "last-reference-dropped", run: { await lastReferenceDropped(seed: $0, failures: $1, scale: $2) }),
    Scenario(name: "value-fan-out", run: { await valueFanOut(seed: $0, failures: $1, scale: $2) }),
    Scenario(name: "value-wakes", run: { await valueWakes(seed: $0, failures: $1, scale: $2) }),
    Scenario(name: "promise-races", run: { await promiseRaces(seed: $0, failures: $1, scale: $2) }),
    Scenario(name: "shared-upstream-churn", run: { await sharedUpstreamChurn(seed: $0, failures: $1, scale: $2) }),
    Scenario(name: "listener-threads", run: { await listenerThreads(seed: $0, failures: $1, scale: $2) }),
    Scenario(name: "eager-upstream-throws", run: { await eagerUpstreamThrows(seed: $0, failures: $1, scale: $2) }),
    Scenario(name: "subscriber-counts", run: { await subscriberCountsChurn(seed: $0, failures: $1, scale: $2) }),
    Scenario(name: "send-contents-of", run: { await sendContentsOf(seed: $0, failures: $1, scale: $2) }),
]

/// Fails the whole run if one scenario runs longer than its limit: a task
/// or a consumer that never ends would otherwise hang until CI's timeout.
final class Watchdog: Sendable {
    struct State {
        var scenario = "(starting)"
        var started = now()
        var passed = 0
        var failed = 0
    }

    let state = Locked(State())
    let limit: Double

    init(limit: Double) {
        self.limit = limit
        let thread = Thread { [self] in
            while true {
                Thread.sleep(forTimeInterval: 0.25)
                let (overdue, snapshot) = state.withLock { ($0.started + limit < now(), $0) }
                if overdue {
                    print("FAIL \(snapshot.scenario): not finished after \(limit) s: a task, thread or consumer hangs (watchdog)")
                    print("\(snapshot.passed) passed, \(snapshot.failed + 1) failed")
                    flushOutput()
                    _exit(3)
                }
            }
        }
        thread.start()
    }

    func begin(_ scenario: String) {
        state.withLock {
            $0.scenario = scenario
            $0.started = now()
        }
    }

    func end(passed: Bool) -> (passed: Int, failed: Int) {
        state.withLock {
            if passed { $0.passed += 1 } else { $0.failed += 1 }
            $0.scenario = "(between scenarios)"
            $0.started = now()
            return ($0.passed, $0.failed)
        }
    }
}

/// Runs the rounds; returns the number of failed scenario runs.
func runAll(_ options: Options) async -> Int {
    let selected = scenarios.filter { options.only == nil || $0.name == options.only }
    guard !selected.isEmpty else {
        print("client-tsan: no scenario named \(options.only ?? ""); scenarios: \(scenarios.map(\.name).joined(separator: ", "))")
        return 1
    }
    let watchdog = Watchdog(limit: options.watchdog)
    let start = now()
    var master = SplitMix64(seed: options.seed)
    var totals = (passed: 0, failed: 0)
    print("client-tsan: seed \(options.seed), \(options.rounds.map { "\($0) rounds" } ?? "\(Int(options.seconds)) s"), scale \(options.scale), \(selected.count) scenarios")
    flushOutput()
    var round = 0
    while true {
        round += 1
        let roundStart = now()
        var roundFailed = 0
        for scenario in selected {
            let seed = master.next()
            let label = "\(scenario.name) (round \(round), seed \(seed))"
            watchdog.begin(label)
            let failures = Failures()
            let scenarioStart = now()
            await scenario.run(seed, failures, options.scale)
            // Every element must be released once its sequence and subscribers are gone.
            let released = await waitUntil(within: 10) { Payload.live.value == 0 }
            if !released {
                failures.record("\(Payload.live.value) payloads still alive after the scenario ended")
                Payload.live.store(0)
            }
            totals = watchdog.end(passed: failures.count == 0)
            if failures.count > 0 {
                roundFailed += 1
                print("FAIL \(label): \(failures.count) failed checks")
                for message in failures.first { print("    \(message)") }
            } else if options.verbose {
                print("  ok \(scenario.name) (\(String(format: "%.2f", now() - scenarioStart)) s)")
            }
            flushOutput()
        }
        print("round \(round): \(selected.count - roundFailed) passed, \(roundFailed) failed (\(String(format: "%.1f", now() - roundStart)) s)")
        flushOutput()
        if let rounds = options.rounds {
            if round >= rounds { break }
        } else if now() - start >= options.seconds {
            break
        }
    }
    print("client-tsan: \(round) rounds in \(String(format: "%.1f", now() - start)) s")
    print("\(totals.passed) passed, \(totals.failed) failed")
    flushOutput()
    return totals.failed
}
