/// The shared heart of a `BroadcastSequence`: the sequence lock around
/// `BroadcastState`, and the code that applies its effects after unlocking.
///
/// Subscribers keep the storage alive (not the public `BroadcastSequence`),
/// so dropping the last reference to the sequence finishes it even while
/// subscribers wait. The storage→subscriber references form a cycle that is
/// broken when a subscriber is removed.
@usableFromInline
final class BroadcastStorage<Element: Sendable, Failure: Error>: @unchecked Sendable {
    @usableFromInline let defaultPolicy: BroadcastBufferingPolicy
    @usableFromInline let lock = Lock()
    @usableFromInline var state: BroadcastState<Element, Failure>
    /// Non-zero while an emitter waits or is checking for room. Lets a
    /// `.bounded` consumer that just dropped below capacity skip the sequence
    /// lock when nobody could be waiting on it. Written under `lock` with
    /// sequential consistency *before* the emitter looks at subscribers'
    /// buffers, so a consumer that drains after that look sees it set.
    @usableFromInline let emittersWaiting = AtomicInt(0)
    /// Reused `Effects` storage, so steady-state sends allocate nothing.
    @usableFromInline let pool = EffectsPool<Element>()
    /// See `BroadcastState.parkedConsumers`.
    @usableFromInline let parkedConsumers: AtomicInt

    @usableFromInline
    init(defaultPolicy: BroadcastBufferingPolicy, replay: Int) {
        self.defaultPolicy = defaultPolicy
        let parkedConsumers = AtomicInt(0)
        self.parkedConsumers = parkedConsumers
        self.state = BroadcastState(replayLimit: replay, parkedConsumers: parkedConsumers)
    }

    deinit {
        lock.destroy()
        emittersWaiting.destroy()
        pool.destroy()
        parkedConsumers.destroy()
    }

    // MARK: Queries

    @usableFromInline
    var subscriberCount: Int { lock.withLock { state.subscribers.count } }
    @usableFromInline
    var isFinished: Bool { lock.withLock { state.terminal != nil } }
    @usableFromInline
    var waitingEmitterCount: Int { lock.withLock { state.waitingEmitterCount } }

    // MARK: Subscribers

    @inlinable
    func subscribe(policy: BroadcastBufferingPolicy) -> SubscriberCore<Element, Failure> {
        let subscriber = SubscriberCore<Element, Failure>(policy: policy, storage: self)
        let fromCancelledTask = Task.isCancelled
        var effects = Effects(pool: pool)
        lock.withLock {
            state.subscribe(subscriber, fromCancelledTask: fromCancelledTask, effects: &effects)
        }
        effects.run()
        return subscriber
    }

    /// Unregisters an ending subscriber and releases emitters that waited on it.
    @inlinable
    func remove(_ subscriber: SubscriberCore<Element, Failure>) {
        var effects = Effects(pool: pool)
        lock.withLock {
            state.remove(subscriber, effects: &effects)
            settleEmitterFlag()
        }
        effects.run()
    }

    /// A `.bounded` subscriber's buffer just dropped below capacity.
    @inlinable
    func boundedSubscriberMayHaveRoom(_ subscriber: SubscriberCore<Element, Failure>) {
        guard emittersWaiting.loadSequentiallyConsistent() != 0 else { return }
        var effects = Effects(pool: pool)
        lock.withLock {
            state.serveEmitters(drained: subscriber, effects: &effects)
            settleEmitterFlag()
        }
        effects.run()
    }

    // MARK: Producers

    @inlinable
    func send(_ element: Element) -> BroadcastSendResult {
        var effects = Effects(pool: pool)
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

    @inlinable
    func emit(_ element: Element) async throws(CancellationError) -> BroadcastSendResult {
        var effects = Effects(pool: pool)
        lock.lock()
        if state.terminal != nil {
            lock.unlock()
            return .finished
        }
        announceEmitterCheck()
        if state.emitterMayProceed() {
            let result = state.deliver(element, effects: &effects)
            settleEmitterFlag()
            lock.unlock()
            effects.run()
            return result
        }
        // Queue now, so arrival order is the order emits found no room.
        let id = state.enqueueEmit(element)
        lock.unlock()
        let outcome = await withTaskCancellationHandler {
            await withUnsafeContinuation { (continuation: UnsafeContinuation<EmitOutcome, Never>) in
                let decided = lock.withLock { state.park(emit: id, continuation) }
                if let decided { continuation.resume(returning: decided) }
            }
        } onCancel: {
            var effects = Effects(pool: pool)
            lock.withLock {
                state.cancelEmit(id, effects: &effects)
                settleEmitterFlag()
            }
            effects.run()
        }
        switch outcome {
        case .delivered(let result): return result
        case .cancelled: throw CancellationError()
        }
    }

    /// Call under `lock`, before looking at subscribers' buffers for room.
    @inlinable
    func announceEmitterCheck() {
        emittersWaiting.storeSequentiallyConsistent(1)
    }

    /// Call under `lock`: clears the flag once nobody waits.
    @inlinable
    func settleEmitterFlag() {
        emittersWaiting.storeSequentiallyConsistent(state.hasWaitingEmitters ? 1 : 0)
    }

    // MARK: Finishing

    @usableFromInline
    func finish(_ event: BroadcastState<Element, Failure>.Terminal) {
        var effects = Effects(pool: pool)
        lock.withLock {
            state.finish(event, effects: &effects)
            settleEmitterFlag()
        }
        effects.run()
    }
}
