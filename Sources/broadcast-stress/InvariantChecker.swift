import AsyncBroadcast

// MARK: - The rules
//
// The checker runs after a round has ended (every task returned), on facts
// recorded during the round. It asserts only what the API contract
// guarantees; where the contract allows either outcome (an operation racing
// a subscribe, a finish or a cancellation), it asserts nothing.
//
// Facts
// - Every producer runs its operations one after another, so its sequence
//   numbers are its program order. Each operation records its outcome: the
//   `BroadcastSendResult`, or `CancellationError` (only ever for an `emit`
//   whose child task the producer cancelled).
// - D, the *delivered* set: operations whose result has `isFinished == false`.
//   Operations reporting `isFinished`, and cancelled emits, delivered nothing.
// - The witness: an `.unbounded` subscriber, subscribed before any producer
//   starts, never leaving, reading as fast as it can. It is registered for
//   every operation that takes effect before finish, so it must receive
//   exactly D; its order W is the global order in which deliveries took
//   effect (they are serialized), and everyone else is compared with it.
// - Join bracket (`JoinInfo`): just before `subscribe` the harness reads how
//   many operations of each producer have *returned* (`completedBefore[p]`),
//   just after it returns how many have *started* (`startedAfter[p]`).
//   An element (p, i) with i < completedBefore[p] took effect before the
//   subscription: the subscriber must never see it. One with
//   i >= startedAfter[p] took effect after: the subscriber was registered
//   for it. Between the two the operation raced the subscription: no claim.
//   Subscribers that join before sending have exact brackets (all zero).
// - "Lives through": planned to stay (no cancel(), no task cancellation, no
//   dropped iterator). Such a subscriber is registered from its subscribe
//   until finish, and ends only by draining after finish.
//
// Checked every round
// 1. Operations: a plain `emit` (task never cancelled) never throws. A result
//    with `isFinished` has `delivered == 0 && dropped == 0`. An operation
//    started after a finish was observed (a finisher returned, or any send
//    reported `isFinished`) must report `isFinished`.
// 2. The witness receives exactly D: nothing missing, nothing extra.
// 3. Per subscriber, per producer: sequence numbers strictly increase (in
//    order, no duplicates). Every received element is in D (a cancelled emit
//    or an `isFinished` send reached nobody); none precedes the subscription
//    (i >= completedBefore[p]); a subscriber that joined after a finish was
//    observed receives nothing. Payload contents match the element's key.
// 4. Common order: every subscriber's elements appear in W in the same
//    relative order (strictly increasing positions in W).
// 5. `.unbounded`/`.bounded` never drop: `droppedCount == 0`, and what a
//    subscriber received is one contiguous run of W (a cancel()/dropped
//    iterator cuts it short, task cancellation drains what was buffered; a
//    gap is a loss). Before the first element received, W may only hold
//    elements not required to reach it (i < startedAfter[p]). If it lives
//    through, the run ends at the end of W (it loses nothing).
//    Together with 2, this is "every delivered emit reached every bounded
//    subscriber that lived through it".
// 6. Dropping policies: received + droppedCount accounts for every element
//    offered. Offered elements are bounded by the bracket:
//       lo = #{W : i >= startedAfter[p]} <= offered <= hi = #{W : i >= completedBefore[p]}
//    For subscribers that live through, lo <= received + dropped <= hi; this
//    is EXACT (lo == hi == |W|) for subscribers that joined before sending,
//    and a range for late joiners whose subscribe raced operations. For
//    subscribers that left, only received + dropped <= hi (the buffer freed
//    by cancel() was neither received nor dropped). `droppedCount` is read
//    after the subscriber ended; consumers that hold only an iterator
//    (dropped-iterator plans, in-consumer joins) have no reading.
// 7. Drop totals: the `dropped` counts of all results add up to the sum of
//    all subscribers' `droppedCount` (each drop or eviction is counted once
//    in both). Exact when every dropping subscriber's count was read (see
//    6); otherwise the results' sum must be at least the known sum.
// 8. Result counts: every delivered operation counts in `delivered` each
//    subscriber that joined before sending and lives through with a policy
//    that always stores (`.unbounded`, `.bounded`, `.bufferingNewest(n>0)`),
//    and in `delivered + dropped` every such subscriber of any policy; neither
//    count exceeds the number of subscribers.
// 9. Terminal: every subscriber that lives through ends the same way as the
//    witness: `nil` if only finish() ran (or the last reference was
//    dropped), the error of a finish(throwing:) if only those ran, and any
//    one outcome if both raced. After the error, next() returns nil; after
//    nil, nil again; after cancel(), nil at once.
// Checked by the round runner (see RoundRunner)
// - Liveness: every task ends before the deadline (watchdog); after the
//   producers end (and before finish), every subscriber that joined before
//   sending and lives through catches up: received (+ droppedCount) reaches |D|.
// - `subscriberCount` equals the early subscribers before sending and is 0
//   after the round; `isFinished` is true after the round.
// - Leaks: live `Payload`s are back to 0 and the sequence is deallocated once
//   the round dropped every reference.

struct RoundObservation {
    let plan: RoundPlan
    let producers: [ProducerRecord]
    let consumers: [ConsumerRecord]
    let executedFinishers: [FinishKind]
}

/// Collects violations, keeping a few of each invariant.
struct ViolationList {
    private(set) var items: [Violation] = []
    private var counts: [String: Int] = [:]
    private let keepPerInvariant = 4

    mutating func add(_ invariant: String, _ detail: @autoclosure () -> String) {
        let count = counts[invariant, default: 0]
        counts[invariant] = count + 1
        if count < keepPerInvariant { items.append(Violation(invariant: invariant, detail: detail())) }
    }

    var all: [Violation] {
        var result = items
        for (invariant, count) in counts.sorted(by: { $0.key < $1.key }) where count > keepPerInvariant {
            result.append(Violation(invariant: invariant, detail: "... and \(count - keepPerInvariant) more"))
        }
        return result
    }
}

enum InvariantChecker {
    static func check(_ observation: RoundObservation) -> [Violation] {
        let plan = observation.plan
        var out = ViolationList()
        func keys(_ list: some Collection<Int>) -> String {
            let shown = list.prefix(6).map(Item.describe).joined(separator: ", ")
            return list.count > 6 ? "\(shown), ... (\(list.count))" : shown
        }
        func resultText(_ result: BroadcastSendResult) -> String {
            "delivered \(result.delivered), dropped \(result.dropped), isFinished \(result.isFinished)"
        }

        // 1. Operations.
        var delivered = Set<Int>()
        var cancelled = Set<Int>()
        var finishedKeys = Set<Int>()
        var deliveredResults: [(Int, BroadcastSendResult)] = []
        for producer in observation.producers {
            if producer.ops.count != plan.producers[producer.id].opCount {
                out.add("harness", "producer \(producer.id) ran \(producer.ops.count) of \(plan.producers[producer.id].opCount) ops")
            }
            for (index, op) in producer.ops.enumerated() {
                let key = Item.key(producer: producer.id, index: index)
                switch op.outcome {
                case .cancelled:
                    cancelled.insert(key)
                    if op.kind != .cancellableEmit {
                        out.add("emit", "\(Item.describe(key)): emit threw CancellationError though its task was never cancelled")
                    }
                case .result(let result):
                    if result.isFinished {
                        finishedKeys.insert(key)
                        if result.delivered != 0 || result.dropped != 0 {
                            out.add("send result", "\(Item.describe(key)) reported isFinished but counted \(resultText(result))")
                        }
                    } else {
                        delivered.insert(key)
                        deliveredResults.append((key, result))
                        if op.finishSeenBefore {
                            out.add("finish is final", "\(Item.describe(key)) (\(op.kind)) started after a finish had returned but delivered (\(resultText(result)))")
                        }
                    }
                }
            }
        }

        // 2. The witness.
        let witness = observation.consumers[0]
        let order = witness.received
        var position: [Int: Int] = [:]
        position.reserveCapacity(order.count)
        for (index, key) in order.enumerated() where position[key] == nil { position[key] = index }
        let missing = delivered.subtracting(position.keys).sorted()
        if !missing.isEmpty {
            out.add("no loss (witness)", "the unbounded witness (subscribed before sending, never left) lacks \(missing.count) of \(delivered.count) delivered elements: \(keys(missing))")
        }
        // Must reach / may reach, for a bracket.
        func mustReach(_ key: Int, _ join: JoinInfo) -> Bool { Item.index(of: key) >= join.startedAfter[Item.producer(of: key)] }
        func mayReach(_ key: Int, _ join: JoinInfo) -> Bool { Item.index(of: key) >= join.completedBefore[Item.producer(of: key)] }

        // 8. Result counts.
        var minDelivered = 0
        var minTotal = 0
        for subscriber in plan.subscribers where subscriber.joinsBeforeSending && subscriber.livesThrough {
            minTotal += 1
            if plan.effectivePolicy(of: subscriber).alwaysCountsDelivered { minDelivered += 1 }
        }
        let maxSubscribers = plan.subscribers.count
        for (key, result) in deliveredResults {
            if result.delivered < minDelivered || result.delivered + result.dropped < minTotal
                || result.delivered > maxSubscribers || result.dropped > maxSubscribers {
                out.add("send result counts", "\(Item.describe(key)): \(resultText(result)); expected delivered >= \(minDelivered), delivered + dropped >= \(minTotal) (early subscribers that live through), each <= \(maxSubscribers) (all subscribers)")
            }
        }

        // 3-6. Each subscriber.
        var knownDropped = 0
        var allDroppedKnown = true
        var livedEnds: [(Int, ConsumerEnd)] = []
        for record in observation.consumers where record.joined {
            let subscriber = plan.subscribers[record.id]
            let name = "subscriber \(record.id) [\(plan.describe(subscriber)); ended by \(record.end)]"
            for note in record.notes { out.add("consumer", "\(name): \(note)") }

            // 3. Per producer: in order, no duplicates.
            var last: [Int: Int] = [:]
            for key in record.received {
                let producer = Item.producer(of: key), index = Item.index(of: key)
                if let previous = last[producer], index <= previous {
                    out.add("per-producer order", index == previous
                            ? "\(name) received \(Item.describe(key)) twice"
                            : "\(name) received \(Item.describe(key)) after p\(producer)#\(previous)")
                }
                last[producer] = index
            }
            // 3. Only delivered elements.
            for key in record.received where !delivered.contains(key) {
                if cancelled.contains(key) {
                    out.add("emit", "\(name) received \(Item.describe(key)), whose emit threw CancellationError")
                } else if finishedKeys.contains(key) {
                    out.add("finish", "\(name) received \(Item.describe(key)), whose send reported isFinished")
                } else {
                    out.add("harness", "\(name) received unknown element \(Item.describe(key))")
                }
            }
            if subscriber.livesThrough { livedEnds.append((record.id, record.end)) }
            if let dropped = record.droppedCount { knownDropped += dropped } else if record.policy.mayDrop { allDroppedKnown = false }
            guard let join = record.join else { continue }

            if join.afterFinish && !record.received.isEmpty {
                out.add("finish", "\(name) subscribed after a finish returned but received \(keys(record.received))")
            }
            if let early = record.received.first(where: { !mayReach($0, join) }) {
                out.add("subscribe", "\(name) received \(Item.describe(early)), whose send returned before subscribe() was called")
            }
            // 4. Common order.
            let positions = record.received.compactMap { position[$0] }
            guard positions.count == record.received.count else { continue }  // reported above
            if let bad = zip(positions, positions.dropFirst()).first(where: { $0 >= $1 }) {
                out.add("common order", "\(name) received \(Item.describe(order[bad.0])) before \(Item.describe(order[bad.1])), the witness the other way round")
                continue
            }

            if !record.policy.mayDrop {
                // 5. Never drops: a contiguous run of W.
                if let dropped = record.droppedCount, dropped != 0 {
                    out.add("droppedCount", "\(name): \(record.policy.short) never drops but droppedCount is \(dropped)")
                }
                if let first = positions.first {
                    if let gap = zip(positions, positions.dropFirst()).first(where: { $1 != $0 + 1 }) {
                        out.add("no loss", "\(name) lost \(keys(order[(gap.0 + 1)..<gap.1])) between \(Item.describe(order[gap.0])) and \(Item.describe(order[gap.1]))")
                    }
                    if let skipped = order[..<first].first(where: { mustReach($0, join) }) {
                        out.add("no loss", "\(name) missed \(Item.describe(skipped)), sent after it subscribed, before its first element \(Item.describe(order[first]))")
                    }
                    if subscriber.livesThrough, let lastPosition = positions.last, lastPosition != order.count - 1 {
                        out.add("no loss", "\(name) lost its tail: last received \(Item.describe(order[lastPosition])), then \(keys(order[(lastPosition + 1)...])) never arrived")
                    }
                } else if subscriber.livesThrough, let owed = order.first(where: { mustReach($0, join) }) {
                    out.add("no loss", "\(name) received nothing, though \(Item.describe(owed)) and later were sent after it subscribed")
                }
            } else if let dropped = record.droppedCount {
                // 6. Dropping policies: received + dropped accounts for every element offered.
                let high = order.reduce(0) { $0 + (mayReach($1, join) ? 1 : 0) }
                let low = order.reduce(0) { $0 + (mustReach($1, join) ? 1 : 0) }
                let total = record.received.count + dropped
                let bound = low == high ? "exactly \(low)" : "between \(low) and \(high)"
                if subscriber.livesThrough ? (total < low || total > high) : total > high {
                    out.add("drop accounting", "\(name): received \(record.received.count) + droppedCount \(dropped) = \(total), but \(subscriber.livesThrough ? bound : "at most \(high)") elements were offered to it")
                }
            }
        }

        // 7. Drop totals.
        let resultDropped = deliveredResults.reduce(0) { $0 + $1.1.dropped }
        if knownDropped > resultDropped || (allDroppedKnown && knownDropped != resultDropped) {
            out.add("drop accounting", "send results report \(resultDropped) drops in all, subscribers' droppedCount add up to \(knownDropped)\(allDroppedKnown ? "" : " (some counts unknown: at most \(resultDropped) expected)")")
        }

        // 9. Terminal.
        let finishers = observation.executedFinishers
        let codes = finishers.compactMap { kind -> Int? in if case .throwing(let code) = kind { return code }; return nil }
        let witnessEnd = witness.end
        let expectation: String
        let allowed: (ConsumerEnd) -> Bool
        if codes.isEmpty {
            expectation = finishers.isEmpty ? "nil (the last reference was dropped)" : "nil (only finish() ran)"
            allowed = { $0 == .end }
        } else if codes.count == finishers.count {
            expectation = "one of the errors \(codes) (only finish(throwing:) ran)"
            allowed = { if case .error(let code) = $0 { return codes.contains(code) }; return false }
        } else {
            expectation = "nil or one of the errors \(codes) (finish() raced finish(throwing:))"
            allowed = { if case .error(let code) = $0 { return codes.contains(code) }; return $0 == .end }
        }
        for (id, end) in livedEnds {
            if !allowed(end) {
                out.add("terminal", "subscriber \(id) [\(plan.describe(plan.subscribers[id]))] ended with \(end); expected \(expectation)")
            } else if end != witnessEnd {
                out.add("terminal", "subscriber \(id) ended with \(end) but the witness with \(witnessEnd): the first finish wins for everyone")
            }
        }
        return out.all
    }
}
