internal import CAtomics

/// A word-sized C11 atomic from the C shim, with the memory order spelled out
/// in every operation's name.
///
/// Like `Lock`, it wraps a stable C allocation that its owner destroys once,
/// and keeps the C type out of its inlinable surface.
@usableFromInline
struct AtomicInt: @unchecked Sendable {
    @usableFromInline let raw: OpaquePointer

    @usableFromInline init(_ initial: Int) { raw = OpaquePointer(cab_atomic_int_create(initial)) }

    /// A word owned by someone else (an `AtomicBlock`): never `destroy()` it.
    @usableFromInline init(unowned raw: OpaquePointer) { self.raw = raw }

    @usableFromInline func destroy() { cab_atomic_int_destroy(UnsafeMutablePointer(raw)) }

    @usableFromInline func loadRelaxed() -> Int { cab_atomic_int_load_relaxed(UnsafeMutablePointer(raw)) }
    @usableFromInline func storeRelaxed(_ value: Int) { cab_atomic_int_store_relaxed(UnsafeMutablePointer(raw), value) }
    @usableFromInline func loadAcquire() -> Int { cab_atomic_int_load_acquire(UnsafeMutablePointer(raw)) }
    @usableFromInline func loadSequentiallyConsistent() -> Int { cab_atomic_int_load_seq_cst(UnsafeMutablePointer(raw)) }
    @usableFromInline func storeRelease(_ value: Int) { cab_atomic_int_store_release(UnsafeMutablePointer(raw), value) }
    @usableFromInline func storeSequentiallyConsistent(_ value: Int) {
        cab_atomic_int_store_seq_cst(UnsafeMutablePointer(raw), value)
    }
    @usableFromInline func exchangeAcquiringAndReleasing(_ value: Int) -> Int {
        cab_atomic_int_exchange_acq_rel(UnsafeMutablePointer(raw), value)
    }

    /// Strong compare-and-exchange with acquire-release ordering on success.
    @usableFromInline
    func compareExchange(expected: Int, desired: Int) -> (exchanged: Bool, original: Int) {
        var expected = expected
        let exchanged = cab_atomic_int_cas_acq_rel(UnsafeMutablePointer(raw), &expected, desired)
        return (exchanged, expected)
    }

    @usableFromInline func fetchAddAcquiringAndReleasing(_ delta: Int) -> Int {
        cab_atomic_int_fetch_add_acq_rel(UnsafeMutablePointer(raw), delta)
    }

    @usableFromInline func fetchOrAcquiringAndReleasing(_ bits: Int) -> Int {
        cab_atomic_int_fetch_or_acq_rel(UnsafeMutablePointer(raw), bits)
    }
}

/// A sequentially consistent fence (see `cab_thread_fence_seq_cst`).
@usableFromInline
func sequentiallyConsistentFence() { cab_thread_fence_seq_cst() }
