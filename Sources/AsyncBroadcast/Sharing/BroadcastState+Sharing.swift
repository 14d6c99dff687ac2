/// What a change of membership or of the terminal state asks for once the
/// sequence lock is released.
@usableFromInline
struct MembershipFollowUp {
    /// `subscriberCounts` to refresh from `registeredCount`.
    var counts: BroadcastValue<Int, Never>?
    /// The count can no longer change (finished, nobody left): end `counts`.
    var countsAreFinal = false
    /// This thread claimed the sharing reconciler role.
    var reconcile = false
    /// `upstreamReady()` waiters to wake: a subscriber left, or the
    /// sequence ended (each rechecks its own case).
    var readinessWakes: WaiterTable?

    @usableFromInline var isEmpty: Bool { counts == nil && !reconcile && readinessWakes == nil }

    @usableFromInline init() {}
}

extension BroadcastState {
    /// Call at the end of a section that may have changed `subscribers` (it
    /// held `countBefore` on entry) or set `terminal`. O(1); nothing at all
    /// for a plain sequence nobody observes.
    /// Whether a membership change can need a follow-up at all. Inlined, so
    /// that subscribing to and leaving a plain sequence nobody observes costs
    /// one check here instead of a call into unspecialized generic code
    /// (which looked up generic metadata on every subscribe and cancel).
    @inlinable
    var observesMembership: Bool { sharing != nil || counts != nil }

    @usableFromInline
    mutating func membershipFollowUp(countBefore: Int, terminalChanged: Bool) -> MembershipFollowUp {
        var followUp = MembershipFollowUp()
        if sharing == nil && counts == nil { return followUp }
        let countAfter = subscribers.count
        let changed = countAfter != countBefore
        if changed || terminalChanged, let counts, !(Fault.countsSkipRemoval && countAfter < countBefore) {
            followUp.counts = counts
            followUp.countsAreFinal = terminal != nil && countAfter == 0
        }
        if sharing != nil {
            if changed { sharing!.subscribersChanged(from: countBefore, to: countAfter) }
            if (countAfter < countBefore || terminalChanged) && !sharing!.readinessWaiters.isEmpty {
                followUp.readinessWakes = sharing!.readinessWaiters.takeAll()
            }
            followUp.reconcile = sharing!.claimReconciler()
        }
        return followUp
    }

    /// The reconciler's next action (see `SharingState.nextAction()`); a
    /// stop also cancels the run's waiting `emit`, so none of its elements
    /// arrive after the stop.
    @usableFromInline
    mutating func nextSharingAction(effects: inout Effects<Element>) -> SharingAction? {
        let action = sharing!.nextAction()
        if case .stop = action, let id = sharing!.pendingEmit {
            sharing!.pendingEmit = nil
            cancelEmit(id, effects: &effects)
        }
        if action == nil { wakeIfUpstreamStopped(effects: &effects) }
        return action
    }

    /// Wakes the `upstreamStopped()` waiters if nothing of the upstream runs.
    @usableFromInline
    mutating func wakeIfUpstreamStopped(effects: inout Effects<Element>) {
        if sharing!.upstreamIsStopped { sharing!.stoppedWaiters.wakeAll(into: &effects) }
    }

    /// Whether the listener serving `subscriber` said it is ready (see
    /// `Subscription.upstreamReady()`); `nil` while that is not decided.
    ///
    /// While a subscriber is registered and the sequence goes on, the run
    /// serving it cannot change (a run stops only with no subscriber, or
    /// at the end), so the current readiness is its readiness.
    @usableFromInline
    func upstreamReadiness(of subscriber: SubscriberCore<Element, Failure>) -> Bool? {
        guard let sharing, sharing.hasListener else { return true }
        guard subscriber.registryIndex != nil else { return false }  // ended, or never registered
        if sharing.readyGeneration != 0 { return true }
        return terminal == nil ? nil : false
    }

    @usableFromInline
    func _checkSharingInvariants() {
        guard let sharing else { return }
        sharing._checkInvariants()
        sharing.readinessWaiters._checkInvariants()
        sharing.stoppedWaiters._checkInvariants()
        internalInvariant(
            sharing.subscriberCount == subscribers.count || Fault.leakSubscriber,
            "sharing counts \(sharing.subscriberCount) subscribers, the registry \(subscribers.count)")
        if let id = sharing.pendingEmit {
            internalInvariant(
                emitters.contains { $0.id == id } || decidedEmits[id] != nil,
                "the upstream's pending emit \(id) is neither queued nor decided")
        }
    }
}
