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

    @inlinable
    init(replayLimit: Int, parkedConsumers: AtomicInt) {
        self.replayLimit = replayLimit
        self.parkedConsumers = parkedConsumers
        self.replay = RingBuffer(initialCapacity: Swift.min(replayLimit, 16))
    }

    @inlinable var hasWaitingEmitters: Bool { !emitters.isEmpty }
    @inlinable var waitingEmitterCount: Int { emitters.count }

    // MARK: Subscribing

    /// Seeds a new subscriber with the replay window and registers it (or
    /// gives it the terminal event).
    @inlinable
    mutating func subscribe(_ subscriber: SubscriberCore<Element, Failure>,
                            fromCancelledTask: Bool,
                            effects: inout Effects<Element>) {
        var overFilled = false
        replay.forEach { element in
            if subscriber.offer(copy element, effects: &effects) == .deliveredFull { overFilled = true }
        }
        if let terminal {
            subscriber.setTerminal(terminal.subscriberTerminal)
        } else if fromCancelledTask {
            subscriber.setTerminal(.cancelled)
        } else {
            subscriber.registryIndex = subscribers.count
            subscribers.append(.passRetained(subscriber))
            if overFilled { markFull(subscriber) }  // replay can fill a `.bounded` subscriber
        }
    }

    /// Unregisters `subscriber` in O(1); no other subscriber is touched.
    @inlinable
    mutating func remove(_ subscriber: SubscriberCore<Element, Failure>, effects: inout Effects<Element>) {
        #if ASYNCBROADCAST_FAULT_LEAK_SUBSCRIBER
        let registryIndex: Int? = nil  // deliberate fault: ended subscribers stay registered
        #else
        let registryIndex = subscriber.registryIndex
        #endif
        if let index = registryIndex {
            subscriber.registryIndex = nil
            let last = subscribers.removeLast()
            if index < subscribers.count {
                subscribers[index] = last
                last._withUnsafeGuaranteedRef { $0.registryIndex = index }
            }
            // The caller holds `subscriber`, so this cannot be the last
            // reference: no deinit (and no element release) runs here.
            Unmanaged.passUnretained(subscriber).release()
        }
        unmarkFull(subscriber)
        serveEmitters(drained: nil, effects: &effects)
    }

    // MARK: Sending

    /// Hands `element` to every subscriber. O(subscribers).
    @inlinable
    mutating func deliver(_ element: Element, effects: inout Effects<Element>) -> BroadcastSendResult {
        var result = BroadcastSendResult()
        for subscriber in subscribers {
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
            case .skipped:
                break
            }
        }
        // Lock-free subscribers: publish everything, then look for parked
        // consumers. The fence pairs with the one a consumer issues after
        // counting itself in `parkedConsumers` and moving to `parked`.
        sequentiallyConsistentFence()
        if parkedConsumers.loadRelaxed() != 0 {
            for subscriber in subscribers {
                subscriber._withUnsafeGuaranteedRef { $0.wakeIfParked(effects: &effects) }
            }
        }
        if replayLimit > 0 {
            if replay.count == replayLimit { effects.release(replay.popFirst().unsafelyUnwrapped) }
            replay.append(element)
        }
        return result
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

    /// Stores the emitter's continuation, or returns the outcome if the emit
    /// was already served, cancelled or finished.
    @inlinable
    mutating func park(emit id: Int, _ continuation: UnsafeContinuation<EmitOutcome, Never>) -> EmitOutcome? {
        if let outcome = decidedEmits.removeValue(forKey: id) { return outcome }
        guard let index = emitters.firstIndex(where: { $0.id == id }) else {
            preconditionFailure("AsyncBroadcast: emit \(id) is neither queued nor decided")
        }
        emitters[index].continuation = continuation
        return nil
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
            #if ASYNCBROADCAST_FAULT_DROP_EMIT
            let result = BroadcastSendResult()  // deliberate fault: claims success, delivers nothing
            #else
            let result = deliver(entry.element.unsafelyUnwrapped, effects: &effects)
            #endif
            decide(entry, .delivered(result), effects: &effects)
        }
    }

    @inlinable
    mutating func decide(_ entry: consuming PendingEmit<Element>, _ outcome: EmitOutcome,
                                 effects: inout Effects<Element>) {
        if let element = entry.element.take() { effects.release(element) }
        if let continuation = entry.continuation {
            effects.resume(continuation, with: outcome)
        } else {
            decidedEmits[entry.id] = outcome
        }
    }

    // MARK: Finishing

    /// First call wins. Wakes parked consumers and releases every waiting
    /// emitter with an `isFinished` result.
    @inlinable
    mutating func finish(_ event: Terminal, effects: inout Effects<Element>) {
        guard terminal == nil else { return }
        terminal = event
        let subscriberTerminal = event.subscriberTerminal
        for subscriber in subscribers {
            subscriber._withUnsafeGuaranteedRef { $0.finish(subscriberTerminal, effects: &effects) }
        }
        while !emitters.isEmpty {
            decide(emitters.removeFirst(), .delivered(.finished), effects: &effects)
        }
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
