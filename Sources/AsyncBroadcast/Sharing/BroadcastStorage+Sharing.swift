/// The storage side of sharing: applying membership follow-ups, the
/// reconciler loop, and the entry points of upstream tasks, sinks and stop
/// timers. Every decision is a `SharingState` transition under the sequence
/// lock; this file performs what they return, unlocked.
extension BroadcastStorage {
    /// Runs after a section that returned a non-empty follow-up: refreshes
    /// `subscriberCounts`, then reconciles if this thread claimed the role.
    @usableFromInline
    func apply(_ followUp: MembershipFollowUp) {
        if let counts = followUp.counts {
            // The value's lock orders these refreshes; each reads the count
            // after its own change, so the last one leaves the latest count.
            // An equal count wakes nobody.
            counts.update { $0 = registeredCount.loadAcquire() }
            if followUp.countsAreFinal { counts.finish() }
        }
        followUp.readinessWakes?.resumeWaiting()
        if followUp.reconcile { reconcileSharing() }
    }

    /// Performs sharing actions until none is needed. Only the thread that
    /// claimed the role calls this; it holds no lock while it runs user code
    /// (`upstream()` runs in the launched task, `register` and unregister
    /// closures run here).
    @usableFromInline
    func reconcileSharing() {
        var outcome: SharingActionOutcome? = nil
        while true {
            // O(1) sections that `subscribe()` and `cancel()` wait for (the
            // start and stop they cause): registrants, so a producer
            // sending without pause serves them at its unlock (`SequenceGate`).
            let action: SharingAction? = withState(.registrant) { state, effects in
                if let outcome { state.sharing!.record(outcome) }
                return state.nextSharingAction(effects: &effects)
            }
            guard let action else {
                topicObserver?(self)
                return
            }
            outcome = perform(action)
        }
    }

    private func perform(_ action: SharingAction) -> SharingActionOutcome? {
        switch action {
        case .start(let generation):
            switch source! {
            case .upstream(let launch):
                return .started(generation: generation, handle: .task(launch(self, generation)))
            case .listener(let register):
                let unregister = register(BroadcastSink(storage: self, generation: generation))
                return .started(generation: generation, handle: .listener(unregister: unregister))
            case .asyncListener(let listen):
                return .started(generation: generation, handle: .task(launchListener(listen, generation: generation)))
            }
        case .stop(let handle):
            if Fault.sharingSkipStop { return nil }
            switch handle {
            case .task(let task): task.cancel()
            case .listener(let unregister): unregister()
            }
            return nil
        case .startTimer(let token):
            guard let sleep = stopDelay?.sleep else {
                internalInconsistency("a stop timer without a delay")
            }
            let task = Task.detached {
                await sleep()
                self.stopTimerReturned(token: token)
            }
            return .timerStarted(token: token, task: task)
        case .cancelTimer(let task):
            task.cancel()
            return nil
        }
    }

    /// The task of an asynchronous listener's run: `listen`, then (once the
    /// stop cancels it) the take-down, in a task of its own so that it does
    /// not run cancelled (an async close must be able to await). The run
    /// is over when both have returned; until then nothing restarts
    /// (`SharingState.takeDownPending`).
    private func launchListener(
        _ listen: @escaping @Sendable (BroadcastSink<Element, Failure>) async -> @Sendable () async -> Void,
        generation: UInt64
    ) -> Task<Void, Never> {
        let sink = BroadcastSink(storage: self, generation: generation)
        return Task.detached {
            let takeDown = await listen(sink)
            // Only the stop cancels this task: until then the listener is
            // in place. The promise is never completed; it is a place to
            // wait that cancellation leaves at once.
            _ = try? await BroadcastPromise<Void, Never>().value
            await Task.detached { await takeDown() }.value
            self.listenerTaskReturned()
        }
    }

    private func listenerTaskReturned() {
        let reconcile = withState { state, effects in
            state.sharing!.counters.liveUpstreamTasks -= 1
            state.wakeIfUpstreamStopped(effects: &effects)
            return state.sharing!.claimReconciler()
        }
        if reconcile {
            reconcileSharing()
        } else {
            // A topic's generation waits for this to retire.
            topicObserver?(self)
        }
    }

    private var stopDelay: StopDelay? {
        guard case .whileSubscribed(let delay) = lock.withLock({ state.sharing?.mode }) else { return nil }
        return delay
    }

    /// Starts an `.eagerly` upstream; call once, at the end of the sequence's init.
    func startSharing() {
        let reconcile = withState { state, _ in state.sharing!.claimReconciler() }
        if reconcile { reconcileSharing() }
    }

    private func stopTimerReturned(token: UInt64) {
        let reconcile = withState { state, _ in
            state.sharing!.timerReturned(token: token)
            return state.sharing!.claimReconciler()
        }
        if reconcile {
            reconcileSharing()
        } else {
            // Nothing to stop (a topic whose start was blocked never ran):
            // the sequence may be idle all the same.
            topicObserver?(self)
        }
    }

    // MARK: Runs

    /// Delivers an upstream element as `emit` does. `false` once run
    /// `generation` is stopped or the sequence has finished: the task stops
    /// iterating.
    @inlinable
    func emitFromUpstream(_ element: Element, generation: UInt64) async -> Bool {
        let start: EmitStart? = withState(.sender) { state, effects in
            guard state.terminal == nil, state.sharing!.isCurrent(generation) || Fault.sharingStaleDelivery else {
                return nil
            }
            announceEmitterCheck()
            if state.emitterMayProceed() { return .done(state.deliver(element, effects: &effects)) }
            let id = state.enqueueEmit(element)
            state.sharing!.pendingEmit = id  // a stop cancels it
            return .queued(id: id)
        }
        switch start {
        case nil: return false
        case .done: return true
        case .queued(let id):
            switch await waitForQueuedEmit(id) {
            case .delivered(let result): return !result.isFinished
            case .cancelled: return false
            }
        }
    }

    /// Run `generation` ended: `end` finishes the sequence if the run is
    /// still current (a stopped run's end, often caused by the stop, counts
    /// for nothing); `nil` when the task stopped on its own account.
    @usableFromInline
    func runEnded(generation: UInt64, end: BroadcastState<Element, Failure>.Terminal?, taskReturned: Bool) {
        let followUp = withState { state, effects in
            if taskReturned {
                state.sharing!.counters.liveUpstreamTasks -= 1
                state.wakeIfUpstreamStopped(effects: &effects)
            }
            guard let end, state.terminal == nil, state.sharing!.isCurrent(generation) else {
                return MembershipFollowUp()
            }
            let countBefore = state.subscribers.count
            state.finish(end, effects: &effects)
            return state.membershipFollowUp(countBefore: countBefore, terminalChanged: true)
        }
        if !followUp.isEmpty { apply(followUp) }
    }

    /// `BroadcastSink.send`: like `send`, while run `generation` is current.
    @inlinable
    func sinkSend(_ element: Element, replayable: Bool = true, generation: UInt64) -> BroadcastSendResult {
        withState(.sender) { state, effects in
            guard state.terminal == nil, state.sharing!.isCurrent(generation) || Fault.sharingStaleDelivery else {
                return .finished
            }
            return state.deliver(element, replayable: replayable, effects: &effects)
        }
    }

    /// `BroadcastSink.ready()`: run `generation`'s listener is in place,
    /// if that run is still current.
    func sinkReady(generation: UInt64) {
        withState { state, effects in
            guard state.terminal == nil, let sharing = state.sharing, sharing.isCurrent(generation),
                sharing.readyGeneration != generation
            else { return }
            sharing.readyGeneration = generation
            if !Fault.readyIgnored { sharing.readinessWaiters.wakeAll(into: &effects) }
        }
    }

    /// `Subscription.upstreamReady()`; `nil` when cancelled.
    func upstreamReady(for subscriber: SubscriberCore<Element, Failure>) async -> Bool? {
        await waitForSharing(.ready) { state in state.upstreamReadiness(of: subscriber) }
    }

    /// `upstreamStopped()`; returns early when cancelled.
    func upstreamStopped() async {
        _ = await waitForSharing(.stopped) { state in
            (state.sharing?.upstreamIsStopped ?? true) ? () : nil
        }
    }

    // MARK: Queries

    var sharingCounters: SharingCounters {
        lock.withLock {
            guard let sharing = state.sharing else { return SharingCounters() }
            var counters = sharing.counters
            if case .stopped = sharing.run {} else { counters.isRunning = true }
            counters.isStopPending = sharing.lingering
            return counters
        }
    }

    /// The value behind `subscriberCounts`, created at the first call
    /// holding the current count (under the lock, so no change is missed:
    /// every later change refreshes it).
    @usableFromInline
    func subscriberCountsValue() -> BroadcastValue<Int, Never> {
        var isFinal = false
        let counts: BroadcastValue<Int, Never> = lock.withLock {
            if let counts = state.counts { return counts }
            let counts = BroadcastValue(state.subscribers.count)
            state.counts = counts
            isFinal = state.terminal != nil && state.subscribers.isEmpty
            return counts
        }
        if isFinal { counts.finish() }
        return counts
    }

    // MARK: Batches

    /// `send(contentsOf:)`: one section for the whole batch, and one wake
    /// pass per chunk of subscribers (`BroadcastState.deliver(batch:effects:)`).
    @inlinable
    func send(batch: UnsafeBufferPointer<Element>) -> BroadcastSendResult {
        withState(.sender) { state, effects in
            state.terminal == nil ? state.deliver(batch: batch, effects: &effects) : .finished
        }
    }
}
