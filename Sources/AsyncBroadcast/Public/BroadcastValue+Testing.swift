// `@_spi(Testing)` entry points of `BroadcastValue`, for the tests, the fuzz
// targets and the stress tool: exact states to wait for instead of sleeping.
// Not part of the public contract.

extension BroadcastValue {
    /// How many changes there have been (sends and updates that changed the
    /// value); the initial value is not one.
    @_spi(Testing)
    public var changeCount: Int { storage.withState { state, _ in state.version - 1 } }

    /// How many parked readers changes and `finish` have woken so far.
    @_spi(Testing)
    public var wakeCount: Int { storage.withState { state, _ in state.wakeCount } }

    /// How many readers are on the parked list (parked in `next()`, or about
    /// to park).
    @_spi(Testing)
    public var parkedSubscriberCount: Int { storage.withState { state, _ in state.parked.count } }
}

extension BroadcastValue.Subscription {
    /// Whether this subscription's consumer is suspended in `next()` now.
    @_spi(Testing)
    public var isConsumerWaiting: Bool { core.parking.isParked }

    /// A non-suspending read: the latest unseen value, `.empty`, or the end.
    /// Claims the consumer slot like `next()`.
    @_spi(Testing)
    public func poll() -> BroadcastSequence<Value, Failure>.Subscription.PollResult {
        switch core.poll() {
        case .element(let value): return .element(value)
        case .empty: return .empty
        case .end: return .end
        case .failure(let error): return .failure(error)
        }
    }
}
