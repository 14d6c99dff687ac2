public import _CAtomics  // `cab_prefetch_for_write` (inlinable)

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
    /// Where each word lives in `block`: eight words per cache line, one
    /// line per writer where it can be, so that while the consumer keeps up
    /// without parking the producer and the consumer never write the same
    /// line. A lock-free buffer's `SPSCRing` keeps its state in the
    /// `SPSCRing.wordsPerSide` words from `tail` and from `head`.
    ///
    /// The park word and the continuation share the producer's line: every
    /// delivery reads the park word (the tombstone in `offer`, then the wake
    /// pass), and a parking reader reads `tail` there anyway (`park`'s last
    /// look for work), so a sparse send, where every delivery wakes its
    /// reader, touches one line of the block fewer (measured with the
    /// `sparse: fan-out` cell of fanout-compare). A reader that keeps up
    /// never touches them.
    @usableFromInline
    enum Word {
        // Line 1: written by producers (under the sequence lock), and by a
        // reader as it parks.
        @inlinable static var tail: Int { 0 }  // ..< 4: the ring's producer words
        @inlinable static var dropped: Int { 4 }
        @inlinable static var lagMarkers: Int { 5 }  // a `LagMarkers` pointer, set at the first drop; must follow `dropped`
        @inlinable static var park: Int { 6 }
        @inlinable static var continuation: Int { 7 }
        // Line 2: written by the consumer.
        @inlinable static var head: Int { 8 }  // ..< 12: the ring's consumer words
        @inlinable static var consumerBusy: Int { 12 }
        @inlinable static var lagReported: Int { 13 }  // drops the events reader has reported
        @inlinable static var lagCheckedDropped: Int { 14 }  // `dropped` at the events reader's last look at the markers
        @inlinable static var lagNextPosition: Int { 15 }  // the first marker's position then (`Int.max`: none)
        // Line 3: written rarely, by whoever ends or cancels.
        @inlinable static var terminalHint: Int { 16 }
        @inlinable static var ended: Int { 17 }
        @inlinable static var cancelRequested: Int { 18 }
        @inlinable static var evicted: Int { 19 }
        @inlinable static var count: Int { 24 }
    }

    @usableFromInline
    enum TerminalKind {
        @inlinable static var finished: Int { 1 }
        @inlinable static var failed: Int { 2 }
        @inlinable static var ended: Int { 3 }
    }

    /// The subscriber's sequence (`BroadcastStorage.subscribe` always sets
    /// it, also for a subscriber created ended). Holding it keeps the
    /// sequence's terminal event alive too, so replacing `terminal` under
    /// `lock` (as `cancel()` does) never releases a failure for the last
    /// time: no error's `deinit` runs under the lock.
    @usableFromInline let storage: BroadcastStorage<Element, Failure>?
    /// The lock, every atomic word below and a lock-free buffer's first
    /// segment, from one allocation.
    @usableFromInline let block: AtomicBlock
    @usableFromInline let lock: Lock
    @usableFromInline let parking: Parking
    @usableFromInline let buffer: SubscriberBuffer<Element>
    /// Its eviction limits, `nil` for none: next to `buffer`, which every
    /// send reads, so the check costs a subscriber without limits nothing
    /// but this load.
    @usableFromInline let eviction: SubscriberEviction?
    /// Which terminal event is recorded (guarded by `lock`): 0 none, else a
    /// `TerminalKind`. With `failure`, it stands for a stored
    /// `SubscriberTerminal<Failure>?`, which the unspecialized `deinit`
    /// would destroy through two generic-metadata lookups on every release.
    @exclusivity(unchecked) @usableFromInline var terminalKind = 0
    /// In the block's extra bytes, after the ring's first segment;
    /// initialized exactly while `terminalKind == TerminalKind.failed`.
    @usableFromInline let failure: UnsafeMutablePointer<Failure>
    @usableFromInline let terminalHint: AtomicInt
    @usableFromInline let consumerBusy: AtomicInt
    @usableFromInline let ended: AtomicInt
    @usableFromInline let cancelRequested: AtomicInt
    // The next three skip the runtime exclusivity check (a `swift_beginAccess`
    // call on every access, and `registryIndex`/`fullIndex` are touched for
    // each subscriber on every send). Their guards already exclude
    // overlapping accesses: the first two are touched only under the sequence
    // lock, and `ignoresTaskCancellation` is written once before the
    // subscriber is published. No access spans a call into user code, so
    // there is no same-thread overlap for the check to find either.
    @exclusivity(unchecked) @usableFromInline var registryIndex: Int?
    @exclusivity(unchecked) @usableFromInline var fullIndex: Int?
    /// Set (before the subscriber is published) for a subscriber created
    /// ended, from a cancelled task or after `finish`: it yields its replay
    /// window whatever its task's state, since nothing sent after the
    /// cancellation can reach it anyway.
    @exclusivity(unchecked) @usableFromInline var ignoresTaskCancellation = false

    @inlinable
    init(
        policy: BroadcastBufferingPolicy, storage: BroadcastStorage<Element, Failure>?,
        eviction: SubscriberEviction? = nil
    ) {
        self.storage = storage
        self.eviction = eviction
        let ringCapacity = SubscriberBuffer<Element>.lockFreeCapacity(for: policy)
        let layout = Self.extraLayout(ringCapacity: ringCapacity)
        let block = AtomicBlock(wordCount: Word.count, extraBytes: layout.bytes, extraAlignment: layout.alignment)
        self.block = block
        let extra = block.extra(wordCount: Word.count, extraAlignment: layout.alignment)
        failure = (extra + layout.failureOffset).bindMemory(to: Failure.self, capacity: 1)
        lock = block.lock
        parking = Parking(word: block.word(Word.park), continuationBits: block.word(Word.continuation))
        let ring = ringCapacity.map {
            SPSCRing<Element>(
                producerWords: block.word(Word.tail), consumerWords: block.word(Word.head),
                firstSegment: extra, capacity: $0)
        }
        buffer = SubscriberBuffer(policy: policy, lock: block.lock, dropped: block.word(Word.dropped), ring: ring)
        terminalHint = block.word(Word.terminalHint)
        consumerBusy = block.word(Word.consumerBusy)
        ended = block.word(Word.ended)
        cancelRequested = block.word(Word.cancelRequested)
    }

    /// The block's extra bytes: a lock-free buffer's first segment, then
    /// room for a `Failure`.
    @inlinable
    static func extraLayout(ringCapacity: Int?) -> (bytes: Int, alignment: Int, failureOffset: Int) {
        let segmentBytes = ringCapacity.map(SPSCSegment<Element>.byteCount(capacity:)) ?? 0
        let failureAlignment = MemoryLayout<Failure>.alignment
        let failureOffset = (segmentBytes + failureAlignment - 1) & ~(failureAlignment - 1)
        return (
            failureOffset + MemoryLayout<Failure>.size,
            Swift.max(SPSCSegment<Element>.alignment, failureAlignment), failureOffset
        )
    }

    deinit {
        internalInvariant(!parking.isParked, "a subscriber released while its reader is parked")
        if terminalKind == TerminalKind.failed { failure.deinitialize(count: 1) }
        buffer.destroy()  // uses the block: its words, its first segment
        block.destroy()
    }

    /// The recorded terminal event (`lock` held).
    @inlinable
    var terminal: SubscriberTerminal<Failure>? {
        get {
            switch terminalKind {
            case 0: return nil
            case TerminalKind.finished: return .finished
            case TerminalKind.failed: return .failed(failure.pointee)
            default: return .ended
            }
        }
        set {
            if terminalKind == TerminalKind.failed { failure.deinitialize(count: 1) }
            switch newValue {
            case nil: terminalKind = 0
            case .finished: terminalKind = TerminalKind.finished
            case .failed(let error):
                failure.initialize(to: error)
                terminalKind = TerminalKind.failed
            case .ended: terminalKind = TerminalKind.ended
            }
        }
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
        if let eviction, let outcome = checkEviction(eviction, adding: 1, effects: &effects) { return outcome }
        let outcome = buffer.offer(element, parking: parking, effects: &effects)
        buffer.checkProducerInvariants()
        return outcome
    }

    /// A send's walk over N subscribers misses the cache on each one (at
    /// 100,000 subscribers it touches over 100 MB), one miss waiting on the
    /// last: the object, then the block's words through the object. The
    /// loop asks for both ahead (`BroadcastState.deliver`): the object's
    /// first two lines for a subscriber it reaches later, and, once that
    /// object is in, the lines `offer` writes and the wake pass reads.
    @inlinable @inline(__always)
    static func prefetchObject(_ subscriber: Unmanaged<SubscriberCore<Element, Failure>>) {
        let object = UnsafeRawPointer(subscriber.toOpaque())
        cab_prefetch_for_write(object)
        cab_prefetch_for_write(object + 64)
    }

    /// The producer's line of the block (`Word.tail`, with the park word).
    @inlinable @inline(__always)
    func prefetchProducerLines() {
        cab_prefetch_for_write(UnsafeRawPointer(block.word(Word.tail).raw))
    }

    @inlinable
    func offer(batch: UnsafeBufferPointer<Element>, effects: inout Effects<Element>) -> (Int, Int, Bool, evicted: Bool) {
        if parking.isCancelled { return (0, 0, false, false) }
        // The batch that would take it over its limit is not delivered to it.
        if let eviction, let outcome = checkEviction(eviction, adding: batch.count, effects: &effects) {
            return (0, 0, false, outcome == .evicted)
        }
        let (delivered, dropped, full) = buffer.offer(batch: batch, parking: parking, effects: &effects)
        buffer.checkProducerInvariants()
        return (delivered, dropped, full, false)
    }

    /// The second half of `finish`, after `setTerminal` and the sequence's
    /// one fence (`BroadcastState.finish`): wakes a parked reader.
    /// Returns `true` if the buffer is empty: the subscriber has ended and
    /// leaves the sequence now.
    ///
    /// Store-buffering with two readers of `terminalHint`: the consumer that
    /// takes its last element (`leaveIfFinishedAndDrained`, row 2 of
    /// Handshakes.md) and a reader about to park (`Parking.park`, row 3).
    /// Each stores its word and then loads `terminalHint`; `finish` stored
    /// `terminalHint` (under the subscriber lock, only a release) and now
    /// loads theirs, after the fence that pairs with the consumer's and the
    /// reader's.
    @usableFromInline
    func finishAfterFence(effects: inout Effects<Element>) -> Bool {
        let drained = buffer.producerCount() == 0
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
        if terminalKind == 0 {
            terminal = event
            terminalHint.storeRelease(1)
        }
        lock.unlock()
    }

    // MARK: Queries

    @usableFromInline var droppedCount: Int { buffer.dropped.loadAcquire() }
    /// Unread elements, from any thread; 0 once ended (the elements a
    /// cancelled lock-free buffer keeps until its reader frees them are
    /// never read) or once the task-cancellation tombstone is set.
    @usableFromInline var bufferedCount: Int {
        if ended.loadAcquire() != 0 || parking.isCancelled { return 0 }
        lock.lock()
        let isDone = terminalKind == TerminalKind.ended
        lock.unlock()
        return isDone ? 0 : observedCount()
    }
    /// The buffer's count, a snapshot; under the sequence lock if producers
    /// push too fast for a lock-free one (after `lockFreeAttempts` tries),
    /// counted by the lock's holder if it is taken (`SequenceGate`).
    @inlinable func observedCount(lockFreeAttempts: Int = 4) -> Int {
        buffer.countForObserver(attempts: lockFreeAttempts) { count in
            guard let storage else { return count() }
            return storage.lock.withLock { count() }
        }
    }
    @usableFromInline var isConsumerParked: Bool { parking.isParked }
    @usableFromInline var isBufferEmpty: Bool { observedCount() == 0 }

    // MARK: Ending

    /// Ends the subscriber at once: unregisters it, frees its buffer and wakes
    /// a parked reader, which then returns `nil`.
    @inlinable
    func cancel() {
        guard cancelRequested.exchangeAcquiringAndReleasing(1) == 0 else { return }
        end()
    }

    /// The ending, for the first `cancel()` or an eviction (which marked
    /// `cancelRequested` itself).
    @inlinable
    func end() {
        storage?.remove(self)  // no producer touches the buffer after this
        lock.lock()
        terminal = .ended
        terminalHint.storeRelease(1)
        if buffer.isLockFree {
            lock.unlock()
        } else {
            let discarded = buffer.takeAllLocked()
            lock.unlock()
            _ = consume discarded  // element deinitializers run here, unlocked
        }
        ended.storeRelease(1)
        // Free a lock-free buffer too, unless a consumer holds the slot (it
        // drops everything itself when it sees `ended`).
        if buffer.isLockFree, consumerBusy.compareExchange(expected: 0, desired: 2).exchanged {
            buffer.removeAllConsumerSide()
            consumerBusy.storeRelease(0)
        }
        // Row 4 of Handshakes.md: we stored `terminalHint` and `ended`, the
        // parking reader stored the park word; each then loads the other's.
        if !Fault.cancelSkipsFence { sequentiallyConsistentFence() }
        // No lock is held here: resume directly (no `Effects` to set up).
        if let continuation = parking.tryUnpark() { Parking.resume(continuation) }
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
        leaveIfFinishedAndDrained()
        return element
    }

    /// Finished and now drained: the subscriber has ended, and leaves the
    /// sequence now, not when its terminal event is taken (a consumer that
    /// stops after its last element must not stay counted).
    ///
    /// Row 2 of Handshakes.md. A lock-free buffer's consumer publishes its
    /// head and then loads `terminalHint`; `finish` stores `terminalHint` and
    /// then loads the head. Without a fence on both sides each may miss the
    /// other (store buffering), and nobody removes the subscriber. So both
    /// sides issue a full fence (an asymmetric pair, membarrier(2) in
    /// `finish` and a compiler barrier here, was measured and dropped: see
    /// Handshakes.md). The fence here is paid only when
    /// this pop emptied the buffer as far as the consumer can see: otherwise
    /// a later pop takes the last element and looks again. A locked buffer
    /// needs no fence: its pop and `finish`'s count both take the subscriber
    /// lock, which orders them. (The consumer's cached tail decides whether
    /// the buffer may be empty: it never runs ahead of the real tail, so a
    /// pop that has not reached it leaves elements behind for certain, and
    /// reloading `tail` here would pull the producer's cache line on every
    /// catch-up. Measured: asking the pop to report it through an `inout`
    /// made batches 25-40 % slower.)
    @inlinable
    func leaveIfFinishedAndDrained() {
        if case .lockFree(let ring) = buffer.storage {
            guard ring.consumerReachedCachedTail else { return }
            if !Fault.popSkipsFence { sequentiallyConsistentFence() }
        }
        // Once `terminalHint` is set nothing more is pushed: the emptiness
        // check after it is final.
        if terminalHint.loadAcquire() != 0 && !buffer.hasElementsForConsumer { storage?.remove(self) }
    }

    /// Appends up to `limit` elements that are already buffered, without
    /// waiting and without taking the terminal event (the next `next()`
    /// finds it). Returns how many.
    @inlinable
    func takeBuffered(upTo limit: Int, into elements: inout [Element]) -> Int {
        guard limit > 0, claimConsumer() else { return 0 }
        defer { releaseConsumer() }
        var taken = 0
        // The tombstone is looked at once: it shares the producer's line,
        // which a look per element would pull on every pop.
        if parking.isCancelled { return 0 }
        while taken < limit, ended.loadAcquire() == 0, let element = pop() {
            elements.append(element)
            taken += 1
        }
        return taken
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
