/// How a waiting `emit` ends. Kept in `BroadcastState.decidedEmits` until
/// the emitter takes it (its continuation carries no payload).
@usableFromInline
enum EmitOutcome: Sendable {
    case delivered(BroadcastSendResult)
    case cancelled
}

/// Work decided inside a critical section and carried out after it.
///
/// Resuming a continuation or running an element's `deinit` while a lock is
/// held can deadlock (against the runtime's task-status lock taken during
/// cancellation, swift-async-algorithms PR 303) or re-enter the sequence from
/// user code. So state transitions only *record* these effects; the caller
/// runs them once every lock is released.
///
/// Recording is allocation-free in steady state: the first two wakes are
/// kept inline (a send to a sequence of one or two subscribers, the sparse
/// case, touches no box, no pool and no array); anything more borrows a box
/// from the storage's `EffectsPool` (its arrays keep their capacity) and
/// `run()` returns it. A section that records nothing touches no box at all.
///
/// An `Effects` must be run: dropping one without `run()` would leave a
/// continuation suspended forever, so its `deinit` traps.
@usableFromInline
struct Effects<Element: Sendable>: ~Copyable {
    @usableFromInline var box: EffectsBox<Element>?
    @usableFromInline let pool: EffectsPool<Element>?
    @usableFromInline var hasRun = false
    /// The first two wakes, before any box (see above).
    @usableFromInline var wake0: UnsafeContinuation<Void, Never>?
    @usableFromInline var wake1: UnsafeContinuation<Void, Never>?

    @inlinable
    init(pool: EffectsPool<Element>?) {
        self.box = nil
        self.pool = pool
        self.wake0 = nil
        self.wake1 = nil
    }

    @inlinable
    deinit {
        if !hasRun { internalInconsistency("Effects dropped without run(): a continuation would never resume") }
    }

    @inlinable
    mutating func recordingBox() -> EffectsBox<Element> {
        if let box { return box }
        let fresh = pool?.take() ?? EffectsBox<Element>()
        box = fresh
        return fresh
    }

    /// Resumes `continuation` (a parked reader or a waiting emitter) in `run()`.
    @inlinable
    mutating func resume(_ continuation: UnsafeContinuation<Void, Never>) {
        if wake0 == nil {
            wake0 = continuation
        } else if wake1 == nil {
            wake1 = continuation
        } else {
            recordingBox().wakes.append(continuation)
        }
    }

    /// Completes a send's eviction of `subscriber` in `run()`: its removal
    /// takes the sequence lock again, so it cannot happen inside the send's.
    @inlinable
    mutating func completeEviction(_ subscriber: any EvictedSubscriber) {
        recordingBox().evictions.append(subscriber)
    }

    /// Keeps `element` alive until `run()`, so its deinitializer runs unlocked.
    @inlinable
    mutating func release(_ element: consuming Element) {
        recordingBox().released.append(element)
    }

    /// Runs the recorded effects. Call with no lock held.
    @inlinable
    consuming func run() {
        hasRun = true
        if let wake0 { Parking.resume(wake0) }
        if let wake1 { Parking.resume(wake1) }
        guard let box else { return }
        for continuation in box.wakes { Parking.resume(continuation) }
        if !box.evictions.isEmpty {
            for subscriber in box.evictions { subscriber.completeEviction() }
            box.evictions.removeAll()
        }
        // Keep the arrays' capacity for the next section (so steady state
        // allocates nothing), but not a burst's: one `finish` that woke
        // 100,000 readers must not pin their array for the sequence's life.
        let keep =
            box.wakes.capacity <= EffectsBox<Element>.retainedCapacity
            && box.released.capacity <= EffectsBox<Element>.retainedCapacity
        box.wakes.removeAll(keepingCapacity: keep)
        box.released.removeAll(keepingCapacity: keep)
        pool?.put(box)
    }
}

/// The reusable arrays behind `Effects`.
@usableFromInline
final class EffectsBox<Element: Sendable> {
    // Unchecked exclusivity (no `swift_beginAccess` per record and per
    // run): one `Effects` at a time owns a box (the pool hands it out by
    // an atomic exchange), and nothing it runs can reach the box again.
    @exclusivity(unchecked) @usableFromInline var wakes: [UnsafeContinuation<Void, Never>] = []
    @exclusivity(unchecked) @usableFromInline var released: [Element] = []
    @exclusivity(unchecked) @usableFromInline var evictions: [any EvictedSubscriber] = []

    /// Larger arrays are freed after use instead of kept for reuse.
    @inlinable static var retainedCapacity: Int { 1024 }

    @inlinable init() {}
}

/// A one-slot, lock-free cache of an `EffectsBox`, so steady-state sends
/// reuse one box instead of allocating. Concurrent users that find the slot
/// empty allocate their own; a box that finds the slot taken is freed.
@usableFromInline
struct EffectsPool<Element: Sendable>: @unchecked Sendable {
    @usableFromInline let slot: AtomicInt

    /// A pool with a slot of its own (`destroy()` frees it).
    @inlinable init() { slot = AtomicInt(0) }

    /// A pool whose slot is a word of its owner's block (never `destroy()`
    /// it: `releaseCachedBox()`, then the owner frees the block).
    @inlinable init(slot: AtomicInt) { self.slot = slot }

    @inlinable
    func take() -> EffectsBox<Element>? {
        let bits = slot.exchangeAcquiringAndReleasing(0)
        guard let pointer = UnsafeRawPointer(bitPattern: bits) else { return nil }
        return Unmanaged<EffectsBox<Element>>.fromOpaque(pointer).takeRetainedValue()
    }

    @inlinable
    func put(_ box: EffectsBox<Element>) {
        let unmanaged = Unmanaged.passRetained(box)
        let bits = Int(bitPattern: unmanaged.toOpaque())
        if !slot.compareExchange(expected: 0, desired: bits).exchanged {
            unmanaged.release()
        }
    }

    /// Frees the cached box and the slot (a pool made by `init()`). Call
    /// once, when no other thread can use the pool.
    @inlinable
    func destroy() {
        releaseCachedBox()
        slot.destroy()
    }

    /// Frees the cached box. Call once, when no other thread can use the pool.
    @inlinable
    func releaseCachedBox() {
        _ = take()
    }
}
