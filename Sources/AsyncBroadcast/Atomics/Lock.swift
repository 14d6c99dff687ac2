internal import CAtomics

/// An OS mutex (pthread mutex on Linux, `os_unfair_lock` on Apple platforms)
/// from the C shim.
///
/// A value wrapper around a C allocation: the owner creates it once and calls
/// `destroy()` in its `deinit`. Copies alias the same mutex. Critical sections
/// guarded by it do bounded work and never run user code (no continuation
/// resumes, no element deinitializers).
struct Lock: @unchecked Sendable {
    private let raw: UnsafeMutablePointer<cab_lock>

    init() { raw = cab_lock_create() }

    func destroy() { cab_lock_destroy(raw) }

    @inline(__always) func lock() { cab_lock_lock(raw) }
    @inline(__always) func unlock() { cab_lock_unlock(raw) }

    @inline(__always)
    func withLock<R, E: Error>(_ body: () throws(E) -> R) throws(E) -> R {
        lock()
        defer { unlock() }
        return try body()
    }
}
