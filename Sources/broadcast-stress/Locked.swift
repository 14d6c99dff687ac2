#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// A value guarded by a pthread mutex.
///
/// The harness must not use the `Synchronization` module (ThreadSanitizer
/// does not see its futex on Linux and would report false races), so this is
/// a plain pthread mutex over a stable heap allocation: TSan sees every edge.
final class Locked<State>: @unchecked Sendable {
    private let mutex: UnsafeMutablePointer<pthread_mutex_t>
    private var state: State

    init(_ initial: State) {
        mutex = .allocate(capacity: 1)
        mutex.initialize(to: pthread_mutex_t())
        guard pthread_mutex_init(mutex, nil) == 0 else { fatalError("pthread_mutex_init failed") }
        state = initial
    }

    deinit {
        pthread_mutex_destroy(mutex)
        mutex.deinitialize(count: 1)
        mutex.deallocate()
    }

    func withLock<R>(_ body: (inout State) throws -> R) rethrows -> R {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return try body(&state)
    }

    /// A copy of the current value.
    var value: State { withLock { $0 } }
}

/// Hands a value to exactly one taker, then forgets it (so the taker holds
/// the only reference).
final class TakeOnce<Value>: @unchecked Sendable {
    private let slot: Locked<Value?>
    init(_ value: Value) { slot = Locked(value) }
    func take() -> Value? { slot.withLock { value in defer { value = nil }; return value } }
}
