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

    @usableFromInline var isEmpty: Bool { counts == nil && !reconcile }

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
        return action
    }

    @usableFromInline
    func _checkSharingInvariants() {
        guard let sharing else { return }
        sharing._checkInvariants()
        internalInvariant(sharing.subscriberCount == subscribers.count || Fault.leakSubscriber,
                          "sharing counts \(sharing.subscriberCount) subscribers, the registry \(subscribers.count)")
        if let id = sharing.pendingEmit {
            internalInvariant(emitters.contains { $0.id == id } || decidedEmits[id] != nil,
                              "the upstream's pending emit \(id) is neither queued nor decided")
        }
    }
}
