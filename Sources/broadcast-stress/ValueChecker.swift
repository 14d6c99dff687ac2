// MARK: - The rules for value rounds
//
// Facts
// - Every fresh write carries a new seq; the initial value is v0. A write
//   that leaves an Equatable value `==` the current one is not a change; one
//   that writes the same content into a non-Equatable value is (a
//   "republish": the same seq becomes current again, as a new change).
// - Exact modes (`.updates`, `.serialized`): the harness logs every write in
//   the order it took effect (inside `update`'s body, under the value's lock;
//   or under the harness lock that serializes `.serialized` writers). The
//   final value F (read once writers and finishers were done; the value is
//   final after finish) is the last change: the log up to F's write is the
//   change order, everything after it (written after finish) was discarded.
// - `.racing`: `send`s take their seq outside any lock, so the commit order
//   is unknown. Instead the checker collects "a committed before b" facts and
//   requires them to be consistent (acyclic): what each subscriber saw in
//   order; what each update body saw and wrote; each producer's program order
//   (writes that returned before any finish started, the values its body saw
//   and its reads); the writes that returned before a subscribe() call
//   precede that subscriber's first value; every write that returned before
//   finish precedes F.
//
// Checked every round
// 1. Exact modes, atomicity: every update body saw the value left by the
//    previous change in the log (no other write interleaved), and bodies run
//    after the last change (after finish, on a discarded copy) saw F. Unless
//    a finish raced the writers, nothing was written after F (no lost write).
// 2. Reads of `value` (exact modes): a committed value, never older than what
//    the same producer wrote (and that returned before any finish started),
//    saw in an update body, or read before.
// 3. Per subscriber: every value is one some write produced (payload intact);
//    no change twice (a seq at most 1 + its republishes times; exactly once
//    for Equatable values); each producer's values in its program order.
//    Exact modes: values in change order (seqs non-decreasing), only
//    committed ones (none written after finish), and each `next()` returns at
//    least the value committed when it was called (conflation: the latest
//    value, never a stale one; the first one too). One subscribed from an
//    already cancelled task (not registered) gets a snapshot: at least the
//    value committed when subscribe() was called; so may one whose task was
//    cancelled from outside before its subscribe() ran (seen under TSan:
//    the consumer task started after the cancel), which the checker knows
//    from `Task.isCancelled` right after subscribe() returned.
// 4. A subscriber that stays (and did not subscribe from a cancelled task)
//    ends with F, also one that subscribed after a finish returned: that one
//    gets exactly [F]. One that subscribed from an already cancelled task
//    gets exactly one value, then the end (nil, or the error if a
//    finish(throwing:) ran).
// 5. Task cancellation: after cancelling its own task after n calls of
//    next(), a subscriber certainly registered (its subscribe() returned
//    before any finish started) gets at most (32 - n % 32) % 32 more values.
//    (One made after finish is not registered and ignores its task's
//    cancellation.)
// 6. Terminal: every subscriber that stays ends like subscriber 0: nil after
//    finish() (or the dropped last reference), the error of a
//    finish(throwing:), whichever finish came first; after the error, nil;
//    after nil, nil; after cancel(), nil at once.
// 7. `.racing`: the order facts are acyclic.
// Checked by the round runner (see ValueRoundRunner)
// - subscriberCount equals the early subscribers before writing; right after
//   finish (writers done, everyone caught up) it is at most the number of
//   subscribers that do not stay; 0 once every consumer ended;
//   parkedSubscriberCount 0 then.
// - Liveness: after the writers end (no finish yet), every subscriber that
//   stays gets F and parks; nothing hangs (watchdog).
// - changeCount equals the changes the writers made. With everyone parked:
//   equal writes to an Equatable value wake nobody (wakeCount, changeCount,
//   received unchanged); a same-content write to a non-Equatable value is
//   delivered to every parked subscriber exactly once.
// - After finish, send and update change nothing; isFinished.
// - Leaks: the BroadcastValue, every Subscription and every payload object
//   are freed once the round released them; dropping the last reference to
//   the value (its subscriptions do not keep it alive) frees it.

enum ValueChecker {
    static func check(_ observation: ValueObservation) -> [Violation] {
        let plan = observation.plan
        let final = observation.final
        let exact = plan.mode.isExact
        var out = ViolationList()

        var origin: [Int: (producer: Int, op: Int)] = [0: (-1, -1)]
        for log in observation.logs where log.fresh {
            if origin[log.new] != nil { out.add("harness", "seq \(log.new) written twice") }
            origin[log.new] = (log.producer, log.op)
        }
        if origin[final] == nil { out.add("final value", "the final value is v\(final), which no write produced") }

        // 1. The change order (exact modes).
        var extra: [Int: Int] = [:]
        var real: Set<Int> = [0]
        if exact {
            let logs = observation.logs.sorted { $0.order < $1.order }
            let cutoff = final == 0 ? -1 : (logs.lastIndex(where: { $0.fresh && $0.new == final }) ?? -1)
            var current = 0
            for (index, log) in logs.enumerated() {
                if index <= cutoff {
                    if let prev = log.prev, prev != current {
                        out.add("update atomicity", "\(log.who) \(log.kind): its body saw v\(prev), but the value was v\(current); writes in order: \(window(logs, index))")
                    }
                    if log.fresh {
                        current = log.new
                        real.insert(log.new)
                    }
                    if log.republish {
                        if log.new != current { out.add("harness", "\(log.who) republished v\(log.new) while the value was v\(current)") }
                        extra[current, default: 0] += 1
                    }
                } else {
                    if let prev = log.prev, prev != final {
                        out.add("update atomicity", "\(log.who) \(log.kind): its body saw v\(prev), but the last change was v\(final) (the final value); writes in order: \(window(logs, index))")
                    }
                    if log.republish { extra[final, default: 0] += 1 }
                    if log.fresh && plan.finishMode != .racing {
                        out.add("lost change", "\(log.who) (\(log.kind)) wrote v\(log.new) after v\(final), and no finish raced the writers, yet the final value is v\(final)")
                    }
                }
            }
        } else {
            for log in observation.logs where log.fresh { real.insert(log.new) }
            for log in observation.logs where log.republish { extra[log.new, default: 0] += 1 }
        }

        // 2. Reads (exact modes); floor events for the order graph (racing).
        var graph = OrderGraph()
        var floorEvents: [[(op: Int, seq: Int)]] = []
        for producer in observation.producers {
            var events: [(op: Int, seq: Int)] = []
            var floor = 0
            var floorOp = -1
            for (index, op) in producer.ops.enumerated() {
                let event: Int?
                switch op.kind {
                case .read:
                    if exact {
                        if !real.contains(op.seq) {
                            out.add("value", "p\(producer.id)#\(index) read v\(op.seq), which was never a committed change (final v\(final))")
                        } else if op.seq < floor {
                            out.add("value", "p\(producer.id)#\(index) read v\(op.seq), older than v\(floor), which its op #\(floorOp) had already seen or written")
                        }
                    }
                    event = op.seq
                case .sendFresh, .updateFresh, .updateThrowing, .sendEqual:
                    event = op.certain ? op.seq : nil
                case .updateNoop, .updateCopy, .updateThrowingUnchanged:
                    event = op.seq >= 0 ? op.seq : nil  // what its body saw under the lock
                }
                if let event {
                    if event > floor || (event == floor && floorOp < 0) { floor = event; floorOp = index }
                    if !exact {
                        if let last = events.last, last.seq != event {
                            graph.add(last.seq, event, .program(producer: producer.id, from: last.op, to: index))
                        }
                    }
                    events.append((index, event))
                }
            }
            floorEvents.append(events)
        }
        if !exact {
            for log in observation.logs where log.fresh {
                if let prev = log.prev { graph.add(prev, log.new, .update(producer: log.producer, op: log.op)) }
            }
            // Every write that returned before any finish started precedes F.
            for producer in observation.producers {
                for (index, op) in producer.ops.enumerated() where op.kind.isFresh && op.certain && op.seq != final {
                    graph.add(op.seq, final, .final(producer: producer.id, op: index))
                }
            }
        }

        // 3-5. Subscribers.
        let throwingCodes = observation.executedFinishers.compactMap { kind -> Int? in
            if case .throwing(let code) = kind { return code }
            return nil
        }
        var livedEnds: [(Int, ConsumerEnd)] = []
        for record in observation.consumers where record.joined {
            let subscriber = plan.subscribers[record.id]
            let name = "subscriber \(record.id) [\(plan.describe(subscriber)); ended by \(record.end)]"
            for note in record.notes { out.add("consumer", "\(name): \(note)") }
            let received = record.received

            for seq in received where origin[seq] == nil {
                out.add("value", "\(name) received v\(seq), which no write produced")
            }
            // Not registered (subscribed from a cancelled task): a snapshot
            // of the value current at subscribe(), not at next().
            var snapshot = false
            if case .inCancelledTask = subscriber.join { snapshot = true }
            // Its task cancelled before its subscribe ran (a consumer task
            // cancelled from outside before it started): possibly a
            // snapshot too, so only the weaker rule holds.
            if record.join?.cancelledAtSubscribe == true { snapshot = true }
            if exact, snapshot, let join = record.join, let first = received.first, first < min(join.committedBefore, final) {
                out.add("conflation", "\(name): its one value is v\(first), though v\(join.committedBefore) was committed before subscribe() was called")
            }
            if exact {
                for seq in received where origin[seq] != nil && !real.contains(seq) {
                    out.add("finish is final", "\(name) received v\(seq), written after the final value v\(final) (after finish, writes are discarded)")
                }
                for index in received.indices {
                    if index > 0 && received[index] < received[index - 1] {
                        out.add("change order", "\(name) received v\(received[index]) after v\(received[index - 1]): \(around(received, index))")
                    }
                    let floor = min(record.floors[index], final)
                    if !snapshot && received[index] < floor {
                        out.add("conflation", "\(name): next() #\(index) returned v\(received[index]), though v\(record.floors[index]) was committed before the call (the latest value, never a stale one): \(around(received, index))")
                    }
                }
            }
            var counts: [Int: Int] = [:]
            for seq in received { counts[seq, default: 0] += 1 }
            for (seq, count) in counts.sorted(by: { $0.key < $1.key }) where count > 1 + extra[seq, default: 0] {
                let changes = 1 + extra[seq, default: 0]
                out.add("duplicate", "\(name) received v\(seq) \(count) times, but it was \(changes == 1 ? "one change" : "\(changes) changes (same content written again)"): never the same change twice; \(around(received, received.firstIndex(of: seq)! + 1))")
            }
            var lastOp: [Int: Int] = [:]
            for seq in received {
                guard let (producer, op) = origin[seq], producer >= 0 else { continue }
                if let previous = lastOp[producer], op < previous {
                    out.add("per-producer order", "\(name) received v\(seq) (p\(producer)#\(op)) after p\(producer)#\(previous)")
                }
                lastOp[producer] = op
            }
            if !exact {
                for (a, b) in zip(received, received.dropFirst()) where a != b {
                    graph.add(a, b, .observed(subscriber: record.id))
                }
                if let join = record.join, let first = received.first {
                    for (producer, events) in floorEvents.enumerated() {
                        guard let event = events.last(where: { $0.op < join.completedBefore[producer] }), event.seq != first else { continue }
                        graph.add(event.seq, first, .subscribed(subscriber: record.id, producer: producer, op: event.op))
                    }
                }
            }

            let join = record.join
            if case .inCancelledTask = subscriber.join {
                let ended: Bool
                switch record.end {
                case .end: ended = true
                case .error(let code):
                    ended = true
                    if !throwingCodes.contains(code) {
                        out.add("terminal", "\(name) threw StressError(\(code)), but no finish(throwing:) with it ran")
                    }
                default: ended = false
                }
                if received.count > 1 || (ended && received.count != 1) {
                    out.add("cancelled task", "\(name): subscribing from an already cancelled task yields the current value once, then ends; it received \(around(received, received.count))")
                }
                continue
            }
            if let join, join.afterFinish {
                var readToEnd: Bool
                switch record.end {
                case .end, .error: readToEnd = true
                default: readToEnd = false
                }
                if case .externalCancel = subscriber.leave { readToEnd = false }
                if received.count > 1 || (received.first.map { $0 != final } ?? false) || (readToEnd && received != [final]) {
                    out.add("finish", "\(name) subscribed after a finish returned: it gets exactly the final value v\(final), then the end; it received \(around(received, received.count))")
                }
            }
            if subscriber.livesThrough {
                livedEnds.append((record.id, record.end))
                if received.last != final {
                    out.add("last value", "\(name) stayed to the end, but its last value is \(received.last.map { "v\($0)" } ?? "none"), not the final value v\(final)")
                }
            }
            if let cancelledAt = record.ownTaskCancelledAfter, let join, !join.finishStartedBefore {
                let unchecked = (32 - cancelledAt % 32) % 32
                let after = received.count - cancelledAt
                if after > unchecked {
                    out.add("task cancellation", "\(name) received \(after) values after cancelling its own task after \(cancelledAt) calls of next(); the flag is read by call \(cancelledAt + unchecked), so at most \(unchecked)")
                }
            }
        }

        // 6. Terminal.
        let finishers = observation.executedFinishers
        let expectation: String
        let allowed: (ConsumerEnd) -> Bool
        if throwingCodes.isEmpty {
            expectation = finishers.isEmpty ? "nil (the last reference was dropped)" : "nil (only finish() ran)"
            allowed = { $0 == .end }
        } else if throwingCodes.count == finishers.count {
            expectation = "one of the errors \(throwingCodes) (only finish(throwing:) ran)"
            allowed = {
                if case .error(let code) = $0 { return throwingCodes.contains(code) }; return false
            }
        } else {
            expectation = "nil or one of the errors \(throwingCodes) (finish() raced finish(throwing:))"
            allowed = {
                if case .error(let code) = $0 { return throwingCodes.contains(code) }; return $0 == .end
            }
        }
        let reference = livedEnds.first { $0.0 == 0 }?.1 ?? livedEnds.first?.1
        for (id, end) in livedEnds {
            if !allowed(end) {
                out.add("terminal", "subscriber \(id) [\(plan.describe(plan.subscribers[id]))] ended with \(end); expected \(expectation)")
            } else if let reference, end != reference {
                out.add("terminal", "subscriber \(id) ended with \(end) but subscriber 0 with \(reference): the first finish wins for everyone")
            }
        }

        // 7. One order explains everything (racing).
        if !exact, let cycle = graph.findCycle() {
            out.add(
                "common order",
                "no single order of the changes explains what was observed; these facts form a cycle: "
                    + cycle.map { "v\($0.from) before v\($0.to) (\($0.reason))" }.joined(separator: "; "))
        }
        return out.all
    }

    private static func window(_ logs: [ChangeLog], _ index: Int) -> String {
        let range = max(0, index - 3)...min(logs.count - 1, index + 1)
        return logs[range].map { log in
            "\(log.who) \(log.kind) \(log.prev.map { "saw v\($0) " } ?? "")-> v\(log.new)"
        }.joined(separator: ", ")
    }

    private static func around(_ received: [Int], _ index: Int) -> String {
        let low = max(0, index - 4), high = min(received.count, index + 3)
        let shown = received[low..<high].map { "v\($0)" }.joined(separator: ", ")
        return "received [\(low > 0 ? "..., " : "")\(shown)\(high < received.count ? ", ..." : "")] (\(received.count) values)"
    }
}

/// "a committed before b" facts between changes, by seq.
struct OrderGraph {
    enum Reason: CustomStringConvertible {
        case observed(subscriber: Int)
        case update(producer: Int, op: Int)
        case program(producer: Int, from: Int, to: Int)
        case subscribed(subscriber: Int, producer: Int, op: Int)
        case final(producer: Int, op: Int)

        var description: String {
            switch self {
            case .observed(let subscriber): return "subscriber \(subscriber) received them in this order"
            case .update(let producer, let op): return "the update body of p\(producer)#\(op) saw the first and wrote the second"
            case .program(let producer, let from, let to): return "p\(producer)#\(from) and p\(producer)#\(to), in program order"
            case .subscribed(let subscriber, let producer, let op): return "p\(producer)#\(op) returned before subscriber \(subscriber) subscribed, and this was its first value"
            case .final(let producer, let op): return "p\(producer)#\(op) returned before any finish, and the second is the final value"
            }
        }
    }

    private struct Edge: Hashable {
        let from: Int
        let to: Int
    }

    private var reasons: [Edge: Reason] = [:]
    private var successors: [Int: [Int]] = [:]
    private var predecessors: [Int: [Int]] = [:]

    mutating func add(_ from: Int, _ to: Int, _ reason: Reason) {
        guard from != to else { return }
        let edge = Edge(from: from, to: to)
        guard reasons[edge] == nil else { return }
        reasons[edge] = reason
        successors[from, default: []].append(to)
        predecessors[to, default: []].append(from)
    }

    /// A cycle (Kahn's algorithm, then a walk back through what is left), or nil.
    func findCycle() -> [(from: Int, to: Int, reason: String)]? {
        var inDegree: [Int: Int] = [:]
        for (node, list) in predecessors { inDegree[node] = list.count }
        var ready = successors.keys.filter { inDegree[$0, default: 0] == 0 }
        var removed = Set<Int>()
        while let node = ready.popLast() {
            removed.insert(node)
            for next in successors[node] ?? [] {
                inDegree[next]! -= 1
                if inDegree[next] == 0 { ready.append(next) }
            }
        }
        guard let start = inDegree.first(where: { $0.value > 0 && !removed.contains($0.key) })?.key else { return nil }
        // Every node left has a predecessor left: walk back until one repeats.
        var path: [Int] = [start]
        var seen: [Int: Int] = [start: 0]
        var node = start
        while true {
            guard let previous = predecessors[node]?.first(where: { !removed.contains($0) }) else { return nil }
            if let at = seen[previous] {
                let cycle = [previous] + path[at...].reversed()
                var result: [(from: Int, to: Int, reason: String)] = []
                for (a, b) in zip(cycle, cycle.dropFirst()).prefix(8) {
                    result.append((a, b, reasons[Edge(from: a, to: b)].map(String.init(describing:)) ?? "?"))
                }
                return result
            }
            seen[previous] = path.count
            path.append(previous)
            node = previous
        }
    }
}
