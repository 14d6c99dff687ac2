/// How a subscriber's stream ends, once it is decided.
@usableFromInline
enum SubscriberTerminal<Failure: Error> {
    /// The sequence finished: drain the buffer, then return `nil`.
    case finished
    /// The sequence failed: drain the buffer, throw once, then return `nil`.
    case failed(Failure)
    /// The consumer's task was cancelled: drain what is already buffered
    /// (nothing new arrives), then return `nil` (as `AsyncStream` does).
    case cancelled
    /// The terminal event was delivered, or `cancel()` was called: `nil`.
    case ended
}

/// What `offer` did with an element.
@usableFromInline
enum OfferOutcome {
    case delivered
    /// Delivered to a `.bounded` subscriber that now holds its capacity or more.
    case deliveredFull
    /// Delivered to a full `.bufferingNewest` subscriber, evicting its oldest.
    case deliveredEvicting
    case dropped
    /// The subscriber is ending: the element is neither delivered nor dropped.
    case skipped
}

/// How a subscriber's consumer reads without the lock.
@usableFromInline
enum BatchMode {
    /// `.bufferingNewest` and capacity 0: producers evict the oldest unread
    /// element, so every read takes the lock.
    case none
    /// `.unbounded`: producers never need the batch's size.
    case plain
    /// `.bufferingOldest(n)`: producers count the batch against `n`.
    case counted
    /// `.bounded(n)`: as `.counted`, and reads may release waiting emitters.
    case bounded
}

/// Result of a non-suspending look at a subscriber.
@usableFromInline
enum PollOutcome<Element, Failure: Error> {
    case element(Element)
    case empty
    case end
    case failure(Failure)
}

/// One subscriber: its ring buffer, its terminal event, and the parked
/// consumer's continuation.
///
/// ## Synchronization
/// - `lock` (this subscriber's own mutex, never shared with other
///   subscribers) guards `ring`, `terminal` and `dropped`. Producers take it
///   while already holding the sequence lock (order: sequence, then
///   subscriber); the consumer takes it alone.
/// - `parkState` guards the hand-off of `continuation` between the consumer,
///   producers and the task-cancellation handler, which takes no lock at all:
///
///   ```
///   idle ──park (consumer, under lock)──▶ parked ──wake (CAS, under lock)──▶ idle
///     │                                      │
///     └──cancel handler──▶ cancelled ◀───────┘ cancel handler (fetch-or) wins
///   ```
///   Whoever moves the word out of `parked` owns the continuation and resumes
///   it, exactly once, after releasing every lock. `cancelled` is a
///   tombstone: a park that comes after it resumes at once, and producers
///   skip the subscriber.
/// - `registryIndex`, `fullIndex` are guarded by the sequence lock.
@usableFromInline
final class SubscriberCore<Element: Sendable, Failure: Error>: @unchecked Sendable {
    @inlinable static var idle: Int { 0 }
    @inlinable static var parked: Int { 1 }
    @inlinable static var cancelledBit: Int { 2 }

    @usableFromInline let policy: BroadcastBufferingPolicy
    /// `nil` for a subscription that was never registered (subscribed from a
    /// cancelled task or after `finish`).
    @usableFromInline let storage: BroadcastStorage<Element, Failure>?

    @usableFromInline let lock = Lock()
    @usableFromInline let parkState = AtomicInt(0)
    @usableFromInline var continuation: UnsafeContinuation<Wake<Element>, Never>?
    /// Shared with producers; guarded by `lock`.
    @usableFromInline var ring: RingBuffer<Element>
    /// The consumer's private batch (see `BatchMode`): only the consumer
    /// touches it, without a lock. Older than everything in `ring`.
    @usableFromInline var batch: RingBuffer<Element>
    /// `batch.count`, published for producers' capacity checks.
    @usableFromInline let batchCount = AtomicInt(0)
    /// Set by `cancel()`: the consumer must drop its batch and end.
    @usableFromInline let ended = AtomicInt(0)
    /// Non-zero while a consumer is inside `poll()`; a second one traps.
    @usableFromInline let consumerBusy = AtomicInt(0)
    @usableFromInline let batchMode: BatchMode
    @usableFromInline var terminal: SubscriberTerminal<Failure>?
    @usableFromInline var dropped = 0

    /// Position in the sequence's registry, or `nil` once removed.
    @usableFromInline var registryIndex: Int?
    /// Position in the sequence's list of full `.bounded` subscribers.
    @usableFromInline var fullIndex: Int?

    /// For `.bounded(n)`: `n`; otherwise `Int.max`.
    @usableFromInline let boundedCapacity: Int

    @usableFromInline
    init(policy: BroadcastBufferingPolicy, storage: BroadcastStorage<Element, Failure>?) {
        self.policy = policy
        self.storage = storage
        self.ring = RingBuffer(initialCapacity: policy.initialStorageCapacity)
        self.batch = RingBuffer()
        switch policy {
        case .unbounded: batchMode = .plain
        case .bufferingOldest(let n): batchMode = n > 0 ? .counted : .none
        case .bounded: batchMode = .bounded
        case .bufferingNewest: batchMode = .none
        }
        if case .bounded(let n) = policy { boundedCapacity = n } else { boundedCapacity = .max }
    }

    deinit {
        // Every path that parks also resumes before the last reference goes.
        assert(continuation == nil)
        lock.destroy()
        parkState.destroy()
        batchCount.destroy()
        ended.destroy()
        consumerBusy.destroy()
    }

    // MARK: Producer side (called with the sequence lock held)

    /// Hands `element` to this subscriber according to its policy.
    @inlinable
    func offer(_ element: Element, effects: inout Effects<Element>) -> OfferOutcome {
        lock.lock()
        defer { lock.unlock() }
        if terminal != nil { return .skipped }
        let state = parkState.loadAcquire()
        if state & Self.cancelledBit != 0 { return .skipped }
        if state == Self.parked {
            #if !ASYNCBROADCAST_FAULT_SKIP_WAKE
            // Parked implies an empty buffer: hand the element over directly.
            guard parkState.compareExchange(expected: Self.parked, desired: Self.idle).exchanged else {
                return .skipped  // the cancellation handler won the continuation
            }
            effects.resume(takeContinuation(), with: .element(element))
            return .delivered
            #endif
        }
        switch policy {
        case .unbounded:
            ring.append(element)
            return .delivered
        case .bounded:
            ring.append(element)
            return ring.count + batchCount.loadAcquire() >= boundedCapacity ? .deliveredFull : .delivered
        case .bufferingOldest(let limit):
            guard ring.count + batchCount.loadAcquire() < limit else {
                dropped += 1
                return .dropped
            }
            ring.append(element)
            return .delivered
        case .bufferingNewest(let limit):
            guard limit > 0 else {
                dropped += 1
                return .dropped
            }
            guard ring.count >= limit else {
                ring.append(element)
                return .delivered
            }
            effects.release(ring.popFirst().unsafelyUnwrapped)
            #if !ASYNCBROADCAST_FAULT_MISCOUNT_EVICTION
            dropped += 1
            #else
            if ring.capacity != limit { dropped += 1 }
            #endif
            ring.append(element)
            return .deliveredEvicting
        }
    }

    /// Records the sequence's terminal event and wakes a parked consumer.
    @usableFromInline
    func finish(_ event: SubscriberTerminal<Failure>, effects: inout Effects<Element>) {
        lock.lock()
        defer { lock.unlock() }
        if terminal == nil { terminal = event }
        if parkState.compareExchange(expected: Self.parked, desired: Self.idle).exchanged {
            effects.resume(takeContinuation(), with: .retry)
        }
    }

    /// `true` if this `.bounded` subscriber holds fewer than its capacity.
    @usableFromInline
    func hasRoom() -> Bool {
        lock.withLock { ring.count + batchCount.loadAcquire() < boundedCapacity }
    }

    // MARK: Consumer side

    @usableFromInline
    var droppedCount: Int { lock.withLock { dropped } }

    @usableFromInline
    var isBufferEmpty: Bool { lock.withLock { ring.isEmpty } && batchCount.loadAcquire() == 0 }

    /// Whether a consumer is suspended in `next()` right now (for tests).
    @usableFromInline
    var isConsumerParked: Bool { parkState.loadAcquire() == Self.parked }

    /// Ends the subscriber at once: unregisters it, frees its buffer and wakes
    /// a parked consumer, which then returns `nil`.
    @usableFromInline
    func cancel() {
        storage?.remove(self)
        var effects = Effects(pool: storage?.pool)
        lock.lock()
        terminal = .ended
        // The consumer drops its private batch when it sees this (it may be
        // reading it right now); `deinit` frees it otherwise.
        ended.storeRelease(1)
        let discarded = ring.takeAll()
        if parkState.compareExchange(expected: Self.parked, desired: Self.idle).exchanged {
            effects.resume(takeContinuation(), with: .retry)
        }
        lock.unlock()
        _ = consume discarded  // element deinitializers run here, unlocked
        effects.run()
    }

    /// The consumer's task is cancelled: stop receiving, keep what is buffered.
    @inlinable
    func endForTaskCancellation() {
        storage?.remove(self)
        lock.withLock {
            if terminal == nil { terminal = .cancelled }
        }
    }

    /// One non-suspending step: an element, the end, or `.empty`.
    ///
    /// With a batch (`batchMode != .none`) the consumer pops from its
    /// private `batch` without locking, and when that runs dry takes the
    /// lock once to swap it with the shared `ring` (O(1), and the drained
    /// allocation goes back to producers, so nothing is allocated).
    @inlinable
    func poll() -> PollOutcome<Element, Failure> {
        if consumerBusy.exchangeAcquiringAndReleasing(1) != 0 {
            preconditionFailure("AsyncBroadcast: concurrent next() calls on one Subscription; a subscription has exactly one consumer")
        }
        defer { consumerBusy.storeRelease(0) }
        if batchMode != .none {
            if ended.loadAcquire() != 0 {
                let discarded = batch.takeAll()
                batchCount.storeRelease(0)
                _ = consume discarded
                return .end
            }
            if let element = batch.popFirst() {
                publishBatchCount()
                notifyEmittersIfBounded()
                return .element(element)
            }
        }
        lock.lock()
        if batchMode != .none {
            if !ring.isEmpty {
                let drained = batch.takeAll()
                batch = ring.takeAll()
                ring = drained
                let element = batch.popFirst().unsafelyUnwrapped
                publishBatchCount()
                lock.unlock()
                notifyEmittersIfBounded()  // never under our lock: it takes the sequence lock
                return .element(element)
            }
        } else if let element = ring.popFirst() {
            lock.unlock()
            return .element(element)
        }
        guard let event = terminal else {
            lock.unlock()
            return .empty
        }
        terminal = .ended
        lock.unlock()
        switch event {
        case .ended:
            return .end
        case .finished, .cancelled:
            storage?.remove(self)
            return .end
        case .failed(let error):
            storage?.remove(self)
            return .failure(error)
        }
    }

    /// Publishes the batch's size for producers' capacity checks. For
    /// `.bounded`, the sequentially consistent store pairs with the emitter's
    /// store of its flag before it reads our count: one sees the other.
    @inlinable
    func publishBatchCount() {
        if batchMode == .bounded {
            batchCount.storeSequentiallyConsistent(batch.count)
        } else {
            batchCount.storeRelease(batch.count)
        }
    }

    /// A read from a `.bounded` subscriber may release waiting emitters.
    /// Call with no lock held.
    @inlinable
    func notifyEmittersIfBounded() {
        if batchMode == .bounded { storage?.boundedSubscriberMayHaveRoom() }
    }

    /// `next()`: a synchronous attempt first, so a consumer with something
    /// buffered never enters another async function, creates no
    /// continuation and never suspends.
    ///
    /// Reading the task's cancellation flag is an expensive 16-byte atomic
    /// load, so the iterator asks for it only on its first call and then
    /// every `cancellationCheckInterval` calls; parking always notices
    /// cancellation (through the cancellation handler).
    @inlinable
    func next(isolation actor: isolated (any Actor)?, checkCancellation: Bool) async throws(Failure) -> Element? {
        if checkCancellation && Task.isCancelled { endForTaskCancellation() }
        switch poll() {
        case .element(let element): return element
        case .end: return nil
        case .failure(let error): throw error
        case .empty: break
        }
        // Let the producer run once before parking: a consumer that keeps
        // up would otherwise park and be woken for every single element.
        await Task.yield()
        switch poll() {
        case .element(let element): return element
        case .end: return nil
        case .failure(let error): throw error
        case .empty: return try await waitForNext(isolation: actor)
        }
    }

    /// The slow path: park until an element, the end, or cancellation.
    @inlinable
    func waitForNext(isolation actor: isolated (any Actor)?) async throws(Failure) -> Element? {
        while true {
            let wake = await withTaskCancellationHandler {
                await withUnsafeContinuation(isolation: actor) { (continuation: UnsafeContinuation<Wake<Element>, Never>) in
                    self.park(continuation)
                }
            } onCancel: {
                self.cancelWhileParked()
            }
            switch wake {
            case .element(let element): return element
            case .retry: break
            case .cancelled: endForTaskCancellation()
            }
            switch poll() {
            case .element(let element): return element
            case .end: return nil
            case .failure(let error): throw error
            case .empty: continue
            }
        }
    }

    /// Stores the continuation, unless the buffer refilled or the subscriber
    /// ended meanwhile (then it resumes at once). Runs inside
    /// `withUnsafeContinuation`, so the lock is only held within this call,
    /// never across the suspension (swiftlang/swift#85668).
    @inlinable
    func park(_ newContinuation: UnsafeContinuation<Wake<Element>, Never>) {
        lock.lock()
        if !ring.isEmpty || terminal != nil {
            lock.unlock()
            newContinuation.resume(returning: .retry)
            return
        }
        let state = parkState.loadAcquire()
        precondition(state & Self.parked == 0,
                     "AsyncBroadcast: concurrent next() calls on one Subscription; a subscription has exactly one consumer")
        continuation = newContinuation
        // Publishes `continuation` (release) to whoever moves us out of `parked`.
        guard parkState.compareExchange(expected: Self.idle, desired: Self.parked).exchanged else {
            // The cancellation tombstone is set: resume at once.
            continuation = nil
            lock.unlock()
            newContinuation.resume(returning: .cancelled)
            return
        }
        lock.unlock()
    }

    /// The task-cancellation handler. Takes no lock: it runs while the
    /// runtime holds the task's status lock.
    @inlinable
    func cancelWhileParked() {
        let previous = parkState.fetchOrAcquiringAndReleasing(Self.cancelledBit)
        guard previous == Self.parked else { return }
        // We moved the word out of `parked`: the continuation is ours. Its
        // store happened before the CAS to `parked` that we just acquired,
        // and nobody else touches it once the word has left `parked`.
        let continuation = takeContinuation()
        parkState.storeRelease(Self.cancelledBit)
        continuation.resume(returning: .cancelled)
    }

    @inlinable
    func takeContinuation() -> UnsafeContinuation<Wake<Element>, Never> {
        let taken = continuation.unsafelyUnwrapped
        continuation = nil
        return taken
    }

    // MARK: Setup (before the subscriber is visible to other threads)

    @usableFromInline
    func setTerminal(_ event: SubscriberTerminal<Failure>) {
        lock.withLock { terminal = event }
    }
}
