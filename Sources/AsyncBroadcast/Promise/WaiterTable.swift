/// The waiters of a `BroadcastPromise`: a table of slots with a free list,
/// so a waiter is added and removed in O(1) and the table never grows with
/// cancelled waiters (their slots are reused).
///
/// A waiter reserves its slot *before* it suspends, so that its
/// cancellation handler knows where to look even if it runs first (the
/// tombstone case). Each slot moves through:
///
/// ```
///   free ──reserve──▶ reserved ──store──▶ waiting
///                        │                   │
///                        │ cancel            │ cancel (resumed now)
///                        ▼                   ▼
///                    cancelled ◀─────────  cancelled ──collect──▶ free
/// ```
///
/// A `cancelled` slot is freed by its own waiter when it collects its
/// outcome (`CancellationError`). Completion takes the whole table
/// (`takeAll()`) and resumes its `waiting` slots; from then on waiters see
/// the result under the promise's lock and never touch a table again.
/// Callers check, under the promise's lock, that the promise is not
/// completed before they touch a slot: after completion the table is empty.
/// Invariants: the free list links exactly the `free` slots; `occupied`
/// counts the others.
@usableFromInline
struct WaiterTable {
    @usableFromInline
    enum Slot {
        case free(next: Int)
        case reserved
        case waiting(UnsafeContinuation<Void, Never>)
        case cancelled
    }

    @usableFromInline var slots: [Slot] = []
    /// First free slot, or -1.
    @usableFromInline var freeHead = -1
    @usableFromInline var occupied = 0

    @inlinable init() {}

    @inlinable
    mutating func reserve() -> Int {
        occupied += 1
        if freeHead >= 0 {
            let index = freeHead
            guard case .free(let next) = slots[index] else { internalInconsistency("free list holds a used slot") }
            freeHead = next
            slots[index] = .reserved
            return index
        }
        slots.append(.reserved)
        return slots.count - 1
    }

    @inlinable
    mutating func free(_ index: Int) {
        slots[index] = .free(next: freeHead)
        freeHead = index
        occupied -= 1
    }

    /// The waiter's continuation arrives. `false` if the waiter was
    /// cancelled already: the caller resumes it at once.
    @inlinable
    mutating func store(_ continuation: UnsafeContinuation<Void, Never>, at index: Int) -> Bool {
        switch slots[index] {
        case .reserved:
            slots[index] = .waiting(continuation)
            return true
        case .cancelled:
            return false
        case .free, .waiting:
            internalInconsistency("a promise waiter stored twice")
        }
    }

    /// The waiter's task was cancelled: returns its continuation if it is
    /// suspended (the caller resumes it), else leaves a tombstone.
    @inlinable
    mutating func cancel(at index: Int) -> UnsafeContinuation<Void, Never>? {
        switch slots[index] {
        case .waiting(let continuation):
            slots[index] = .cancelled
            return continuation
        case .reserved:
            slots[index] = .cancelled
            return nil
        case .free, .cancelled:
            return nil  // unreachable while the caller checks `result_ == nil`; harmless
        }
    }

    /// Whether the waiter at `index` was cancelled; frees its slot either
    /// way if it was (the waiter leaves).
    @inlinable
    mutating func collectCancelled(at index: Int) -> Bool {
        guard case .cancelled = slots[index] else { return false }
        if !Fault.promiseLeakCancelled { free(index) }
        return true
    }

    /// The whole table, leaving an empty one: the promise completed, and
    /// no waiter touches the table after that.
    @inlinable
    mutating func takeAll() -> WaiterTable {
        let taken = self
        self = WaiterTable()
        return taken
    }

    /// Resumes every suspended waiter of a taken table. Call with no lock
    /// held.
    @inlinable
    func resumeWaiting() {
        for slot in slots {
            if case .waiting(let continuation) = slot { Parking.resume(continuation) }
        }
    }

    @inlinable
    func _checkInvariants() {
        guard internalChecksEnabled else { return }
        var freeCount = 0
        var cursor = freeHead
        while cursor >= 0 {
            guard case .free(let next) = slots[cursor] else {
                internalInconsistency("free list holds a used slot")
            }
            freeCount += 1
            internalInvariant(freeCount <= slots.count, "free list has a cycle")
            cursor = next
        }
        internalInvariant(freeCount + occupied == slots.count, "free list and occupied count disagree")
    }
}
