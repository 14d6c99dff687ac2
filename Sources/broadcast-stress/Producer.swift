@_spi(Testing) import AsyncBroadcast
import AsyncBroadcastTestSupport

/// A producer: runs its operations in order (so its sequence numbers are its
/// program order), and the chaos actions attached to them. Some of its
/// `send`s are `send(contentsOf:)` of several elements (see `Batching`);
/// elements, not operations, carry the sequence numbers.
enum Producer {
    static func run(_ context: RoundContext, _ plan: ProducerPlan) async -> ProducerRecord {
        let token = watchdog.register { context.producerStatus(plan.id) }
        defer { watchdog.unregister(token) }
        if plan.onThread {
            return await withCheckedContinuation { continuation in
                spawnThread {
                    continuation.resume(returning: runOnThread(context, plan))
                }
            }
        }
        return await runInTask(context, plan)
    }

    private static func runInTask(_ context: RoundContext, _ plan: ProducerPlan) async -> ProducerRecord {
        var record = ProducerRecord(id: plan.id)
        guard let sequence = context.holder.get() else { return record }
        record.ops.reserveCapacity(plan.opCount)
        var rng = SplitMix64(seed: plan.seed)
        var batching = Batching(plan)
        var next = 0  // the next element's index
        for index in 0..<plan.opCount {
            if let actions = plan.actions[index] {
                for action in actions {
                    await context.yieldUntilParked(action)
                    context.perform(action, sequence: sequence)
                }
            }
            var kind = OpKind.send
            if rng.chance(plan.emitChance) { kind = rng.chance(plan.cancellableChance) ? .cancellableEmit : .emit }
            let waitForParkedEmitter = rng.chance(0.6)
            let yieldsBeforeCancel = rng.int(in: 0...3)
            let elements = kind == .send ? batching.nextLength() : 1
            let first = next
            next += elements
            if elements > 1 {
                let (outcome, finishSeen) = sendBatch(context, plan, sequence, first: first, elements: elements)
                record.ops.append(
                    OpRecord(
                        kind: .send, outcome: outcome, finishSeenBefore: finishSeen,
                        firstIndex: first, elements: elements))
                if plan.yieldEvery > 0 && index % plan.yieldEvery == 0 { await Task.yield() }
                continue
            }
            let item = Item(producer: plan.id, index: first, payload: plan.payload)

            let finishSeen = context.beginOp(producer: plan.id, index: first, kind: kind)
            let outcome: OpOutcome
            switch kind {
            case .send:
                outcome = .result(sequence.send(item))
            case .emit:
                do {
                    outcome = .result(try await sequence.emit(item))
                } catch {
                    outcome = .cancelled
                }
            case .cancellableEmit:
                let emitter = watchdog.register { "emitter p\(plan.id)#\(first) (emit cancelled by its producer)" }
                let child = Task { try await sequence.emit(item) }
                if waitForParkedEmitter {
                    for _ in 0..<RoundContext.parkSpins where sequence.waitingEmitterCount == 0 { await Task.yield() }
                } else {
                    for _ in 0..<yieldsBeforeCancel { await Task.yield() }
                }
                let wasWaiting = sequence.waitingEmitterCount > 0
                child.cancel()
                switch await child.result {
                case .success(let result): outcome = .result(result)
                case .failure: outcome = .cancelled
                }
                if case .cancelled = outcome {
                    Coverage.add("emit:cancelled")
                } else {
                    Coverage.add(wasWaiting ? "emit:cancel-too-late(others waiting)" : "emit:cancel-too-late")
                }
                watchdog.unregister(emitter)
            }
            context.endOp(producer: plan.id, index: first, reportedFinished: outcome.isFinished)
            record.ops.append(OpRecord(kind: kind, outcome: outcome, finishSeenBefore: finishSeen, firstIndex: first))
            if plan.yieldEvery > 0 && index % plan.yieldEvery == 0 { await Task.yield() }
        }
        return record
    }

    /// Thread producers only `send` (it never suspends).
    private static func runOnThread(_ context: RoundContext, _ plan: ProducerPlan) -> ProducerRecord {
        var record = ProducerRecord(id: plan.id)
        guard let sequence = context.holder.get() else { return record }
        record.ops.reserveCapacity(plan.opCount)
        var batching = Batching(plan)
        var next = 0  // the next element's index
        for index in 0..<plan.opCount {
            if let actions = plan.actions[index] {
                for action in actions {
                    context.spinUntilParked(action)
                    context.perform(action, sequence: sequence)
                }
            }
            let elements = batching.nextLength()
            let first = next
            next += elements
            if elements > 1 {
                let (outcome, finishSeen) = sendBatch(context, plan, sequence, first: first, elements: elements)
                record.ops.append(
                    OpRecord(
                        kind: .send, outcome: outcome, finishSeenBefore: finishSeen,
                        firstIndex: first, elements: elements))
            } else {
                let item = Item(producer: plan.id, index: first, payload: plan.payload)
                let finishSeen = context.beginOp(producer: plan.id, index: first, kind: .send)
                let outcome = OpOutcome.result(sequence.send(item))
                context.endOp(producer: plan.id, index: first, reportedFinished: outcome.isFinished)
                record.ops.append(OpRecord(kind: .send, outcome: outcome, finishSeenBefore: finishSeen, firstIndex: first))
            }
            if plan.yieldEvery > 0 && index % plan.yieldEvery == 0 { yieldThread() }
        }
        return record
    }

    /// `send(contentsOf:)` of the elements `first ..< first + elements`.
    /// The join bracket treats them as one operation: all of them start
    /// before the call and complete after it (the sequence takes a batch in
    /// one step, so a subscriber registers before all of it or after).
    private static func sendBatch(
        _ context: RoundContext, _ plan: ProducerPlan, _ sequence: Stream,
        first: Int, elements: Int
    ) -> (OpOutcome, Bool) {
        let items = (first..<(first + elements)).map { Item(producer: plan.id, index: $0, payload: plan.payload) }
        let last = first + elements - 1
        let finishSeen = context.beginOp(producer: plan.id, index: last, kind: .send)
        let outcome = OpOutcome.result(sequence.send(contentsOf: items))
        context.endOp(producer: plan.id, index: last, reportedFinished: outcome.isFinished)
        Coverage.add("send(contentsOf:)")
        return (outcome, finishSeen)
    }
}

/// Which of a producer's `send`s are batches, and how long: drawn from the
/// producer's seed with a generator of their own (the plan and the other
/// per-operation choices are those of a round without batches). Batches
/// add at most `opCount` elements in all, so a round's deliveries stay
/// within twice its plan's budget.
struct Batching {
    private var rng: SplitMix64
    private let chance: Double
    private let longest: Int
    private var extra: Int

    init(_ plan: ProducerPlan) {
        var rng = SplitMix64(seed: plan.seed ^ 0x6261_7463_6865_7321)
        chance = [0, 0.1, 0.3, 1][rng.weighted([40, 25, 25, 10])]
        longest = [4, 16, 64, 200][rng.weighted([25, 30, 30, 15])]
        extra = plan.opCount
        self.rng = rng
    }

    /// 1 for a plain `send`, else the length of a batch.
    mutating func nextLength() -> Int {
        guard chance > 0, extra > 0, rng.chance(chance) else { return 1 }
        let length = Swift.min(rng.int(in: 2...longest), extra + 1)
        extra -= length - 1
        return length
    }
}
