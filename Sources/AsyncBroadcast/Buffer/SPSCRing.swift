public import _CAtomics  // `cab_atomic_int`, for the inlinable views below

/// One segment of an `SPSCRing`: a power-of-two ring of slots that holds the
/// elements with indices in `[base, end)`, as a view of raw memory.
///
/// Layout: a header {`base`, `mask`, `next`, `end`} padded to a cache line,
/// then `mask + 1` slots aligned for `Element`. Raw memory rather than an object: a class
/// cost three mallocs per segment (the object, its slots and `end`) and a
/// reference count, and subscribing paid all of them for the first segment.
///
/// `end` is `Int.max` while producers still append here. A producer that
/// finds the segment full links `next` and then stores `end` (release); the
/// consumer that reaches `end` (acquire) follows `next`, and frees the
/// segment it leaves. The first segment (`base == 0`) lives inside its
/// owner's `AtomicBlock` allocation and is never freed on its own; every
/// later one starts after at least one element, so `base > 0` tells them
/// apart.
@usableFromInline
struct SPSCSegment<Element> {
    @usableFromInline let raw: UnsafeMutableRawPointer

    @inlinable @inline(__always) init(_ raw: UnsafeMutableRawPointer) { self.raw = raw }

    /// A whole cache line: the consumer reads `end` on every pop, so no slot
    /// the producer writes may share its line.
    @inlinable static var headerSize: Int { 64 }
    /// The alignment the segment's memory needs (its header holds words).
    @inlinable static var alignment: Int { Swift.max(MemoryLayout<Element>.alignment, MemoryLayout<Int>.alignment) }
    @inlinable static var slotsOffset: Int {
        let alignment = MemoryLayout<Element>.alignment
        return (headerSize + alignment - 1) & ~(alignment - 1)
    }

    /// Bytes for a segment of `capacity` slots.
    @inlinable
    static func byteCount(capacity: Int) -> Int {
        slotsOffset + capacity * MemoryLayout<Element>.stride
    }

    /// Writes a fresh header into `raw` (`byteCount(capacity:)` bytes,
    /// aligned to `alignment`), before the segment is published.
    @inlinable
    static func initialize(_ raw: UnsafeMutableRawPointer, base: Int, capacity: Int) -> Self {
        internalInvariant(capacity > 0 && capacity & (capacity - 1) == 0, "segment capacity \(capacity) is not a power of two")
        raw.storeBytes(of: base, toByteOffset: 0, as: Int.self)
        raw.storeBytes(of: capacity - 1, toByteOffset: 8, as: Int.self)
        raw.storeBytes(of: nil, toByteOffset: 16, as: UnsafeMutableRawPointer?.self)
        (raw + 24).bindMemory(to: cab_atomic_int.self, capacity: 1)
        (raw + slotsOffset).bindMemory(to: Element.self, capacity: capacity)
        let segment = Self(raw)
        segment.end.storeRelaxed(.max)
        return segment
    }

    /// A segment of its own allocation, linked after the first one.
    @inlinable
    static func allocate(base: Int, capacity: Int) -> Self {
        internalInvariant(base > 0, "a linked segment at base 0 would pass for the inline one")
        let raw = UnsafeMutableRawPointer.allocate(byteCount: byteCount(capacity: capacity), alignment: alignment)
        return initialize(raw, base: base, capacity: capacity)
    }

    /// Frees a linked segment; the inline one goes with its block. Its
    /// elements must already be gone.
    @inlinable @inline(__always)
    func deallocateIfLinked() {
        guard base != 0 else { return }
        #if ASYNCBROADCAST_WEAK_MEMORY
        cab_wm_forget(raw, Self.byteCount(capacity: capacity))
        #endif
        raw.deallocate()
    }

    @inlinable @inline(__always) var base: Int { raw.load(fromByteOffset: 0, as: Int.self) }
    @inlinable @inline(__always) var mask: Int { raw.load(fromByteOffset: 8, as: Int.self) }
    @inlinable @inline(__always) var capacity: Int { mask + 1 }

    /// Written once, by the producer before its release store of `end`; read
    /// by the consumer only after its acquire load of `end` sees that store.
    @inlinable @inline(__always) var next: Self? {
        get { nextRaw.map(Self.init) }
        nonmutating set { nextRaw = newValue?.raw }
    }
    /// `next` without an `Optional<Self>`, whose metadata unspecialized
    /// code would have to look up.
    @inlinable @inline(__always) var nextRaw: UnsafeMutableRawPointer? {
        get { raw.load(fromByteOffset: 16, as: UnsafeMutableRawPointer?.self) }
        nonmutating set { raw.storeBytes(of: newValue, toByteOffset: 16, as: UnsafeMutableRawPointer?.self) }
    }

    @inlinable @inline(__always) var end: AtomicInt { AtomicInt(unowned: (raw + 24).assumingMemoryBound(to: cab_atomic_int.self)) }

    @inlinable @inline(__always) var slots: UnsafeMutablePointer<Element> {
        (raw + Self.slotsOffset).assumingMemoryBound(to: Element.self)
    }
}

/// A single-producer, single-consumer FIFO of unbounded size, for
/// subscribers whose producers never remove elements.
///
/// "Single producer" holds because every producer runs under the sequence
/// lock; "single consumer" because a subscription has one consumer (guarded
/// by `SubscriberCore.consumerBusy`). Neither side takes a lock per element.
///
/// The ring is a view: its state is eight words of the owner's `AtomicBlock`
/// (`SubscriberCore.Word`), four on the producer's cache line and four on the
/// consumer's, and its first segment is in the same allocation. Subscribing
/// allocates nothing for it, and no access pays an exclusivity check or a
/// reference count. The owner calls `destroy()` once, before freeing the
/// block.
///
/// Invariants (the producer's checked by `_checkProducerInvariants()` under
/// `ASYNCBROADCAST_INTERNAL_CHECKS`):
/// - Elements have consecutive indices; `tail` (published by the producer)
///   counts pushes, `head` (published by the consumer) counts pops, and
///   exactly the indices in `[head, tail)` hold initialized elements.
/// - Index `i` of a segment lives in `slots[i & mask]`; a producer never has
///   more than `capacity` unread elements in one segment, so live slots
///   never collide.
/// - The producer's words (`tail`, `producerTail`, `producerCachedHead`,
///   `producerSegment`) are written only under the sequence lock; the
///   consumer's (`head`, `consumerHead`, `consumerCachedTail`,
///   `consumerSegment`) only by the holder of the consumer slot. Each side's
///   words share a cache line that the other side never writes. Only `tail`,
///   `head` and a segment's `end` cross threads, with release/acquire; the
///   other words are plain loads and stores (never atomic, never mixed).
/// - Every segment from the consumer's to the producer's is reachable through
///   `next` and not yet freed; the consumer frees one (unless it is the inline
///   first one) after reading its last element, when the producer has
///   already moved on.
/// - Steady state allocates nothing: while the consumer keeps within one
///   segment, the producer wraps around it. A full segment links a new one of
///   twice the capacity (up to `maximumSegmentCapacity`).
@usableFromInline
struct SPSCRing<Element>: @unchecked Sendable {
    @inlinable static var defaultCapacity: Int { 64 }
    @inlinable static var maximumSegmentCapacity: Int { 1 << 16 }
    /// Words the ring uses on each side, from the word it is given.
    @inlinable static var wordsPerSide: Int { 4 }

    /// `tail` (atomic), `producerTail`, `producerCachedHead`, `producerSegment`.
    @usableFromInline let producer: UnsafeMutableRawPointer
    /// `head` (atomic), `consumerHead`, `consumerCachedTail`, `consumerSegment`.
    @usableFromInline let consumer: UnsafeMutableRawPointer

    /// - Parameters:
    ///   - producerWords, consumerWords: the first of `wordsPerSide` zeroed
    ///     words each, on lines the other side does not write.
    ///   - firstSegment: `SPSCSegment<Element>.byteCount(capacity:)` bytes
    ///     aligned to `SPSCSegment<Element>.alignment`, owned by the caller.
    @inlinable
    init(producerWords: AtomicInt, consumerWords: AtomicInt, firstSegment: UnsafeMutableRawPointer, capacity: Int) {
        producer = UnsafeMutableRawPointer(producerWords.raw)
        consumer = UnsafeMutableRawPointer(consumerWords.raw)
        let first = SPSCSegment<Element>.initialize(firstSegment, base: 0, capacity: capacity)
        producerSegment = first
        consumerSegment = first
    }

    /// Bytes of slots the first segment may take: it sits inside every
    /// subscriber, idle or not, so it holds a few elements and the ring
    /// grows (doubling) for a consumer that falls further behind. 64 slots
    /// of a 64-byte element made an idle subscriber cost 4.7 KB.
    @inlinable static var firstSegmentSlotBytes: Int { 128 }

    /// The capacity of the first segment for a policy's `limit`: at most
    /// `defaultCapacity` slots and `firstSegmentSlotBytes` bytes (at least
    /// one slot), a power of two.
    @inlinable
    static func firstCapacity(limit: Int) -> Int {
        let wanted = RingBuffer<Element>.roundUpToPowerOfTwo(Swift.max(Swift.min(limit, defaultCapacity), 1))
        return Swift.min(wanted, slotsFittingFirstSegmentBytes)
    }

    /// The most slots, a power of two and at least one, that fit in
    /// `firstSegmentSlotBytes`: 16 `Int`s, 2 elements of 64 bytes, 4 of 24.
    @inlinable
    static var slotsFittingFirstSegmentBytes: Int {
        let fitting = Swift.max(firstSegmentSlotBytes / Swift.max(MemoryLayout<Element>.stride, 1), 1)
        return 1 << (Int.bitWidth - 1 - fitting.leadingZeroBitCount)
    }

    @inlinable @inline(__always) var tail: AtomicInt { AtomicInt(unowned: producer.assumingMemoryBound(to: cab_atomic_int.self)) }
    @inlinable @inline(__always) var head: AtomicInt { AtomicInt(unowned: consumer.assumingMemoryBound(to: cab_atomic_int.self)) }

    @inlinable @inline(__always) var producerTail: Int {
        get { producer.load(fromByteOffset: 8, as: Int.self) }
        nonmutating set { producer.storeBytes(of: newValue, toByteOffset: 8, as: Int.self) }
    }
    @inlinable @inline(__always) var producerCachedHead: Int {
        get { producer.load(fromByteOffset: 16, as: Int.self) }
        nonmutating set { producer.storeBytes(of: newValue, toByteOffset: 16, as: Int.self) }
    }
    @inlinable @inline(__always) var producerSegment: SPSCSegment<Element> {
        get { SPSCSegment(producer.load(fromByteOffset: 24, as: UnsafeMutableRawPointer.self)) }
        nonmutating set { producer.storeBytes(of: newValue.raw, toByteOffset: 24, as: UnsafeMutableRawPointer.self) }
    }

    @inlinable @inline(__always) var consumerHead: Int {
        get { consumer.load(fromByteOffset: 8, as: Int.self) }
        nonmutating set { consumer.storeBytes(of: newValue, toByteOffset: 8, as: Int.self) }
    }
    /// The last `tail` the consumer loaded (never ahead of the real one):
    /// while it is ahead of `consumerHead`, `pop` takes elements without
    /// touching the line the producer writes on every push.
    @inlinable @inline(__always) var consumerCachedTail: Int {
        get { consumer.load(fromByteOffset: 16, as: Int.self) }
        nonmutating set { consumer.storeBytes(of: newValue, toByteOffset: 16, as: Int.self) }
    }
    @inlinable @inline(__always) var consumerSegment: SPSCSegment<Element> {
        get { SPSCSegment(consumer.load(fromByteOffset: 24, as: UnsafeMutableRawPointer.self)) }
        nonmutating set { consumer.storeBytes(of: newValue.raw, toByteOffset: 24, as: UnsafeMutableRawPointer.self) }
    }

    /// Deinitializes what is left and frees the linked segments. Call once,
    /// with exclusive access (the owner's `deinit`), while the owner's block
    /// still exists. The acquire load of `tail` orders the producer's last
    /// writes before these reads.
    ///
    /// It runs in the owner's `deinit`, which is never specialized: the
    /// common case (nothing left, the inline segment only) is a few loads,
    /// and the walk uses raw pointers so that it needs no generic metadata
    /// but `Element`'s.
    @inlinable @inline(__always)
    func destroy() {
        var index = consumerHead
        let end = tail.loadAcquire()
        var segment = consumerSegment
        if index == end && segment.base == 0 && segment.nextRaw == nil { return }
        while index != end {
            if index == segment.end.loadAcquire() {
                let next = segment.nextRaw.unsafelyUnwrapped
                segment.deallocateIfLinked()
                segment = SPSCSegment(next)
            }
            (segment.slots + (index & segment.mask)).deinitialize(count: 1)
            index += 1
        }
        var remaining: UnsafeMutableRawPointer? = segment.raw
        while let current = remaining {
            let segment = SPSCSegment<Element>(current)
            remaining = segment.nextRaw
            segment.deallocateIfLinked()
        }
    }

    // MARK: Producer (sequence lock held)

    /// Traps if the producer's view breaks an invariant above (internal
    /// checks only; sequence lock held).
    @inlinable
    func _checkProducerInvariants() {
        guard internalChecksEnabled else { return }
        let segment = producerSegment
        let producerTail = producerTail
        internalInvariant(tail.loadRelaxed() == producerTail, "published tail \(tail.loadRelaxed()) != producer tail \(producerTail)")
        internalInvariant(producerCachedHead <= producerTail, "cached head \(producerCachedHead) ahead of tail \(producerTail)")
        internalInvariant(head.loadAcquire() <= producerTail, "consumer head ahead of tail \(producerTail)")
        internalInvariant(segment.capacity & segment.mask == 0, "segment capacity \(segment.capacity) is not a power of two")
        internalInvariant(segment.base <= producerTail, "producer segment starts at \(segment.base) after tail \(producerTail)")
        internalInvariant(
            producerTail - Swift.max(head.loadAcquire(), segment.base) <= segment.capacity,
            "more unread elements than slots in the producer's segment")
        internalInvariant(segment.end.loadRelaxed() == .max, "the producer's segment is closed")
        internalInvariant(segment.next == nil, "the producer's segment has a successor")
    }

    /// Links a segment after the full `segment` and makes it the producer's.
    @inlinable
    func linkSegment(after segment: SPSCSegment<Element>, at producerTail: Int) -> SPSCSegment<Element> {
        let fresh = SPSCSegment<Element>.allocate(
            base: producerTail,
            capacity: Swift.min(segment.capacity * 2, Self.maximumSegmentCapacity))
        segment.next = fresh
        segment.end.storeRelease(producerTail)  // publishes `next`
        producerSegment = fresh
        return fresh
    }

    @inlinable
    func push(_ element: consuming Element) {
        var segment = producerSegment
        let producerTail = producerTail
        if producerTail - Swift.max(producerCachedHead, segment.base) == segment.capacity {
            producerCachedHead = head.loadAcquire()
            if producerTail - Swift.max(producerCachedHead, segment.base) == segment.capacity {
                segment = linkSegment(after: segment, at: producerTail)
            }
        }
        (segment.slots + (producerTail & segment.mask)).initialize(to: element)
        self.producerTail = producerTail + 1
        tail.storeRelease(producerTail + 1)
    }

    /// Appends `elements` in order and publishes `tail` once.
    @inlinable
    func push(contentsOf elements: UnsafeBufferPointer<Element>) {
        var source = elements.baseAddress.unsafelyUnwrapped
        var remaining = elements.count
        var producerTail = producerTail
        while remaining > 0 {
            var segment = producerSegment
            var free = segment.capacity - (producerTail - Swift.max(producerCachedHead, segment.base))
            if free < remaining {
                producerCachedHead = head.loadAcquire()
                free = segment.capacity - (producerTail - Swift.max(producerCachedHead, segment.base))
                if free == 0 {
                    segment = linkSegment(after: segment, at: producerTail)
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
        self.producerTail = producerTail
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
        let head = head.loadSequentiallyConsistent()
        producerCachedHead = head
        return producerTail - head
    }

    // MARK: Consumer

    /// - Parameter publishSequentiallyConsistent: publish the new `head`
    ///   with a sequentially consistent store (for `.bounded`, whose
    ///   emitters read it after storing their own flag).
    @inlinable
    func pop(publishSequentiallyConsistent: Bool) -> Element? {
        let index = consumerHead
        if index == consumerCachedTail {
            let tail = tail.loadAcquire()
            consumerCachedTail = tail
            guard index != tail else { return nil }
        }
        var segment = consumerSegment
        if index == segment.end.loadAcquire() {
            // The producer left this segment when it linked `next`, and we
            // have read its last element: nobody touches it again.
            let next = SPSCSegment<Element>(segment.nextRaw.unsafelyUnwrapped)
            consumerSegment = next
            segment.deallocateIfLinked()
            segment = next
        }
        let element = (segment.slots + (index & segment.mask)).move()
        consumerHead = index + 1
        if publishSequentiallyConsistent && !Fault.boundedHeadRelease {
            head.storeSequentiallyConsistent(index + 1)
        } else {
            head.storeRelease(index + 1)
        }
        return element
    }

    /// Whether the consumer has taken everything up to the last `tail` it
    /// loaded (consumer side, no atomic access): `false` means more is
    /// certainly there (the cache never runs ahead of the real tail); `true`
    /// that the buffer may be empty.
    @inlinable
    var consumerReachedCachedTail: Bool { consumerHead == consumerCachedTail }

    /// Whether the consumer can pop now (consumer side): loads `tail`
    /// (acquire, caching it as `pop` does) only when the cached one shows
    /// nothing, so a later `pop` does not load it again.
    @inlinable
    var consumerHasElement: Bool {
        let index = consumerHead
        if index != consumerCachedTail { return true }
        let tail = tail.loadAcquire()
        consumerCachedTail = tail
        return index != tail
    }

    /// Whether the consumer has something to read (consumer side).
    @inlinable
    var hasElementsForConsumer: Bool { consumerHead != tail.loadAcquire() }

    /// Unread elements, for observers on other threads: a count that was
    /// true at one moment during the call, or `nil` if producers kept
    /// pushing through `attempts` tries (the caller then reads under the
    /// sequence lock, `countWhileProducersExcluded`).
    ///
    /// Two loads are not a snapshot: an observer preempted between a load
    /// of `head` and one of `tail` would subtract a head that was stale by
    /// everything read meanwhile (seen: 46,867 for a capacity of 16). So
    /// `tail` is read on both sides of `head`. `tail` only grows: if both
    /// reads agree, it held that value the whole time, in particular when
    /// `head` was read, and `tail - head` was the count then. It is never
    /// negative (the consumer popped only what a `tail` it read allowed,
    /// and that store of `tail` happens before its `head` store, so a later
    /// `tail` read sees it) and never above what the producer let in: the
    /// producer pushed index `tail - 1` after reading a `head` that our
    /// acquire of `tail` orders before our `head` read.
    @inlinable
    func countForObserver(attempts: Int) -> Int? {
        if Fault.tornBufferedCount {
            let head = head.loadAcquire()
            return tail.loadAcquire() - head
        }
        var tail = tail.loadAcquire()
        for _ in 0..<attempts {
            let head = head.loadAcquire()
            let again = self.tail.loadAcquire()
            if again == tail { return tail - head }
            tail = again
        }
        return nil
    }

    /// Unread elements while no producer can push (the sequence lock held):
    /// `tail` is fixed, so one read of `head` makes a snapshot.
    @inlinable
    func countWhileProducersExcluded() -> Int {
        producerTail - head.loadAcquire()
    }

    /// Drops every element. Consumer side, or exclusive access.
    @inlinable
    func removeAll() {
        while pop(publishSequentiallyConsistent: false) != nil {}
    }
}
