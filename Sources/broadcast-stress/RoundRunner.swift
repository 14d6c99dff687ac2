@_spi(Testing) import AsyncBroadcast

struct RoundReport {
    var violations: [Violation]
    var duration: Double
    var ops: Int
    var delivered: Int
    var received: Int
}

/// Runs one round: builds the sequence, subscribers and producers from the
/// plan, lets them race, ends the sequence per the finish mode, waits for
/// everything, then checks the invariants.
enum RoundRunner {
    static func run(_ plan: RoundPlan, header: [String], options: Options) async -> RoundReport {
        let start = monotonicSeconds()
        var violations: [Violation] = []

        var sequence: Stream? = Stream(bufferingPolicy: plan.defaultPolicy, replay: plan.replay)
        weak let weakSequence = sequence
        let holder = SequenceHolder(sequence!)
        let context = RoundContext(plan: plan, holder: holder)
        watchdog.beginRound(
            .init(
                number: 0, header: header, deadlineAt: start + options.deadline,
                deadline: options.deadline,
                sequenceState: {
                    guard let sequence = holder.get() else { return "last reference dropped" }
                    return "subscriberCount \(sequence.subscriberCount), waitingEmitterCount \(sequence.waitingEmitterCount), isFinished \(sequence.isFinished)"
                }))
        defer { watchdog.endRound() }

        // Subscribers that join before sending: all registered before any consumer runs.
        var early: [(SubscriberSlot, Stream.Subscription)] = []
        for slot in context.slots where slot.plan.joinsBeforeSending {
            slot.setJoin(.beforeSending(producers: plan.producers.count))
            early.append((slot, sequence!.subscribe(bufferingPolicy: slot.policyArgument)))
        }
        let countBefore = sequence!.subscriberCount
        if countBefore != early.count {
            violations.append(Violation(invariant: "subscriberCount", detail: "\(countBefore) after \(early.count) subscribe() calls, before sending"))
        }
        for (slot, subscription) in early { context.startConsumer(slot, subscription: subscription) }
        early.removeAll()

        // Producers (their chaos actions join, cancel and finish during sending).
        var producers = await withTaskGroup(of: ProducerRecord.self) { group in
            for producer in plan.producers {
                group.addTask { await Producer.run(context, producer) }
            }
            var records: [ProducerRecord] = []
            for await record in group { records.append(record) }
            return records
        }
        producers.sort { $0.id < $1.id }

        switch plan.finishMode {
        case .afterProducers:
            let behind = await quiesce(context, producers: producers, timeout: options.deadline * 0.5)
            violations += behind
            for finisher in plan.finishers { context.startFinisher(finisher.id, sequence: sequence!) }
            if behind.isEmpty {
                // Every early subscriber that lives through has caught up:
                // its buffer is empty, so it leaves at finish, at once (one
                // that still holds elements leaves when it takes the last).
                await context.awaitFinishers()
                let idle = context.slots.filter { $0.plan.joinsBeforeSending && $0.plan.livesThrough }.count
                let bound = context.slots.count - idle
                let count = sequence!.subscriberCount
                if count > bound {
                    violations.append(Violation(invariant: "subscriberCount", detail: "\(count) right after finish returned; \(idle) of the \(context.slots.count) subscribers had drained everything (they leave at finish), so at most \(bound)"))
                }
                Coverage.add("finish:idle-subscribers-left", idle)
            }
        case .racing:
            break  // the producers ran the finishers
        case .dropReference:
            violations += await quiesce(context, producers: producers, timeout: options.deadline * 0.5)
            Coverage.add("drop-reference:consumers-parked", context.slots.filter { $0.isParked }.count)
            holder.clear()
            sequence = nil  // the last reference: the sequence finishes while consumers wait
        }

        let waiting = watchdog.register { "round: waiting for every consumer task to end" }
        for slot in context.slots { await slot.task?.value }
        await context.awaitFinishers()
        watchdog.unregister(waiting)

        if let sequence {
            if !sequence.isFinished {
                violations.append(Violation(invariant: "isFinished", detail: "false after the round finished"))
            }
            // A subscriber leaves at once when it ends (nil, error, cancel(),
            // release, task cancellation noticed): no lag is allowed.
            let count = sequence.subscriberCount
            if count != 0 {
                let settled = await settle { sequence.subscriberCount }
                violations.append(Violation(invariant: "subscriberCount", detail: "\(count) after every subscriber ended (expected 0 at once; \(settled) a second later)"))
            }
        } else if weakSequence != nil {
            violations.append(Violation(invariant: "leak", detail: "the sequence outlived its last reference"))
        }

        let consumers = context.slots.map { slot in slot.record ?? ConsumerRecord(id: slot.plan.id, policy: slot.policy) }
        let observation = RoundObservation(
            plan: plan, producers: producers, consumers: consumers,
            executedFinishers: context.executedFinishers)
        violations += context.violations

        // Drop every reference, then nothing may be left alive.
        for slot in context.slots { slot.release() }
        holder.clear()
        sequence = nil
        if await settle({ weakSequence == nil ? 0 : 1 }) != 0 {
            violations.append(Violation(invariant: "leak", detail: "the sequence is still alive after the round released it"))
        }
        let live = await settle { LiveObjects.count.value }
        if live != 0 {
            violations.append(Violation(invariant: "leak", detail: "\(live) payload objects still alive after the round released everything"))
            LiveObjects.count.withLock { $0 = 0 }  // report each leak once
        }

        violations += InvariantChecker.check(observation)
        recordCoverage(observation)
        let delivered = producers.reduce(0) { sum, producer in
            sum
                + producer.ops.reduce(0) { count, op in
                    if case .result(let result) = op.outcome, !result.isFinished { return count + op.elements }
                    return count
                }
        }
        return RoundReport(
            violations: violations, duration: monotonicSeconds() - start, ops: plan.totalOps,
            delivered: delivered, received: consumers.reduce(0) { $0 + $1.received.count })
    }

    private static func recordCoverage(_ observation: RoundObservation) {
        Coverage.add("rounds:\(observation.plan.finishMode)")
        var finished = 0, dropped = 0
        for producer in observation.producers {
            for op in producer.ops {
                guard case .result(let result) = op.outcome else { continue }
                if result.isFinished { finished += 1 }
                dropped += result.dropped
            }
        }
        Coverage.add("ops:isFinished", finished)
        Coverage.add("drops", dropped)
        for record in observation.consumers where record.joined {
            if record.join?.afterFinish == true { Coverage.add("join:after-finish") }
            if let join = record.join, !join.isExact { Coverage.add("join:racing-sends") }
            if case .error = record.end { Coverage.add("end:error") }
        }
    }

    /// Polls `value` for up to a second until it is 0 (releases triggered by
    /// the last steps may complete on other threads a moment later).
    private static func settle(_ value: () -> Int) async -> Int {
        let deadline = monotonicSeconds() + 1
        while true {
            let current = value()
            if current == 0 || monotonicSeconds() > deadline { return current }
            try? await Task.sleep(nanoseconds: 1_000_000)
        }
    }

    /// After the producers end and before the sequence finishes: every
    /// subscriber that joined before sending and lives through must catch up
    /// with everything delivered (received, or dropped for dropping
    /// policies) without any finish to wake it.
    private static func quiesce(_ context: RoundContext, producers: [ProducerRecord], timeout: Double) async -> [Violation] {
        let expected = producers.reduce(0) { sum, producer in
            sum
                + producer.ops.reduce(0) { count, op in
                    if case .result(let result) = op.outcome, !result.isFinished { return count + op.elements }
                    return count
                }
        }
        let watched = context.slots.filter { $0.plan.joinsBeforeSending && $0.plan.livesThrough }
        func caughtUp(_ slot: SubscriberSlot) -> Bool {
            if slot.hasEnded { return true }  // ended early: the checker reports it
            if !slot.policy.mayDrop { return slot.received >= expected }
            guard let subscription = slot.observedSubscription else { return true }
            return slot.received + subscription.droppedCount >= expected
        }
        let token = watchdog.register { "round: quiescence (early subscribers catching up with \(expected) delivered elements)" }
        defer { watchdog.unregister(token) }
        let deadline = monotonicSeconds() + timeout
        while true {
            let behind = watched.filter { !caughtUp($0) }
            if behind.isEmpty { return [] }
            if monotonicSeconds() > deadline {
                return behind.prefix(6).map { slot in
                    Violation(invariant: "liveness", detail: "\(slot.status()) has not accounted for all \(expected) delivered elements \(formatSeconds(timeout)) after the producers ended (no finish yet): a parked consumer not woken, or elements lost or miscounted")
                }
            }
            try? await Task.sleep(nanoseconds: 1_000_000)
        }
    }
}
