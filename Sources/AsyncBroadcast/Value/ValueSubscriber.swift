/// One subscriber of a `BroadcastValue`: the version it last returned, its
/// parked reader, and its consumer slot.
///
/// A value subscriber has no buffer: its pending value is the shared one,
/// read under the value's lock when `seen` is behind `version`.
///
/// ## Guards
/// - The value's lock (`ValueStorage.lock`): `seen`, `registryIndex`,
///   `parkedIndex`, `ended`, `faultToggle`.
/// - Atomics in `block`: the consumer slot, the park word and continuation
///   (`Parking`), and `cancelRequested`.
/// - `snapshot` belongs to the consumer (slot held) of a subscriber created
///   ended; it is set before the subscriber is published.
@usableFromInline
final class ValueSubscriber<Value: Sendable, Failure: Error>: @unchecked Sendable {
    @usableFromInline
    enum Word {
        @inlinable static var consumerBusy: Int { 0 }
        @inlinable static var park: Int { 8 }
        @inlinable static var continuation: Int { 9 }
        @inlinable static var cancelRequested: Int { 10 }
        @inlinable static var count: Int { 16 }
    }

    /// `nil` for a subscription created ended (from a cancelled task or
    /// after `finish`): it yields `snapshot`, then `snapshotTerminal`.
    @usableFromInline let storage: ValueStorage<Value, Failure>?
    @usableFromInline let block = AtomicBlock(wordCount: Word.count)
    @usableFromInline let parking: Parking
    @usableFromInline let consumerBusy: AtomicInt
    @usableFromInline let cancelRequested: AtomicInt

    @usableFromInline var seen = 0
    @usableFromInline var registryIndex: Int?
    @usableFromInline var parkedIndex: Int?
    @usableFromInline var ended = false
    @usableFromInline var faultToggle = false

    @usableFromInline var snapshot: Value?
    @usableFromInline var snapshotTerminal: ValueTerminal<Failure>?

    @inlinable
    init(storage: ValueStorage<Value, Failure>?) {
        self.storage = storage
        parking = Parking(word: block.word(Word.park), continuationBits: block.word(Word.continuation))
        consumerBusy = block.word(Word.consumerBusy)
        cancelRequested = block.word(Word.cancelRequested)
    }

    deinit {
        internalInvariant(!parking.isParked, "a value subscriber released while its reader is parked")
        block.destroy()
    }

    // MARK: Ending

    /// Ends the subscriber: it leaves the value now, and a parked reader
    /// returns `nil`. Idempotent and lock-free after the first call.
    @inlinable
    func cancel() {
        guard cancelRequested.exchangeAcquiringAndReleasing(1) == 0 else { return }
        guard let storage else {
            // Never registered: only the parked reader (if any) needs waking.
            if let continuation = parking.tryUnpark() { Parking.resume(continuation) }
            return
        }
        storage.end(self)
    }

    // MARK: Consumer side

    @inlinable
    func claimConsumer() {
        guard consumerBusy.compareExchange(expected: 0, desired: 1).exchanged else {
            misuse("concurrent next() calls on one Subscription; a subscription has exactly one consumer")
        }
    }

    @inlinable
    func releaseConsumer() {
        consumerBusy.storeRelease(0)
    }

    /// One step, holding the consumer slot. With `preparingToPark`, an
    /// `.empty` result leaves the reader on the parked list.
    @inlinable
    func take(preparingToPark: Bool = true) -> PollOutcome<Value, Failure> {
        guard let storage else { return takeSnapshot() }
        return storage.take(for: self, preparingToPark: preparingToPark)
    }

    /// A non-suspending step (the `poll()` SPI).
    @usableFromInline
    func poll() -> PollOutcome<Value, Failure> {
        claimConsumer()
        defer { releaseConsumer() }
        return take(preparingToPark: false)
    }

    @inlinable
    func takeSnapshot() -> PollOutcome<Value, Failure> {
        if cancelRequested.loadAcquire() != 0 { return .end }
        if let value = snapshot.take() { return .element(value) }
        guard let terminal = snapshotTerminal.take() else { return .end }
        switch terminal {
        case .finished: return .end
        case .failed(let error): return .failure(error)
        }
    }

    /// `next()`: one locked step, and a park only when nothing is new.
    @inlinable
    func next(isolation actor: isolated (any Actor)?, checkCancellation: Bool) async throws(Failure) -> Value? {
        claimConsumer()
        if checkCancellation && storage != nil && Task.isCancelled {
            cancel()
            releaseConsumer()
            return nil
        }
        switch take() {
        case .element(let value):
            releaseConsumer()
            return value
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

    /// Nothing new: park until a change, the end, or cancellation. The
    /// reader is already on the parked list. Releases the consumer slot.
    @inlinable
    func waitForNext(isolation actor: isolated (any Actor)?) async throws(Failure) -> Value? {
        defer { releaseConsumer() }
        while true {
            await withTaskCancellationHandler {
                await withUnsafeContinuation(isolation: actor) { (continuation: UnsafeContinuation<Void, Never>) in
                    self.parking.park(continuation, parkedCount: nil) { self.storage?.hasWork(for: self) ?? true }
                }
            } onCancel: {
                self.parking.cancelHandler()
            }
            if parking.isCancelled {
                cancel()
                return nil
            }
            switch take() {
            case .element(let value): return value
            case .end: return nil
            case .failure(let error): throw error
            case .empty: continue
            }
        }
    }
}
