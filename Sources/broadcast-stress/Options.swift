/// Command-line options (hand-rolled: the target has no package dependencies).
struct Options: Sendable {
    /// Time budget; no new round starts after it.
    var seconds: Double?
    var rounds: Int?
    /// Master seed: the whole round sequence derives from it.
    var seed: UInt64?
    /// Runs every round with this exact round seed (replays one failing round).
    var roundSeed: UInt64?
    var producers: Int?
    var subscribers: Int?
    var quiet = false
    /// Round kinds to run (nil: all, in their usual shares).
    var kinds: [RoundKind]?
    /// Per-round deadline: a round that has not ended by then fails and the
    /// process exits (hung tasks cannot be cancelled).
    var deadline: Double = 20

    static let usage = """
        usage: broadcast-stress [--seconds N] [--rounds N] [--seed S] [--round-seed S]
                                [--producers N] [--subscribers N] [--deadline SECONDS] [--quiet]
                                [--kinds sequence,value,promise,sharing,litmus,topics,lifecycle,large-n]

          --seconds N       time budget (default 10 unless --rounds is given)
          --rounds N        stop after N rounds
          --seed S          master seed (decimal or 0x-hex): replays the exact round sequence
          --round-seed S    run every round with this round seed (replay one failing round)
          --producers N     producers per round (default: random 1...8; value rounds 1...6;
                            promise rounds: completers, 1...6; sharing rounds: listener
                            threads per registration, 1...3, at most 4; topics rounds:
                            producer threads, 1...4, at most 4; lifecycle
                            rounds: producer threads, 1...3, at most 3)
          --subscribers N   subscribers per round, besides the witness (default: random 1...64;
                            value rounds 1...48; promise rounds: waiters, 1...10000;
                            sharing rounds: subscribers per wave, 1...24; topics
                            rounds: subscriber tasks, 2...16, at most 24;
                            lifecycle rounds: stayers, 1...6, at most 8)
          --deadline S      seconds a round may take before it fails as hung (default 20)
          --kinds K,...     only these round kinds (default: all; about 48% sequence,
                            11% BroadcastValue, 7% BroadcastPromise, 12% sharing
                            (a shared upstream or listener), 7% litmus (one
                            cross-thread handshake on two threads, many times),
                            8% topics (BroadcastTopics, topics coming and going),
                            8% lifecycle (topics' events, eviction, cancelled
                            subscribes, finish(topic:) racing subscribes)
                            rounds); large-n (sequence rounds with 1,000-4,000
                            subscribers joining and leaving while producers send)
                            runs only when named; a --round-seed replay needs the
                            same --kinds
          --quiet           print only the seed, failures and the summary
        """

    enum ParseError: Error, CustomStringConvertible {
        case message(String)
        var description: String { if case .message(let text) = self { return text }; return "" }
    }

    static func parse(_ arguments: [String]) throws(ParseError) -> Options {
        var options = Options()
        var index = 0
        func value(_ flag: String) throws(ParseError) -> String {
            index += 1
            guard index < arguments.count else { throw .message("\(flag) needs a value") }
            return arguments[index]
        }
        func positiveInt(_ flag: String) throws(ParseError) -> Int {
            let text = try value(flag)
            guard let number = Int(text), number > 0 else { throw .message("\(flag): expected a positive integer, got '\(text)'") }
            return number
        }
        func seedValue(_ flag: String) throws(ParseError) -> UInt64 {
            let text = try value(flag)
            let parsed = text.lowercased().hasPrefix("0x") ? UInt64(text.dropFirst(2), radix: 16) : UInt64(text)
            guard let seed = parsed else { throw .message("\(flag): expected a decimal or 0x-hex seed, got '\(text)'") }
            return seed
        }
        while index < arguments.count {
            let argument = arguments[index]
            switch argument {
            case "--seconds":
                let text = try value(argument)
                guard let seconds = Double(text), seconds > 0 else { throw .message("--seconds: expected a positive number, got '\(text)'") }
                options.seconds = seconds
            case "--deadline":
                let text = try value(argument)
                guard let seconds = Double(text), seconds > 0 else { throw .message("--deadline: expected a positive number, got '\(text)'") }
                options.deadline = seconds
            case "--rounds": options.rounds = try positiveInt(argument)
            case "--seed": options.seed = try seedValue(argument)
            case "--round-seed": options.roundSeed = try seedValue(argument)
            case "--producers": options.producers = try positiveInt(argument)
            case "--subscribers": options.subscribers = try positiveInt(argument)
            case "--quiet", "-q": options.quiet = true
            case "--kinds", "--kind":
                let text = try value(argument)
                var kinds: [RoundKind] = []
                for name in text.split(separator: ",") {
                    guard let kind = RoundKind(rawValue: String(name)) else {
                        throw .message("\(argument): expected a comma-separated list of sequence, value, promise, sharing, litmus, topics, lifecycle, large-n; got '\(text)'")
                    }
                    if !kinds.contains(kind) { kinds.append(kind) }
                }
                guard !kinds.isEmpty else { throw .message("\(argument): expected at least one kind") }
                options.kinds = kinds
            case "--help", "-h": throw .message(usage)
            default: throw .message("unknown argument '\(argument)'\n\(usage)")
            }
            index += 1
        }
        if options.seconds == nil && options.rounds == nil { options.seconds = 10 }
        return options
    }
}
