/// What `offer` did with an element.
@usableFromInline
enum OfferOutcome {
    case delivered
    /// Delivered to a `.bounded` subscriber that now holds its capacity or more.
    case deliveredFull
    /// Delivered to a full `.bufferingNewest` subscriber, evicting its oldest.
    case deliveredEvicting
    case dropped
    /// Ended by its eviction limit at this send (`SubscriberEviction`).
    case evicted
    /// The subscriber is ending: the element is neither delivered nor dropped.
    case skipped
}

/// A locked FIFO, for policies whose producer may remove elements.
@usableFromInline
final class LockedRing<Element> {
    /// Guarded by the owning subscriber's lock.
    @usableFromInline var ring: RingBuffer<Element>

    @inlinable init(initialCapacity: Int) { ring = RingBuffer(initialCapacity: initialCapacity) }
}

/// One subscriber's buffer, in the form its policy needs, chosen once at
/// `init`:
///
/// - **lock-free** for `.unbounded`, `.bounded(n)` and `.bufferingOldest(n > 0)`:
///   producers only ever append, so it is a single-producer/single-consumer
///   queue (`SPSCRing`). Producers are serialised by the sequence lock and a
///   subscription has one consumer (its claimed consumer slot), so neither
///   side takes a lock per element.
/// - **locked** for `.bufferingNewest(n)` and capacity 0: a producer may
///   evict the oldest unread element or hand an element only to a waiting
///   reader, so both sides take the subscriber's lock.
///
/// Replay is the exception to the policy: `seed` appends the whole window,
/// even past the capacity, and a subscriber holding more than its capacity
/// counts as full for later sends.
@usableFromInline
struct SubscriberBuffer<Element: Sendable>: @unchecked Sendable {
    @usableFromInline
    enum Storage {
        /// A view of the owner's block: no object, no reference count.
        case lockFree(SPSCRing<Element>)
        case locked(Unmanaged<LockedRing<Element>>)
    }

    /// A locked ring is retained once at `init` and released by `destroy()`:
    /// the hot paths never touch a reference count (it would bounce between
    /// the producer's and the consumer's cores).
    @usableFromInline let storage: Storage
    /// The subscriber's lock: guards a locked ring.
    @usableFromInline let lock: Lock
    /// Elements dropped by the policy; written only by producers (under the
    /// sequence lock).
    @usableFromInline let dropped: AtomicInt
    /// The `LagMarkers` pointer (0 until the first positioned drop): the
    /// block word after `dropped` (`SubscriberCore.Word.lagMarkers`),
    /// computed rather than stored so the subscriber object keeps its
    /// layout (the fields a send reads stay on the lines it prefetches).
    @inlinable var lagMarkers: AtomicInt { AtomicInt(unowned: dropped.raw + 1) }
    /// `n` for `.bounded(n)`, `.bufferingOldest(n)` and `.bufferingNewest(n)`;
    /// `Int.max` for `.unbounded`.
    @usableFromInline let limit: Int
    @usableFromInline let isBounded: Bool
    @usableFromInline let dropsNewest: Bool  // `.bufferingOldest`

    /// The first segment's capacity if `policy` takes the lock-free form
    /// (whose memory the owner provides: see `SPSCRing.init`), else `nil`.
    @inlinable
    static func lockFreeCapacity(for policy: BroadcastBufferingPolicy) -> Int? {
        switch policy {
        case .unbounded: return SPSCRing<Element>.firstCapacity(limit: .max)
        case .bounded(let n): return SPSCRing<Element>.firstCapacity(limit: n)
        case .bufferingOldest(let n): return n > 0 ? SPSCRing<Element>.firstCapacity(limit: n) : nil
        case .bufferingNewest: return nil
        }
    }

    /// - Parameter ring: the lock-free form, made for
    ///   `lockFreeCapacity(for: policy)`, or `nil` when that is `nil`.
    @inlinable
    init(policy: BroadcastBufferingPolicy, lock: Lock, dropped: AtomicInt, ring: SPSCRing<Element>?) {
        self.lock = lock
        self.dropped = dropped
        var isBounded = false
        var dropsNewest = false
        switch policy {
        case .unbounded:
            limit = .max
        case .bounded(let n):
            limit = n
            isBounded = true
        case .bufferingOldest(let n):
            limit = n
            dropsNewest = true
        case .bufferingNewest(let n):
            limit = n
        }
        self.isBounded = isBounded
        self.dropsNewest = dropsNewest
        if let ring {
            storage = .lockFree(ring)
        } else {
            // Capped like the lock-free ring's first segment
            // (`SPSCRing.firstSegmentSlotBytes`): an idle subscriber holds
            // a few slots, and the ring doubles when more are needed.
            let fitting = SPSCRing<Element>.slotsFittingFirstSegmentBytes
            storage = .locked(.passRetained(LockedRing(initialCapacity: Swift.min(policy.initialStorageCapacity, fitting))))
        }
    }

    /// Frees what the buffer still holds (and a locked ring). Call once, from
    /// the owner's `deinit`, while its block still exists. Always inlined:
    /// that `deinit` is unspecialized, and a call would look up this type's
    /// generic metadata on every release.
    @inlinable @inline(__always)
    func destroy() {
        LagMarkers.destroy(in: lagMarkers)
        switch storage {
        case .lockFree(let ring):
            ring.destroy()
        case .locked(let locked):
            locked.release()
        }
    }

    @inlinable var isLockFree: Bool {
        if case .lockFree = storage { return true }
        return false
    }

    // MARK: Producer side (sequence lock held)

    /// A replayed element: appended whatever the policy says. Returns `true`
    /// if a `.bounded` subscriber now holds its capacity or more.
    @inlinable
    func seed(_ element: Element) -> Bool {
        switch storage {
        case .lockFree(let ring):
            ring.push(element)
            return isBounded && ring.producerCountReaches(limit)
        case .locked(let locked):
            lock.lock()
            locked._withUnsafeGuaranteedRef { $0.ring.append(element) }
            lock.unlock()
            return false
        }
    }

    /// Hands `element` to this buffer according to the policy.
    ///
    /// - Parameter readerIsParked: for the locked form, whether the reader
    ///   waits in `next()` now (it then takes the element whatever the
    ///   capacity, and is woken by the send's wake pass).
    @inlinable
    func offer(_ element: Element, parking: Parking, effects: inout Effects<Element>) -> OfferOutcome {
        switch storage {
        case .lockFree(let ring):
            if dropsNewest && ring.producerCountReaches(limit) {
                recordGap(at: ring.producerTail, count: 1, passed: ring.producerCachedHead)
                return .dropped
            }
            ring.push(element)
            if isBounded && ring.producerCountReaches(limit) { return .deliveredFull }
            return .delivered
        case .locked(let locked):
            lock.lock()
            defer { lock.unlock() }
            return locked._withUnsafeGuaranteedRef { locked in
                if locked.ring.isEmpty && parking.isParked {
                    locked.ring.append(element)  // a reader waits: it gets the element
                    return .delivered
                }
                if limit == 0 || dropsNewest {
                    // Capacity 0 and no reader waiting: the gap comes after
                    // what it holds (the events reader counts it down).
                    LagMarkers.list(in: lagMarkers).record(ahead: locked.ring.count, count: 1)
                    countDrop()
                    return .dropped
                }
                guard locked.ring.count >= limit else {
                    locked.ring.append(element)
                    return .delivered
                }
                // Full (or over-filled by replay): evict the oldest for the new one.
                effects.release(locked.ring.popFirst().unsafelyUnwrapped)
                if !(Fault.miscountEviction && locked.ring.capacity == limit) { countDrop() }
                locked.ring.append(element)
                return .deliveredEvicting
            }
        }
    }

    /// Hands all of `batch` to this buffer in one step; returns (delivered,
    /// dropped, full), counted as consecutive `offer` calls would count them
    /// if the reader took nothing in between.
    ///
    /// One step, because a reader running at the same time must never take
    /// an element from the middle of a batch (see "Sending a batch" in
    /// Semantics.md): per element, a reader popping between two offers
    /// would make room (or re-park) mid-batch and receive elements that the
    /// policy applied to the whole batch keeps from it. So each form
    /// publishes the batch's outcome at once:
    ///
    /// - lock-free, never dropping: the whole batch, one `tail` store;
    /// - lock-free `.bufferingOldest(n)`: the prefix that fits (from the
    ///   producer's view of the count), one `tail` store; the rest dropped;
    /// - locked: the subscriber's lock taken once for the batch, and
    ///   `parking.isParked` read once, at its start (a capacity-0 reader that
    ///   waits then takes the first element, the rest is dropped).
    @inlinable
    func offer(batch: UnsafeBufferPointer<Element>, parking: Parking, effects: inout Effects<Element>) -> (Int, Int, Bool) {
        switch storage {
        case .lockFree(let ring):
            guard dropsNewest else {
                ring.push(contentsOf: batch)
                return (batch.count, 0, isBounded && ring.producerCountReaches(limit))
            }
            // Re-read the consumer's `head` only if the cached one (never
            // ahead of the real one) leaves too little room for the batch.
            var room = limit - (ring.producerTail - ring.producerCachedHead)
            if room < batch.count { room = limit - ring.producerCount() }
            let kept = Swift.min(Swift.max(room, 0), batch.count)  // replay may over-fill: room < 0
            if kept > 0 { ring.push(contentsOf: UnsafeBufferPointer(rebasing: batch[..<kept])) }
            if kept < batch.count {
                recordGap(at: ring.producerTail, count: batch.count - kept, passed: ring.producerCachedHead)
            }
            return (kept, batch.count - kept, false)
        case .locked(let locked):
            lock.lock()
            defer { lock.unlock() }
            return locked._withUnsafeGuaranteedRef { locked in
                offerLocked(batch: batch, to: &locked.ring, parking: parking, effects: &effects)
            }
        }
    }

    /// `offer(batch:)` for the locked form; call with `lock` held.
    @inlinable
    func offerLocked(
        batch: UnsafeBufferPointer<Element>, to ring: inout RingBuffer<Element>,
        parking: Parking, effects: inout Effects<Element>
    ) -> (Int, Int, Bool) {
        var next = 0
        // Only an empty buffer hands an element to a waiting reader, and
        // after that element it is not empty: one look, for the first.
        if ring.isEmpty && parking.isParked {
            ring.append(batch[0])
            next = 1
        }
        let remaining = batch.count - next
        guard remaining > 0 else { return (next, 0, false) }
        if limit == 0 || dropsNewest {
            // Capacity 0 (or a locked `.bufferingOldest`): what fits stays,
            // the rest is dropped. No reader can have made room meanwhile.
            let kept = Swift.min(Swift.max(limit - ring.count, 0), remaining)
            for element in batch[next..<(next + kept)] { ring.append(element) }
            if kept < remaining {
                LagMarkers.list(in: lagMarkers).record(ahead: ring.count, count: remaining - kept)
                countDrops(remaining - kept)
            }
            return (next + kept, remaining - kept, false)
        }
        // `.bufferingNewest(n)`: every element is delivered, and each one
        // past the capacity evicts the oldest. A buffer over-filled by
        // replay stays at its size: each send then evicts one.
        let size = Swift.max(limit, ring.count)
        let final = Swift.min(ring.count + remaining, size)
        let evictions = ring.count + remaining - final
        // Batch elements that a later one of the batch would evict at once
        // are never stored (they count as delivered and evicted).
        let skipped = remaining - Swift.min(remaining, final)
        // Release evicted elements after the locks (their deinitializers
        // are user code).
        for _ in 0..<(evictions - skipped) { effects.release(ring.popFirst().unsafelyUnwrapped) }
        for element in batch[(next + skipped)...] { ring.append(element) }
        if evictions > 0 && !(Fault.miscountEviction && ring.capacity == limit) { countDrops(evictions) }
        return (next + remaining, evictions, false)
    }

    @inlinable
    func countDrop() {
        countDrops(1)
    }

    /// A lock-free buffer dropped `count` new elements: records where (the
    /// ring's absolute index of the next accepted element), then counts them.
    ///
    /// Message passing to the events reader, which never looks at the
    /// markers unless `dropped` moved past what it reported: the marker is
    /// stored (under the subscriber lock) before the `dropped` increment
    /// (a release, in the same section), and both before the `tail` store
    /// (a release) of any later element. The reader loads `tail`, then
    /// `dropped` (both acquire), then takes the lock: if it sees the element
    /// after the gap it sees the increment, and the lock hands it the
    /// marker. A marker at the reader's position recorded after its look
    /// (the buffer was empty then) is found at its next look; a parking
    /// events reader counts a moved `dropped` as work (row 1 of
    /// Handshakes.md orders that against the send's wake pass).
    @inlinable
    func recordGap(at position: Int, count: Int, passed: Int) {
        lock.lock()
        LagMarkers.list(in: lagMarkers).record(
            at: Fault.lagMarkerOffByOne ? position + 1 : position, count: count, passed: passed)
        countDrops(count)
        lock.unlock()
    }

    @inlinable
    func countDrops(_ count: Int) {
        dropped.storeRelease(dropped.loadRelaxed() + count)  // single writer: the sequence lock holder
    }

    /// At least the unread elements, as producers see them, without loading
    /// the consumer's `head` for a lock-free buffer (sequence lock held).
    @inlinable
    func producerCountUpperBound() -> Int {
        switch storage {
        case .lockFree(let ring):
            return ring.producerTail - ring.producerCachedHead
        case .locked:
            return producerCount()
        }
    }

    /// Unread elements, as producers see them (sequence lock held).
    @inlinable
    func producerCount() -> Int {
        switch storage {
        case .lockFree(let ring):
            return ring.producerCount()
        case .locked(let locked):
            lock.lock()
            defer { lock.unlock() }
            return locked._withUnsafeGuaranteedRef { $0.ring.count }
        }
    }

    @inlinable
    func checkProducerInvariants() {
        guard internalChecksEnabled else { return }
        switch storage {
        case .lockFree(let ring):
            ring._checkProducerInvariants()
        case .locked(let locked):
            lock.lock()
            locked._withUnsafeGuaranteedRef { $0.ring._checkInvariants() }
            lock.unlock()
        }
    }

    // MARK: Consumer side (the consumer slot claimed)

    /// The next element; a `.bounded` buffer publishes its new head with a
    /// sequentially consistent store (see `SPSCRing.pop`).
    @inlinable
    func pop() -> Element? {
        switch storage {
        case .lockFree(let ring):
            return ring.pop(publishSequentiallyConsistent: isBounded)
        case .locked(let locked):
            lock.lock()
            defer { lock.unlock() }
            return locked._withUnsafeGuaranteedRef { $0.ring.popFirst() }
        }
    }

    /// Whether the consumer has something to read.
    @inlinable
    var hasElementsForConsumer: Bool {
        switch storage {
        case .lockFree(let ring):
            return ring.hasElementsForConsumer
        case .locked(let locked):
            lock.lock()
            defer { lock.unlock() }
            return locked._withUnsafeGuaranteedRef { !$0.ring.isEmpty }
        }
    }

    /// Unread elements, a snapshot from any thread (`bufferedCount`).
    ///
    /// - Parameters:
    ///   - attempts: lock-free tries first (tests pass 0 to check the
    ///     fallback). Each fails only if a push lands between two loads a
    ///     few nanoseconds apart.
    ///   - excludingProducers: runs its argument while no producer can push
    ///     (under the sequence lock): the lock-free form's fallback when
    ///     producers push too fast for a lock-free snapshot.
    @inlinable
    func countForObserver(attempts: Int = 4, excludingProducers: (() -> Int) -> Int) -> Int {
        switch storage {
        case .lockFree(let ring):
            if let count = ring.countForObserver(attempts: attempts) { return count }
            return excludingProducers { ring.countWhileProducersExcluded() }
        case .locked(let locked):
            lock.lock()
            defer { lock.unlock() }
            return locked._withUnsafeGuaranteedRef { $0.ring.count }
        }
    }

    /// The locked form's elements, detached so that their deinitializers run
    /// after `lock` is released. Call with `lock` held.
    @inlinable
    func takeAllLocked() -> RingBuffer<Element> {
        guard case .locked(let locked) = storage else { return RingBuffer() }
        return locked.takeUnretainedValue().ring.takeAll()
    }

    /// Drops everything, consumer side. The lock-free form needs the consumer
    /// slot (or exclusive access); the locked form takes the lock.
    @inlinable
    func removeAllConsumerSide() {
        switch storage {
        case .lockFree(let ring):
            ring.removeAll()
        case .locked:
            lock.lock()
            let discarded = takeAllLocked()
            lock.unlock()
            _ = consume discarded  // element deinitializers run unlocked
        }
    }
}
