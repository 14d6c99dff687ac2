internal import CAtomics

/// An OS mutex (pthread mutex on Linux, `os_unfair_lock` on Apple platforms)
/// from the C shim.
///
/// A value wrapper around a C allocation: the owner creates it once and calls
/// `destroy()` in its `deinit`. Copies alias the same mutex. Critical sections
/// guarded by it do bounded work and never run user code (no continuation
/// resumes, no element deinitializers).
///
/// The pointer is stored untyped and the operations are not inlinable, so
/// that `CAtomics` stays an internal import while the generic code that uses
/// the lock is `@inlinable` (and so specialized in the client).
@usableFromInline
struct Lock: @unchecked Sendable {
    @usableFromInline let raw: OpaquePointer

    @usableFromInline init() { raw = OpaquePointer(cab_lock_create()) }

    /// A mutex owned by someone else (an `AtomicBlock`): never `destroy()` it.
    @usableFromInline init(unowned raw: OpaquePointer) { self.raw = raw }

    @usableFromInline func destroy() { cab_lock_destroy(UnsafeMutablePointer(raw)) }

    @usableFromInline func lock() { cab_lock_lock(UnsafeMutablePointer(raw)) }
    @usableFromInline func unlock() { cab_lock_unlock(UnsafeMutablePointer(raw)) }
    /// `true` if the lock was free and is now held.
    @usableFromInline func tryLock() -> Bool { cab_lock_trylock(UnsafeMutablePointer(raw)) }

    /// A non-zero word naming the calling thread (see `ReentranceGuard`).
    @usableFromInline static func currentThreadID() -> Int { cab_current_thread_id() }

    @inlinable
    func withLock<R, E: Error>(_ body: () throws(E) -> R) throws(E) -> R {
        lock()
        defer { unlock() }
        return try body()
    }
}
