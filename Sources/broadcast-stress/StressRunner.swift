import AsyncBroadcastTestSupport

/// Runs rounds until the budget is spent, prints progress and failures, and
/// checks that resident memory stays flat.
struct StressRunner {
    let options: Options

    func run() async -> Int32 {
        var seedSource = SystemRandomNumberGenerator()
        let masterSeed = options.seed ?? seedSource.next()
        say("broadcast-stress seed \(hex(masterSeed))  (replay: --seed \(hex(masterSeed)))")
        var budget: [String] = []
        if let seconds = options.seconds { budget.append("\(formatSeconds(seconds)) budget") }
        if let rounds = options.rounds { budget.append("\(rounds) rounds max") }
        if let producers = options.producers { budget.append("\(producers) producers") }
        if let subscribers = options.subscribers { budget.append("\(subscribers) subscribers") }
        if let roundSeed = options.roundSeed { budget.append("every round with round seed \(hex(roundSeed))") }
        if let kinds = options.kinds { budget.append("kinds \(kinds.map(\.rawValue).joined(separator: ","))") }
        budget.append("deadline \(formatSeconds(options.deadline)) per round")
        say(budget.joined(separator: ", "))
        watchdog.start()

        var rng = SplitMix64(seed: masterSeed)
        var passed = 0
        var failed = 0
        var byKind: [RoundKind: (rounds: Int, seconds: Double)] = [:]
        var round = 0
        let start = monotonicSeconds()
        var lastLine = start
        var memory = MemoryTrend(
            warmUpSeconds: options.seconds.map { $0 * 0.2 },
            warmUpRounds: options.rounds.map { max(1, $0 / 5) })

        while true {
            if let rounds = options.rounds, round >= rounds { break }
            if let seconds = options.seconds, monotonicSeconds() - start >= seconds { break }
            round += 1
            let roundSeed = options.roundSeed ?? rng.next()
            let plan = StressRound.generate(seed: roundSeed, options: options)
            let kinds = options.kinds.map { " --kinds " + $0.map(\.rawValue).joined(separator: ",") } ?? ""
            let header =
                [
                    "FAIL round \(round): seed \(hex(masterSeed)) round-seed \(hex(roundSeed))",
                    "  replay: --seed \(hex(masterSeed)) --rounds \(round)\(kinds) (this sequence of rounds), or --round-seed \(hex(roundSeed))\(kinds) (this round's parameters)",
                    "  round: \(plan.summary)",
                ]
                + plan.details.map { "    " + $0 }
            watchdog.setTotals(passed: passed, failed: failed)

            let report = await RoundRunner.run(plan, header: header, options: options)
            let rss = residentMemoryBytes() ?? 0
            byKind[plan.kind, default: (0, 0)].rounds += 1
            byKind[plan.kind, default: (0, 0)].seconds += report.duration
            memory.record(rss, round: round, elapsed: monotonicSeconds() - start)

            if report.violations.isEmpty {
                passed += 1
            } else {
                failed += 1
                for line in header { say(line) }
                for violation in report.violations { say("  invariant broken: \(violation)") }
            }
            let now = monotonicSeconds()
            if !options.quiet && (report.duration >= 1 || now - lastLine >= 1) {
                lastLine = now
                let verdict = report.violations.isEmpty ? "ok" : "FAILED"
                say(
                    "round \(round) \(verdict) in \(formatSeconds(report.duration)) [\(plan.summary)] "
                        + "delivered \(report.delivered) received \(report.received) | \(passed) passed, \(failed) failed "
                        + "| \(formatSeconds(now - start)) | RSS \(formatMB(rss))")
            }
        }

        let elapsed = monotonicSeconds() - start
        let verdict = memory.verdict()
        say("memory: \(verdict.text)")
        if !verdict.flat {
            failed += 1
            say("FAIL memory: resident memory kept growing across rounds (seed \(hex(masterSeed)))")
        }
        say("coverage: \(Coverage.summary)")
        say(
            "rounds by kind: "
                + RoundKind.allCases.compactMap { kind in
                    byKind[kind].map { "\(kind.rawValue) \($0.rounds) (\(formatSeconds($0.seconds)))" }
                }.joined(separator: ", "))
        say("\(round) rounds in \(formatSeconds(elapsed)), seed \(hex(masterSeed))")
        say("\(passed) passed, \(failed) failed")
        return failed == 0 ? 0 : 1
    }
}
