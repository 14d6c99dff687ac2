/// One segment of an `SPSCRing`: a power-of-two ring of slots that holds the
/// elements with indices in `[base, end)`.
///
/// `end` is `Int.max` while producers still append here. A producer that
/// finds the segment full links `next` and then stores `end` (release); the
/// consumer that reaches `end` (acquire) follows `next`.
@usableFromInline
final class SPSCSegment<Element> {
    @usableFromInline let base: Int
    @usableFromInline let mask: Int
    @usableFromInline let slots: UnsafeMutablePointer<Element>
    /// Written once, by the producer before its release store of `end`; read
    /// by the consumer only after its acquire load of `end` sees that store.
    /// Unchecked: the runtime check could only catch an overlap on one
    /// thread, and neither side holds an access across a call.
    @exclusivity(unchecked) @usableFromInline var next: SPSCSegment<Element>?
    @usableFromInline let end = AtomicInt(.max)

    @inlinable var capacity: Int { mask + 1 }

    @inlinable
    init(base: Int, capacity: Int) {
        internalInvariant(capacity > 0 && capacity & (capacity - 1) == 0, "segment capacity \(capacity) is not a power of two")
        self.base = base
        self.mask = capacity - 1
        self.slots = .allocate(capacity: capacity)
    }

    deinit {
        // The owner deinitializes every element before letting go.
        slots.deallocate()
        end.destroy()
    }
}

/// A single-producer, single-consumer FIFO of unbounded size, for
/// subscribers whose producers never remove elements.
///
/// "Single producer" holds because every producer runs under the sequence
/// lock; "single consumer" because a subscription has one consumer (guarded
/// by `SubscriberCore.consumerBusy`). Neither side takes a lock per element.
///
/// Invariants (the producer's checked by `_checkProducerInvariants()` under
/// `ASYNCBROADCAST_INTERNAL_CHECKS`):
/// - Elements have consecutive indices; `tail` (published by the producer)
///   counts pushes, `head` (published by the consumer) counts pops, and
///   exactly the indices in `[head, tail)` hold initialized elements.
/// - Index `i` of a segment lives in `slots[i & mask]`; a producer never has
///   more than `capacity` unread elements in one segment, so live slots
///   never collide.
/// - The producer's fields (`producerSegment`, `producerTail`,
///   `producerCachedHead`) are touched only under the sequence lock; the
///   consumer's (`consumerSegment`, `consumerHead`) only by the consumer.
///   Each is a separate stored property, so the two sides never overlap.
/// - Steady state allocates nothing: while the consumer keeps within one
///   segment, the producer wraps around it. A full segment links a new one of
///   twice the capacity (up to `maximumSegmentCapacity`); the consumer frees
///   the old one after reading its last element.
@usableFromInline
final class SPSCRing<Element> {
    @inlinable static var defaultCapacity: Int { 64 }
    @inlinable static var maximumSegmentCapacity: Int { 1 << 16 }

    /// Both start at 0 and belong to the owner (on separate cache lines of
    /// its `AtomicBlock`: the producer writes `tail`, the consumer `head`).
    @usableFromInline let tail: AtomicInt
    @usableFromInline let head: AtomicInt

    // Hot paths use unowned(unsafe) references: retaining a segment that
    // both sides touch would bounce its reference count between cores.
    // `consumerOwner` keeps the consumer's segment alive, and each segment
    // keeps its `next` alive, so every segment up to the producer's is owned.
    //
    // The six side-owned fields below skip the runtime exclusivity check
    // (`swift_beginAccess` on every read and write, ~13 % of push/pop in a
    // profile). The design already excludes overlapping accesses: producer
    // fields are touched only under the sequence lock, consumer fields only
    // by the holder of the consumer slot (`SubscriberCore.consumerBusy`),
    // and `deinit` runs alone. Every access is a plain load or store that
    // never spans a call into user code, so there is no same-thread overlap
    // for the check to find either (it cannot see other threads anyway).
    @exclusivity(unchecked) @usableFromInline unowned(unsafe) var producerSegment: SPSCSegment<Element>
    @exclusivity(unchecked) @usableFromInline var producerTail = 0
    @exclusivity(unchecked) @usableFromInline var producerCachedHead = 0

    @exclusivity(unchecked) @usableFromInline unowned(unsafe) var consumerSegment: SPSCSegment<Element>
    @exclusivity(unchecked) @usableFromInline var consumerOwner: SPSCSegment<Element>
    @exclusivity(unchecked) @usableFromInline var consumerHead = 0
    /// The last `tail` the consumer loaded (never ahead of the real one):
    /// while it is ahead of `consumerHead`, `pop` takes elements without
    /// touching the line the producer writes on every push.
    @exclusivity(unchecked) @usableFromInline var consumerCachedTail = 0

    @inlinable
    init(capacity: Int, tail: AtomicInt, head: AtomicInt) {
        self.tail = tail
        self.head = head
        let first = SPSCSegment<Element>(base: 0, capacity: RingBuffer<Element>.roundUpToPowerOfTwo(Swift.max(capacity, 1)))
        consumerOwner = first
        producerSegment = first
        consumerSegment = first
    }

    deinit {
        // No other thread can hold the ring now, and the owner's `head` and
        // `tail` words may already be freed: walk the plain indices. (The
        // owner empties the ring first with `removeAll()`, whose acquire
        // load of `tail` orders the producer's writes before this read.)
        var index = consumerHead
        unowned(unsafe) var segment = consumerSegment
        while index != producerTail {
            if index == segment.end.loadAcquire() { segment = segment.next.unsafelyUnwrapped }
            (segment.slots + (index & segment.mask)).deinitialize(count: 1)
            index += 1
        }
    }

    // MARK: Producer (sequence lock held)

    /// Traps if the producer's view breaks an invariant above (internal
    /// checks only; sequence lock held).
    @inlinable
    func _checkProducerInvariants() {
        guard internalChecksEnabled else { return }
        let segment = producerSegment
        internalInvariant(tail.loadRelaxed() == producerTail, "published tail \(tail.loadRelaxed()) != producer tail \(producerTail)")
        internalInvariant(producerCachedHead <= producerTail, "cached head \(producerCachedHead) ahead of tail \(producerTail)")
        internalInvariant(head.loadAcquire() <= producerTail, "consumer head ahead of tail \(producerTail)")
        internalInvariant(segment.capacity & segment.mask == 0, "segment capacity \(segment.capacity) is not a power of two")
        internalInvariant(segment.base <= producerTail, "producer segment starts at \(segment.base) after tail \(producerTail)")
        internalInvariant(producerTail - Swift.max(head.loadAcquire(), segment.base) <= segment.capacity,
                          "more unread elements than slots in the producer's segment")
        internalInvariant(segment.end.loadRelaxed() == .max, "the producer's segment is closed")
    }

    @inlinable
    func push(_ element: consuming Element) {
        unowned(unsafe) var segment = producerSegment
        if producerTail - Swift.max(producerCachedHead, segment.base) == segment.capacity {
            producerCachedHead = head.loadAcquire()
            if producerTail - Swift.max(producerCachedHead, segment.base) == segment.capacity {
                let fresh = SPSCSegment<Element>(
                    base: producerTail,
                    capacity: Swift.min(segment.capacity * 2, Self.maximumSegmentCapacity))
                segment.next = fresh  // owns `fresh`
                segment.end.storeRelease(producerTail)  // publishes `next`
                producerSegment = fresh
                segment = fresh
            }
        }
        (segment.slots + (producerTail & segment.mask)).initialize(to: element)
        producerTail += 1
        tail.storeRelease(producerTail)
    }

    /// Appends `elements` in order and publishes `tail` once.
    @inlinable
    func push(contentsOf elements: UnsafeBufferPointer<Element>) {
        var source = elements.baseAddress.unsafelyUnwrapped
        var remaining = elements.count
        while remaining > 0 {
            unowned(unsafe) var segment = producerSegment
            var free = segment.capacity - (producerTail - Swift.max(producerCachedHead, segment.base))
            if free < remaining {
                producerCachedHead = head.loadAcquire()
                free = segment.capacity - (producerTail - Swift.max(producerCachedHead, segment.base))
                if free == 0 {
                    let fresh = SPSCSegment<Element>(
                        base: producerTail,
                        capacity: Swift.min(segment.capacity * 2, Self.maximumSegmentCapacity))
                    segment.next = fresh
                    segment.end.storeRelease(producerTail)
                    producerSegment = fresh
                    segment = fresh
                    free = segment.capacity
                }
            }
            let count = Swift.min(free, remaining)
            let start = producerTail & segment.mask
            let first = Swift.min(count, segment.capacity - start)
            (segment.slots + start).initialize(from: source, count: first)
            if count > first { segment.slots.initialize(from: source + first, count: count - first) }
            producerTail += count
            source += count
            remaining -= count
        }
        tail.storeRelease(producerTail)
    }

    /// `producerCount() >= n`, re-reading the consumer's `head` only when
    /// the cached one (never ahead of the real one) says it might be.
    @inlinable
    func producerCountReaches(_ n: Int) -> Bool {
        producerTail - producerCachedHead >= n && producerCount() >= n
    }

    /// Unread elements as the producer sees them (it may count an element
    /// the consumer is taking right now: the read is ordered after us).
    @inlinable
    func producerCount() -> Int {
        producerCachedHead = head.loadSequentiallyConsistent()
        return producerTail - producerCachedHead
    }

    // MARK: Consumer

    /// - Parameter publishSequentiallyConsistent: publish the new `head`
    ///   with a sequentially consistent store (for `.bounded`, whose
    ///   emitters read it after storing their own flag).
    @inlinable
    func pop(publishSequentiallyConsistent: Bool) -> Element? {
        let index = consumerHead
        if index == consumerCachedTail {
            consumerCachedTail = tail.loadAcquire()
            guard index != consumerCachedTail else { return nil }
        }
        unowned(unsafe) var segment = consumerSegment
        if index == segment.end.loadAcquire() {
            let next = segment.next.unsafelyUnwrapped
            consumerOwner = next  // the old segment is empty: freed here
            consumerSegment = next
            segment = next
        }
        let element = (segment.slots + (index & segment.mask)).move()
        consumerHead = index + 1
        if publishSequentiallyConsistent {
            head.storeSequentiallyConsistent(index + 1)
        } else {
            head.storeRelease(index + 1)
        }
        return element
    }

    /// Whether the consumer has something to read (consumer side).
    @inlinable
    var hasElementsForConsumer: Bool { consumerHead != tail.loadAcquire() }

    /// A snapshot for observers on other threads (tests).
    @inlinable
    var isEmptyForObserver: Bool { head.loadAcquire() == tail.loadAcquire() }

    /// Drops every element. Consumer side, or exclusive access.
    @inlinable
    func removeAll() {
        while pop(publishSequentiallyConsistent: false) != nil {}
    }
}
