/// How a subscriber's stream ends, once it is decided.
@usableFromInline
enum SubscriberTerminal<Failure: Error> {
    /// The sequence finished (or the subscriber was created ended): drain the
    /// buffer, then return `nil`.
    case finished
    /// The sequence failed: drain the buffer, throw once, then return `nil`.
    case failed(Failure)
    /// Nothing more: the terminal event was delivered, or the subscriber was
    /// cancelled (`cancel()`, release, or its task's cancellation).
    case ended
}

/// Result of a non-suspending look at a subscriber.
@usableFromInline
enum PollOutcome<Element, Failure: Error> {
    case element(Element)
    case empty
    case end
    case failure(Failure)
}

/// One subscriber: its buffer, its lifecycle, and the parked reader.
///
/// ## Lifecycle
///
/// | state | registered (`registryIndex`) | `terminal` | `ended` | how it is left |
/// |---|---|---|---|---|
/// | **active** | yes | `nil` | 0 | `finish` → *finishing* or *drained*; `cancel()` / task cancellation → *cancelled* |
/// | **finishing**: finished with elements left | yes | `.finished`/`.failed` | 0 | the consumer takes the last element → *drained*; `cancel()` → *cancelled* |
/// | **drained**: finished, buffer empty | no | `.finished`/`.failed` | 0 | the consumer takes the terminal event → *done* |
/// | **done** | no | `.ended` | 0 | — |
/// | **cancelled** | no | `.ended` | 1 | — (its buffer is freed) |
///
/// A subscriber created from a cancelled task, or after `finish`, starts in
/// *finishing* or *drained* but never registered: it yields the replay
/// window, then ends.
///
/// Beside the table:
/// - `terminalHint` is 1 exactly when `terminal` is set; it lets the
///   lock-free reader skip the lock while nothing has ended.
/// - `cancelRequested` is 1 from the first `cancel()`: later calls (the
///   subscription's `deinit` after an explicit `cancel()`) return at once.
/// - `consumerBusy` is the consumer slot: 0 free, 1 held by a `next()` or
///   `poll()` for its whole duration (suspension included), 2 while
///   `cancel()` frees a lock-free buffer. A second consumer finds it taken
///   and traps; it never touches the buffer or the park word.
/// - The park word (`Parking`) is orthogonal: *idle*, *parked*, or the
///   task-cancellation tombstone. A tombstoned subscriber is skipped by
///   producers and becomes *cancelled* as soon as its reader runs.
/// - `fullIndex` (sequence lock): position in the list of full `.bounded`
///   subscribers while registered and full.
///
/// ## Guards
/// - The sequence lock: `registryIndex`, `fullIndex`, and the producer side
///   of the buffer. Lock order: sequence lock, then subscriber lock.
/// - The subscriber's `lock`: `terminal`, and a locked buffer.
/// - The consumer slot: the consumer side of a lock-free buffer.
@usableFromInline
final class SubscriberCore<Element: Sendable, Failure: Error>: @unchecked Sendable {
    /// Where each atomic lives in `block`: eight words per cache line, one
    /// line per writer, so the producer and the consumer never write the
    /// same line.
    @usableFromInline
    enum Word {
        // Line 1: written by producers (under the sequence lock).
        @inlinable static var tail: Int { 0 }
        @inlinable static var dropped: Int { 1 }
        // Line 2: written by the consumer.
        @inlinable static var head: Int { 8 }
        @inlinable static var consumerBusy: Int { 9 }
        // Line 3: written rarely, by whoever parks, wakes, ends or cancels.
        @inlinable static var park: Int { 16 }
        @inlinable static var continuation: Int { 17 }
        @inlinable static var terminalHint: Int { 18 }
        @inlinable static var ended: Int { 19 }
        @inlinable static var cancelRequested: Int { 20 }
        @inlinable static var count: Int { 24 }
    }

    /// `nil` for a subscription that was never registered (subscribed from a
    /// cancelled task or after `finish`).
    @usableFromInline let storage: BroadcastStorage<Element, Failure>?
    /// The lock and every atomic word below, from one allocation.
    @usableFromInline let block = AtomicBlock(wordCount: Word.count)
    @usableFromInline let lock: Lock
    @usableFromInline let parking: Parking
    @usableFromInline let buffer: SubscriberBuffer<Element>
    @usableFromInline var terminal: SubscriberTerminal<Failure>?
    @usableFromInline let terminalHint: AtomicInt
    @usableFromInline let consumerBusy: AtomicInt
    @usableFromInline let ended: AtomicInt
    @usableFromInline let cancelRequested: AtomicInt
    @usableFromInline var registryIndex: Int?
    @usableFromInline var fullIndex: Int?
    /// Set (before the subscriber is published) for a subscriber created
    /// ended, from a cancelled task or after `finish`: it yields its replay
    /// window whatever its task's state, since nothing sent after the
    /// cancellation can reach it anyway.
    @usableFromInline var ignoresTaskCancellation = false

    @inlinable
    init(policy: BroadcastBufferingPolicy, storage: BroadcastStorage<Element, Failure>?) {
        self.storage = storage
        lock = block.lock
        parking = Parking(word: block.word(Word.park), continuationBits: block.word(Word.continuation))
        buffer = SubscriberBuffer(policy: policy, lock: block.lock, dropped: block.word(Word.dropped),
                                  tail: block.word(Word.tail), head: block.word(Word.head))
        terminalHint = block.word(Word.terminalHint)
        consumerBusy = block.word(Word.consumerBusy)
        ended = block.word(Word.ended)
        cancelRequested = block.word(Word.cancelRequested)
    }

    deinit {
        internalInvariant(!parking.isParked, "a subscriber released while its reader is parked")
        buffer.destroy()
        block.destroy()
    }

    // MARK: Producer side (sequence lock held)

    /// A replayed element, whatever the policy. `true` if a `.bounded`
    /// subscriber is now full.
    @inlinable
    func seed(_ element: Element) -> Bool {
        buffer.seed(element)
    }

    /// Hands `element` to this subscriber according to its policy. A parked
    /// reader is woken afterwards, by the send's wake pass.
    @inlinable
    func offer(_ element: Element, effects: inout Effects<Element>) -> OfferOutcome {
        // Registered implies no terminal event; only the task-cancellation
        // tombstone can be set, and then the reader is about to end.
        if parking.isCancelled { return .skipped }
        let outcome = buffer.offer(element, parking: parking, effects: &effects)
        buffer.checkProducerInvariants()
        return outcome
    }

    @inlinable
    func offer(batch: UnsafeBufferPointer<Element>, effects: inout Effects<Element>) -> (Int, Int, Bool) {
        if parking.isCancelled { return (0, 0, false) }
        let outcome = buffer.offer(batch: batch, parking: parking, effects: &effects)
        buffer.checkProducerInvariants()
        return outcome
    }

    /// Records the sequence's terminal event and wakes a parked reader.
    /// Returns `true` if the buffer is empty: the subscriber has ended and
    /// leaves the sequence now.
    @usableFromInline
    func finish(_ event: SubscriberTerminal<Failure>, effects: inout Effects<Element>) -> Bool {
        setTerminal(event)
        let drained = buffer.producerCount() == 0
        sequentiallyConsistentFence()  // pairs with the fence in `Parking.park`
        if let continuation = parking.tryUnpark() { effects.resume(continuation) }
        return drained
    }

    /// `true` if this `.bounded` subscriber holds fewer than its capacity.
    @usableFromInline
    func hasRoom() -> Bool {
        buffer.producerCount() < buffer.limit
    }

    @usableFromInline
    func setTerminal(_ event: SubscriberTerminal<Failure>) {
        lock.lock()
        if terminal == nil {
            terminal = event
            terminalHint.storeRelease(1)
        }
        lock.unlock()
    }

    // MARK: Queries

    @usableFromInline var droppedCount: Int { buffer.dropped.loadAcquire() }
    @usableFromInline var isConsumerParked: Bool { parking.isParked }
    @usableFromInline var isBufferEmpty: Bool { buffer.isEmptyForObserver }

    // MARK: Ending

    /// Ends the subscriber at once: unregisters it, frees its buffer and wakes
    /// a parked reader, which then returns `nil`.
    @inlinable
    func cancel() {
        guard cancelRequested.exchangeAcquiringAndReleasing(1) == 0 else { return }
        storage?.remove(self)  // no producer touches the buffer after this
        var effects = Effects(pool: storage?.pool)
        lock.lock()
        terminal = .ended
        terminalHint.storeRelease(1)
        let discarded = buffer.takeAllLocked()
        lock.unlock()
        _ = consume discarded  // element deinitializers run here, unlocked
        ended.storeRelease(1)
        // Free a lock-free buffer too, unless a consumer holds the slot (it
        // drops everything itself when it sees `ended`).
        if buffer.isLockFree, consumerBusy.compareExchange(expected: 0, desired: 2).exchanged {
            buffer.removeAllConsumerSide()
            consumerBusy.storeRelease(0)
        }
        sequentiallyConsistentFence()  // pairs with the fence in `Parking.park`
        if let continuation = parking.tryUnpark() { effects.resume(continuation) }
        effects.run()
    }

    /// The consumer, holding its slot, ends the subscriber as `cancel()`
    /// does (task cancellation noticed). Always `nil`.
    @inlinable
    func endByConsumer() -> Element? {
        cancel()
        buffer.removeAllConsumerSide()
        return nil
    }

    // MARK: Consumer side

    /// Takes the consumer slot for one `next()` or `poll()`. `false` if
    /// `cancel()` is freeing the buffer right now (the subscriber has ended).
    @inlinable
    func claimConsumer() -> Bool {
        let (claimed, original) = consumerBusy.compareExchange(expected: 0, desired: 1)
        if claimed { return true }
        if original == 2 { return false }
        misuse("concurrent next() calls on one Subscription; a subscription has exactly one consumer")
    }

    @inlinable
    func releaseConsumer() {
        consumerBusy.storeRelease(0)
    }

    /// One non-suspending step (`poll()` SPI): claims the slot around `pollClaimed()`.
    @inlinable
    func poll() -> PollOutcome<Element, Failure> {
        guard claimConsumer() else { return .end }
        defer { releaseConsumer() }
        return pollClaimed()
    }

    /// An element, the end, or `.empty`. The consumer slot is held.
    @inlinable
    func pollClaimed() -> PollOutcome<Element, Failure> {
        if ended.loadAcquire() != 0 {
            buffer.removeAllConsumerSide()
            return .end
        }
        if let element = pop() { return .element(element) }
        guard terminalHint.loadAcquire() != 0 else { return .empty }
        // Everything sent before the terminal event is visible now.
        if let element = pop() { return .element(element) }
        return takeTerminal()
    }

    @inlinable
    func pop() -> Element? {
        guard let element = buffer.pop() else { return nil }
        // A `.bounded` read may release waiting emitters. The emitter stores
        // its flag, then reads our count; we publish our count (sequentially
        // consistent), then read its flag: one of the two sees the other.
        if buffer.isBounded { storage?.boundedSubscriberMayHaveRoom(self) }
        // Finished and now drained: the subscriber has ended; it leaves the
        // sequence now, not when its terminal event is taken.
        if terminalHint.loadAcquire() != 0 && !buffer.hasElementsForConsumer { storage?.remove(self) }
        return element
    }

    /// Delivers the terminal event once (`.empty` if there is none yet).
    @inlinable
    func takeTerminal() -> PollOutcome<Element, Failure> {
        lock.lock()
        guard let event = terminal else {
            lock.unlock()
            return .empty
        }
        terminal = .ended
        lock.unlock()
        switch event {
        case .ended:
            return .end
        case .finished:
            storage?.remove(self)
            return .end
        case .failed(let error):
            storage?.remove(self)
            return .failure(error)
        }
    }

    /// `next()`: claims the consumer slot for the whole call, then tries
    /// synchronously, so a consumer with something buffered never enters
    /// another async function, creates no continuation and never suspends.
    ///
    /// Reading the task's cancellation flag is an expensive 16-byte atomic
    /// load, so the iterator asks for it only on its first call and then
    /// every 32 calls; a parked reader notices cancellation at once (through
    /// the cancellation handler).
    @inlinable
    func next(isolation actor: isolated (any Actor)?, checkCancellation: Bool) async throws(Failure) -> Element? {
        guard claimConsumer() else { return nil }
        if checkCancellation && !ignoresTaskCancellation && Task.isCancelled {
            defer { releaseConsumer() }
            return endByConsumer()
        }
        // The fast path is synchronous: no suspension, so nothing async
        // (not even a `defer` spanning an `await`) is set up for it.
        switch pollClaimed() {
        case .element(let element):
            releaseConsumer()
            return element
        case .end:
            releaseConsumer()
            return nil
        case .failure(let error):
            releaseConsumer()
            throw error
        case .empty:
            return try await waitForNext(isolation: actor)
        }
    }

    /// The slow path: park until an element, the end, or cancellation.
    /// Releases the consumer slot that `next()` claimed.
    ///
    /// It parks at once, with no `Task.yield()` (or spin) first. A yield
    /// allocates a runtime job for every catch-up, and, being nonisolated,
    /// takes an actor-isolated reader off its actor and back (two executor
    /// hops for a `@MainActor` loop). A spin holds a cooperative thread that
    /// other readers need, and contends for the producer's cache line.
    /// `park` looks for work once more after announcing itself, so an element
    /// sent meanwhile is never slept through.
    ///
    /// Known gap: in Swift 6.3 the operation closure of
    /// `withTaskCancellationHandler` is nonisolated whatever its `isolation:`
    /// (swiftlang/swift#85518 makes it `nonisolated(nonsending)`), so an
    /// actor-isolated reader may still switch executors around its
    /// suspension; it costs its actor one enqueue per wake-up, no more.
    @inlinable
    func waitForNext(isolation actor: isolated (any Actor)?) async throws(Failure) -> Element? {
        defer { releaseConsumer() }
        while true {
            await withTaskCancellationHandler {
                await withUnsafeContinuation(isolation: actor) { (continuation: UnsafeContinuation<Void, Never>) in
                    self.parking.park(continuation, parkedCount: self.storage?.parkedConsumers) {
                        self.buffer.hasElementsForConsumer || self.terminalHint.loadAcquire() != 0
                    }
                }
            } onCancel: {
                self.parking.cancelHandler()
            }
            parking.unparked(parkedCount: storage?.parkedConsumers)
            if parking.isCancelled { return endByConsumer() }
            switch pollClaimed() {
            case .element(let element): return element
            case .end: return nil
            case .failure(let error): throw error
            case .empty: continue
            }
        }
    }
}
