import AsyncBroadcast
import AsyncBroadcastTestSupport

// What a sharing round's subscribers saw, and the invariants checked on it
// at the end of the round.

struct SharedTag: Sendable, CustomStringConvertible {
    let run: Int
    let index: Int
    let stale: Bool

    var description: String { "r\(run)#\(index)\(stale ? " (stale)" : "")" }

    static func < (lhs: SharedTag, rhs: SharedTag) -> Bool { (lhs.run, lhs.index) < (rhs.run, rhs.index) }
}

enum SharingRole: String, Sendable {
    case churn
    case livesThrough = "lives-through"
    /// Subscribed after the sequence finished.
    case late
}

/// How a subscriber's reading ended.
enum SharingSubscriberEnd: Sendable, Equatable, CustomStringConvertible {
    /// It had nothing to subscribe to (the sequence was released).
    case neverJoined
    /// It left: cancel(), dropped, or its task cancelled while holding.
    case left
    case finished
    case failed(Int)

    var terminal: SelfEnd? {
        switch self {
        case .finished: return .finished
        case .failed(let code): return .failed(code)
        default: return nil
        }
    }

    var description: String {
        switch self {
        case .neverJoined: return "never joined"
        case .left: return "left"
        case .finished: return "nil"
        case .failed(let code): return SharingCode.describe(code)
        }
    }
}

struct SharingSubscriberRecord: Sendable {
    let id: Int
    let role: SharingRole
    let join: String
    let policy: BroadcastBufferingPolicy
    var received: [SharedTag] = []
    var end: SharingSubscriberEnd = .neverJoined
    /// Its task was cancelled by the time it ended (by the round, or itself).
    var taskCancelled = false
    /// Its reading ended with nil or an error while the sequence was alive
    /// and not finished.
    var endedUnfinished = false
    var notes: [String] = []

    var label: String { "\(role.rawValue) subscriber \(id) (\(join), \(policy))" }

    /// Never drops: every element delivered while it is subscribed reaches it.
    var dropsNothing: Bool {
        switch policy {
        case .unbounded, .bounded: return true
        case .bufferingNewest, .bufferingOldest: return false
        }
    }

    /// Ended by the sequence's own end, not by leaving or by its task's cancellation.
    var sawTerminal: SelfEnd? { taskCancelled ? nil : end.terminal }
}

enum SharingChecker {
    struct Input {
        let plan: SharingRoundPlan
        let records: [SharingSubscriberRecord]
        /// What the sources ended with by themselves (while current or not).
        let selfEnds: Set<SelfEnd>
        /// The round's own end (nil if it never got there).
        let explicitEnd: SelfEnd?
        let observerValues: [Int]?
        let subscribersCreated: Int
    }

    static func check(_ input: Input) -> [Violation] {
        var out = ViolationList()
        for record in input.records {
            checkOrder(record, into: &out)
            for note in record.notes { out.add("subscriber", "\(record.label): \(note)") }
            if record.endedUnfinished {
                out.add("end only after finish", "\(record.label) ended with \(record.end) while the sequence was alive and not finished (received \(record.received.count))")
            }
            if case .failed(let code) = record.end, SharingCode.isStale(code) {
                out.add("stopped run's end ignored", "\(record.label) got \(SharingCode.describe(code)): the end of a stopped run (or of an unregistered listener) must not finish the sequence")
            }
            if record.role == .livesThrough, record.end == .left || (record.taskCancelled && record.end != .neverJoined) {
                out.add("lives-through subscriber", "\(record.label) was never cancelled but ended as \(record.end)\(record.taskCancelled ? " with its task cancelled" : "")")
            }
        }

        // Every subscriber that saw the end saw the same one, one that happened.
        let terminals = Dictionary(grouping: input.records.compactMap { record in record.sawTerminal.map { ($0, record) } }, by: \.0)
        if terminals.count > 1 {
            let summary = terminals.map { "\($0.key): \($0.value.prefix(3).map(\.1.label).joined(separator: ", "))\($0.value.count > 3 ? " ..." : "")" }
            out.add("one end for all", "subscribers saw different ends: \(summary.joined(separator: "; "))")
        }
        var allowed = input.selfEnds
        if let explicit = input.explicitEnd { allowed.insert(explicit) }
        for (terminal, records) in terminals where !allowed.contains(terminal) {
            out.add("end", "\(records.count) subscriber(s), e.g. \(records[0].1.label), ended with \(terminal), which no source produced while it could count (possible: \(allowed.map(\.description).sorted().joined(separator: ", ")))")
        }
        if input.selfEnds.isEmpty, let explicit = input.explicitEnd, let (terminal, records) = terminals.first, terminal != explicit {
            out.add("end", "\(records[0].1.label) ended with \(terminal); no run ended by itself, so the end is the round's \(explicit)")
        }

        if let values = input.observerValues {
            checkCounts(values, created: input.subscribersCreated, into: &out)
        }
        return out.all
    }

    /// In order, no duplicates, nothing stale; no gaps for policies that never drop.
    private static func checkOrder(_ record: SharingSubscriberRecord, into out: inout ViolationList) {
        var previous: SharedTag?
        for (position, tag) in record.received.enumerated() {
            if tag.stale {
                out.add("stopped run delivers nothing", "\(record.label) received \(tag) at position \(position): it was produced after its run was stopped (task cancelled / unregister called)")
            }
            defer { previous = tag }
            guard let previous else { continue }
            if !(previous < tag) {
                let what =
                    previous.run == tag.run
                    ? (previous.index == tag.index ? "a duplicate" : "out of order within its run")
                    : "an element of run \(tag.run) after one of the later run \(previous.run)"
                out.add("order", "\(record.label) received \(tag) right after \(previous) (position \(position)): \(what); around it: \(around(record.received, position))")
                continue
            }
            guard record.dropsNothing else { continue }
            if previous.run == tag.run, tag.index != previous.index + 1 {
                out.add("no gaps", "\(record.label) never drops, but received \(tag) right after \(previous) (position \(position)): elements of run \(tag.run) missing; around it: \(around(record.received, position))")
            } else if previous.run != tag.run, tag.index != 0 {
                out.add("no gaps", "\(record.label) never drops, but its first element of run \(tag.run) is \(tag) (after \(previous), position \(position)): the run's first elements were delivered without it")
            }
        }
    }

    private static func around(_ tags: [SharedTag], _ position: Int) -> String {
        tags[max(0, position - 3)..<min(tags.count, position + 3)].map(\.description).joined(separator: " ")
    }

    /// In range, ending at 0. (The same count twice in a row is possible:
    /// conflation returns the latest change, and a count that went from n
    /// to n + 1 and back while the reader was away comes back as n.)
    private static func checkCounts(_ values: [Int], created: Int, into out: inout ViolationList) {
        for (position, value) in values.enumerated() where value < 0 || value > created {
            out.add("subscriberCounts", "value \(value) at position \(position): at most \(created) subscribers ever existed")
        }
        if let last = values.last, last != 0 {
            out.add("subscriberCounts", "the last count was \(last), but every subscriber is gone: the final count is 0 (last values \(values.suffix(6)))")
        }
    }
}
