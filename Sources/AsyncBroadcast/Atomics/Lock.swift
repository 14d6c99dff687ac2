public import _CAtomics  // public for the inlinable wrappers: see AtomicInt.swift

/// An OS mutex (pthread mutex on Linux, `os_unfair_lock` on Apple platforms)
/// from the C shim.
///
/// A value wrapper around a C allocation: the owner creates it once and calls
/// `destroy()` in its `deinit`. Copies alias the same mutex. Critical sections
/// guarded by it do bounded work and never run user code (no continuation
/// resumes, no element deinitializers).
///
/// The operations are inlinable so that the generic code that uses the lock,
/// specialized in the client, calls `pthread_mutex_lock` directly rather than
/// through a wrapper.
@usableFromInline
struct Lock: @unchecked Sendable {
    @usableFromInline let raw: UnsafeMutablePointer<cab_lock>

    @inlinable init() { raw = cab_lock_create() }

    /// A mutex owned by someone else (an `AtomicBlock`): never `destroy()` it.
    @inlinable init(unowned raw: UnsafeMutablePointer<cab_lock>) { self.raw = raw }

    #if ASYNCBROADCAST_WEAK_MEMORY
    // The deterministic checkers' build: unlocking is a release only, and
    // locking makes the last releaser's stores visible (WeakMemory.c).
    @inlinable func destroy() {
        cab_wm_forget(raw, MemoryLayout<cab_lock>.size)
        cab_lock_destroy(raw)
    }
    @inlinable func lock() { cab_wm_lock(raw) }
    @inlinable func unlock() { cab_wm_unlock(raw) }
    @inlinable func tryLock() -> Bool { cab_wm_trylock(raw) }
    #else
    @inlinable func destroy() { cab_lock_destroy(raw) }

    @inlinable func lock() { cab_lock_lock(raw) }
    @inlinable func unlock() { cab_lock_unlock(raw) }
    /// `true` if the lock was free and is now held.
    @inlinable func tryLock() -> Bool { cab_lock_trylock(raw) }
    #endif

    /// A non-zero word naming the calling thread (see `ReentranceGuard`).
    @inlinable static func currentThreadID() -> Int { cab_current_thread_id() }

    @inlinable
    func withLock<R, E: Error>(_ body: () throws(E) -> R) throws(E) -> R {
        lock()
        defer { unlock() }
        return try body()
    }
}
