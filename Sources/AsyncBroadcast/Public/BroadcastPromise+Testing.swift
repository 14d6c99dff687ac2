// `@_spi(Testing)` entry points of `BroadcastPromise`. Not part of the
// public contract.

extension BroadcastPromise {
    /// Waiters in the table now (waiting, about to wait, or cancelled and
    /// not yet gone).
    @_spi(Testing)
    public var waiterCount: Int { lock.withLock { waiters.occupied } }

    /// The size of the waiter table: the most waiters there have been at
    /// once, never more (cancelled waiters' slots are reused).
    @_spi(Testing)
    public var waiterSlotCapacity: Int { lock.withLock { waiters.slots.count } }
}
