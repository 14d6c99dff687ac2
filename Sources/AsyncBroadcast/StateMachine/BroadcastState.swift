/// The sequence-wide state: who is subscribed, the replay window, the
/// terminal event and the queue of waiting emitters.
///
/// Guarded by `BroadcastStorage.lock`. Its transitions never resume a
/// continuation or release an element themselves: they record that in
/// `Effects`, which the storage runs after unlocking.
@usableFromInline
struct BroadcastState<Element: Sendable, Failure: Error>: ~Copyable {
    @usableFromInline
    enum Terminal {
        case finished
        case failed(Failure)

        @inlinable
        var subscriberTerminal: SubscriberTerminal<Failure> {
            switch self {
            case .finished: return .finished
            case .failed(let error): return .failed(error)
            }
        }
    }

    /// Live subscribers, in no particular order (removal swaps with the last).
    /// Each entry holds one manual retain (taken at registration, released
    /// at removal), so the per-send loop touches no reference counts: those
    /// cache lines are shared with the consumers.
    @usableFromInline var subscribers: [Unmanaged<SubscriberCore<Element, Failure>>] = []
    /// `.bounded` subscribers last seen holding their capacity or more.
    ///
    /// It may hold stale entries (a consumer drained while no emitter was
    /// waiting, so it did not tell us); the emit that finds the queue empty
    /// drops them with `refreshFullSubscribers()` before it waits. From then
    /// on, while any emitter waits, every read from a `.bounded` subscriber
    /// calls `serveEmitters(drained:)` (see `BroadcastStorage.emittersWaiting`),
    /// so the list stays exact by checking only the subscriber that read.
    @usableFromInline var fullSubscribers: [SubscriberCore<Element, Failure>] = []
    @usableFromInline var replay: RingBuffer<Element>
    @usableFromInline let replayLimit: Int
    /// Lock-free consumers that are parked or about to park (see
    /// `SubscriberCore`): a send looks for them only when this is non-zero.
    @usableFromInline let parkedConsumers: AtomicInt
    @usableFromInline var terminal: Terminal?
    /// Waiting emitters, in arrival order.
    @usableFromInline var emitters: [PendingEmit<Element>] = []
    /// Outcomes of queued emits decided before their continuation was stored.
    @usableFromInline var decidedEmits: [Int: EmitOutcome] = [:]
    @usableFromInline var nextEmitID = 0
    /// `subscribers.count`, published for lock-free readers
    /// (`subscriberCount`, `subscriberCounts`).
    @usableFromInline let registeredCount: AtomicInt
    /// The upstream lifecycle of a shared sequence (`nil` for a plain one).
    @usableFromInline var sharing: SharingState?
    /// Behind `subscriberCounts`, created at its first use.
    @usableFromInline var counts: BroadcastValue<Int, Never>?
    /// Where the next `_checkInvariants()` looks (internal checks only).
    @usableFromInline var checkCursor = 0
    /// A topic's generation without a listener: between its last
    /// subscriber's removal and its retirement (after the sequence lock) the
    /// topic is not live, and a send then keeps nothing for a subscriber
    /// that arrives before the retirement. (With a listener the topic stays
    /// live for `stopAfter` and the window keeps the listener's sends.)
    @usableFromInline var replaysOnlyWhileSubscribed = false
    @inlinable var keepsReplay: Bool { replayLimit > 0 && !(replaysOnlyWhileSubscribed && subscribers.isEmpty) }

    @inlinable
    init(replayLimit: Int, parkedConsumers: AtomicInt, registeredCount: AtomicInt, sharing: SharingState?) {
        self.replayLimit = replayLimit
        self.parkedConsumers = parkedConsumers
        self.registeredCount = registeredCount
        self.sharing = sharing
        self.replay = RingBuffer(initialCapacity: Swift.min(replayLimit, 16))
    }

    @inlinable var hasWaitingEmitters: Bool { !emitters.isEmpty }
    @inlinable var waitingEmitterCount: Int { emitters.count }

    // MARK: Subscribing

    /// Seeds a new subscriber with the replay window and registers it (or
    /// gives it the terminal event).
    @inlinable
    mutating func subscribe(
        _ subscriber: SubscriberCore<Element, Failure>,
        fromCancelledTask: Bool,
        effects: inout Effects<Element>
    ) {
        // The whole window, whatever the subscriber's policy: the policy
        // governs later sends, and an over-filled subscriber counts as full.
        var overFilled = false
        replay.forEach { element in
            if subscriber.seed(copy element) { overFilled = true }
        }
        if let terminal {
            subscriber.ignoresTaskCancellation = true
            subscriber.setTerminal(terminal.subscriberTerminal)
        } else if fromCancelledTask {
            subscriber.ignoresTaskCancellation = true
            subscriber.setTerminal(.finished)  // the replay window, then `nil`
        } else {
            subscriber.registryIndex = subscribers.count
            subscribers.append(.passRetained(subscriber))
            registeredCount.storeRelease(subscribers.count)
            if overFilled { markFull(subscriber) }  // replay can fill a `.bounded` subscriber
        }
    }

    /// Unregisters `subscriber` in O(1) and serves the emitters that waited
    /// on it; no other subscriber is touched.
    @inlinable
    mutating func remove(_ subscriber: SubscriberCore<Element, Failure>, effects: inout Effects<Element>) {
        unregister(subscriber)
        serveEmitters(drained: nil, effects: &effects)
    }

    /// Swap-removes `subscriber` from the registry and the full list.
    @inlinable
    mutating func unregister(_ subscriber: SubscriberCore<Element, Failure>) {
        let registryIndex = Fault.leakSubscriber ? nil : subscriber.registryIndex
        if let index = registryIndex {
            subscriber.registryIndex = nil
            let last = subscribers.removeLast()
            if index < subscribers.count {
                subscribers[index] = last
                last._withUnsafeGuaranteedRef { $0.registryIndex = index }
            }
            registeredCount.storeRelease(subscribers.count)
            shrinkIfSparse(&subscribers)
            // The caller holds `subscriber`, so this cannot be the last
            // reference: no deinit (and no element release) runs here.
            Unmanaged.passUnretained(subscriber).release()
        }
        unmarkFull(subscriber)
    }

    // MARK: Sending

    /// Hands `element` to every subscriber. O(subscribers).
    ///
    /// In chunks of `wakeChunk` subscribers, each followed by its wake pass
    /// (`wakeParkedReaders(from:to:)`): the chunk's lines are still in the
    /// cache then. One pass over all N after delivering to all N missed the
    /// cache twice per subscriber at large N. Above `prefetchThreshold`
    /// subscribers the loop prefetches ahead (`SubscriberCore.prefetchObject`).
    /// `replayable: false` (`send(_:replayable:)`): the replay window keeps what it had.
    @inlinable
    mutating func deliver(
        _ element: Element, replayable: Bool = true,
        effects: inout Effects<Element>
    ) -> BroadcastSendResult {
        var result = BroadcastSendResult()
        // By index: `for … in subscribers` copies the array, and the retain
        // and release of its buffer cost a fifth of a send at N = 1 (an
        // atomic on a line that may neighbour one a consumer writes).
        let count = subscribers.count
        let prefetching = count >= Self.prefetchThreshold
        var position = 0
        while position < count {
            let chunkStart = position
            let chunkEnd = Swift.min(position &+ Self.wakeChunk, count)
            while position < chunkEnd {
                if prefetching { prefetchAhead(of: position, count: count) }
                let subscriber = subscribers[position]
                position += 1
                switch subscriber._withUnsafeGuaranteedRef({ $0.offer(element, effects: &effects) }) {
                case .delivered:
                    result.delivered += 1
                case .deliveredFull:
                    result.delivered += 1
                    markFull(subscriber.takeUnretainedValue())
                case .deliveredEvicting:
                    result.delivered += 1
                    result.dropped += 1
                case .dropped:
                    result.dropped += 1
                case .evicted:
                    result.evicted += 1
                case .skipped:
                    break
                }
            }
            wakeParkedReaders(from: chunkStart, to: chunkEnd, effects: &effects)
        }
        if (replayable || Fault.replayableIgnored) && keepsReplay { remember(element, effects: &effects) }
        return result
    }

    /// Subscribers per wake pass: a fence each, about 0.2 ns per subscriber.
    @inlinable static var wakeChunk: Int { 128 }
    /// Up to this many subscribers in a wake pass, it looks at their park
    /// words without reading `parkedCount` first (`wakeParkedReaders`).
    @inlinable static var directWakeLimit: Int { 4 }
    /// Below this many subscribers everything a send touches stays in the
    /// cache, and prefetching is only overhead.
    @inlinable static var prefetchThreshold: Int { 512 }

    /// Asks for the lines of the subscribers 16 and 8 places ahead: the
    /// second stage reads the object the first brought in. (A third stage
    /// for the ring's next slot measured no better: at 100,000 subscribers
    /// what remains is mostly resuming the readers, not reaching them.)
    @inlinable @inline(__always)
    func prefetchAhead(of position: Int, count: Int) {
        if position &+ 16 < count { SubscriberCore.prefetchObject(subscribers[position &+ 16]) }
        if position &+ 8 < count { subscribers[position &+ 8]._withUnsafeGuaranteedRef { $0.prefetchProducerLines() } }
    }
    /// `send(contentsOf:)`: hands the whole of `batch` to each subscriber
    /// in turn, in one step per subscriber (`SubscriberBuffer.offer(batch:)`),
    /// then wakes that chunk's parked readers once (see `deliver(_:effects:)`).
    /// What each subscriber holds, drops
    /// and counts is what consecutive `deliver` calls would give if no
    /// reader ran before the last of them (a parked capacity-0 reader takes
    /// the first element, the rest is dropped): a reader running meanwhile,
    /// woken or not, sees a subscriber's buffer before the batch or after
    /// it, never in the middle. The wake pass's fence and scan are paid per
    /// batch, not per element: a reader woken after the first element would
    /// often find the rest still coming and park again.
    @inlinable
    mutating func deliver(batch: UnsafeBufferPointer<Element>, effects: inout Effects<Element>) -> BroadcastSendResult {
        var result = BroadcastSendResult()
        guard !batch.isEmpty else { return result }
        // By index, not `for … in`: see `deliver(_:effects:)`.
        let count = subscribers.count
        let prefetching = count >= Self.prefetchThreshold
        var position = 0
        while position < count {
            let chunkStart = position
            let chunkEnd = Swift.min(position &+ Self.wakeChunk, count)
            while position < chunkEnd {
                if prefetching { prefetchAhead(of: position, count: count) }
                let subscriber = subscribers[position]
                position += 1
                let (delivered, dropped, full, evicted) = subscriber._withUnsafeGuaranteedRef {
                    $0.offer(batch: batch, effects: &effects)
                }
                result.delivered += delivered
                result.dropped += dropped
                if evicted { result.evicted += 1 }
                // `send` never waits: a `.bounded` subscriber takes the whole
                // batch even past its capacity, and counts as full from then on.
                if full { markFull(subscriber.takeUnretainedValue()) }
            }
            wakeParkedReaders(from: chunkStart, to: chunkEnd, effects: &effects)
        }
        if keepsReplay {
            // Only the last `replayLimit` elements can stay in the window.
            let kept = batch.count > replayLimit ? batch.count - replayLimit : 0
            for element in batch[kept...] { remember(element, effects: &effects) }
        }
        return result
    }

    /// Call after publishing a send's elements to the subscribers at
    /// `start ..< end`.
    ///
    /// Publish, then wake parked readers (see `Parking`): the fence in
    /// `producerMayNeedToWake` orders this chunk's publications before its
    /// park-word loads. A parked reader's buffer was empty, so the send gave
    /// it an element (or it is ending): none of these wakes is spurious.
    ///
    /// A chunk of at most `directWakeLimit` subscribers skips `parkedCount`
    /// and looks at their park words at once: each is on the line `offer`
    /// just wrote, while the shared count is on a line every parking reader
    /// of the sequence writes, a cache miss on most sparse sends (measured:
    /// the `sparse: fan-out` cell of fanout-compare). Many subscribers keep
    /// the count, so that a send whose readers keep up skips the pass.
    ///
    /// `mutating` though it changes nothing: called on the `inout` state and
    /// not inlined, a non-mutating method took a copy of the whole state
    /// (129 bytes) on every call.
    @inlinable
    mutating func wakeParkedReaders(from start: Int, to end: Int, effects: inout Effects<Element>) {
        if end &- start <= Self.directWakeLimit {
            Parking.producerFence()
        } else {
            guard Parking.producerMayNeedToWake(parkedCount: parkedConsumers) else { return }
        }
        // By index, not `for … in`: see `deliver(_:effects:)`.
        var position = start
        while position < end {
            let subscriber = subscribers[position]
            position += 1
            if let continuation = subscriber._withUnsafeGuaranteedRef({ $0.parking.tryUnpark() }) {
                effects.resume(continuation)
            }
        }
    }

    /// Appends `element` to the replay window, evicting its oldest when full.
    @inlinable
    mutating func remember(_ element: Element, effects: inout Effects<Element>) {
        if replay.count == replayLimit { effects.release(replay.popFirst().unsafelyUnwrapped) }
        replay.append(element)
    }

    /// `true` when a new `emit` may deliver now: nobody queued ahead of it and
    /// every `.bounded` subscriber has room.
    ///
    /// `emitterFlag` must already announce the check (see
    /// `BroadcastStorage.emittersWaiting`): a consumer that drains after our
    /// look at it then knows to call back.
    @inlinable
    mutating func emitterMayProceed() -> Bool {
        if !emitters.isEmpty { return false }
        refreshFullSubscribers()
        return fullSubscribers.isEmpty
    }

    /// Queues an emit that must wait; returns its ticket.
    @inlinable
    mutating func enqueueEmit(_ element: Element) -> Int {
        let id = nextEmitID
        nextEmitID += 1
        emitters.append(PendingEmit(id: id, element: element, continuation: nil))
        return id
    }

    /// Stores the emitter's continuation; `false` if the emit was already
    /// served, cancelled or finished (then the emitter resumes at once).
    @inlinable
    mutating func park(emit id: Int, _ continuation: UnsafeContinuation<Void, Never>) -> Bool {
        if decidedEmits[id] != nil { return false }
        guard let index = emitters.firstIndex(where: { $0.id == id }) else {
            internalInconsistency("emit \(id) is neither queued nor decided")
        }
        emitters[index].continuation = continuation
        return true
    }

    /// The outcome of a decided emit, taken once by its emitter after it
    /// resumes: the continuation carries no payload (see `Parking`).
    @inlinable
    mutating func takeOutcome(emit id: Int) -> EmitOutcome {
        guard let outcome = decidedEmits.removeValue(forKey: id) else {
            internalInconsistency("emit \(id) resumed before it was decided")
        }
        return outcome
    }

    /// The emitter's task was cancelled: if it still waits, dequeue it.
    @inlinable
    mutating func cancelEmit(_ id: Int, effects: inout Effects<Element>) {
        guard let index = emitters.firstIndex(where: { $0.id == id }) else { return }  // already decided
        let entry = emitters.remove(at: index)
        decide(entry, .cancelled, effects: &effects)
    }

    /// Delivers for queued emitters, oldest first, while every `.bounded`
    /// subscriber has room.
    ///
    /// - Parameter drained: the subscriber whose consumer just read, if any.
    ///   Only it is re-checked: O(1) per read. (Re-checking every full
    ///   subscriber here made each element cost O(N²) when an emitter
    ///   outran N `.bounded` consumers that all sat at capacity.)
    @inlinable
    mutating func serveEmitters(drained: SubscriberCore<Element, Failure>?, effects: inout Effects<Element>) {
        if let drained, drained.fullIndex != nil, drained.hasRoom() { unmarkFull(drained) }
        while !emitters.isEmpty {
            guard fullSubscribers.isEmpty else { return }
            let entry = emitters.removeFirst()
            let result =
                Fault.dropEmit
                ? BroadcastSendResult()
                : deliver(entry.element.unsafelyUnwrapped, effects: &effects)
            decide(entry, .delivered(result), effects: &effects)
        }
    }

    @inlinable
    mutating func decide(
        _ entry: consuming PendingEmit<Element>, _ outcome: EmitOutcome,
        effects: inout Effects<Element>
    ) {
        if let element = entry.element.take() { effects.release(element) }
        decidedEmits[entry.id] = outcome
        if let continuation = entry.continuation { effects.resume(continuation) }
    }

    // MARK: Finishing

    /// First call wins. Releases every waiting emitter with an `isFinished`
    /// result, wakes parked readers, and unregisters the subscribers that
    /// hold nothing (they have ended; the others leave once drained).
    @inlinable
    mutating func finish(_ event: Terminal, effects: inout Effects<Element>) {
        guard terminal == nil else { return }
        terminal = event
        sharing?.sequenceEnded()
        while !emitters.isEmpty {
            decide(emitters.removeFirst(), .delivered(.finished), effects: &effects)
        }
        let subscriberTerminal = event.subscriberTerminal
        for position in subscribers.indices {
            subscribers[position]._withUnsafeGuaranteedRef { $0.setTerminal(subscriberTerminal) }
        }
        // One fence for every subscriber (rows 2 and 3 of Handshakes.md):
        // then each one's head and park word are read.
        if !Fault.finishSkipsFence { sequentiallyConsistentFence() }
        // Backwards, so that a swap-remove only moves an entry already seen.
        var index = subscribers.count - 1
        while index >= 0 {
            let subscriber = subscribers[index].takeUnretainedValue()
            if subscriber.finishAfterFence(effects: &effects) { unregister(subscriber) }
            index -= 1
        }
    }

    // MARK: Invariants

    /// Checks the registry and the full list (under
    /// `ASYNCBROADCAST_INTERNAL_CHECKS` only; a window of each per call, see
    /// `invariantCheckPositions`).
    @inlinable
    mutating func _checkInvariants() {
        guard internalChecksEnabled else { return }
        for index in invariantCheckPositions(count: subscribers.count, cursor: &checkCursor) {
            let subscriber = subscribers[index]
            let registered = subscriber._withUnsafeGuaranteedRef { $0.registryIndex }
            internalInvariant(registered == index, "registry entry \(index) records index \(String(describing: registered))")
        }
        for index in invariantCheckPositions(count: fullSubscribers.count, cursor: &checkCursor) {
            let subscriber = fullSubscribers[index]
            internalInvariant(subscriber.fullIndex == index, "full-list entry \(index) records index \(String(describing: subscriber.fullIndex))")
            internalInvariant(subscriber.registryIndex != nil, "full-list entry \(index) is not registered")
        }
        internalInvariant(replay.count <= replayLimit, "replay holds \(replay.count) > \(replayLimit)")
        replay._checkInvariants()
        internalInvariant(emitters.allSatisfy { decidedEmits[$0.id] == nil }, "a queued emit is also decided")
        internalInvariant(
            registeredCount.loadRelaxed() == subscribers.count,
            "published count \(registeredCount.loadRelaxed()) != \(subscribers.count) subscribers")
        _checkSharingInvariants()
    }

    // MARK: Full `.bounded` subscribers

    @inlinable
    mutating func markFull(_ subscriber: SubscriberCore<Element, Failure>) {
        guard subscriber.fullIndex == nil else { return }
        subscriber.fullIndex = fullSubscribers.count
        fullSubscribers.append(subscriber)
    }

    @inlinable
    mutating func unmarkFull(_ subscriber: SubscriberCore<Element, Failure>) {
        guard let index = subscriber.fullIndex else { return }
        subscriber.fullIndex = nil
        let last = fullSubscribers.removeLast()
        if index < fullSubscribers.count {
            fullSubscribers[index] = last
            last.fullIndex = index
        }
        shrinkIfSparse(&fullSubscribers)
    }

    @inlinable
    mutating func refreshFullSubscribers() {
        var index = fullSubscribers.count - 1
        while index >= 0 {
            let subscriber = fullSubscribers[index]
            if subscriber.registryIndex == nil || subscriber.hasRoom() { unmarkFull(subscriber) }
            index -= 1
        }
    }
}
