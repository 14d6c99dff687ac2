/// A lock whose holder may run user code (`BroadcastValue.update`'s body,
/// `Value.==`), and that turns a call back from that code into a trap with a
/// message instead of a silent self-deadlock.
///
/// While user code runs, the holder records its thread in `owner`. An
/// uncontended `lock()` is one `tryLock`; only a caller that finds the lock
/// taken reads `owner`, and it can read its own thread there only if it set
/// it itself (nobody else writes its thread's name), so the check has no
/// false positives. A call back from another thread that the body waits for
/// cannot be told apart from ordinary contention and still deadlocks; the
/// documentation says the body must not call back at all.
@usableFromInline
struct ReentrantCallGuardedLock: @unchecked Sendable {
    @usableFromInline let mutex: Lock
    @usableFromInline let owner: AtomicInt
    @usableFromInline let misuseMessage: StaticString

    @usableFromInline
    init(mutex: Lock, owner: AtomicInt, misuseMessage: StaticString) {
        self.mutex = mutex
        self.owner = owner
        self.misuseMessage = misuseMessage
    }

    @inlinable
    func lock() {
        if mutex.tryLock() { return }
        if owner.loadRelaxed() == Lock.currentThreadID() { misuse("\(misuseMessage)") }
        mutex.lock()
    }

    @inlinable
    func unlock() { mutex.unlock() }

    /// The same check for a lock-free read.
    @inlinable
    func trapIfHeldByThisThread() {
        if owner.loadRelaxed() == Lock.currentThreadID() { misuse("\(misuseMessage)") }
    }

    /// Runs user code with the lock held, marked as this thread's.
    @inlinable
    func runningUserCode<R, E: Error>(_ body: () throws(E) -> R) throws(E) -> R {
        owner.storeRelaxed(Lock.currentThreadID())
        defer { owner.storeRelaxed(0) }
        return try body()
    }
}
