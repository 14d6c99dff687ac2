/// The sequence-wide state: who is subscribed, the replay window, the
/// terminal event and the queue of waiting emitters.
///
/// Guarded by `BroadcastStorage.lock`. Its transitions never resume a
/// continuation or release an element themselves: they record that in
/// `Effects`, which the storage runs after unlocking.
struct BroadcastState<Element: Sendable, Failure: Error>: ~Copyable {
    enum Terminal {
        case finished
        case failed(Failure)

        var subscriberTerminal: SubscriberTerminal<Failure> {
            switch self {
            case .finished: return .finished
            case .failed(let error): return .failed(error)
            }
        }
    }

    /// Live subscribers, in no particular order (removal swaps with the last).
    private(set) var subscribers: [SubscriberCore<Element, Failure>] = []
    /// `.bounded` subscribers last seen holding their capacity or more. It
    /// may hold stale entries (a consumer drained without telling us);
    /// `refreshFullSubscribers()` drops those before anyone waits on them.
    private var fullSubscribers: [SubscriberCore<Element, Failure>] = []
    private var replay: RingBuffer<Element>
    let replayLimit: Int
    private(set) var terminal: Terminal?
    /// Waiting emitters, in arrival order.
    private var emitters: [EmitWaiter<Element>] = []

    init(replayLimit: Int) {
        self.replayLimit = replayLimit
        self.replay = RingBuffer(initialCapacity: Swift.min(replayLimit, 16))
    }

    var hasWaitingEmitters: Bool { !emitters.isEmpty }
    var waitingEmitterCount: Int { emitters.count }

    // MARK: Subscribing

    /// Seeds a new subscriber with the replay window and registers it (or
    /// gives it the terminal event).
    mutating func subscribe(_ subscriber: SubscriberCore<Element, Failure>,
                            fromCancelledTask: Bool,
                            effects: inout Effects<Element>) {
        replay.forEach { element in
            _ = subscriber.offer(copy element, effects: &effects)
        }
        if let terminal {
            subscriber.setTerminal(terminal.subscriberTerminal)
        } else if fromCancelledTask {
            subscriber.setTerminal(.cancelled)
        } else {
            subscriber.registryIndex = subscribers.count
            subscribers.append(subscriber)
        }
    }

    /// Unregisters `subscriber` in O(1); no other subscriber is touched.
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
                last.registryIndex = index
            }
        }
        unmarkFull(subscriber)
        serveEmitters(effects: &effects)
    }

    // MARK: Sending

    /// Hands `element` to every subscriber. O(subscribers).
    mutating func deliver(_ element: Element, effects: inout Effects<Element>) -> BroadcastSendResult {
        var result = BroadcastSendResult()
        for subscriber in subscribers {
            switch subscriber.offer(element, effects: &effects) {
            case .delivered:
                result.delivered += 1
            case .deliveredFull:
                result.delivered += 1
                markFull(subscriber)
            case .deliveredEvicting:
                result.delivered += 1
                result.dropped += 1
            case .dropped:
                result.dropped += 1
            case .skipped:
                break
            }
        }
        if replayLimit > 0 {
            if replay.count == replayLimit { effects.release(replay.popFirst().unsafelyUnwrapped) }
            replay.append(element)
        }
        return result
    }

    /// `true` when an `emit` may deliver now: nobody queued ahead of it and
    /// every `.bounded` subscriber has room.
    ///
    /// `emitterFlag` must already announce the check (see
    /// `BroadcastStorage.emittersWaiting`): a consumer that drains after our
    /// look at it then knows to call back.
    mutating func emitterMayProceed(queuedAhead: Bool) -> Bool {
        if queuedAhead && !emitters.isEmpty { return false }
        refreshFullSubscribers()
        return fullSubscribers.isEmpty
    }

    mutating func enqueue(_ waiter: EmitWaiter<Element>) {
        emitters.append(waiter)
    }

    /// Removes a cancelled waiter; returns its continuation if it was queued.
    mutating func cancel(_ waiter: EmitWaiter<Element>) -> UnsafeContinuation<EmitOutcome, Never>? {
        guard let index = emitters.firstIndex(where: { $0 === waiter }) else {
            waiter.isCancelled = true  // not queued yet (or already served)
            return nil
        }
        emitters.remove(at: index)
        let continuation = waiter.continuation
        waiter.continuation = nil
        return continuation
    }

    /// Delivers for queued emitters, oldest first, while every `.bounded`
    /// subscriber has room.
    mutating func serveEmitters(effects: inout Effects<Element>) {
        while let waiter = emitters.first {
            refreshFullSubscribers()
            guard fullSubscribers.isEmpty else { return }
            emitters.removeFirst()
            let result = deliver(waiter.element, effects: &effects)
            effects.resume(waiter.continuation.unsafelyUnwrapped, with: .delivered(result))
            waiter.continuation = nil
        }
    }

    // MARK: Finishing

    /// First call wins. Wakes parked consumers and releases every waiting
    /// emitter with an `isFinished` result.
    mutating func finish(_ event: Terminal, effects: inout Effects<Element>) {
        guard terminal == nil else { return }
        terminal = event
        for subscriber in subscribers {
            subscriber.finish(event.subscriberTerminal, effects: &effects)
        }
        for waiter in emitters {
            effects.resume(waiter.continuation.unsafelyUnwrapped, with: .delivered(.finished))
            waiter.continuation = nil
        }
        emitters = []
    }

    // MARK: Full `.bounded` subscribers

    private mutating func markFull(_ subscriber: SubscriberCore<Element, Failure>) {
        guard subscriber.fullIndex == nil else { return }
        subscriber.fullIndex = fullSubscribers.count
        fullSubscribers.append(subscriber)
    }

    private mutating func unmarkFull(_ subscriber: SubscriberCore<Element, Failure>) {
        guard let index = subscriber.fullIndex else { return }
        subscriber.fullIndex = nil
        let last = fullSubscribers.removeLast()
        if index < fullSubscribers.count {
            fullSubscribers[index] = last
            last.fullIndex = index
        }
    }

    private mutating func refreshFullSubscribers() {
        var index = fullSubscribers.count - 1
        while index >= 0 {
            let subscriber = fullSubscribers[index]
            if subscriber.registryIndex == nil || subscriber.hasRoom() { unmarkFull(subscriber) }
            index -= 1
        }
    }
}
