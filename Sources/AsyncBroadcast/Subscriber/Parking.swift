/// The park/wake protocol: the one place where a suspended reader's
/// continuation is stored, claimed and resumed.
///
/// A `Parking` is two words of its owner's `AtomicBlock`: the park word and
/// the continuation itself (an `UnsafeContinuation<Void, Never>` is one
/// pointer, stored as its bit pattern). The continuation carries no payload:
/// why the reader was woken, and any element for it, travel through the
/// subscriber's own synchronised state, where ThreadSanitizer sees the
/// hand-off. (A payload would cross threads inside the runtime's resume,
/// which TSan cannot see, and users' TSan runs would report it:
/// swiftlang/swift#57803.)
///
/// ```
///            park (reader)             tryUnpark (producer, finish, cancel())
///   idle ───────────────────▶ parked ──────────────────────────────────────▶ idle
///     │                          │
///     │ cancelHandler            │ cancelHandler (the task was cancelled)
///     ▼                          ▼
///  cancelled ◀──────────────── cancelled   (a tombstone: never parks again)
/// ```
///
/// Rules:
/// - Whoever moves the word out of `parked` owns the continuation and resumes
///   it exactly once, after releasing every lock (it records the resume in
///   `Effects`, or resumes directly where it holds none).
/// - The reader stores the continuation *before* its CAS to `parked`
///   (release); the winner of the CAS out of `parked` (acquire) reads it.
///   Nobody else touches the continuation word.
/// - A task-cancellation handler runs while the runtime holds the task's
///   status lock: `cancelHandler()` takes no lock. If it fires before the
///   reader parks, the tombstone makes `park` fail, so the reader resumes at
///   once instead of sleeping through its cancellation.
/// - Lost wake-ups are excluded Dekker-style: the reader counts itself in
///   the sequence's `parkedCount`, moves to `parked`, issues a sequentially
///   consistent fence and looks for work once more (`park(_:parkedCount:hasWork:)`);
///   a producer publishes, issues the same fence (`producerMayNeedToWake`,
///   or `producerFence` where it looks at every park word anyway) and then
///   calls `tryUnpark()` on the subscribers. One of the two always sees the
///   other: the park word itself is the store-buffering pair with the
///   published work; `parkedCount` only lets a producer with many
///   subscribers skip looking at their park words while nobody is parked.
@usableFromInline
struct Parking: @unchecked Sendable {
    @inlinable static var idle: Int { 0 }
    @inlinable static var parked: Int { 1 }
    @inlinable static var cancelledBit: Int { 2 }

    @usableFromInline let word: AtomicInt
    @usableFromInline let continuationBits: AtomicInt

    @inlinable
    init(word: AtomicInt, continuationBits: AtomicInt) {
        self.word = word
        self.continuationBits = continuationBits
    }

    /// A reader is suspended right now.
    @inlinable var isParked: Bool { word.loadAcquire() == Self.parked }

    /// The reader's task was cancelled (the tombstone is set).
    @inlinable var isCancelled: Bool { word.loadAcquire() & Self.cancelledBit != 0 }

    // MARK: Reader

    /// Suspends-to-be: stores `continuation`, unless there is work already or
    /// the task was cancelled, in which case it is resumed at once. Call it
    /// from inside `withUnsafeContinuation`, holding no lock (the runtime may
    /// run the closure after re-enqueueing the task, swiftlang/swift#85668).
    ///
    /// - Parameters:
    ///   - parkedCount: the count producers read to decide whether to look
    ///     for parked readers; the reader leaves it with `unparked(parkedCount:)`
    ///     after it resumes.
    ///   - hasWork: looks at the reader's buffer and terminal state; may take
    ///     the subscriber's own lock briefly.
    @inlinable
    func park(
        _ continuation: UnsafeContinuation<Void, Never>, parkedCount: AtomicInt?,
        hasWork: () -> Bool
    ) {
        _ = parkedCount?.fetchAddAcquiringAndReleasing(1)
        continuationBits.storeRelaxed(unsafeBitCast(continuation, to: Int.self))
        let (exchanged, original) = word.compareExchange(expected: Self.idle, desired: Self.parked)
        guard exchanged else {
            if original & Self.cancelledBit == 0 {
                misuse("concurrent next() calls on one Subscription; a subscription has exactly one consumer")
            }
            continuationBits.storeRelaxed(0)
            Self.resume(continuation)  // the tombstone: the task is already cancelled
            return
        }
        if !Fault.parkSkipsFence { sequentiallyConsistentFence() }  // Handshakes.md, row 1
        if hasWork(), let mine = tryUnpark() { Self.resume(mine) }
    }

    /// The reader is running again: it no longer counts as parked.
    @inlinable
    func unparked(parkedCount: AtomicInt?) {
        _ = parkedCount?.fetchAddAcquiringAndReleasing(-1)
    }

    // MARK: Wakers

    /// Claims the parked reader's continuation, if a reader is parked and
    /// nobody claimed it first. The caller resumes it once, outside any lock.
    @inlinable
    func tryUnpark() -> UnsafeContinuation<Void, Never>? {
        if Fault.skipWake { return nil }
        guard word.loadAcquire() == Self.parked,
            word.compareExchange(expected: Self.parked, desired: Self.idle).exchanged
        else { return nil }
        return takeContinuation()
    }

    /// Call after publishing work and before `tryUnpark()`: `true` if any
    /// reader of the sequence may be parked.
    @inlinable
    static func producerMayNeedToWake(parkedCount: AtomicInt) -> Bool {
        producerFence()
        return parkedCount.loadRelaxed() != 0
    }

    /// Call after publishing work and before `tryUnpark()` when the caller
    /// looks at every park word it published to, without `parkedCount`
    /// (`BroadcastState.wakeParkedReaders` for a few subscribers).
    @inlinable
    static func producerFence() {
        if !Fault.wakeSkipsFence { sequentiallyConsistentFence() }  // Handshakes.md, row 1
    }

    /// The reader's task-cancellation handler: sets the tombstone, and
    /// resumes the reader if it is parked. Takes no lock.
    @inlinable
    func cancelHandler() {
        let previous = word.fetchOrAcquiringAndReleasing(Self.cancelledBit)
        guard previous == Self.parked else { return }
        // We moved the word out of `parked`: the continuation is ours.
        let continuation = takeContinuation()
        word.storeRelease(Self.cancelledBit)
        Self.resume(continuation)
    }

    /// Resumes a claimed continuation: every resume in the library (readers'
    /// and emitters') goes through here.
    ///
    /// The call is hidden from ThreadSanitizer's access tracking (not its
    /// synchronisation) because of a gap in the Swift runtime's TSan model:
    /// when a continuation is resumed before its task has finished
    /// suspending, `swift_continuation_await` finds it already resumed and
    /// continues the task without the `tsan_acquire` that the normal path
    /// (enqueue, then run) has. `resume()` itself, inlined here, reads the
    /// task's continuation context; the resumed task soon reuses that memory
    /// for its next suspension, and TSan, seeing no edge between the two,
    /// reports a race inside the runtime's own bookkeeping. It is the
    /// payload-free remainder of swiftlang/swift#57803 (a payload's write
    /// would race the same way, which is why no continuation here carries
    /// one). Nothing of ours is accessed during the call: every element and
    /// outcome crosses threads through our own synchronised state, which
    /// TSan checks in full.
    @inlinable
    static func resume(_ continuation: UnsafeContinuation<Void, Never>) {
        runtimeSynchronizes()  // the model's stand-in for the runtime's enqueue
        ThreadSanitizer.ignoreAccessesBegin()
        continuation.resume()
        ThreadSanitizer.ignoreAccessesEnd()
    }

    @inlinable
    func takeContinuation() -> UnsafeContinuation<Void, Never> {
        let bits = continuationBits.loadRelaxed()  // ordered by the CAS that won it
        if bits == 0 { internalInconsistency("a parked reader without a continuation") }
        continuationBits.storeRelaxed(0)
        return unsafeBitCast(bits, to: UnsafeContinuation<Void, Never>.self)
    }
}
