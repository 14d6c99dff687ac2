// What a topic's registry (`TopicRegistry`) asks of one topic's sequence.
// Each call takes the sequence lock; the registry never calls them holding a
// shard lock (a send would hold up the shard's other topics; `ShardLock`),
// and nothing here resumes a continuation or runs user code while the
// sequence lock is held: an idle sequence has no subscriber, no waiting
// emitter and no running upstream.

extension BroadcastStorage {
    /// `subscribe(policy:)` without its follow-up: the caller applies it
    /// (`apply(_:)`, which may call `register`) once it holds no lock.
    /// Also tells whether the subscriber was registered (not when the
    /// sequence has finished, or the task is cancelled).
    @inlinable
    func subscribeDeferringFollowUp(
        policy: BroadcastBufferingPolicy, eviction: SubscriberEviction? = nil,
        fromCancelledTask: Bool = Task.isCancelled
    )
        -> (subscriber: SubscriberCore<Element, Failure>, registered: Bool, followUp: MembershipFollowUp?)
    {
        let subscriber = SubscriberCore<Element, Failure>(policy: policy, storage: self, eviction: eviction)
        var registered = false
        let followUp: MembershipFollowUp? = withState(.registrant) { state, effects in
            let countBefore = state.subscribers.count
            state.subscribe(subscriber, fromCancelledTask: fromCancelledTask, effects: &effects)
            registered = state.subscribers.count > countBefore
            return state.observesMembership
                ? state.membershipFollowUp(countBefore: countBefore, terminalChanged: false) : nil
        }
        return (subscriber, registered, followUp)
    }

    /// What `retireIfIdle()` found.
    @usableFromInline
    enum Retirement {
        /// Subscribers, or a run starting, running, stopping or lingering.
        case busy
        /// Idle, and now finished: nothing of it runs or will run.
        case retired
        /// It had finished already (its listener's `sink.finish()`); its run
        /// may still be stopping.
        case finished
    }

    /// Finishes this sequence if it is idle: no subscriber, and for a
    /// listener no run starting, running, stopping or lingering. Its
    /// finished word then says so (`retiredWhileIdle`), for a subscribe that
    /// finds it in `live` before the registry has taken it out.
    @inlinable
    func retireIfIdle() -> Retirement {
        withState { state, effects in
            if state.terminal != nil { return .finished }
            guard state.subscribers.isEmpty, state.sharing?.isIdle ?? true else { return .busy }
            state.finish(.finished, effects: &effects)
            lock.finished.storeRelease(Self.finishedWhileIdle)
            return .retired
        }
    }

    /// The finished word's value for a sequence `retireIfIdle` finished (1:
    /// any other finish).
    @inlinable static var finishedWhileIdle: Int { 2 }

    /// `retireIfIdle` finished it: nothing of it runs or will run, so a
    /// topic's next generation need not wait for it (read without the lock).
    @inlinable
    var retiredWhileIdle: Bool { lock.finished.loadAcquire() == Self.finishedWhileIdle }

    /// Whether the sequence has finished (a listener's `sink.finish()`, or
    /// the registry).
    @inlinable
    var hasFinished: Bool { isFinished }

    /// Whether this sequence has finished and its last run has stopped:
    /// its unregister closure has returned (without a listener: whether it
    /// has finished). A retired generation that has not finished yet (the
    /// registry finishes it after releasing its shard lock) may still start
    /// a run: a subscriber's start, or a blocked start let go, can be on its
    /// way.
    @inlinable
    var runHasStopped: Bool { lock.withLock { state.terminal != nil && (state.sharing?.hasStopped ?? true) } }

    /// Lets a generation created blocked (its predecessor was stopping)
    /// start its upstream; performs the start, with no lock held. If there
    /// is nothing to start (its subscribers left meanwhile) it may be idle:
    /// the registry hears of it either way.
    @inlinable
    func unblockStart() {
        let reconcile = withState { state, _ in
            guard state.sharing?.startBlocked == true else { return false }
            state.sharing!.startBlocked = false
            return state.sharing!.claimReconciler()
        }
        if reconcile {
            reconcileSharing()
        } else {
            topicObserver?(self)
        }
    }
}
