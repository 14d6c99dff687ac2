#if ASYNCBROADCAST_INTERNAL_CHECKS
public import _CAtomics  // `cab_shard_locks_held_add` (inlinable callers)
#endif

/// A topic shard's lock: the OS mutex of `Lock`, which, in builds with the
/// internal checks, also counts the shard locks the calling thread holds.
///
/// Why: a shard lock is held only for a lookup, a reservation or a
/// retirement, never while waiting for a sequence lock (a long send would
/// then hold up every topic of the shard). The sequence lock
/// (`SequenceGate`) traps, under the internal checks, when it is taken
/// with this count above zero, on every path and whether or not it would
/// have waited (`LockNestingTests`).
@usableFromInline
struct ShardLock: @unchecked Sendable {
    @usableFromInline let mutex = Lock()

    @inlinable init() {}

    @inlinable func destroy() { mutex.destroy() }

    @inlinable
    func lock() {
        mutex.lock()
        #if ASYNCBROADCAST_INTERNAL_CHECKS
        cab_shard_locks_held_add(1)
        #endif
    }

    @inlinable
    func unlock() {
        #if ASYNCBROADCAST_INTERNAL_CHECKS
        cab_shard_locks_held_add(-1)
        #endif
        mutex.unlock()
    }

    @inlinable
    func withLock<R>(_ body: () throws -> R) rethrows -> R {
        lock()
        defer { unlock() }
        return try body()
    }
}
