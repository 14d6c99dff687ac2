// What a topic's registry (`TopicRegistry`) asks of one topic's sequence.
// Each call takes the sequence lock; the registry calls them holding its
// shard lock (lock order: shard, then sequence), and nothing here resumes a
// continuation or runs user code while that lock is held: an idle sequence
// has no subscriber, no waiting emitter and no running upstream.

extension BroadcastStorage {
    /// `subscribe(policy:)` without its follow-up: the caller applies it
    /// (`apply(_:)`, which may call `register`) once it holds no lock.
    /// Also tells whether the subscriber was registered (not when the
    /// sequence has finished, or the task is cancelled).
    @inlinable
    func subscribeDeferringFollowUp(policy: BroadcastBufferingPolicy)
        -> (subscriber: SubscriberCore<Element, Failure>, registered: Bool, followUp: MembershipFollowUp?)
    {
        let subscriber = SubscriberCore<Element, Failure>(policy: policy, storage: self)
        let fromCancelledTask = Task.isCancelled
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

    /// Finishes this sequence if it is idle: no subscriber, and for a
    /// listener no run starting, running, stopping or lingering. Returns
    /// whether it is now finished (already finished counts: a listener's
    /// `sink.finish()` ended it).
    @usableFromInline
    func retireIfIdle() -> Bool {
        withState { state, effects in
            if state.terminal != nil { return true }
            guard state.subscribers.isEmpty, state.sharing?.isIdle ?? true else { return false }
            state.finish(.finished, effects: &effects)
            return true
        }
    }

    /// Whether the sequence has finished (a listener's `sink.finish()`, or
    /// the registry).
    @usableFromInline
    var hasFinished: Bool { lock.withLock { state.terminal != nil } }

    /// Whether this (finished) sequence's last run has stopped: its
    /// unregister closure has returned (always true without a listener).
    @usableFromInline
    var runHasStopped: Bool { lock.withLock { state.sharing?.hasStopped ?? true } }

    /// Lets a generation created blocked (its predecessor was stopping)
    /// start its upstream; performs the start, with no lock held.
    @usableFromInline
    func unblockStart() {
        let reconcile = withState { state, _ in
            guard state.sharing?.startBlocked == true else { return false }
            state.sharing!.startBlocked = false
            return state.sharing!.claimReconciler()
        }
        if reconcile { reconcileSharing() }
    }
}
