// Public only so that the `@inlinable` wrappers below can name the C
// functions: clients' specializations of the generic hot paths then inline
// the C11 atomics instead of calling a wrapper per operation. `_CAtomics` is
// underscored and is not API (see its header).
public import _CAtomics

/// A word-sized C11 atomic from the C shim, with the memory order spelled out
/// in every operation's name.
///
/// Like `Lock`, it wraps a stable C allocation that its owner destroys once.
/// Every operation is inlinable, down to the `static inline` C function, so
/// an atomic in client-specialized code is one instruction, not two calls.
@usableFromInline
struct AtomicInt: @unchecked Sendable {
    @usableFromInline let raw: UnsafeMutablePointer<cab_atomic_int>

    @inlinable init(_ initial: Int) { raw = cab_atomic_int_create(initial) }

    /// A word owned by someone else (an `AtomicBlock`): never `destroy()` it.
    @inlinable init(unowned raw: UnsafeMutablePointer<cab_atomic_int>) { self.raw = raw }

    #if ASYNCBROADCAST_WEAK_MEMORY
    // The deterministic checkers' build (`ASYNCBROADCAST_WEAK_MEMORY=1`):
    // every operation goes through the weak-memory model (WeakMemory.c),
    // which keeps a store invisible to other logical threads until a fence,
    // a read-modify-write or a lock drains it.
    @inlinable func destroy() {
        cab_wm_forget(raw, MemoryLayout<cab_atomic_int>.size)
        cab_atomic_int_destroy(raw)
    }
    @inlinable func loadRelaxed() -> Int { cab_wm_load(raw, Int(CAB_WM_RELAXED)) }
    @inlinable func storeRelaxed(_ value: Int) { cab_wm_store(raw, value, Int(CAB_WM_RELAXED)) }
    @inlinable func loadAcquire() -> Int { cab_wm_load(raw, Int(CAB_WM_ACQUIRE)) }
    @inlinable func loadSequentiallyConsistent() -> Int { cab_wm_load(raw, Int(CAB_WM_SEQ_CST)) }
    @inlinable func storeRelease(_ value: Int) { cab_wm_store(raw, value, Int(CAB_WM_ACQUIRE)) }
    @inlinable func storeSequentiallyConsistent(_ value: Int) { cab_wm_store(raw, value, Int(CAB_WM_SEQ_CST)) }
    @inlinable func exchangeAcquiringAndReleasing(_ value: Int) -> Int { cab_wm_exchange(raw, value) }
    @inlinable
    func compareExchange(expected: Int, desired: Int) -> (exchanged: Bool, original: Int) {
        var expected = expected
        let exchanged = cab_wm_cas(raw, &expected, desired)
        return (exchanged, expected)
    }
    @inlinable func fetchAddAcquiringAndReleasing(_ delta: Int) -> Int { cab_wm_fetch_add(raw, delta) }
    @inlinable func fetchOrAcquiringAndReleasing(_ bits: Int) -> Int { cab_wm_fetch_or(raw, bits) }
    #else
    @inlinable func destroy() { cab_atomic_int_destroy(raw) }

    @inlinable func loadRelaxed() -> Int { cab_atomic_int_load_relaxed(raw) }
    @inlinable func storeRelaxed(_ value: Int) { cab_atomic_int_store_relaxed(raw, value) }
    @inlinable func loadAcquire() -> Int { cab_atomic_int_load_acquire(raw) }
    @inlinable func loadSequentiallyConsistent() -> Int { cab_atomic_int_load_seq_cst(raw) }
    @inlinable func storeRelease(_ value: Int) { cab_atomic_int_store_release(raw, value) }
    @inlinable func storeSequentiallyConsistent(_ value: Int) { cab_atomic_int_store_seq_cst(raw, value) }
    @inlinable func exchangeAcquiringAndReleasing(_ value: Int) -> Int {
        cab_atomic_int_exchange_acq_rel(raw, value)
    }

    /// Strong compare-and-exchange with acquire-release ordering on success.
    @inlinable
    func compareExchange(expected: Int, desired: Int) -> (exchanged: Bool, original: Int) {
        var expected = expected
        let exchanged = cab_atomic_int_cas_acq_rel(raw, &expected, desired)
        return (exchanged, expected)
    }

    @inlinable func fetchAddAcquiringAndReleasing(_ delta: Int) -> Int {
        cab_atomic_int_fetch_add_acq_rel(raw, delta)
    }

    @inlinable func fetchOrAcquiringAndReleasing(_ bits: Int) -> Int {
        cab_atomic_int_fetch_or_acq_rel(raw, bits)
    }
    #endif
}

/// A sequentially consistent fence (see `cab_thread_fence_seq_cst`).
@inlinable
func sequentiallyConsistentFence() {
    #if ASYNCBROADCAST_WEAK_MEMORY
    cab_wm_fence()
    #else
    cab_thread_fence_seq_cst()
    #endif
}

/// Marks where the Swift runtime synchronises for us (a continuation's
/// resume enqueues its task with a full barrier): nothing in a normal build;
/// the weak-memory model drains the calling thread's stores there.
@inlinable @inline(__always)
func runtimeSynchronizes() {
    #if ASYNCBROADCAST_WEAK_MEMORY
    cab_wm_runtime_sync()
    #endif
}
