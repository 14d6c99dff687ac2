/// The shared heart of a `BroadcastSequence`: the sequence lock around
/// `BroadcastState`, and the code that applies its effects after unlocking.
///
/// Subscribers keep the storage alive (not the public `BroadcastSequence`),
/// so dropping the last reference to the sequence finishes it even while
/// subscribers wait. The storage→subscriber references form a cycle that is
/// broken when a subscriber is removed.
@usableFromInline
final class BroadcastStorage<Element: Sendable, Failure: Error>: @unchecked Sendable {
    /// Where each word of `block` lives, by who writes it (words `8k ..<
    /// 8k + 8` share cache line `k + 1`; line 0 is the sequence lock):
    /// - line 1: `SequenceGate` (words 0-4: the lock word, the holder's
    ///   queue, `finished`, `spinner`), `registeredCount` (under the lock),
    ///   `emittersWaiting` (rarely), the effects pool's slot;
    /// - line 2: `parkedConsumers`, alone: every reader that parks or
    ///   wakes increments or decrements it.
    ///
    /// One allocation, where a lock and five atomics used to take six (a
    /// topic of a `BroadcastTopics` is one of these: it matters a million times).
    /// (The block's own mutex, in line 0, is not used: the sequence lock is
    /// the gate's word.)
    @usableFromInline
    enum Word {
        @inlinable static var registeredCount: Int { 5 }
        @inlinable static var emittersWaiting: Int { 6 }
        @inlinable static var poolSlot: Int { 7 }
        @inlinable static var parkedConsumers: Int { 8 }
        @inlinable static var count: Int { 9 }
    }

    @usableFromInline let defaultPolicy: BroadcastBufferingPolicy
    /// The sequence lock and the atomic words (`Word`).
    @usableFromInline let block: AtomicBlock
    /// Skips the runtime exclusivity check (a `swift_beginAccess` and
    /// `swift_endAccess` per section: about 3 % of the samples of a send to
    /// one subscriber). That check only finds overlapping accesses on one
    /// thread, and every access is under `lock`, which no section takes
    /// twice; other threads are the lock's business (and ThreadSanitizer's).
    @exclusivity(unchecked) @usableFromInline var state: BroadcastState<Element, Failure>

    /// The sequence lock: `withLock` bodies may run on the lock holder's
    /// thread (`SequenceGate`).
    @inlinable var lock: SequenceGate { SequenceGate(block: block) }
    /// Non-zero while an emitter waits or is checking for room. Lets a
    /// `.bounded` consumer that just dropped below capacity skip the sequence
    /// lock when nobody could be waiting on it. Set under `lock` with
    /// sequential consistency *before* the emitter looks at subscribers'
    /// buffers, so a consumer that drains after that look sees it set.
    @inlinable var emittersWaiting: AtomicInt { block.word(Word.emittersWaiting) }
    /// Reused `Effects` storage, so steady-state sends allocate nothing.
    @inlinable var pool: EffectsPool<Element> { EffectsPool(slot: block.word(Word.poolSlot)) }
    /// Readers that are parked or about to park (see `Parking`): a send
    /// looks for them only when this is non-zero.
    @inlinable var parkedConsumers: AtomicInt { block.word(Word.parkedConsumers) }
    /// `state.subscribers.count`, readable without the lock.
    @inlinable var registeredCount: AtomicInt { block.word(Word.registeredCount) }
    /// What feeds a shared sequence (`nil` for a plain one). Read without
    /// the lock: it never changes.
    @usableFromInline let source: SharedSource<Element, Failure>?
    /// For one topic of a `BroadcastTopics` (`nil` otherwise): told, with no
    /// lock held, whenever this sequence may have become idle or stopped
    /// its upstream (its last subscriber left; a start or stop of its
    /// upstream completed), so that the topic registry can retire it.
    @usableFromInline let topicObserver: (@Sendable (BroadcastStorage<Element, Failure>) -> Void)?
    /// A topic's generation that `finish(topic:)` took out of `live`
    /// (guarded by the topic's shard lock): a `subscribe(to:)` that
    /// registered on it and finds this set before it returns starts again.
    /// Not set when its own listener ended it (`sink.finish()`): that ends
    /// its subscribers, who drain and end, including one whose `register`
    /// call is the one that finished it.
    @usableFromInline var finishedAsTopic = false
    /// `subscribe(to:)` calls that chose this generation under the shard
    /// lock and have not finished registering (guarded by the topic's shard
    /// lock): a notice that sees it leaves the generation alone, and the
    /// subscribe looks again when it is done.
    @usableFromInline var pendingSubscribes = 0

    /// Inlinable, so that a client's specialization creates it without
    /// generic metadata lookups (a `BroadcastTopics` creates one per topic).
    @inlinable
    init(
        defaultPolicy: BroadcastBufferingPolicy, replay: Int, sharing: Sharing<Element, Failure>? = nil,
        startBlocked: Bool = false,
        topicObserver: (@Sendable (BroadcastStorage<Element, Failure>) -> Void)? = nil
    ) {
        self.topicObserver = topicObserver
        self.defaultPolicy = defaultPolicy
        let block = AtomicBlock(wordCount: Word.count)
        self.block = block
        let parkedConsumers = block.word(Word.parkedConsumers)
        let registeredCount = block.word(Word.registeredCount)
        self.source = sharing?.source
        self.state = BroadcastState(
            replayLimit: replay, parkedConsumers: parkedConsumers, registeredCount: registeredCount,
            sharing: sharing.map {
                SharingState(
                    mode: $0.start.mode, source: $0.source, startBlocked: startBlocked,
                    startDecided: $0.startDecided)
            })
        state.replaysOnlyWhileSubscribed = topicObserver != nil && sharing == nil
    }

    deinit {
        pool.releaseCachedBox()
        block.destroy()
    }

    /// Every transition of the sequence goes through here: `body` runs under
    /// the sequence lock and records its effects; then the emitter flag and
    /// the finished word are settled, the lock released, and the effects run
    /// (resumes, element deinitializers) by the caller, in that order, always.
    ///
    /// - Parameter role: a sender takes the lock itself (after the requests
    ///   queued before it); anyone else hands `body` to the lock's holder if
    ///   the lock is taken (`SequenceGate`), so `body` must not depend on
    ///   the thread that runs it.
    @inlinable
    func withState<R>(
        _ role: LockRole = .other,
        _ body: (inout BroadcastState<Element, Failure>, inout Effects<Element>) -> R
    ) -> R {
        var effects = Effects(pool: pool)
        let result: R
        switch role {
        case .sender:
            lock.lock()
            result = criticalSection(&effects, body)
            lock.unlock()
        case .registrant, .other:
            result = lock.withLock { criticalSection(&effects, body) }
        }
        effects.run()
        return result
    }

    /// `body`, then what every critical section settles before the unlock.
    @inlinable @inline(__always)
    func criticalSection<R>(
        _ effects: inout Effects<Element>,
        _ body: (inout BroadcastState<Element, Failure>, inout Effects<Element>) -> R
    ) -> R {
        let result = body(&state, &effects)
        settleEmitterFlag()
        if _slowPath(state.terminal != nil) { settleFinished() }
        state._checkInvariants()
        return result
    }

    /// Call under `lock` once the terminal is set: `isFinished` reads it
    /// without the lock.
    @inlinable
    func settleFinished() {
        let finished = lock.finished
        if finished.loadRelaxed() == 0 { finished.storeRelease(1) }
    }

    /// Who is taking the sequence lock, for `withState`.
    @usableFromInline
    enum LockRole {
        /// `send`, `emit`, a sink's or an upstream's element: takes the lock.
        case sender
        /// `subscribe()` and a subscriber's removal.
        case registrant
        case other
    }

    // MARK: Queries

    @usableFromInline
    var subscriberCount: Int { registeredCount.loadAcquire() }
    @usableFromInline
    var isFinished: Bool { lock.finished.loadAcquire() != 0 }
    @usableFromInline
    var waitingEmitterCount: Int { lock.withLock { state.waitingEmitterCount } }

    // MARK: Subscribers

    @inlinable
    func subscribe(policy: BroadcastBufferingPolicy, eviction: SubscriberEviction? = nil) -> SubscriberCore<Element, Failure> {
        let subscriber = SubscriberCore<Element, Failure>(policy: policy, storage: self, eviction: eviction)
        let fromCancelledTask = Task.isCancelled
        let followUp: MembershipFollowUp? = withState(.registrant) { state, effects in
            let countBefore = state.subscribers.count
            state.subscribe(subscriber, fromCancelledTask: fromCancelledTask, effects: &effects)
            return state.observesMembership
                ? state.membershipFollowUp(countBefore: countBefore, terminalChanged: false) : nil
        }
        if let followUp, !followUp.isEmpty { apply(followUp) }
        return subscriber
    }

    /// Unregisters an ending subscriber and releases emitters that waited on it.
    @inlinable
    func remove(_ subscriber: SubscriberCore<Element, Failure>) {
        var leftEmpty = false
        let followUp: MembershipFollowUp? = withState(.registrant) { state, effects in
            let countBefore = state.subscribers.count
            state.remove(subscriber, effects: &effects)
            leftEmpty = countBefore > 0 && state.subscribers.isEmpty
            return state.observesMembership
                ? state.membershipFollowUp(countBefore: countBefore, terminalChanged: false) : nil
        }
        if let followUp, !followUp.isEmpty { apply(followUp) }
        if leftEmpty, let topicObserver { topicObserver(self) }
    }

    /// A `.bounded` subscriber's buffer just dropped below capacity.
    @inlinable
    func boundedSubscriberMayHaveRoom(_ subscriber: SubscriberCore<Element, Failure>) {
        guard emittersWaiting.loadSequentiallyConsistent() != 0 else { return }
        withState { state, effects in state.serveEmitters(drained: subscriber, effects: &effects) }
    }

    // MARK: Producers

    @inlinable
    func send(_ element: Element, replayable: Bool = true) -> BroadcastSendResult {
        withState(.sender) { state, effects in
            state.terminal == nil ? state.deliver(element, replayable: replayable, effects: &effects) : .finished
        }
    }

    /// Where an `emit` stands after its first look.
    @usableFromInline
    enum EmitStart {
        case done(BroadcastSendResult)
        case queued(id: Int)
    }

    @inlinable
    func emit(_ element: Element) async throws(CancellationError) -> BroadcastSendResult {
        let start: EmitStart = withState(.sender) { state, effects in
            if state.terminal != nil { return .done(.finished) }
            announceEmitterCheck()
            if state.emitterMayProceed() { return .done(state.deliver(element, effects: &effects)) }
            // Queue now, so arrival order is the order emits found no room.
            return .queued(id: state.enqueueEmit(element))
        }
        let id: Int
        switch start {
        case .done(let result): return result
        case .queued(let queued): id = queued
        }
        switch await waitForQueuedEmit(id) {
        case .delivered(let result): return result
        case .cancelled: throw CancellationError()
        }
    }

    /// Parks the emitter queued as `id` until it is served, cancelled or
    /// finished, and takes its outcome.
    @inlinable
    func waitForQueuedEmit(_ id: Int) async -> EmitOutcome {
        await withTaskCancellationHandler {
            await withUnsafeContinuation { (continuation: UnsafeContinuation<Void, Never>) in
                // The lock is taken inside the closure, never across it.
                if !lock.withLock({ state.park(emit: id, continuation) }) { Parking.resume(continuation) }
            }
        } onCancel: {
            withState { state, effects in state.cancelEmit(id, effects: &effects) }
        }
        return lock.withLock {
            if state.sharing?.pendingEmit == id { state.sharing!.pendingEmit = nil }
            return state.takeOutcome(emit: id)
        }
    }

    /// Call under `lock`, before looking at subscribers' buffers for room.
    @inlinable
    func announceEmitterCheck() {
        // Handshakes.md, row 5: sequentially consistent, like the consumer's
        // head store and both sides' loads.
        if Fault.emitterFlagRelease { emittersWaiting.storeRelease(1); return }
        emittersWaiting.storeSequentiallyConsistent(1)
    }

    /// Call under `lock`: the flag is 1 exactly while an emitter waits. The
    /// sequentially consistent store is paid only when the value changes.
    @inlinable
    func settleEmitterFlag() {
        let waiting = state.hasWaitingEmitters ? 1 : 0
        if emittersWaiting.loadRelaxed() != waiting { emittersWaiting.storeSequentiallyConsistent(waiting) }
    }

    // MARK: Finishing

    /// Inlinable, so that a client's specialization of `BroadcastSequence`
    /// finishes without generic metadata lookups (see
    /// `BroadcastSequence.finishWhenDropped`).
    @inlinable
    func finish(_ event: BroadcastState<Element, Failure>.Terminal) {
        let followUp: MembershipFollowUp? = withState { state, effects in
            let countBefore = state.subscribers.count
            state.finish(event, effects: &effects)
            return state.observesMembership
                ? state.membershipFollowUp(countBefore: countBefore, terminalChanged: true) : nil
        }
        if let followUp, !followUp.isEmpty { apply(followUp) }
    }
}
