/// A growable FIFO ring buffer over a power-of-two allocation.
///
/// Each subscriber owns one, and the sequence keeps one for replay. It is not
/// thread-safe: its owner guards it with a lock. It is `~Copyable` so that
/// exactly one value owns the allocation and its `deinit` frees it.
///
/// Invariants (checked by `_checkInvariants()` under
/// `ASYNCBROADCAST_INTERNAL_CHECKS`):
/// - `capacity` is 0 (nothing allocated) or a power of two, so a slot index is
///   `(head + i) & (capacity - 1)`, never a division.
/// - `0 <= count <= capacity`, `0 <= head < max(capacity, 1)`.
/// - Exactly the `count` slots starting at `head` (wrapping) are initialized.
/// - Growth only happens in `append` when `count == capacity`; steady-state
///   appends and removals allocate nothing.
@usableFromInline
struct RingBuffer<Element>: ~Copyable {
    @usableFromInline var storage: UnsafeMutablePointer<Element>?
    @usableFromInline var capacity: Int
    @usableFromInline var head: Int
    @usableFromInline var count: Int

    /// An empty buffer that allocates lazily, `initialCapacity` slots at the
    /// first append (rounded up to a power of two).
    @inlinable
    init(initialCapacity: Int = 0) {
        storage = nil
        capacity = 0
        head = 0
        count = 0
        if initialCapacity > 0 { reallocate(to: Self.roundUpToPowerOfTwo(initialCapacity)) }
    }

    @inlinable
    init(storage: UnsafeMutablePointer<Element>?, capacity: Int, head: Int, count: Int) {
        self.storage = storage
        self.capacity = capacity
        self.head = head
        self.count = count
    }

    @inlinable
    deinit {
        if let storage {
            var index = head
            for _ in 0..<count {
                (storage + index).deinitialize(count: 1)
                index = (index + 1) & (capacity - 1)
            }
            storage.deallocate()
        }
    }

    @inlinable
    var isEmpty: Bool { count == 0 }

    /// Traps if an invariant above is broken (internal checks only).
    @inlinable
    func _checkInvariants() {
        guard internalChecksEnabled else { return }
        internalInvariant(capacity == 0 || capacity & (capacity - 1) == 0, "ring capacity \(capacity) is not a power of two")
        internalInvariant((storage == nil) == (capacity == 0), "ring storage and capacity \(capacity) disagree")
        internalInvariant(count >= 0 && count <= capacity, "ring count \(count) outside 0...\(capacity)")
        internalInvariant(head >= 0 && head < Swift.max(capacity, 1), "ring head \(head) outside its capacity \(capacity)")
    }

    @inlinable
    mutating func append(_ element: consuming Element) {
        if count == capacity { reallocate(to: capacity == 0 ? 4 : capacity * 2) }
        (storage.unsafelyUnwrapped + ((head + count) & (capacity - 1))).initialize(to: element)
        count += 1
        _checkInvariants()
    }

    @inlinable
    mutating func popFirst() -> Element? {
        guard count > 0 else { return nil }
        let element = (storage.unsafelyUnwrapped + head).move()
        head = (head + 1) & (capacity - 1)
        count -= 1
        return element
    }

    /// Calls `body` on every element, oldest first, without removing them.
    @inlinable
    func forEach(_ body: (borrowing Element) -> Void) {
        guard let storage else { return }
        var index = head
        for _ in 0..<count {
            body(storage[index])
            index = (index + 1) & (capacity - 1)
        }
    }

    /// Moves the whole content (and allocation) out, leaving `self` empty.
    ///
    /// Lets an owner that holds a lock detach the elements in O(1) and run
    /// their deinitializers (user code) after unlocking.
    @inlinable
    mutating func takeAll() -> RingBuffer<Element> {
        let taken = RingBuffer(storage: storage, capacity: capacity, head: head, count: count)
        storage = nil
        capacity = 0
        head = 0
        count = 0
        return taken
    }

    @inlinable
    mutating func reallocate(to newCapacity: Int) {
        internalInvariant(newCapacity >= count && newCapacity & (newCapacity - 1) == 0, "bad ring growth to \(newCapacity)")
        let newStorage = UnsafeMutablePointer<Element>.allocate(capacity: newCapacity)
        if let storage {
            // Move the two wrapped runs into the front of the new allocation.
            let firstRun = Swift.min(count, capacity - head)
            newStorage.moveInitialize(from: storage + head, count: firstRun)
            (newStorage + firstRun).moveInitialize(from: storage, count: count - firstRun)
            storage.deallocate()
        }
        storage = newStorage
        capacity = newCapacity
        head = 0
    }

    @inlinable
    static func roundUpToPowerOfTwo(_ value: Int) -> Int {
        if value <= 0 || value > Int.max >> 1 { internalInconsistency("no power of two for \(value)") }
        var result = 1
        while result < value { result <<= 1 }
        return result
    }
}
