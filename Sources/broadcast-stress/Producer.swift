@_spi(Testing) import AsyncBroadcast

/// A producer: runs its operations in order (so its sequence numbers are its
/// program order), and the chaos actions attached to them.
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
            let item = Item(producer: plan.id, index: index, payload: plan.payload)

            let finishSeen = context.beginOp(producer: plan.id, index: index, kind: kind)
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
                let emitter = watchdog.register { "emitter p\(plan.id)#\(index) (emit cancelled by its producer)" }
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
            context.endOp(producer: plan.id, index: index, reportedFinished: outcome.isFinished)
            record.ops.append(OpRecord(kind: kind, outcome: outcome, finishSeenBefore: finishSeen))
            if plan.yieldEvery > 0 && index % plan.yieldEvery == 0 { await Task.yield() }
        }
        return record
    }

    /// Thread producers only `send` (it never suspends).
    private static func runOnThread(_ context: RoundContext, _ plan: ProducerPlan) -> ProducerRecord {
        var record = ProducerRecord(id: plan.id)
        guard let sequence = context.holder.get() else { return record }
        record.ops.reserveCapacity(plan.opCount)
        for index in 0..<plan.opCount {
            if let actions = plan.actions[index] {
                for action in actions {
                    context.spinUntilParked(action)
                    context.perform(action, sequence: sequence)
                }
            }
            let item = Item(producer: plan.id, index: index, payload: plan.payload)
            let finishSeen = context.beginOp(producer: plan.id, index: index, kind: .send)
            let outcome = OpOutcome.result(sequence.send(item))
            context.endOp(producer: plan.id, index: index, reportedFinished: outcome.isFinished)
            record.ops.append(OpRecord(kind: .send, outcome: outcome, finishSeenBefore: finishSeen))
            if plan.yieldEvery > 0 && index % plan.yieldEvery == 0 { yieldThread() }
        }
        return record
    }
}
