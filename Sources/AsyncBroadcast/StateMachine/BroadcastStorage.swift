/// The shared heart of a `BroadcastSequence`: the sequence lock around
/// `BroadcastState`, and the code that applies its effects after unlocking.
///
/// Subscribers keep the storage alive (not the public `BroadcastSequence`),
/// so dropping the last reference to the sequence finishes it even while
/// subscribers wait. The storage→subscriber references form a cycle that is
/// broken when a subscriber is removed.
final class BroadcastStorage<Element: Sendable, Failure: Error>: @unchecked Sendable {
    let defaultPolicy: BroadcastBufferingPolicy
    private let lock = Lock()
    private var state: BroadcastState<Element, Failure>
    /// Non-zero while an emitter waits or is checking for room. Lets a
    /// `.bounded` consumer that just dropped below capacity skip the sequence
    /// lock when nobody could be waiting on it. Written under `lock` with
    /// sequential consistency *before* the emitter looks at subscribers'
    /// buffers, so a consumer that drains after that look sees it set.
    private let emittersWaiting = AtomicInt(0)

    init(defaultPolicy: BroadcastBufferingPolicy, replay: Int) {
        self.defaultPolicy = defaultPolicy
        self.state = BroadcastState(replayLimit: replay)
    }

    deinit {
        lock.destroy()
        emittersWaiting.destroy()
    }

    // MARK: Queries

    var subscriberCount: Int { lock.withLock { state.subscribers.count } }
    var isFinished: Bool { lock.withLock { state.terminal != nil } }
    var waitingEmitterCount: Int { lock.withLock { state.waitingEmitterCount } }

    // MARK: Subscribers

    func subscribe(policy: BroadcastBufferingPolicy) -> SubscriberCore<Element, Failure> {
        let subscriber = SubscriberCore<Element, Failure>(policy: policy, storage: self)
        let fromCancelledTask = Task.isCancelled
        var effects = Effects<Element>()
        lock.withLock {
            state.subscribe(subscriber, fromCancelledTask: fromCancelledTask, effects: &effects)
        }
        effects.run()
        return subscriber
    }

    /// Unregisters an ending subscriber and releases emitters that waited on it.
    func remove(_ subscriber: SubscriberCore<Element, Failure>) {
        var effects = Effects<Element>()
        lock.withLock {
            state.remove(subscriber, effects: &effects)
            settleEmitterFlag()
        }
        effects.run()
    }

    /// A `.bounded` subscriber's buffer just dropped below capacity.
    func boundedSubscriberMayHaveRoom() {
        guard emittersWaiting.loadSequentiallyConsistent() != 0 else { return }
        var effects = Effects<Element>()
        lock.withLock {
            state.serveEmitters(effects: &effects)
            settleEmitterFlag()
        }
        effects.run()
    }

    // MARK: Producers

    func send(_ element: Element) -> BroadcastSendResult {
        var effects = Effects<Element>()
        lock.lock()
        guard state.terminal == nil else {
            lock.unlock()
            return .finished
        }
        let result = state.deliver(element, effects: &effects)
        lock.unlock()
        effects.run()
        return result
    }

    func emit(_ element: Element) async throws(CancellationError) -> BroadcastSendResult {
        var effects = Effects<Element>()
        lock.lock()
        if state.terminal != nil {
            lock.unlock()
            return .finished
        }
        if !state.hasWaitingEmitters {
            announceEmitterCheck()
            if state.emitterMayProceed(queuedAhead: true) {
                let result = state.deliver(element, effects: &effects)
                settleEmitterFlag()
                lock.unlock()
                effects.run()
                return result
            }
        }
        lock.unlock()
        return try await emitSlowPath(element)
    }

    private func emitSlowPath(_ element: Element) async throws(CancellationError) -> BroadcastSendResult {
        let waiter = EmitWaiter(element: element)
        let outcome = await withTaskCancellationHandler {
            await withUnsafeContinuation { (continuation: UnsafeContinuation<EmitOutcome, Never>) in
                var effects = Effects<Element>()
                let immediate: EmitOutcome?
                lock.lock()
                if waiter.isCancelled {
                    immediate = .cancelled
                } else if state.terminal != nil {
                    immediate = .delivered(.finished)
                } else {
                    announceEmitterCheck()
                    if state.emitterMayProceed(queuedAhead: true) {
                        immediate = .delivered(state.deliver(element, effects: &effects))
                    } else {
                        waiter.continuation = continuation
                        state.enqueue(waiter)
                        immediate = nil
                    }
                    settleEmitterFlag()
                }
                lock.unlock()
                effects.run()
                if let immediate { continuation.resume(returning: immediate) }
            }
        } onCancel: {
            let continuation = lock.withLock {
                let continuation = state.cancel(waiter)
                settleEmitterFlag()
                return continuation
            }
            continuation?.resume(returning: .cancelled)
        }
        switch outcome {
        case .delivered(let result): return result
        case .cancelled: throw CancellationError()
        }
    }

    /// Call under `lock`, before looking at subscribers' buffers for room.
    private func announceEmitterCheck() {
        emittersWaiting.storeSequentiallyConsistent(1)
    }

    /// Call under `lock`: clears the flag once nobody waits.
    private func settleEmitterFlag() {
        emittersWaiting.storeSequentiallyConsistent(state.hasWaitingEmitters ? 1 : 0)
    }

    // MARK: Finishing

    func finish(_ event: BroadcastState<Element, Failure>.Terminal) {
        var effects = Effects<Element>()
        lock.withLock {
            state.finish(event, effects: &effects)
            settleEmitterFlag()
        }
        effects.run()
    }
}
