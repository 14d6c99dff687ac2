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

/// Result of a non-suspending look at a subscriber.
@usableFromInline
enum PollOutcome<Element, Failure: Error> {
    case element(Element)
    case empty
    case end
    case failure(Failure)
}

/// One subscriber: its buffer, its terminal event, and the parked consumer's
/// continuation.
///
/// ## Two buffer modes
/// - **Lock-free (`isLockFree`)**, for `.unbounded`, `.bounded` and
///   `.bufferingOldest(n > 0)`: producers never remove elements, so the
///   buffer is a single-producer/single-consumer queue (`SPSCRing`).
///   Producers are already serialized by the sequence lock and a
///   subscription has one consumer, so neither side takes a lock per
///   element.
/// - **Locked**, for `.bufferingNewest` and capacity 0: a producer may evict
///   the oldest unread element, so `ring` is guarded by `lock` on both sides.
///
/// ## The park/wake hand-off
/// `parkState` decides who owns `continuation`:
///
/// ```
/// idle ──park (consumer)──▶ parked ──wake (CAS)──▶ idle
///   │                          │
///   └──cancel handler──▶ cancelled ◀── cancel handler (fetch-or) wins
/// ```
/// Whoever moves the word out of `parked` owns the continuation and resumes
/// it exactly once, after releasing every lock. `cancelled` is a tombstone:
/// a park that comes after it resumes at once and producers skip the
/// subscriber. The task-cancellation handler takes no lock.
///
/// In locked mode the consumer parks under `lock` after seeing an empty
/// ring, and producers (also under `lock`) hand an element straight to a
/// parked consumer. In lock-free mode nobody holds a common lock, so the two
/// sides meet Dekker-style: the consumer counts itself in
/// `storage.parkedConsumers`, moves to `parked`, issues a sequentially
/// consistent fence and looks for work once more; a producer publishes its
/// elements, issues a fence, and wakes parked subscribers if any are
/// counted. One of the two always sees the other.
///
/// ## Guards
/// - `lock` (this subscriber's own) guards `ring` and `terminal`. Order: sequence lock, then subscriber lock.
/// - The sequence lock guards `registryIndex`, `fullIndex` and the
///   producer side of `SPSCRing`.
/// - `consumerBusy` guards the consumer side of `SPSCRing`; a second
///   concurrent consumer traps instead of corrupting it.
@usableFromInline
final class SubscriberCore<Element: Sendable, Failure: Error>: @unchecked Sendable {
    @inlinable static var idle: Int { 0 }
    @inlinable static var parked: Int { 1 }
    @inlinable static var cancelledBit: Int { 2 }

    /// Where each atomic lives in `block`: eight words per cache line, one
    /// line per writer, so the producer and the consumer never write the
    /// same line.
    @usableFromInline
    enum Word {
        // Line 1: written by the producer (under the sequence lock).
        @inlinable static var tail: Int { 0 }
        @inlinable static var dropped: Int { 1 }
        // Line 2: written by the consumer.
        @inlinable static var head: Int { 8 }
        @inlinable static var consumerBusy: Int { 9 }
        // Line 3: written rarely, by whoever parks, wakes, ends or cancels.
        @inlinable static var parkState: Int { 16 }
        @inlinable static var terminalHint: Int { 17 }
        @inlinable static var ended: Int { 18 }
        @inlinable static var cancelRequested: Int { 19 }
        @inlinable static var count: Int { 24 }
    }

    @usableFromInline let policy: BroadcastBufferingPolicy
    /// `nil` for a subscription that was never registered (subscribed from a
    /// cancelled task or after `finish`).
    @usableFromInline let storage: BroadcastStorage<Element, Failure>?
    @usableFromInline let isLockFree: Bool
    /// For `.bounded(n)` and `.bufferingOldest(n)`: `n`; otherwise `Int.max`.
    @usableFromInline let limit: Int

    /// The lock and every atomic word below, from one allocation. Word
    /// indices group words by writer, one cache line each: the producer's
    /// (`tail`, `dropped`), the consumer's (`head`, `consumerBusy`), and
    /// the rarely written rest.
    @usableFromInline let block = AtomicBlock(wordCount: Word.count)
    @usableFromInline let lock: Lock
    @usableFromInline let parkState: AtomicInt
    @usableFromInline var continuation: UnsafeContinuation<Wake<Element>, Never>?
    @usableFromInline var terminal: SubscriberTerminal<Failure>?
    /// Non-zero once `terminal` is set (it is read under `lock`).
    @usableFromInline let terminalHint: AtomicInt
    @usableFromInline let dropped: AtomicInt

    /// Locked mode: the buffer.
    @usableFromInline var ring: RingBuffer<Element>
    /// Lock-free mode: the buffer (`spscOwner` owns it; hot paths go
    /// through the unmanaged `spscHandle` so that neither side touches its
    /// reference count, which would bounce between cores).
    @usableFromInline let spscOwner: SPSCRing<Element>
    @usableFromInline let spscHandle: Unmanaged<SPSCRing<Element>>
    /// 1 while a consumer is inside `poll()`, 2 while `cancel()` frees the
    /// buffer.
    @usableFromInline let consumerBusy: AtomicInt
    /// Set by `cancel()`; the consumer then drops what it holds and ends.
    @usableFromInline let ended: AtomicInt
    /// Set by the first `cancel()`, so that later calls (the subscription's
    /// `deinit` after an explicit `cancel()`) return without touching the
    /// sequence lock.
    @usableFromInline let cancelRequested: AtomicInt

    /// Position in the sequence's registry, or `nil` once removed.
    @usableFromInline var registryIndex: Int?
    /// Position in the sequence's list of full `.bounded` subscribers.
    @usableFromInline var fullIndex: Int?

    @inlinable
    init(policy: BroadcastBufferingPolicy, storage: BroadcastStorage<Element, Failure>?) {
        self.policy = policy
        self.storage = storage
        switch policy {
        case .unbounded:
            isLockFree = true
            limit = .max
        case .bounded(let n):
            isLockFree = true
            limit = n
        case .bufferingOldest(let n):
            isLockFree = n > 0
            limit = n
        case .bufferingNewest(let n):
            isLockFree = false
            limit = n
        }
        lock = block.lock
        dropped = block.word(Word.dropped)
        consumerBusy = block.word(Word.consumerBusy)
        parkState = block.word(Word.parkState)
        terminalHint = block.word(Word.terminalHint)
        ended = block.word(Word.ended)
        cancelRequested = block.word(Word.cancelRequested)
        ring = RingBuffer(initialCapacity: isLockFree ? 0 : policy.initialStorageCapacity)
        spscOwner = SPSCRing(
            capacity: isLockFree ? Swift.min(limit, SPSCRing<Element>.defaultCapacity) : 1,
            tail: block.word(Word.tail), head: block.word(Word.head))
        spscHandle = Unmanaged.passUnretained(spscOwner)
    }

    deinit {
        // Every path that parks also resumes before the last reference goes.
        assert(continuation == nil)
        // Empty the ring while its `head`/`tail` words exist; `spscOwner`
        // is released after this body, when they are gone.
        spscHandle._withUnsafeGuaranteedRef { $0.removeAll() }
        block.destroy()
    }

    // MARK: Producer side (called with the sequence lock held)

    /// Hands `element` to this subscriber according to its policy. In
    /// lock-free mode a parked consumer is woken later, by `wakeIfParked`,
    /// once the whole send is published.
    @inlinable
    func offer(_ element: Element, effects: inout Effects<Element>) -> OfferOutcome {
        isLockFree ? offerLockFree(element) : offerLocked(element, effects: &effects)
    }

    @inlinable
    func offerLockFree(_ element: Element) -> OfferOutcome {
        // Registered implies no terminal event (finish runs under the
        // sequence lock too); only the cancellation tombstone can be set.
        if parkState.loadAcquire() & Self.cancelledBit != 0 { return .skipped }
        if limit != .max, case .bufferingOldest = policy,
           spscHandle._withUnsafeGuaranteedRef({ $0.producerCountReaches(limit) }) {
            countDrop()
            return .dropped
        }
        spscHandle._withUnsafeGuaranteedRef { $0.push(element) }
        return deliveredOutcome()
    }

    @inlinable
    func deliveredOutcome() -> OfferOutcome {
        if case .bounded = policy, spscHandle._withUnsafeGuaranteedRef({ $0.producerCountReaches(limit) }) {
            return .deliveredFull
        }
        return .delivered
    }

    /// Unread elements, as the producer sees them (sequence lock held).
    @inlinable
    func producerCount() -> Int {
        spscHandle._withUnsafeGuaranteedRef { $0.producerCount() }
    }

    @inlinable
    func countDrop() {
        #if ASYNCBROADCAST_FAULT_MISCOUNT_EVICTION
        if case .bufferingNewest(let n) = policy, ring.capacity == n { return }
        #endif
        dropped.storeRelease(dropped.loadRelaxed() + 1)  // single writer: the lock holder
    }

    @inlinable
    func offerLocked(_ element: Element, effects: inout Effects<Element>) -> OfferOutcome {
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
        case .bufferingOldest, .bufferingNewest(0):
            countDrop()  // capacity 0 and no reader waiting
            return .dropped
        default:
            guard ring.count >= limit else {
                ring.append(element)
                return .delivered
            }
            effects.release(ring.popFirst().unsafelyUnwrapped)
            countDrop()
            ring.append(element)
            return .deliveredEvicting
        }
    }

    /// Lock-free mode, after a send is published and fenced: resume a
    /// parked consumer.
    @inlinable
    func wakeIfParked(effects: inout Effects<Element>) {
        #if !ASYNCBROADCAST_FAULT_SKIP_WAKE
        guard isLockFree, parkState.loadAcquire() == Self.parked else { return }
        if parkState.compareExchange(expected: Self.parked, desired: Self.idle).exchanged {
            effects.resume(takeContinuation(), with: .retry)
        }
        #endif
    }

    /// Records the sequence's terminal event and wakes a parked consumer.
    @usableFromInline
    func finish(_ event: SubscriberTerminal<Failure>, effects: inout Effects<Element>) {
        setTerminal(event)
        sequentiallyConsistentFence()  // pairs with the fence in `park`
        if parkState.compareExchange(expected: Self.parked, desired: Self.idle).exchanged {
            effects.resume(takeContinuation(), with: .retry)
        }
    }

    /// `true` if this `.bounded` subscriber holds fewer than its capacity.
    /// Called with the sequence lock held.
    @usableFromInline
    func hasRoom() -> Bool {
        producerCount() < limit
    }

    // MARK: Queries

    @usableFromInline
    var droppedCount: Int { dropped.loadAcquire() }

    @usableFromInline
    var isBufferEmpty: Bool {
        isLockFree
            ? spscHandle._withUnsafeGuaranteedRef { $0.isEmptyForObserver }
            : lock.withLock { ring.isEmpty }
    }

    /// Whether a consumer is suspended in `next()` right now (for tests).
    @usableFromInline
    var isConsumerParked: Bool { parkState.loadAcquire() == Self.parked }

    // MARK: Ending

    /// Ends the subscriber at once: unregisters it, frees its buffer and wakes
    /// a parked consumer, which then returns `nil`.
    @inlinable
    func cancel() {
        guard cancelRequested.exchangeAcquiringAndReleasing(1) == 0 else { return }
        storage?.remove(self)  // no producer touches the buffer after this
        var effects = Effects(pool: storage?.pool)
        lock.lock()
        terminal = .ended
        terminalHint.storeRelease(1)
        let discarded = ring.takeAll()
        lock.unlock()
        _ = consume discarded  // element deinitializers run here, unlocked
        if isLockFree {
            ended.storeRelease(1)
            // Free the consumer side too, unless a consumer is reading it
            // right now (it drops everything itself when it sees `ended`).
            if consumerBusy.compareExchange(expected: 0, desired: 2).exchanged {
                spscHandle._withUnsafeGuaranteedRef { $0.removeAll() }
                consumerBusy.storeRelease(0)
            }
        }
        sequentiallyConsistentFence()  // pairs with the fence in `park`
        if parkState.compareExchange(expected: Self.parked, desired: Self.idle).exchanged {
            effects.resume(takeContinuation(), with: .retry)
        }
        effects.run()
    }

    /// The consumer's task is cancelled: stop receiving, keep what is buffered.
    @inlinable
    func endForTaskCancellation() {
        storage?.remove(self)
        lock.lock()
        switch terminal {
        case nil, .failed, .finished:
            setTerminalLocked(.cancelled)  // a cancelled reader ends with nil, never an error
        case .cancelled, .ended:
            break
        }
        lock.unlock()
    }

    @usableFromInline
    func setTerminal(_ event: SubscriberTerminal<Failure>) {
        lock.lock()
        if terminal == nil { setTerminalLocked(event) }
        lock.unlock()
    }

    @inlinable
    func setTerminalLocked(_ event: SubscriberTerminal<Failure>) {
        terminal = event
        terminalHint.storeRelease(1)
    }

    // MARK: Consumer side

    /// One non-suspending step: an element, the end, or `.empty`.
    @inlinable
    func poll() -> PollOutcome<Element, Failure> {
        if isLockFree {
            let claimed = consumerBusy.compareExchange(expected: 0, desired: 1)
            if !claimed.exchanged {
                if claimed.original == 2 { return .end }  // cancel() is freeing the buffer
                preconditionFailure("AsyncBroadcast: concurrent next() calls on one Subscription; a subscription has exactly one consumer")
            }
            defer { consumerBusy.storeRelease(0) }
            if ended.loadAcquire() != 0 {
                spscHandle._withUnsafeGuaranteedRef { $0.removeAll() }
                return .end
            }
            if let element = popLockFree() { return .element(element) }
            guard terminalHint.loadAcquire() != 0 else { return .empty }
            // Everything sent before the terminal event is visible now.
            if let element = popLockFree() { return .element(element) }
            return takeTerminal()
        }
        lock.lock()
        if let element = ring.popFirst() {
            lock.unlock()
            return .element(element)
        }
        // Still holding the lock: nothing can be buffered between our empty
        // look and taking the terminal event.
        return takeTerminalLocked()
    }

    /// Lock-free mode, `consumerBusy` held.
    @inlinable
    func popLockFree() -> Element? {
        let isBounded: Bool
        if case .bounded = policy { isBounded = true } else { isBounded = false }
        guard let element = spscHandle._withUnsafeGuaranteedRef({ $0.pop(publishSequentiallyConsistent: isBounded) }) else {
            return nil
        }
        // A `.bounded` read may release waiting emitters. The emitter stores
        // its flag, then reads our count; we publish our count (sequentially
        // consistent), then read its flag: one of the two sees the other.
        if isBounded { storage?.boundedSubscriberMayHaveRoom(self) }
        return element
    }

    /// Delivers the terminal event once (`.empty` if there is none yet).
    @inlinable
    func takeTerminal() -> PollOutcome<Element, Failure> {
        lock.lock()
        return takeTerminalLocked()
    }

    /// `takeTerminal` with `lock` already held; releases it.
    @inlinable
    func takeTerminalLocked() -> PollOutcome<Element, Failure> {
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

    /// `next()`: a synchronous attempt first, so a consumer with something
    /// buffered never enters another async function, creates no
    /// continuation and never suspends.
    ///
    /// Reading the task's cancellation flag is an expensive 16-byte atomic
    /// load, so the iterator asks for it only on its first call and then
    /// every 32 calls; parking always notices cancellation (through the
    /// cancellation handler).
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
            if isLockFree { _ = storage?.parkedConsumers.fetchAddAcquiringAndReleasing(-1) }
            // The cancellation handler may have fired after someone else
            // resumed us: its tombstone makes producers skip this subscriber,
            // so end it now rather than leave it registered and starved.
            if parkState.loadAcquire() & Self.cancelledBit != 0 { endForTaskCancellation() }
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

    /// Stores the continuation, unless there is work already (then it
    /// resumes at once). Runs inside `withUnsafeContinuation`; any lock is
    /// held only within this call, never across the suspension
    /// (swiftlang/swift#85668).
    @inlinable
    func park(_ newContinuation: UnsafeContinuation<Wake<Element>, Never>) {
        let state = parkState.loadAcquire()
        precondition(state & Self.parked == 0,
                     "AsyncBroadcast: concurrent next() calls on one Subscription; a subscription has exactly one consumer")
        if isLockFree {
            _ = storage?.parkedConsumers.fetchAddAcquiringAndReleasing(1)
            continuation = newContinuation
            // Publishes `continuation` (release) to whoever moves us out of `parked`.
            guard parkState.compareExchange(expected: Self.idle, desired: Self.parked).exchanged else {
                continuation = nil
                newContinuation.resume(returning: .cancelled)  // the cancellation tombstone is set
                return
            }
            sequentiallyConsistentFence()  // pairs with the producers' fence after publishing
            let hasWork = spscHandle._withUnsafeGuaranteedRef { !$0.isEmptyForObserver }
                || terminalHint.loadAcquire() != 0 || ended.loadAcquire() != 0
            if hasWork, parkState.compareExchange(expected: Self.parked, desired: Self.idle).exchanged {
                continuation = nil
                newContinuation.resume(returning: .retry)
            }
            return
        }
        lock.lock()
        if !ring.isEmpty || terminal != nil {
            lock.unlock()
            newContinuation.resume(returning: .retry)
            return
        }
        continuation = newContinuation
        guard parkState.compareExchange(expected: Self.idle, desired: Self.parked).exchanged else {
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
}
