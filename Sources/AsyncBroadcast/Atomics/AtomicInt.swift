internal import CAtomics

/// A word-sized C11 atomic from the C shim, with the memory order spelled out
/// at every call site.
///
/// Like `Lock`, it wraps a stable C allocation that its owner destroys once.
struct AtomicInt: @unchecked Sendable {
    private let raw: UnsafeMutablePointer<cab_atomic_int>

    init(_ initial: Int) { raw = cab_atomic_int_create(initial) }

    func destroy() { cab_atomic_int_destroy(raw) }

    @inline(__always) func loadRelaxed() -> Int { cab_atomic_int_load_relaxed(raw) }
    @inline(__always) func loadAcquire() -> Int { cab_atomic_int_load_acquire(raw) }
    @inline(__always) func loadSequentiallyConsistent() -> Int { cab_atomic_int_load_seq_cst(raw) }
    @inline(__always) func storeRelaxed(_ value: Int) { cab_atomic_int_store_relaxed(raw, value) }
    @inline(__always) func storeRelease(_ value: Int) { cab_atomic_int_store_release(raw, value) }
    @inline(__always) func storeSequentiallyConsistent(_ value: Int) { cab_atomic_int_store_seq_cst(raw, value) }
    @inline(__always) func exchangeAcquiringAndReleasing(_ value: Int) -> Int {
        cab_atomic_int_exchange_acq_rel(raw, value)
    }

    /// Strong compare-and-exchange with acquire-release ordering on success.
    @inline(__always)
    func compareExchange(expected: Int, desired: Int) -> (exchanged: Bool, original: Int) {
        var expected = expected
        let exchanged = cab_atomic_int_cas_acq_rel(raw, &expected, desired)
        return (exchanged, expected)
    }

    @inline(__always) func fetchOrAcquiringAndReleasing(_ bits: Int) -> Int {
        cab_atomic_int_fetch_or_acq_rel(raw, bits)
    }
    @inline(__always) func fetchAddRelaxed(_ delta: Int) -> Int { cab_atomic_int_fetch_add_relaxed(raw, delta) }
}
