/// Deliberate faults, compiled in only with `-DASYNCBROADCAST_FAULT_<NAME>`.
///
/// They exist to prove that the checkers catch real bugs:
/// `scripts/stress-faults.sh` and `Fuzz/fault-check.sh` build the library with
/// each one and require the stress run or a fuzz target to fail. Every
/// `#if` for a fault lives here; the code consults these constants, which
/// fold to `false` in a normal build.
@usableFromInline
enum Fault {
    /// A producer never wakes a parked consumer.
    @inlinable static var skipWake: Bool {
        #if ASYNCBROADCAST_FAULT_SKIP_WAKE
        return true
        #else
        return false
        #endif
    }

    /// Ended subscribers stay registered (`subscriberCount` never drops).
    @inlinable static var leakSubscriber: Bool {
        #if ASYNCBROADCAST_FAULT_LEAK_SUBSCRIBER
        return true
        #else
        return false
        #endif
    }

    /// A full `.bufferingNewest` subscriber's eviction is not counted in
    /// `droppedCount`.
    @inlinable static var miscountEviction: Bool {
        #if ASYNCBROADCAST_FAULT_MISCOUNT_EVICTION
        return true
        #else
        return false
        #endif
    }

    /// A served `emit` reports success but delivers nothing.
    @inlinable static var dropEmit: Bool {
        #if ASYNCBROADCAST_FAULT_DROP_EMIT
        return true
        #else
        return false
        #endif
    }
}
