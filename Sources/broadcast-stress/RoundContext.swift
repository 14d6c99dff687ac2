@_spi(Testing) import AsyncBroadcast
import AsyncBroadcastTestSupport

/// What every task and thread of one round shares.
final class RoundContext: Sendable {
    /// Producer-side facts, under one lock: operation counters (for join
    /// brackets and the watchdog) and what is known about finishing.
    struct Production {
        var started: [Int]
        var completed: [Int]
        var currentKind: [OpKind?]
        var finishSeen = false
        var executedFinishers: [FinishKind] = []
    }

    let plan: RoundPlan
    let holder: SequenceHolder
    let slots: [SubscriberSlot]
    private let production: Locked<Production>
    private let runtimeViolations = Locked<[Violation]>([])
    private let finisherTasks = Locked<[Task<Void, Never>]>([])

    init(plan: RoundPlan, holder: SequenceHolder) {
        self.plan = plan
        self.holder = holder
        slots = plan.subscribers.map {
            SubscriberSlot(plan: $0, policy: plan.effectivePolicy(of: $0), summary: plan.describe($0))
        }
        let count = plan.producers.count
        production = Locked(
            Production(
                started: Array(repeating: 0, count: count),
                completed: Array(repeating: 0, count: count),
                currentKind: Array(repeating: nil, count: count)))
    }

    // MARK: Producer bookkeeping

    /// Marks operation `index` of `producer` as started; returns whether a
    /// finish had been observed before.
    func beginOp(producer: Int, index: Int, kind: OpKind) -> Bool {
        production.withLock { state in
            state.started[producer] = index + 1
            state.currentKind[producer] = kind
            return state.finishSeen
        }
    }

    func endOp(producer: Int, index: Int, reportedFinished: Bool) {
        production.withLock { state in
            state.completed[producer] = index + 1
            state.currentKind[producer] = nil
            if reportedFinished { state.finishSeen = true }
        }
    }

    var executedFinishers: [FinishKind] { production.withLock { $0.executedFinishers } }

    func producerStatus(_ id: Int) -> String {
        let (started, completed, kind) = production.withLock { ($0.started[id], $0.completed[id], $0.currentKind[id]) }
        let count = plan.producers[id].opCount
        if let kind, started > completed {
            return "producer \(id): inside op \(started - 1) of \(count) (\(kind))"
        }
        return "producer \(id): \(completed) of \(count) ops done, between ops"
    }

    func violate(_ invariant: String, _ detail: String) {
        runtimeViolations.withLock { $0.append(Violation(invariant: invariant, detail: detail)) }
    }

    var violations: [Violation] { runtimeViolations.value }

    // MARK: Subscribers

    /// Subscribes `id` now, bracketed by the producers' counters, and starts its consumer.
    func join(_ id: Int, sequence: Stream) {
        let slot = slots[id]
        let (completedBefore, afterFinish) = production.withLock { ($0.completed, $0.finishSeen) }
        let subscription = sequence.subscribe(bufferingPolicy: slot.policyArgument)
        let startedAfter = production.withLock { $0.started }
        slot.setJoin(JoinInfo(completedBefore: completedBefore, startedAfter: startedAfter, afterFinish: afterFinish))
        startConsumer(slot, subscription: subscription)
    }

    /// Starts the consumer task of a subscriber that is already subscribed.
    func startConsumer(_ slot: SubscriberSlot, subscription: Stream.Subscription) {
        slot.attach(subscription)
        let box = TakeOnce(subscription)
        let task = Task { [self] in await Consumer.run(self, slot, .subscription(box)) }
        slot.setTask(task)
    }

    /// Starts a consumer task that subscribes itself with `makeAsyncIterator()`.
    func startConsumerThatSubscribes(_ id: Int) {
        let slot = slots[id]
        let task = Task { [self] in await Consumer.run(self, slot, .sequence) }
        slot.setTask(task)
    }

    /// `sequence.makeAsyncIterator()`, bracketed by the producers' counters.
    func subscribeInConsumer() -> (JoinInfo, Stream.Subscription.AsyncIterator?) {
        let (completedBefore, afterFinish) = production.withLock { ($0.completed, $0.finishSeen) }
        let iterator = holder.makeIterator()
        let startedAfter = production.withLock { $0.started }
        return (JoinInfo(completedBefore: completedBefore, startedAfter: startedAfter, afterFinish: afterFinish), iterator)
    }

    // MARK: Chaos actions

    /// Runs one action (a task cancellation's wait for the consumer to park
    /// is done by the caller, which knows whether it may suspend).
    func perform(_ action: ChaosAction, sequence: Stream) {
        switch action {
        case .join(let id):
            join(id, sequence: sequence)
        case .joinInConsumer(let id):
            startConsumerThatSubscribes(id)
        case .cancelSubscription(let id):
            let slot = slots[id]
            Coverage.add(slot.hasEnded ? "cancel():after-end" : slot.isParked ? "cancel():parked" : "cancel():running")
            slot.strongSubscription?.cancel()
        case .cancelTask(let id):
            let slot = slots[id]
            Coverage.add(slot.hasEnded ? "task-cancel:after-end" : slot.isParked ? "task-cancel:parked" : "task-cancel:running")
            slot.task?.cancel()
        case .finish(let id):
            if plan.finishers[id].spawned {
                startFinisher(id, sequence: sequence)
            } else {
                runFinisher(id, sequence: sequence)
            }
        }
    }

    /// How long a producer waits for a consumer to park before cancelling
    /// its task anyway.
    static let parkSpins = 400

    /// A producer task waits (yielding) for the target consumer to park in `next()`.
    func yieldUntilParked(_ action: ChaosAction) async {
        guard case .cancelTask(let id) = action else { return }
        let slot = slots[id]
        for _ in 0..<Self.parkSpins where !slot.isParked && !slot.hasEnded { await Task.yield() }
    }

    /// A producer thread waits (sched_yield) for the target consumer to park in `next()`.
    ///
    /// Also bounded in time: on a machine with many more runnable threads
    /// than cores each `sched_yield` gives the CPU away for a whole time
    /// slice, and a round of a large-n plan, with dozens of cancellations
    /// of consumers that will not park (asleep, not started, subscribing
    /// themselves), spent seconds per action here and overran its deadline
    /// with every task idle (seen at 7 busy threads on 2 cores).
    func spinUntilParked(_ action: ChaosAction) {
        guard case .cancelTask(let id) = action else { return }
        let slot = slots[id]
        let giveUp = monotonicSeconds() + Self.parkWaitSeconds
        for _ in 0..<Self.parkSpins * 4 where !slot.isParked && !slot.hasEnded {
            if monotonicSeconds() > giveUp { return }
            yieldThread()
        }
    }

    /// The longest a producer thread waits for one consumer to park.
    static let parkWaitSeconds = 0.05

    // MARK: Finishing

    func runFinisher(_ id: Int, sequence: Stream) {
        let kind = plan.finishers[id].kind
        switch kind {
        case .normal: sequence.finish()
        case .throwing(let code): sequence.finish(throwing: StressError(code: code))
        }
        if !sequence.isFinished {
            violate("finish", "isFinished is false after \(kind) returned (finisher \(id))")
        }
        production.withLock {
            $0.finishSeen = true
            $0.executedFinishers.append(kind)
        }
    }

    /// Runs finisher `id` in its own task (so it races whoever started it).
    func startFinisher(_ id: Int, sequence: Stream) {
        let token = watchdog.register { "finisher \(id) (\(self.plan.finishers[id].kind)) has not returned" }
        let task = Task { [self] in
            runFinisher(id, sequence: sequence)
            watchdog.unregister(token)
        }
        finisherTasks.withLock { $0.append(task) }
    }

    func awaitFinishers() async {
        for task in finisherTasks.value { await task.value }
        finisherTasks.withLock { $0.removeAll() }
    }
}
