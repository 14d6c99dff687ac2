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
// - A `send` may be a `send(contentsOf:)` of several elements (a batch):
//   a producer numbers its elements, and a batch's elements, all started
//   before the call and completed after it, count as one operation in the
//   join bracket. The rules below are per element unless they say
//   otherwise; a result counts its whole batch.
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
//   subscription; one with i >= startedAfter[p] took effect after: the
//   subscriber was registered for it. Between the two the operation raced
//   the subscription. So the subscriber registered at a position r of W with
//   rLow <= r <= rHigh: rLow is just past the last element of W that took
//   effect before, rHigh the first that took effect after. Subscribers that
//   join before sending have exact brackets (all zero: r = 0).
// - Replay (`replay: k`): a new subscriber first gets the whole window,
//   W[max(0, r - k) ..< r], whatever its policy (a smaller capacity, even 0,
//   does not cut it, and nothing counts as dropped for it); its policy
//   governs what is sent afterwards. One that subscribes after finish is
//   never registered: it gets the last k elements of W, then the end.
// - "Lives through": planned to stay (no cancel(), no task cancellation, no
//   dropped iterator). Such a subscriber is registered from its subscribe
//   until finish, and ends only by draining after finish.
// - Leaving: cancel(), a dropped iterator and task cancellation (once
//   noticed) all end the subscriber the same way: it leaves at once and what
//   it held is discarded (neither received nor dropped). So a subscriber that
//   left is only bounded from above below.
//
// Checked every round
// 1. Operations: a plain `emit` (task never cancelled) never throws. A result
//    with `isFinished` has `delivered == 0 && dropped == 0`. An operation
//    started after a finish was observed (a finisher returned, or any send
//    reported `isFinished`) must report `isFinished`.
// 2. The witness receives exactly D: nothing missing, nothing extra.
// 3. Per subscriber, per producer: sequence numbers strictly increase (in
//    order, no duplicates). Every received element is in D (a cancelled emit
//    or an `isFinished` send reached nobody). The first element received is
//    at position >= max(0, rLow - k) of W (nothing that had left the replay
//    window before subscribe() was called). A subscriber that joined after a
//    finish was observed receives exactly the last k elements of W (a prefix
//    of them if it left before the end). Payload contents match the key.
// 4. Common order: every subscriber's elements appear in W in the same
//    relative order (strictly increasing positions in W).
// 5. `.unbounded`/`.bounded` never drop: `droppedCount == 0`, and what a
//    subscriber received is one contiguous run of W (leaving cuts it short;
//    a gap is a loss). Its first element is the head of the replay window
//    or, with nothing replayed, the first element sent after it subscribed:
//    position <= max(0, rHigh - k) (also for `.bufferingOldest(n > 0)`, and
//    for capacity 0 when the window is certainly not empty). If it lives
//    through, the run ends at the end of W (it loses nothing), and it
//    receives something whenever the window or later sends owe it anything.
//    Together with 2, this is "every delivered emit reached every bounded
//    subscriber that lived through it".
// 6. Dropping policies: received + droppedCount accounts for the replay
//    window and every element offered afterwards: min(k, r) + |W| - r, which
//    does not grow with r, so
//       lo = min(k, rHigh) + |W| - rHigh <= received + dropped <= hi = min(k, rLow) + |W| - rLow
//    for subscribers that live through (EXACT, |W|, for subscribers that
//    joined before sending), and only <= hi for subscribers that left (what
//    they held was discarded). `droppedCount` is read after the subscriber
//    ended; consumers that hold only an iterator (dropped-iterator plans,
//    in-consumer joins) have no reading.
// 7. Drop totals: the `dropped` counts of all results add up to the sum of
//    all subscribers' `droppedCount` (each drop or eviction is counted once
//    in both). Exact when every dropping subscriber's count was read (see
//    6); otherwise the results' sum must be at least the known sum.
// 8. Result counts: every delivered operation counts in `delivered` each
//    subscriber that joined before sending and lives through with a policy
//    that always stores (`.unbounded`, `.bounded`, `.bufferingNewest(n>0)`),
//    and in `delivered + dropped` every such subscriber of any policy; neither
//    count exceeds the number of subscribers (all per element of a batch).
// 9. Terminal: every subscriber that lives through ends the same way as the
//    witness: `nil` if only finish() ran (or the last reference was
//    dropped), the error of a finish(throwing:) if only those ran, and any
//    one outcome if both raced. After the error, next() returns nil; after
//    nil, nil again; after cancel(), nil at once.
// 10. Task cancellation: a consumer that cancels its own task after n calls
//    of next() (each returned an element) gets at most (32 - n % 32) % 32
//    more elements: the iterator reads the flag on calls 0, 32, 64, ..., and
//    a call that would wait notices at once; the call that reads the flag
//    returns nil, never the sequence's error. Checked only for a subscriber
//    certainly registered (made before finish: one made after ignores its
//    task's cancellation).
// 11. A batch is one step: a subscriber takes a `send(contentsOf:)` of L
//    elements at once, so a consumer reading meanwhile never takes one from
//    its middle. Of a batch sent after it registered (W position >= rHigh:
//    nothing of it replayed), a dropping subscriber receives
//    - capacity 0: nothing, or the first element (its reader waited when
//      the batch began; the rest was dropped);
//    - `.bufferingOldest(n)`: a prefix, at most n (what fitted at once;
//      nothing is evicted later);
//    - `.bufferingNewest(n)`: only elements among the batch's last m, m =
//      max(n, k) if replay may have over-filled it (its size then stays), else
//      n: the batch evicted everything older at once.
//    (`.unbounded`/`.bounded` keep every element: rule 5.) Taken per
//    element, a consumer that read (or waited again) between two elements
//    made room mid-batch and received elements from its middle.
// Checked by the round runner (see RoundRunner)
// - Liveness: every task ends before the deadline (watchdog); after the
//   producers end (and before finish), every subscriber that joined before
//   sending and lives through catches up: received (+ droppedCount) reaches |D|.
// - `subscriberCount` equals the early subscribers before sending. When
//   finish comes after the producers and every early subscriber that lives
//   through has caught up (its buffer is empty), those leave at finish: right
//   after finish returns, the count is at most the number of the others. It
//   is 0 as soon as every consumer task has ended (no lag), and `isFinished`
//   is true after the round.
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
        /// Results of delivered operations: their first key, and how many elements.
        var deliveredResults: [(key: Int, result: BroadcastSendResult, elements: Int)] = []
        /// Elements of batches of two or more: where in its batch, and the batch's length.
        var batchPlace: [Int: (position: Int, length: Int)] = [:]
        for producer in observation.producers {
            if producer.ops.count != plan.producers[producer.id].opCount {
                out.add("harness", "producer \(producer.id) ran \(producer.ops.count) of \(plan.producers[producer.id].opCount) ops")
            }
            var nextIndex = 0
            for op in producer.ops {
                if op.firstIndex != nextIndex || op.elements < 1 {
                    out.add("harness", "producer \(producer.id): an op of \(op.elements) elements from #\(op.firstIndex), expected from #\(nextIndex)")
                }
                nextIndex = op.firstIndex + op.elements
                let keys = op.keys(producer: producer.id)
                let key = keys.lowerBound
                let what = op.elements > 1 ? "\(Item.describe(key)) (send(contentsOf:) of \(op.elements))" : Item.describe(key)
                if op.elements > 1 {
                    for (position, element) in keys.enumerated() { batchPlace[element] = (position, op.elements) }
                }
                switch op.outcome {
                case .cancelled:
                    cancelled.formUnion(keys)
                    if op.kind != .cancellableEmit {
                        out.add("emit", "\(what): emit threw CancellationError though its task was never cancelled")
                    }
                case .result(let result):
                    if result.isFinished {
                        finishedKeys.formUnion(keys)
                        if result.delivered != 0 || result.dropped != 0 {
                            out.add("send result", "\(what) reported isFinished but counted \(resultText(result))")
                        }
                    } else {
                        delivered.formUnion(keys)
                        deliveredResults.append((key, result, op.elements))
                        if op.finishSeenBefore {
                            out.add("finish is final", "\(what) (\(op.kind)) started after a finish had returned but delivered (\(resultText(result)))")
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
        for (key, result, elements) in deliveredResults {
            if result.delivered < minDelivered * elements || result.delivered + result.dropped < minTotal * elements
                || result.delivered > maxSubscribers * elements || result.dropped > maxSubscribers * elements
            {
                let per = elements > 1 ? " per element of a batch of \(elements)" : ""
                out.add("send result counts", "\(Item.describe(key)): \(resultText(result)); expected delivered >= \(minDelivered), delivered + dropped >= \(minTotal) (early subscribers that live through), each <= \(maxSubscribers) (all subscribers)\(per)")
            }
        }

        // 11. What a dropping subscriber received of each batch sent after
        // `rHigh` (a batch never straddles it: its elements all start
        // before the call), given that replay may have left it holding up
        // to `replayed` elements.
        func checkBatches(_ record: ConsumerRecord, positions: [Int], from rHigh: Int, replayed: Int) {
            let subscriber = plan.subscribers[record.id]
            let name = "subscriber \(record.id) [\(plan.describe(subscriber)); ended by \(record.end)]"
            var index = 0
            while index < record.received.count {
                let key = record.received[index]
                guard let place = batchPlace[key] else { index += 1; continue }
                // Its elements are consecutive in `received` (a subsequence of W, where a batch is contiguous).
                let first = key - place.position
                var seen: [Int] = []
                while index < record.received.count, let next = batchPlace[record.received[index]],
                    record.received[index] - next.position == first
                {
                    seen.append(next.position)
                    index += 1
                }
                guard positions[index - 1] >= rHigh else { continue }  // may have been replayed
                let length = place.length
                let allowed: String?
                switch record.policy {
                case .bufferingOldest(0), .bufferingNewest(0):
                    allowed = seen.isEmpty || seen == [0] ? nil : "capacity 0: nothing, or the first element"
                case .bufferingOldest(let n):
                    allowed = seen == Array(0..<seen.count) && seen.count <= n ? nil : "a prefix of at most \(n)"
                case .bufferingNewest(let n):
                    let kept = max(n, replayed)
                    allowed =
                        seen.allSatisfy { $0 >= length - kept }
                        ? nil
                        : "only elements among its last \(kept)\(kept > n ? " (replay may have over-filled it)" : "")"
                case .unbounded, .bounded:
                    allowed = nil
                }
                if let allowed {
                    out.add("batch is one step", "\(name) received elements \(seen) of the batch \(Item.describe(first)) ..< #\(Item.index(of: first) + length) (sent after it subscribed); \(record.policy.short) allows \(allowed)")
                }
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
                    out.add(
                        "per-producer order",
                        index == previous
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

            // 4. Common order.
            let positions = record.received.compactMap { position[$0] }
            guard positions.count == record.received.count else { continue }  // reported above
            if let bad = zip(positions, positions.dropFirst()).first(where: { $0 >= $1 }) {
                out.add("common order", "\(name) received \(Item.describe(order[bad.0])) before \(Item.describe(order[bad.1])), the witness the other way round")
                continue
            }

            // 10. Task cancellation (own task: the harness knows the call).
            // Only for a subscriber certainly registered: an element started
            // after its subscribe() returned was delivered, so the sequence
            // had not finished. (One made after finish ignores its task's
            // cancellation and yields the whole replay window.)
            if let cancelledAt = record.ownTaskCancelledAfter,
                order.contains(where: { mustReach($0, join) })
            {
                let unchecked = (32 - cancelledAt % 32) % 32  // calls before the next look at the flag
                let after = record.received.count - cancelledAt
                if after > unchecked {
                    out.add("task cancellation", "\(name) received \(after) elements after cancelling its own task after \(cancelledAt) calls of next(); the flag is read by call \(cancelledAt + unchecked), so at most \(unchecked)")
                } else if after == unchecked, case .error = record.end {
                    out.add("task cancellation", "\(name) cancelled its own task after \(cancelledAt) calls; call \(cancelledAt + unchecked) of next() reads the flag and must return nil, but it threw")
                }
            }

            // 3. + replay. A subscriber that joined after a finish gets
            // exactly the replay window, which is then the last k of W.
            if join.afterFinish {
                let window = Array(order.suffix(plan.replay))
                // It ignores its task's cancellation, but a cancel() by a
                // producer (nil at once) or by itself cuts the window short.
                var readToEnd: Bool
                switch record.end {
                case .end, .error: readToEnd = true
                default: readToEnd = false
                }
                if case .externalCancel = subscriber.leave { readToEnd = false }
                if record.received.count > window.count || Array(window.prefix(record.received.count)) != record.received
                    || (readToEnd && record.received.count != window.count)
                {
                    out.add("replay", "\(name) subscribed after a finish returned, so it gets exactly the replay window (\(readToEnd ? "" : "a prefix of ")\(keys(window))), but received \(keys(record.received))")
                }
                continue
            }

            // Where it registered in W: after every element that returned
            // before subscribe() was called (rLow), before every element that
            // started after it returned (rHigh). Replay gives it
            // W[max(0, r - k) ..< r] first, whatever its policy.
            let replay = plan.replay
            let rLow = (order.lastIndex(where: { !mayReach($0, join) }) ?? -1) + 1
            let rHigh = order.firstIndex(where: { mustReach($0, join) }) ?? order.count
            if rLow > rHigh {
                out.add("subscribe", "\(name): the witness received \(Item.describe(order[rHigh])) (started after subscribe() returned) before \(Item.describe(order[rLow - 1])) (returned before subscribe() was called)")
                continue
            }
            let firstLow = max(0, rLow - replay), firstHigh = max(0, rHigh - replay)
            if let first = positions.first, first < firstLow {
                out.add("subscribe", "\(name) received \(Item.describe(order[first])), which had left the replay window (k = \(replay)) before subscribe() was called")
            }
            // The first element read is the head of the replay window, or
            // the first element sent after subscribing, unless the policy
            // may drop it: capacity 0 with nothing replayed, or an eviction.
            let firstIsExact: Bool
            switch record.policy {
            case .unbounded, .bounded, .bufferingOldest(1...): firstIsExact = true
            case .bufferingOldest, .bufferingNewest(0): firstIsExact = replay > 0 && rLow > 0  // the window is not empty
            case .bufferingNewest: firstIsExact = false
            }
            if firstIsExact, let first = positions.first, first > firstHigh {
                out.add("no loss", "\(name) missed \(keys(order[firstHigh..<first])) (replayed or sent after it subscribed) before its first element \(Item.describe(order[first]))")
            }

            // 11. A batch is one step.
            if !batchPlace.isEmpty, record.policy.mayDrop {
                checkBatches(record, positions: positions, from: rHigh, replayed: replay > 0 && rHigh > 0 ? replay : 0)
            }

            if !record.policy.mayDrop {
                // 5. Never drops: a contiguous run of W.
                if let dropped = record.droppedCount, dropped != 0 {
                    out.add("droppedCount", "\(name): \(record.policy.short) never drops but droppedCount is \(dropped)")
                }
                if !positions.isEmpty {
                    if let gap = zip(positions, positions.dropFirst()).first(where: { $1 != $0 + 1 }) {
                        out.add("no loss", "\(name) lost \(keys(order[(gap.0 + 1)..<gap.1])) between \(Item.describe(order[gap.0])) and \(Item.describe(order[gap.1]))")
                    }
                    if subscriber.livesThrough, let lastPosition = positions.last, lastPosition != order.count - 1 {
                        out.add("no loss", "\(name) lost its tail: last received \(Item.describe(order[lastPosition])), then \(keys(order[(lastPosition + 1)...])) never arrived")
                    }
                } else if subscriber.livesThrough, firstHigh < order.count {
                    out.add("no loss", "\(name) received nothing, though \(keys(order[firstHigh...])) were replayed to it or sent after it subscribed")
                }
            } else if let dropped = record.droppedCount {
                // 6. Dropping policies: received + dropped accounts for the
                // replay window and every element offered afterwards:
                // min(k, r) + |W| - r, which does not grow with r.
                func accounted(_ r: Int) -> Int { min(replay, r) + order.count - r }
                let low = accounted(rHigh), high = accounted(rLow)
                let total = record.received.count + dropped
                let bound = low == high ? "exactly \(low)" : "between \(low) and \(high)"
                if subscriber.livesThrough ? (total < low || total > high) : total > high {
                    out.add("drop accounting", "\(name): received \(record.received.count) + droppedCount \(dropped) = \(total), but \(subscriber.livesThrough ? bound : "at most \(high)") elements were replayed or offered to it")
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
        let codes = finishers.compactMap { kind -> Int? in
            if case .throwing(let code) = kind { return code }; return nil
        }
        let witnessEnd = witness.end
        let expectation: String
        let allowed: (ConsumerEnd) -> Bool
        if codes.isEmpty {
            expectation = finishers.isEmpty ? "nil (the last reference was dropped)" : "nil (only finish() ran)"
            allowed = { $0 == .end }
        } else if codes.count == finishers.count {
            expectation = "one of the errors \(codes) (only finish(throwing:) ran)"
            allowed = {
                if case .error(let code) = $0 { return codes.contains(code) }; return false
            }
        } else {
            expectation = "nil or one of the errors \(codes) (finish() raced finish(throwing:))"
            allowed = {
                if case .error(let code) = $0 { return codes.contains(code) }; return $0 == .end
            }
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
