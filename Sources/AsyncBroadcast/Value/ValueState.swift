/// How a `BroadcastValue` ended.
@usableFromInline
enum ValueTerminal<Failure: Error> {
    case finished
    case failed(Failure)
}

/// The state of one `BroadcastValue`, guarded by its storage's lock.
///
/// Conflation is by version: `version` counts the changes so far (starting
/// at 1 for the initial value), and each subscriber records the version it
/// last returned (`seen`). A reader returns the current value only when
/// `version != seen`, and then sets `seen = version`, so it never returns a
/// change twice and, having fallen behind, returns only the latest: each
/// subscriber holds at most one pending value, the shared one.
///
/// Invariants (checked by `_checkInvariants()` under internal checks):
/// - `subscribers[i].registryIndex == i` and `parked[i].parkedIndex == i`;
///   a subscriber is on the parked list only while registered.
/// - every registered subscriber has `seen < version`, or `seen == version`
///   and no terminal event yet (a finished subscriber that has seen the last
///   value has left).
/// - no ended subscriber is registered or parked.
@usableFromInline
struct ValueState<Value: Sendable, Failure: Error> {
    @usableFromInline var value: Value
    @usableFromInline var version = 1
    @usableFromInline var terminal: ValueTerminal<Failure>?
    /// Every registered subscriber, for `subscriberCount` and `finish`.
    @usableFromInline var subscribers: [ValueSubscriber<Value, Failure>] = []
    /// Registered readers that found nothing new and are parked or about to
    /// park: a change wakes exactly these, never scanning the others.
    @usableFromInline var parked: [ValueSubscriber<Value, Failure>] = []
    /// Readers woken by changes or by `finish` (a testing counter).
    @usableFromInline var wakeCount = 0
    /// Where the next `_checkInvariants()` looks (internal checks only).
    @usableFromInline var checkCursor = 0

    @inlinable
    init(value: Value) {
        self.value = value
    }

    // MARK: Subscribers

    @inlinable
    mutating func register(_ subscriber: ValueSubscriber<Value, Failure>) {
        subscriber.seen = version - 1  // holds the current value
        subscriber.registryIndex = subscribers.count
        subscribers.append(subscriber)
    }

    @inlinable
    mutating func unregister(_ subscriber: ValueSubscriber<Value, Failure>) {
        if let index = subscriber.parkedIndex {
            removeFromParked(at: index)
        }
        guard let index = subscriber.registryIndex else { return }
        if Fault.leakSubscriber { return }
        subscriber.registryIndex = nil
        let last = subscribers.removeLast()
        if index < subscribers.count {
            subscribers[index] = last
            last.registryIndex = index
        }
        shrinkIfSparse(&subscribers)
    }

    @inlinable
    mutating func removeFromParked(at index: Int) {
        let removed = parked[index]
        removed.parkedIndex = nil
        let last = parked.removeLast()
        if index < parked.count {
            parked[index] = last
            last.parkedIndex = index
        }
        shrinkIfSparse(&parked)
    }

    /// Ends `subscriber` (cancel, release, task cancellation): it leaves now
    /// and a parked reader is woken to return `nil`.
    @inlinable
    mutating func end(_ subscriber: ValueSubscriber<Value, Failure>, effects: inout Effects<Value>) {
        subscriber.ended = true
        unregister(subscriber)
        if let continuation = subscriber.parking.tryUnpark() { effects.resume(continuation) }
    }

    // MARK: Changes

    /// A change happened (`value` already holds the new value): publish its
    /// version and wake the parked readers, which resume after the lock.
    @inlinable
    mutating func changed(effects: inout Effects<Value>) {
        version &+= 1
        wakeParked(effects: &effects)
    }

    @inlinable
    mutating func wakeParked(effects: inout Effects<Value>) {
        if Fault.valueSkipWake || parked.isEmpty { return }
        for subscriber in parked {
            subscriber.parkedIndex = nil
            // Fails for a reader that has not parked yet: it looks again
            // under this lock before sleeping (`ValueStorage.hasWork`) and
            // sees the change; or for one whose task was cancelled.
            if let continuation = subscriber.parking.tryUnpark() {
                effects.resume(continuation)
                wakeCount += 1
            }
        }
        // Reused by the next wake-up, unless a burst of readers grew it.
        parked.removeAll(keepingCapacity: parked.capacity <= 1024)
    }

    /// The first terminal event wins. Subscribers that have seen the last
    /// value leave now; the others leave when they take it.
    @inlinable
    mutating func finish(_ event: ValueTerminal<Failure>, effects: inout Effects<Value>) -> Bool {
        guard terminal == nil else { return false }
        terminal = event
        wakeParked(effects: &effects)
        var index = subscribers.count
        while index > 0 {
            index -= 1
            let subscriber = subscribers[index]
            if subscriber.seen == version { unregister(subscriber) }
        }
        return true
    }

    // MARK: Reading

    /// The reader's step (a `PollOutcome`, as for a sequence subscriber):
    /// the latest unseen value, the end, the error once, or `.empty` (and
    /// then, when `preparingToPark`, it is on the parked list).
    @inlinable
    mutating func take(
        for subscriber: ValueSubscriber<Value, Failure>,
        preparingToPark: Bool = true
    ) -> PollOutcome<Value, Failure> {
        if subscriber.ended { return .end }
        if subscriber.seen != version {
            if Fault.valueDuplicate {
                subscriber.faultToggle.toggle()
                if !subscriber.faultToggle { subscriber.seen = version }
            } else {
                subscriber.seen = version
            }
            if terminal != nil && subscriber.seen == version { unregister(subscriber) }
            return .element(value)
        }
        if let terminal {
            subscriber.ended = true
            unregister(subscriber)
            switch terminal {
            case .finished: return .end
            case .failed(let error): return .failure(error)
            }
        }
        if preparingToPark && subscriber.parkedIndex == nil && subscriber.registryIndex != nil {
            subscriber.parkedIndex = parked.count
            parked.append(subscriber)
        }
        return .empty
    }

    /// Whether a reader about to sleep must not: something changed, the
    /// value ended, or the subscriber did.
    @inlinable
    func hasWork(for subscriber: ValueSubscriber<Value, Failure>) -> Bool {
        subscriber.ended || subscriber.seen != version || terminal != nil
    }

    // MARK: Invariants

    @inlinable
    mutating func _checkInvariants() {
        guard internalChecksEnabled else { return }
        for index in invariantCheckPositions(count: subscribers.count, cursor: &checkCursor) {
            let subscriber = subscribers[index]
            internalInvariant(subscriber.registryIndex == index, "registry index out of place")
            internalInvariant(!subscriber.ended, "an ended subscriber is still registered")
            internalInvariant(
                subscriber.seen < version || (subscriber.seen == version && terminal == nil),
                "a finished subscriber that has seen the last value is still registered")
        }
        for index in invariantCheckPositions(count: parked.count, cursor: &checkCursor) {
            let subscriber = parked[index]
            internalInvariant(subscriber.parkedIndex == index, "parked index out of place")
            internalInvariant(subscriber.registryIndex != nil, "a parked reader that is not registered")
        }
    }
}
