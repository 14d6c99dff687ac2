/// A subscriber's eviction limits (`BroadcastEviction`) and where it stands
/// against them. Only subscribers that have a limit carry one: for the
/// others, the producers' delivery loop pays one `nil` check of a field
/// next to the buffer's, on a line it reads anyway.
///
/// Guarded by the sequence lock (producers check it inside the sends they
/// already do: no timer, no task).
@usableFromInline
final class SubscriberEviction: @unchecked Sendable {
    /// `Int.max`: none.
    @usableFromInline let hard: Int
    /// `Int.max`: none.
    @usableFromInline let soft: Int
    @usableFromInline let softNanoseconds: Int
    /// Nanoseconds since an origin of the clock (`ContinuousClock`, or a
    /// test's); read only for a subscriber over its soft limit, at a send.
    @usableFromInline let now: @Sendable () -> Int
    /// When a send first found it over its soft limit (since then, every
    /// send has); `nil` while it is not.
    @exclusivity(unchecked) @usableFromInline var overSince: Int?
    /// Ended by a limit: producers skip it until its removal (which runs
    /// after the send's critical section) takes it out of the registry.
    @exclusivity(unchecked) @usableFromInline var isEvicted = false

    @usableFromInline
    init(_ limits: BroadcastEviction, now: @escaping @Sendable () -> Int) {
        hard = limits.hard
        soft = limits.soft
        softNanoseconds = limits.softNanoseconds
        self.now = now
    }

    /// The same limits and clock, with nothing recorded: for a subscriber
    /// made again after its first one was let go unseen (a topic's
    /// `subscribe(to:)` that lost a race with `finish(topic:)`).
    @usableFromInline
    func renewed() -> SubscriberEviction {
        SubscriberEviction(BroadcastEviction(hard: hard, soft: soft, softNanoseconds: softNanoseconds), now: now)
    }

    /// `nil` for `.never`; the soft limit reads `ContinuousClock`.
    @usableFromInline
    static func make(_ limits: BroadcastEviction) -> SubscriberEviction? {
        if limits.isNever { return nil }
        guard limits.soft != .max else { return SubscriberEviction(limits, now: { 0 }) }
        if #available(macOS 13, iOS 16, tvOS 16, watchOS 9, *) {
            return make(limits, clock: ContinuousClock())
        }
        // A soft limit can only be made where `Duration` exists.
        internalInconsistency("a soft eviction limit without ContinuousClock")
    }

    /// With the soft limit's time read from `clock` (tests drive a manual one).
    @available(macOS 13, iOS 16, tvOS 16, watchOS 9, *)
    @usableFromInline
    static func make<C: Clock>(_ limits: BroadcastEviction, clock: C) -> SubscriberEviction? where C.Duration == Duration {
        if limits.isNever { return nil }
        let origin = clock.now
        return SubscriberEviction(limits) {
            // Never negative (a clock that went back counts as no time).
            let (seconds, attoseconds) = origin.duration(to: clock.now).components
            if seconds < 0 { return 0 }
            if seconds >= Int64(Int.max / 1_000_000_000) { return .max }
            return Int(seconds) * 1_000_000_000 + Int(attoseconds / 1_000_000_000)
        }
    }
}

/// What `Effects.run()` calls for a subscriber a send evicted: the rest of
/// its ending, with no lock held.
@usableFromInline
protocol EvictedSubscriber: AnyObject {
    func completeEviction()
}

extension SubscriberCore: EvictedSubscriber {
    /// Checks this subscriber's limits before a send hands it `adding`
    /// elements (sequence lock held). `nil`: go on and offer; `.skipped`:
    /// already evicted, waiting for its removal; `.evicted`: evicted now
    /// (the send does not deliver to it).
    @inlinable
    func checkEviction(_ eviction: SubscriberEviction, adding: Int, effects: inout Effects<Element>) -> OfferOutcome? {
        if eviction.isEvicted { return .skipped }
        // The hard limit asks what the send does, not what the subscriber
        // holds: the policy's drops and evictions do not make it hold more,
        // so a lossy subscriber that replay over-filled past its capacity
        // (and past the limit) is not ended by a send that adds nothing.
        let growthLimit = buffer.isBounded ? Int.max : buffer.limit
        var count = buffer.producerCountUpperBound()
        func growsPastHard(_ count: Int) -> Bool {
            let after = count >= growthLimit ? count : Swift.min(count &+ adding, growthLimit)
            return after > eviction.hard - (Fault.evictionOffByOne ? 1 : 0) && (after > count || Fault.evictionComparesHeld)
        }
        // Conservative on the upper bound (the real count may be lower and
        // still have room to grow).
        let mayBeOver =
            Swift.min(count &+ adding, growthLimit) > eviction.hard || growsPastHard(count)
            || count > eviction.soft
        if !mayBeOver {
            if eviction.overSince != nil { eviction.overSince = nil }
            return nil
        }
        count = buffer.producerCount()
        var evict = growsPastHard(count)
        if !evict && count > eviction.soft {
            let now = eviction.now()
            let since = eviction.overSince ?? now
            eviction.overSince = since
            evict = now - since >= eviction.softNanoseconds
        } else if count <= eviction.soft {
            eviction.overSince = nil
        }
        guard evict else { return nil }
        return evictLocked(eviction, effects: &effects) ? .evicted : .skipped
    }

    /// Ends the subscriber as `cancel()` does, from inside a send (sequence
    /// lock held): it stops reading at once (`terminal`, `ended`), and the
    /// rest (its removal from the registry, which releases emitters waiting
    /// on it, freeing its buffer, waking its reader) runs in `effects`,
    /// after the lock. `false` if a `cancel()` got there first.
    @inlinable
    func evictLocked(_ eviction: SubscriberEviction, effects: inout Effects<Element>) -> Bool {
        eviction.isEvicted = true  // skipped by producers from now on, either way
        guard cancelRequested.exchangeAcquiringAndReleasing(1) == 0 else { return false }
        evicted.storeRelease(1)
        // Registered: no terminal event yet (sends stop at `finish`), so no
        // failure is released under the lock here.
        lock.lock()
        terminal = .ended
        terminalHint.storeRelease(1)
        lock.unlock()
        ended.storeRelease(1)
        effects.completeEviction(self)
        return true
    }

    @usableFromInline
    func completeEviction() {
        end()
    }

    @inlinable var evicted: AtomicInt { block.word(Word.evicted) }
    @inlinable var isEvicted: Bool { evicted.loadAcquire() != 0 }
}
