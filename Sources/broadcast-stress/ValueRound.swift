@_spi(Testing) import AsyncBroadcast
import AsyncBroadcastTestSupport

// Value rounds: `BroadcastValue<V, StressError>` with V `Equatable` or not.
// 1-6 writers (tasks and raw threads) send/update strictly increasing seqs
// (plus equal writes, throwing updates and reads), while 1-48 subscribers
// join (before writing, from a producer, from a consumer task, from an
// already cancelled task) and leave (cancel(), dropped iterator, own or
// external task cancellation); finish() / finish(throwing:) race the writers,
// come after them, or the last reference is dropped. See ValueChecker for
// the invariants.

enum ValueConsumerSource<V: StressValue>: Sendable {
    case subscription(TakeOnce<BroadcastValue<V, StressError>.Subscription>)
    /// `makeAsyncIterator()` on the value itself.
    case value
    /// The task cancelled itself first: `subscribe()` or `makeAsyncIterator()`.
    case cancelledTask(viaSubscribe: Bool)
}

enum ValueConsumer {
    static func run<V: StressValue>(_ context: ValueRoundContext<V>, _ slot: ValueSlot<V>, _ source: ValueConsumerSource<V>) async {
        typealias Subscription = BroadcastValue<V, StressError>.Subscription
        let plan = slot.plan
        let token = watchdog.register { slot.status() }
        defer { watchdog.unregister(token) }

        var record = ValueConsumerRecord(id: plan.id)
        var subscription: Subscription?
        var iterator: Subscription.AsyncIterator?
        switch source {
        case .subscription(let box):
            record.join = slot.join
            if case .dropIteratorAfter = plan.leave {
                iterator = box.take()?.makeAsyncIterator()
            } else {
                subscription = box.take()
                iterator = subscription?.makeAsyncIterator()
            }
        case .value:
            let (join, made) = context.iteratorNow()
            record.join = join
            iterator = made
        case .cancelledTask(let viaSubscribe):
            if viaSubscribe {
                let (join, made) = context.subscribeNow()
                record.join = join
                if let made { slot.attach(made) }
                iterator = made?.makeAsyncIterator()
            } else {
                let (join, made) = context.iteratorNow()
                record.join = join
                iterator = made
            }
        }
        guard iterator != nil else {
            slot.finish(record)
            return
        }
        record.joined = true
        slot.markJoined()
        let exact = context.plan.mode.isExact

        var count = 0
        var sleeps = 0
        var left = false
        reading: while true {
            if !left {
                switch plan.leave {
                case .cancelAfter(let n) where count >= n:
                    left = true
                    subscription?.cancel()
                    do {
                        if let value = try await iterator!.next() {
                            record.notes.append("next() returned v\(value.seq) after cancel()")
                        }
                    } catch {
                        record.notes.append("next() threw StressError(\(error.code)) after cancel()")
                    }
                    record.end = .cancelledByConsumer
                    break reading
                case .dropIteratorAfter(let n) where count >= n:
                    left = true
                    iterator = nil
                    record.end = .droppedIterator
                    break reading
                case .cancelOwnTaskAfter(let n) where count >= n:
                    left = true
                    record.ownTaskCancelledAfter = count
                    withUnsafeCurrentTask { $0?.cancel() }
                default:
                    break
                }
            }

            let floor = exact ? context.committedNow() : 0
            let next: V?
            do {
                next = try await iterator!.next()
            } catch {
                record.end = .error(error.code)
                await expectEnd(&iterator!, after: "the error", into: &record)
                break reading
            }
            guard let value = next else {
                record.end = .end
                await expectEnd(&iterator!, after: "nil", into: &record)
                break reading
            }
            if let problem = value.integrityProblem() { record.notes.append(problem) }
            record.received.append(value.seq)
            record.floors.append(floor)
            count += 1
            slot.setProgress(count, last: value.seq)

            switch plan.slowness {
            case .fast:
                break
            case .yielding(let every):
                if count % every == 0 { await Task.yield() }
            case .sleeping(let every, let micros, let maxSleeps):
                if count % every == 0 && sleeps < maxSleeps {
                    sleeps += 1
                    try? await Task.sleep(nanoseconds: UInt64(micros) * 1000)
                }
            }
        }
        slot.finish(record)
    }

    private static func expectEnd<V: StressValue>(
        _ iterator: inout BroadcastValue<V, StressError>.Subscription.AsyncIterator,
        after what: String, into record: inout ValueConsumerRecord
    ) async {
        do {
            if let value = try await iterator.next() {
                record.notes.append("next() returned v\(value.seq) after \(what)")
            }
        } catch {
            record.notes.append("next() threw StressError(\(error.code)) after \(what)")
        }
    }
}

enum ValueProducer {
    static func run<V: StressValue>(_ context: ValueRoundContext<V>, _ plan: ValueProducerPlan) async -> ValueProducerRecord {
        let token = watchdog.register { context.producerStatus(plan.id) }
        defer { watchdog.unregister(token) }
        if plan.onThread {
            return await withCheckedContinuation { continuation in
                spawnThread { continuation.resume(returning: runOps(context, plan, onThread: true)) }
            }
        }
        return await runInTask(context, plan)
    }

    private static func runInTask<V: StressValue>(_ context: ValueRoundContext<V>, _ plan: ValueProducerPlan) async -> ValueProducerRecord {
        var record = ValueProducerRecord(id: plan.id)
        guard let value = context.value else { return record }
        record.ops.reserveCapacity(plan.opCount)
        var rng = SplitMix64(seed: plan.seed)
        for index in 0..<plan.opCount {
            if let actions = plan.actions[index] {
                for action in actions {
                    await context.yieldUntilParked(action)
                    context.perform(action, on: value)
                }
            }
            let kind = ValueOpKind(rawValue: rng.weighted(plan.weights))!
            record.ops.append(context.perform(kind, producer: plan.id, op: index, on: value, inPlace: rng.chance(0.5)))
            if plan.yieldEvery > 0 && index % plan.yieldEvery == 0 { await Task.yield() }
        }
        return record
    }

    private static func runOps<V: StressValue>(_ context: ValueRoundContext<V>, _ plan: ValueProducerPlan, onThread: Bool) -> ValueProducerRecord {
        var record = ValueProducerRecord(id: plan.id)
        guard let value = context.value else { return record }
        record.ops.reserveCapacity(plan.opCount)
        var rng = SplitMix64(seed: plan.seed)
        for index in 0..<plan.opCount {
            if let actions = plan.actions[index] {
                for action in actions {
                    context.spinUntilParked(action)
                    context.perform(action, on: value)
                }
            }
            let kind = ValueOpKind(rawValue: rng.weighted(plan.weights))!
            record.ops.append(context.perform(kind, producer: plan.id, op: index, on: value, inPlace: rng.chance(0.5)))
            if plan.yieldEvery > 0 && index % plan.yieldEvery == 0 { yieldThread() }
        }
        return record
    }
}

struct ValueObservation {
    let plan: ValueRoundPlan
    let producers: [ValueProducerRecord]
    let consumers: [ValueConsumerRecord]
    let logs: [ChangeLog]
    /// The seq of the final value (read once writers and finishers were done).
    let final: Int
    let executedFinishers: [FinishKind]
}

enum ValueRoundRunner<V: StressValue> {
    typealias Value = BroadcastValue<V, StressError>

    static func run(_ plan: ValueRoundPlan, header: [String], options: Options) async -> RoundReport {
        let start = monotonicSeconds()
        var violations: [Violation] = []

        var value: Value? = Value(V(seq: 0, producer: -1, payload: plan.payload), throwing: StressError.self)
        weak let weakValue = value
        let context = ValueRoundContext<V>(plan: plan, value: value!)
        watchdog.beginRound(
            .init(
                number: 0, header: header, deadlineAt: start + options.deadline,
                deadline: options.deadline, sequenceState: { context.state() }))
        defer { watchdog.endRound() }

        // Subscribers that join before writing.
        var early: [(ValueSlot<V>, Value.Subscription)] = []
        for slot in context.slots where slot.plan.joinsBeforeWriting {
            slot.setJoin(.beforeWriting(producers: plan.producers.count))
            early.append((slot, value!.subscribe()))
        }
        let countBefore = value!.subscriberCount
        if countBefore != early.count {
            violations.append(Violation(invariant: "subscriberCount", detail: "\(countBefore) after \(early.count) subscribe() calls, before writing"))
        }
        for (slot, subscription) in early { context.startConsumer(slot, subscription: subscription) }
        early.removeAll()

        var producers = await withTaskGroup(of: ValueProducerRecord.self) { group in
            for producer in plan.producers {
                group.addTask { await ValueProducer.run(context, producer) }
            }
            var records: [ValueProducerRecord] = []
            for await record in group { records.append(record) }
            return records
        }
        producers.sort { $0.id < $1.id }

        var final = value!.value.seq
        switch plan.finishMode {
        case .afterProducers:
            violations += countChanges(context, value!)
            let behind = await quiesce(context, final: final, timeout: options.deadline * 0.5)
            violations += behind
            if behind.isEmpty { violations += await probe(context, value!, final: final, timeout: options.deadline * 0.25) }
            showIfHung(violations)
            for finisher in plan.finishers { context.startFinisher(finisher.id, value: value!) }
            await context.awaitFinishers()
            if behind.isEmpty {
                // Every subscriber that stays had seen the last value: each
                // leaves at finish, at once.
                let idle = context.slots.filter { $0.plan.livesThrough }.count
                let bound = context.slots.count - idle
                let count = value!.subscriberCount
                if count > bound {
                    violations.append(Violation(invariant: "subscriberCount", detail: "\(count) right after finish returned; \(idle) of the \(context.slots.count) subscribers had seen the last value (they leave at finish), so at most \(bound)"))
                }
            }
        case .racing:
            break
        case .dropReference:
            violations += countChanges(context, value!)
            let behind = await quiesce(context, final: final, timeout: options.deadline * 0.5)
            violations += behind
            if behind.isEmpty { violations += await probe(context, value!, final: final, timeout: options.deadline * 0.25) }
            showIfHung(violations)
            Coverage.add("value:drop-reference:consumers-parked", context.slots.filter { $0.isParked }.count)
            context.dropValue()
            value = nil  // the last reference: it finishes while consumers wait
        }

        let waiting = watchdog.register { "round: waiting for every value consumer task to end" }
        for slot in context.slots { await slot.task?.value }
        await context.awaitFinishers()
        watchdog.unregister(waiting)

        if let value {
            final = value.value.seq  // final now: every writer and finisher is done
            if !value.isFinished {
                violations.append(Violation(invariant: "isFinished", detail: "false after the round finished"))
            }
            let count = value.subscriberCount
            if count != 0 {
                let settled = await settle { value.subscriberCount }
                violations.append(Violation(invariant: "subscriberCount", detail: "\(count) after every subscriber ended (expected 0 at once; \(settled) a second later)"))
            }
            let parked = value.parkedSubscriberCount
            if parked != 0 {
                violations.append(Violation(invariant: "parkedSubscriberCount", detail: "\(parked) after every consumer task ended"))
            }
            let after = value.update { (current: inout V) -> Int in
                current = V(seq: -5, producer: -5, payload: plan.payload)
                return current.seq
            }
            if after != -5 || value.value.seq != final {
                violations.append(Violation(invariant: "finish is final", detail: "update after finish changed the value to v\(value.value.seq) (expected v\(final))"))
            }
            value.send(V(seq: -6, producer: -6, payload: plan.payload))
            if value.value.seq != final {
                violations.append(Violation(invariant: "finish is final", detail: "send after finish changed the value to v\(value.value.seq) (expected v\(final))"))
            }
        } else if weakValue != nil {
            violations.append(Violation(invariant: "leak", detail: "the BroadcastValue outlived its last reference (its subscriptions must not keep it alive)"))
        }

        let consumers = context.slots.map { $0.record ?? ValueConsumerRecord(id: $0.plan.id) }
        let observation = ValueObservation(
            plan: plan, producers: producers, consumers: consumers, logs: context.logs,
            final: final, executedFinishers: context.executedFinishers)
        violations += context.violations

        for slot in context.slots { slot.release() }
        context.dropValue()
        value = nil
        if await settle({ weakValue == nil ? 0 : 1 }) != 0 {
            violations.append(Violation(invariant: "leak", detail: "the BroadcastValue is still alive after the round released it"))
        }
        let alive = await settle { context.slots.filter(\.subscriptionAlive).count }
        if alive != 0 {
            violations.append(Violation(invariant: "leak", detail: "\(alive) subscriptions still alive after their consumers ended and the round released everything"))
        }
        let live = await settle { LiveObjects.count.value }
        if live != 0 {
            violations.append(Violation(invariant: "leak", detail: "\(live) payload objects still alive after the round released everything"))
            LiveObjects.count.withLock { $0 = 0 }
        }

        violations += ValueChecker.check(observation)
        recordCoverage(observation)
        let changes = observation.logs.filter { $0.fresh || $0.republish }.count
        return RoundReport(
            violations: violations, duration: monotonicSeconds() - start, ops: plan.totalOps,
            delivered: changes, received: consumers.reduce(0) { $0 + $1.received.count })
    }

    /// Violations found so far, for the watchdog's report if the round then
    /// hangs (its report replaces the round's).
    private static func showIfHung(_ violations: [Violation]) {
        for violation in violations.prefix(4) {
            _ = watchdog.register { "(found before the hang) \(violation)" }
        }
    }

    /// Once the writers are done and before any finish: `changeCount` equals
    /// the changes the writers made (fresh values, and same-content writes
    /// to a non-Equatable value; equal writes to an Equatable one are not changes).
    private static func countChanges(_ context: ValueRoundContext<V>, _ value: Value) -> [Violation] {
        let logs = context.logs
        let expected = logs.filter { $0.fresh || $0.republish }.count
        let equal = logs.filter { !$0.fresh && !$0.republish }.count
        let count = value.changeCount
        guard count != expected else { return [] }
        return [Violation(invariant: "changeCount", detail: "\(count) after the writers ended; they made \(expected) changes (and \(equal) writes equal to the current \(V.typeName) value)")]
    }

    /// After the writers end, before finish: every subscriber that stays
    /// sees the last value and parks, with no finish to wake it.
    private static func quiesce(_ context: ValueRoundContext<V>, final: Int, timeout: Double) async -> [Violation] {
        let watched = context.slots.filter { $0.plan.livesThrough }
        func caughtUp(_ slot: ValueSlot<V>) -> Bool {
            let progress = slot.progress
            if progress.ended { return true }  // reported below
            return progress.joined && progress.last == final && slot.parked != false
        }
        let token = watchdog.register { "round: quiescence (subscribers that stay catching up with v\(final))" }
        defer { watchdog.unregister(token) }
        let deadline = monotonicSeconds() + timeout
        while true {
            let behind = watched.filter { !caughtUp($0) }
            if behind.isEmpty { break }
            if monotonicSeconds() > deadline {
                return behind.prefix(6).map { slot in
                    Violation(invariant: "liveness", detail: "\(slot.status()) has not seen the last value v\(final) and parked \(formatSeconds(timeout)) after the writers ended (no finish yet): a parked reader not woken, or a change lost")
                }
            }
            try? await Task.sleep(nanoseconds: 1_000_000)
        }
        let ended = watched.filter(\.hasEnded)
        return ended.prefix(4).map { slot in
            Violation(invariant: "ended early", detail: "\(slot.status()) stays, but ended before any finish")
        }
    }

    /// With everyone caught up and parked: equal writes to an Equatable value
    /// wake nobody and change nothing; a same-content write to a
    /// non-Equatable one is a change that every parked subscriber receives.
    private static func probe(_ context: ValueRoundContext<V>, _ value: Value, final: Int, timeout: Double) async -> [Violation] {
        var violations: [Violation] = []
        let watched = context.slots.filter { $0.plan.livesThrough && !$0.hasEnded }
        let before = watched.map(\.progress.received)
        let parkedBefore = watched.filter { $0.parked == true }.count
        let changes = value.changeCount, wakes = value.wakeCount
        let parkedCount = value.parkedSubscriberCount
        if parkedCount < parkedBefore {
            violations.append(Violation(invariant: "parkedSubscriberCount", detail: "\(parkedCount), but \(parkedBefore) subscriptions report a reader parked in next()"))
        }
        if V.isEquatableKind {
            for index in 0..<context.plan.probeWrites {
                switch index % 3 {
                case 0: value.send(value.value.copy())
                case 1: _ = context.perform(.updateNoop, producer: -1, op: index, on: value, inPlace: false)
                default: _ = context.perform(.updateCopy, producer: -1, op: index, on: value, inPlace: false)
                }
            }
            for _ in 0..<20 { await Task.yield() }
            try? await Task.sleep(nanoseconds: 2_000_000)
            let after = watched.map(\.progress.received)
            if value.changeCount != changes || value.wakeCount != wakes || after != before {
                let woken = zip(watched, zip(before, after)).filter { $1.0 != $1.1 }.map { "subscriber \($0.0.plan.id)" }
                violations.append(Violation(invariant: "equal writes", detail: "\(context.plan.probeWrites) writes equal to the current Equatable value v\(final) (send, update no-op, update with a copy) are not changes: changeCount \(changes) -> \(value.changeCount), wakeCount \(wakes) -> \(value.wakeCount), received by \(woken.isEmpty ? "nobody" : woken.joined(separator: ", "))"))
            }
            Coverage.add("value:equal-probe")
            return violations
        }
        // Non-Equatable: one same-content write, a change.
        _ = context.perform(.updateNoop, producer: -1, op: 0, on: value, inPlace: false)
        if value.changeCount != changes + 1 {
            violations.append(Violation(invariant: "changeCount", detail: "\(changes) -> \(value.changeCount) after an update that kept the non-Equatable value v\(final) (every update is a change)"))
        }
        let deadline = monotonicSeconds() + timeout
        while true {
            let lagging = zip(watched, before).filter { slot, count in
                let progress = slot.progress
                return !progress.ended && (progress.received < count + 1 || slot.parked == false)
            }
            if lagging.isEmpty { break }
            if monotonicSeconds() > deadline {
                for (slot, count) in lagging.prefix(4) {
                    violations.append(Violation(invariant: "liveness", detail: "\(slot.status()): an update that kept the non-Equatable value v\(final) is a change, yet it was not delivered within \(formatSeconds(timeout)) (received \(count) before it)"))
                }
                return violations
            }
            try? await Task.sleep(nanoseconds: 1_000_000)
        }
        let over = zip(watched, before).filter { $0.0.progress.received > $0.1 + 1 }
        for (slot, count) in over.prefix(4) {
            violations.append(Violation(invariant: "duplicate", detail: "\(slot.status()): one same-content change, but it received \(slot.progress.received - count) values"))
        }
        if value.wakeCount < wakes + parkedBefore {
            violations.append(Violation(invariant: "wakeCount", detail: "\(wakes) -> \(value.wakeCount) after a change with \(parkedBefore) readers parked"))
        }
        Coverage.add("value:republish-probe")
        return violations
    }

    private static func settle(_ value: () -> Int) async -> Int {
        let deadline = monotonicSeconds() + 1
        while true {
            let current = value()
            if current == 0 || monotonicSeconds() > deadline { return current }
            try? await Task.sleep(nanoseconds: 1_000_000)
        }
    }

    private static func recordCoverage(_ observation: ValueObservation) {
        let plan = observation.plan
        Coverage.add("rounds:value:\(plan.mode):\(V.isEquatableKind ? "eq" : "plain"):\(plan.finishMode)")
        let logs = observation.logs
        Coverage.add("value:changes", logs.filter { $0.fresh }.count)
        Coverage.add("value:equal-writes", logs.filter { !$0.fresh && !$0.republish }.count)
        Coverage.add("value:republish", logs.filter { $0.republish }.count)
        let discarded = logs.filter { $0.fresh && $0.new > observation.final }.count
        if plan.mode.isExact { Coverage.add("value:writes-after-finish", discarded) }
        for record in observation.consumers where record.joined {
            if record.join?.afterFinish == true { Coverage.add("value:join:after-finish") }
            if case .error = record.end { Coverage.add("value:end:error") }
            if case .inCancelledTask = plan.subscribers[record.id].join { Coverage.add("value:join:cancelled-task") }
            // Conflation: it skipped values.
            if record.received.count >= 2, zip(record.received, record.received.dropFirst()).contains(where: { $1 > $0 + 1 }) {
                Coverage.add("value:conflated-readers")
            }
        }
    }
}
