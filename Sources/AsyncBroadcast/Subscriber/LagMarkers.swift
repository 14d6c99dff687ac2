/// Where a subscriber's policy dropped elements, for the events reader
/// (`Subscription.events`), which puts each `.lagged(n)` exactly there.
///
/// Recorded only on the drop path, never on a delivery: a plain `send` that
/// delivers, and a plain `next()`, never touch it. Created at the first
/// drop (its pointer is a word of the subscriber's block, on the producer's
/// line), freed with the subscriber. Guarded by the subscriber's lock on
/// both sides.
///
/// What a position means depends on the buffer's form:
/// - lock-free (`.bufferingOldest(n > 0)`): the ring's absolute index where
///   the next accepted element will land (the producer's tail at the drop):
///   the gap comes after every element held at that moment. The reader, at
///   absolute index `h`, reports every marker at `h` or before.
/// - locked with capacity 0: the number of held elements before the gap
///   (`ring.count` at the drop); the events reader counts it down as it
///   pops, and a marker reaches 0 when the gap is next.
/// - `.bufferingNewest` keeps no markers: it drops its oldest, so every
///   eviction since the reader's last pop lies before the element it pops
///   next, and the dropped count read under the subscriber's lock says it all.
///
/// Bounded memory: consecutive drops at one position merge; in the lock-free
/// form the producer folds markers the reader has already passed (a plain
/// `next()` passes them without reporting) into one; in the relative form
/// equal positions merge. So a subscriber read only by plain `next()` keeps
/// at most its capacity + 2 markers.
@usableFromInline
final class LagMarkers {
    @usableFromInline
    struct Marker {
        @usableFromInline var position: Int
        @usableFromInline var count: Int
        @inlinable init(position: Int, count: Int) {
            self.position = position
            self.count = count
        }
    }

    /// Ascending by position.
    @usableFromInline var markers: [Marker] = []

    @inlinable init() {}

    /// The list behind `word`, created on first use (subscriber lock held).
    @inlinable
    static func list(in word: AtomicInt) -> LagMarkers {
        if let pointer = UnsafeRawPointer(bitPattern: word.loadRelaxed()) {
            return Unmanaged<LagMarkers>.fromOpaque(pointer).takeUnretainedValue()
        }
        let fresh = LagMarkers()
        word.storeRelaxed(Int(bitPattern: Unmanaged.passRetained(fresh).toOpaque()))
        return fresh
    }

    /// The list behind `word`, if any (subscriber lock held).
    @inlinable
    static func existing(in word: AtomicInt) -> LagMarkers? {
        guard let pointer = UnsafeRawPointer(bitPattern: word.loadRelaxed()) else { return nil }
        return Unmanaged<LagMarkers>.fromOpaque(pointer).takeUnretainedValue()
    }

    /// Frees the list behind `word` (the subscriber's `deinit`).
    @inlinable @inline(__always)
    static func destroy(in word: AtomicInt) {
        guard let pointer = UnsafeRawPointer(bitPattern: word.loadRelaxed()) else { return }
        Unmanaged<LagMarkers>.fromOpaque(pointer).release()
    }

    // MARK: Producer (sequence lock and subscriber lock held)

    /// A gap of `count` at absolute `position` (lock-free form). Markers
    /// before `passed` (the producer's cached head: never ahead of the real
    /// one) were passed by a plain reader: they fold into the first.
    @inlinable
    func record(at position: Int, count: Int, passed: Int) {
        if let last = markers.last, last.position == position {
            markers[markers.count - 1].count += count
        } else {
            markers.append(Marker(position: position, count: count))
        }
        var passedCount = 0
        while passedCount < markers.count - 1, markers[passedCount + 1].position < passed { passedCount += 1 }
        if passedCount > 0 {
            var folded = markers[passedCount]
            for index in 0..<passedCount { folded.count += markers[index].count }
            markers.removeFirst(passedCount)
            markers[0] = folded
        }
    }

    /// A gap of `count` after `ahead` held elements (capacity-0 form).
    @inlinable
    func record(ahead: Int, count: Int) {
        var index = markers.count
        while index > 0, markers[index - 1].position > ahead { index -= 1 }
        if index > 0, markers[index - 1].position == ahead {
            markers[index - 1].count += count
        } else {
            markers.insert(Marker(position: ahead, count: count), at: index)
        }
    }

    // MARK: Events reader (consumer slot and subscriber lock held)

    /// Removes the markers at `position` or before; returns their total.
    @inlinable
    func takeDue(upTo position: Int) -> Int {
        var due = 0
        var taken = 0
        while taken < markers.count, markers[taken].position <= position {
            due += markers[taken].count
            taken += 1
        }
        if taken > 0 { markers.removeFirst(taken) }
        return due
    }

    /// The events reader popped one element (capacity-0 form).
    @inlinable
    func elementPopped() {
        for index in markers.indices where markers[index].position > 0 { markers[index].position -= 1 }
    }

    @inlinable
    func removeAll() { markers.removeAll() }
}
