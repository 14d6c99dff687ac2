@_spi(Testing) import AsyncBroadcast
import AsyncBroadcastTestSupport

/// What every task and thread of one value round shares.
final class ValueRoundContext<V: StressValue>: Sendable {
    typealias Value = BroadcastValue<V, StressError>
    typealias Subscription = Value.Subscription

    private struct Shared {
        /// Last seq handed out.
        var counter = 0
        /// Last log position handed out.
        var order = 0
        /// Exact modes: highest seq certainly committed.
        var committed = 0
        /// `.serialized`: the content last written (seq, producer), for equal sends.
        var current = (seq: 0, producer: -1)
        var logs: [ChangeLog] = []
        var started: [Int]
        var completed: [Int]
        var currentKind: [ValueOpKind?]
        var finishStarted = false
        var finishSeen = false
        var executedFinishers: [FinishKind] = []
    }

    let plan: ValueRoundPlan
    let slots: [ValueSlot<V>]
    private let holder: Locked<Value?>
    private let shared: Locked<Shared>
    /// `.serialized`: every write holds it, with the seq taken under it.
    private let serial = Locked<Int>(0)
    private let runtimeViolations = Locked<[Violation]>([])
    private let finisherTasks = Locked<[Task<Void, Never>]>([])

    init(plan: ValueRoundPlan, value: Value) {
        self.plan = plan
        holder = Locked(value)
        slots = plan.subscribers.map { ValueSlot(plan: $0, summary: plan.describe($0)) }
        let count = plan.producers.count
        shared = Locked(
            Shared(
                started: Array(repeating: 0, count: count), completed: Array(repeating: 0, count: count),
                currentKind: Array(repeating: nil, count: count)))
    }

    var value: Value? { holder.withLock { $0 } }
    func dropValue() { holder.withLock { $0 = nil } }

    func violate(_ invariant: String, _ detail: String) {
        runtimeViolations.withLock { $0.append(Violation(invariant: invariant, detail: detail)) }
    }

    var violations: [Violation] { runtimeViolations.value }
    var logs: [ChangeLog] { shared.withLock { $0.logs } }
    var executedFinishers: [FinishKind] { shared.withLock { $0.executedFinishers } }
    var finishStarted: Bool { shared.withLock { $0.finishStarted } }

    /// Exact modes: the highest seq certainly committed now.
    func committedNow() -> Int { shared.withLock { $0.committed } }

    // MARK: Writing

    /// Runs one operation of `producer` (-1: the harness) and records it.
    func perform(_ kind: ValueOpKind, producer: Int, op: Int, on value: Value, inPlace: Bool) -> ValueOpRecord {
        if producer >= 0 {
            shared.withLock {
                $0.started[producer] = op + 1
                $0.currentKind[producer] = kind
            }
        }
        let seq: Int
        if plan.mode == .serialized && kind != .read {
            seq = serial.withLock { _ in write(kind, producer: producer, op: op, on: value, inPlace: inPlace) }
        } else {
            seq = write(kind, producer: producer, op: op, on: value, inPlace: inPlace)
        }
        let exact = plan.mode.isExact
        let certain = shared.withLock { state -> Bool in
            // Committed once the write has *returned* (a reader racing the
            // call may be ordered before it).
            if exact && kind.isFresh { state.committed = max(state.committed, seq) }
            if producer >= 0 {
                state.completed[producer] = op + 1
                state.currentKind[producer] = nil
            }
            return !state.finishStarted
        }
        return ValueOpRecord(kind: kind, seq: seq, certain: certain)
    }

    private func write(_ kind: ValueOpKind, producer: Int, op: Int, on value: Value, inPlace: Bool) -> Int {
        let equatable = V.isEquatableKind
        switch kind {
        case .read:
            let current = value.value
            if let problem = current.integrityProblem() { violate("value", "value read by p\(producer)#\(op): \(problem)") }
            return current.seq

        case .sendFresh:
            let (seq, order) = shared.withLock { state -> (Int, Int) in
                state.counter += 1
                state.order += 1
                return (state.counter, state.order)
            }
            value.send(V(seq: seq, producer: producer, payload: plan.payload))
            shared.withLock { state in
                if plan.mode == .serialized { state.current = (seq, producer) }
                state.logs.append(
                    ChangeLog(
                        order: order, producer: producer, op: op, kind: kind, prev: nil, new: seq,
                        fresh: true, republish: false))
            }
            return seq

        case .sendEqual:
            let (content, order) = shared.withLock { state -> ((seq: Int, producer: Int), Int) in
                state.order += 1
                return (state.current, state.order)
            }
            value.send(V(seq: content.seq, producer: content.producer, payload: plan.payload))
            shared.withLock { state in
                state.logs.append(
                    ChangeLog(
                        order: order, producer: producer, op: op, kind: kind, prev: nil, new: content.seq,
                        fresh: false, republish: !equatable))
            }
            return content.seq

        case .updateFresh, .updateNoop, .updateCopy, .updateThrowing, .updateThrowingUnchanged:
            var seen = -1
            var taken: Int?
            let throwsError = kind == .updateThrowing || kind == .updateThrowingUnchanged
            do {
                let result = try value.update { (current: inout V) throws(StressError) -> Int in
                    let prev = current.seq
                    seen = prev
                    let fresh = kind.isFresh
                    let seq = shared.withLock { state -> Int in
                        state.order += 1
                        var new = prev
                        if fresh {
                            state.counter += 1
                            new = state.counter
                            if plan.mode == .serialized { state.current = (new, producer) }
                        }
                        state.logs.append(
                            ChangeLog(
                                order: state.order, producer: producer, op: op, kind: kind, prev: prev,
                                new: new, fresh: fresh, republish: !fresh && !equatable && kind != .updateThrowingUnchanged))
                        return new
                    }
                    switch kind {
                    case .updateFresh:
                        if inPlace {
                            current.overwrite(seq: seq, producer: producer)
                        } else {
                            current = V(seq: seq, producer: producer, payload: plan.payload)
                        }
                    case .updateThrowing:
                        current.overwrite(seq: seq, producer: producer)
                    case .updateCopy:
                        current = current.copy()
                    case .updateNoop, .updateThrowingUnchanged, .sendFresh, .sendEqual, .read:
                        break
                    }
                    if fresh { taken = seq }
                    if throwsError { throw StressError(code: 7) }
                    return seq &* 3 &+ 1
                }
                if throwsError {
                    violate("update", "p\(producer)#\(op) \(kind): update returned \(result) though its body threw")
                } else if result != (taken ?? seen) &* 3 &+ 1 {
                    violate("update", "p\(producer)#\(op) \(kind): update returned \(result), its body returned \((taken ?? seen) &* 3 &+ 1)")
                }
            } catch {
                if !throwsError || error.code != 7 {
                    violate("update", "p\(producer)#\(op) \(kind): update threw StressError(\(error.code)), its body threw \(throwsError ? "StressError(7)" : "nothing")")
                }
            }
            if seen < 0 { violate("update", "p\(producer)#\(op) \(kind): update returned without running its body") }
            return taken ?? seen
        }
    }

    func producerStatus(_ id: Int) -> String {
        let (started, completed, kind) = shared.withLock { ($0.started[id], $0.completed[id], $0.currentKind[id]) }
        let count = plan.producers[id].opCount
        if let kind, started > completed { return "producer \(id): inside op \(started - 1) of \(count) (\(kind))" }
        return "producer \(id): \(completed) of \(count) ops done, between ops"
    }

    // MARK: Subscribers

    /// Runs `subscribe` between two looks at the round's state.
    private func bracket<T>(_ subscribe: () -> T) -> (ValueJoinInfo, T) {
        let before = shared.withLock { ($0.completed, $0.committed, $0.finishSeen) }
        let made = subscribe()
        let cancelled = Task.isCancelled
        let finishStarted = shared.withLock { $0.finishStarted }
        var join = ValueJoinInfo(
            completedBefore: before.0, committedBefore: before.1, afterFinish: before.2,
            finishStartedBefore: finishStarted)
        join.cancelledAtSubscribe = cancelled
        return (join, made)
    }

    /// `subscribe()` now, bracketed.
    func subscribeNow() -> (ValueJoinInfo, Subscription?) {
        bracket { value?.subscribe() }
    }

    /// `makeAsyncIterator()` on the value itself, bracketed; the value is not retained.
    func iteratorNow() -> (ValueJoinInfo, Subscription.AsyncIterator?) {
        bracket { value?.makeAsyncIterator() }
    }

    func startConsumer(_ slot: ValueSlot<V>, subscription: Subscription) {
        slot.attach(subscription)
        let box = TakeOnce(subscription)
        slot.setTask(Task { [self] in await ValueConsumer.run(self, slot, .subscription(box)) })
    }

    func perform(_ action: ValueChaosAction, on value: Value) {
        switch action {
        case .join(let id):
            let slot = slots[id]
            let (join, subscription) = subscribeNow()
            slot.setJoin(join)
            if let subscription { startConsumer(slot, subscription: subscription) }
        case .joinInConsumer(let id):
            let slot = slots[id]
            slot.setTask(Task { [self] in await ValueConsumer.run(self, slot, .value) })
        case .joinInCancelledTask(let id):
            let slot = slots[id]
            guard case .inCancelledTask(_, let viaSubscribe) = slot.plan.join else { return }
            slot.setTask(
                Task { [self] in
                    withUnsafeCurrentTask { $0?.cancel() }
                    await ValueConsumer.run(self, slot, .cancelledTask(viaSubscribe: viaSubscribe))
                })
        case .cancelSubscription(let id):
            let slot = slots[id]
            Coverage.add(slot.hasEnded ? "value:cancel():after-end" : slot.isParked ? "value:cancel():parked" : "value:cancel():running")
            slot.strongSubscription?.cancel()
        case .cancelTask(let id):
            let slot = slots[id]
            Coverage.add(slot.hasEnded ? "value:task-cancel:after-end" : slot.isParked ? "value:task-cancel:parked" : "value:task-cancel:running")
            slot.task?.cancel()
        case .finish(let id):
            if plan.finishers[id].spawned { startFinisher(id, value: value) } else { runFinisher(id, value: value) }
        }
    }

    func yieldUntilParked(_ action: ValueChaosAction) async {
        guard case .cancelTask(let id) = action else { return }
        let slot = slots[id]
        for _ in 0..<RoundContext.parkSpins where !slot.isParked && !slot.hasEnded { await Task.yield() }
    }

    func spinUntilParked(_ action: ValueChaosAction) {
        guard case .cancelTask(let id) = action else { return }
        let slot = slots[id]
        for _ in 0..<RoundContext.parkSpins * 4 where !slot.isParked && !slot.hasEnded { yieldThread() }
    }

    // MARK: Finishing

    func runFinisher(_ id: Int, value: Value) {
        let kind = plan.finishers[id].kind
        shared.withLock { $0.finishStarted = true }
        switch kind {
        case .normal: value.finish()
        case .throwing(let code): value.finish(throwing: StressError(code: code))
        }
        if !value.isFinished { violate("finish", "isFinished is false after \(kind) returned (finisher \(id))") }
        shared.withLock {
            $0.finishSeen = true
            $0.executedFinishers.append(kind)
        }
    }

    func startFinisher(_ id: Int, value: Value) {
        let token = watchdog.register { "finisher \(id) (\(self.plan.finishers[id].kind)) has not returned" }
        let task = Task { [self] in
            runFinisher(id, value: value)
            watchdog.unregister(token)
        }
        finisherTasks.withLock { $0.append(task) }
    }

    func awaitFinishers() async {
        for task in finisherTasks.value { await task.value }
        finisherTasks.withLock { $0.removeAll() }
    }

    /// For the watchdog.
    func state() -> String {
        guard let value else { return "last reference dropped" }
        let current = value.value.seq
        return "value v\(current), subscriberCount \(value.subscriberCount), parkedSubscriberCount \(value.parkedSubscriberCount), "
            + "changeCount \(value.changeCount), wakeCount \(value.wakeCount), isFinished \(value.isFinished), last seq handed out \(shared.withLock { $0.counter })"
    }
}

/// One value subscriber's shared state during a round.
final class ValueSlot<V: StressValue>: Sendable {
    typealias Subscription = BroadcastValue<V, StressError>.Subscription
    let plan: ValueSubscriberPlan
    let summary: String

    private struct State {
        var join: ValueJoinInfo?
        /// Only for subscribers that a producer cancels.
        var strong: Subscription?
        weak var observed: Subscription?
        var attached = false
        var task: Task<Void, Never>?
        var received = 0
        var last: Int?
        var joined = false
        var ended = false
        var record: ValueConsumerRecord?
    }

    private let state = Locked(State())

    init(plan: ValueSubscriberPlan, summary: String) {
        self.plan = plan
        self.summary = summary
    }

    var needsStrongReference: Bool {
        switch plan.leave {
        case .externalCancel, .externalTaskCancel: return true
        default: return false
        }
    }

    func setJoin(_ join: ValueJoinInfo) { state.withLock { $0.join = join } }
    var join: ValueJoinInfo? { state.withLock { $0.join } }

    func attach(_ subscription: Subscription) {
        let strong = needsStrongReference
        state.withLock {
            $0.observed = subscription
            $0.attached = true
            if strong { $0.strong = subscription }
        }
    }

    func setTask(_ task: Task<Void, Never>) { state.withLock { $0.task = task } }
    var task: Task<Void, Never>? { state.withLock { $0.task } }
    var strongSubscription: Subscription? { state.withLock { $0.strong } }
    var observedSubscription: Subscription? { state.withLock { $0.observed } }

    func markJoined() { state.withLock { $0.joined = true } }
    func setProgress(_ count: Int, last: Int) {
        state.withLock {
            $0.received = count; $0.last = last
        }
    }
    /// (joined, received, last seq, ended)
    var progress: (joined: Bool, received: Int, last: Int?, ended: Bool) {
        state.withLock { ($0.joined, $0.received, $0.last, $0.ended) }
    }
    var hasEnded: Bool { state.withLock { $0.ended } }
    /// Parked in `next()`; nil when the harness cannot see its subscription
    /// (consumers that subscribed with `makeAsyncIterator()`).
    var parked: Bool? { observedSubscription.map { $0.isConsumerWaiting } }
    var isParked: Bool { parked ?? false }
    /// A subscription the harness saw is still alive.
    var subscriptionAlive: Bool { state.withLock { $0.attached && $0.observed != nil } }

    func finish(_ record: ValueConsumerRecord) {
        state.withLock {
            $0.record = record
            $0.ended = true
        }
    }

    var record: ValueConsumerRecord? { state.withLock { $0.record } }

    func release() {
        state.withLock {
            $0.strong = nil
            $0.task = nil
        }
    }

    func status() -> String {
        let (received, last, ended, subscription) = state.withLock { ($0.received, $0.last, $0.ended, $0.observed) }
        var text = "subscriber \(plan.id) [\(summary)]: received \(received), last \(last.map { "v\($0)" } ?? "none")"
        if ended { return text + ", ended" }
        if let subscription { text += subscription.isConsumerWaiting ? ", parked in next()" : ", not parked" }
        return text
    }
}
