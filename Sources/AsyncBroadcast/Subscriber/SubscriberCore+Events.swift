/// Result of a non-suspending look at a subscriber read as events.
@usableFromInline
enum EventPollOutcome<Element: Sendable, Failure: Error> {
    case event(BroadcastEvent<Element>)
    case empty
    case end
    case failure(Failure)
}

/// The events reader (`Subscription.events`): the consumer side of the
/// subscriber, with `.lagged(n)` put where the drops happened (see
/// `LagMarkers`). It holds the same consumer slot as `next()`; the plain
/// path (`pollClaimed`) is untouched and never looks at lag.
extension SubscriberCore {
    /// Drops the events reader has reported (consumer slot only; a word on
    /// the consumer's line, so that a second `Events` iterator, or plain
    /// reads in between, carry on from it).
    @inlinable var lagReported: AtomicInt { block.word(Word.lagReported) }
    /// The events reader's note of its last look at the markers (consumer
    /// slot only): while `dropped` still reads the same and it has not
    /// reached `lagNextPosition`, nothing is due and it skips the lock.
    @inlinable var lagCheckedDropped: AtomicInt { block.word(Word.lagCheckedDropped) }
    @inlinable var lagNextPosition: AtomicInt { block.word(Word.lagNextPosition) }

    /// An event, the end, or `.empty`. The consumer slot is held.
    ///
    /// - Parameter takeTerminal: `false` for the rest of a batch, which
    ///   leaves the terminal event to the next call.
    @inlinable
    func pollEventClaimed(takeTerminal: Bool = true) -> EventPollOutcome<Element, Failure> {
        if ended.loadAcquire() != 0 {
            buffer.removeAllConsumerSide()
            if let due = takeFinalLag() { return .event(.lagged(due)) }
            return .end
        }
        // First: once it is set, everything sent before the end is visible.
        let terminalSeen = terminalHint.loadAcquire() != 0
        switch buffer.storage {
        case .lockFree(let ring):
            // Loads `tail` (acquire) unless the cached one already shows an
            // element: then every gap before that element is visible too.
            let available = ring.consumerHasElement
            let dropped = buffer.dropped.loadAcquire()
            let reported = lagReported.loadRelaxed()
            // Drained at the end: every gap left is due (a marker past the
            // tail can only come from the off-by-one fault).
            let position = available || !terminalSeen ? ring.consumerHead : .max
            // The lock only if a marker may be due: one was recorded since
            // the last look (each comes with its increment, in one section
            // of the subscriber lock), or the reader reached the first one.
            if dropped != reported,
                dropped != lagCheckedDropped.loadRelaxed() || position >= lagNextPosition.loadRelaxed()
            {
                let due = takeDueLag(upTo: position, reported: reported)
                if due > 0 { return .event(.lagged(due)) }
            }
            if available, let element = pop() { return .event(.element(element)) }
        case .locked(let locked):
            lock.lock()
            let outcome: BroadcastEvent<Element>? = locked._withUnsafeGuaranteedRef { locked in
                // Drops are counted under this lock: `dropped` is exact here.
                let dropped = buffer.dropped.loadRelaxed()
                let reported = lagReported.loadRelaxed()
                if dropped != reported {
                    var due = dropped - reported
                    if buffer.limit == 0 || buffer.dropsNewest, !locked.ring.isEmpty {
                        // Capacity 0: only the gaps before the element next.
                        due = LagMarkers.existing(in: buffer.lagMarkers)?.takeDue(upTo: 0) ?? 0
                    } else {
                        LagMarkers.existing(in: buffer.lagMarkers)?.removeAll()
                    }
                    if due > 0 {
                        lagReported.storeRelaxed(reported + due)
                        return .lagged(due)
                    }
                }
                guard let element = locked.ring.popFirst() else { return nil }
                if buffer.limit == 0 || buffer.dropsNewest { LagMarkers.existing(in: buffer.lagMarkers)?.elementPopped() }
                return .element(element)
            }
            lock.unlock()
            if let outcome {
                if case .element = outcome { leaveIfFinishedAndDrained() }
                return .event(outcome)
            }
        }
        guard terminalSeen else { return .empty }
        // Nothing more can be pushed: a pop that found nothing found the end.
        if case .lockFree = buffer.storage, let element = pop() { return .event(.element(element)) }
        guard takeTerminal else { return .empty }
        switch self.takeTerminal() {
        case .end: return .end
        case .failure(let error): return .failure(error)
        case .element, .empty: return .empty
        }
    }

    /// Takes the lock-free form's markers due at `position` (all of them
    /// for `.max`) and records them as reported.
    @inlinable
    func takeDueLag(upTo position: Int, reported: Int) -> Int {
        lock.lock()
        let due: Int
        if position == .max {
            // Read under the lock the producer counts under: exact.
            due = buffer.dropped.loadRelaxed() - reported
            LagMarkers.existing(in: buffer.lagMarkers)?.removeAll()
        } else {
            due = LagMarkers.existing(in: buffer.lagMarkers)?.takeDue(upTo: position) ?? 0
        }
        lagCheckedDropped.storeRelaxed(buffer.dropped.loadRelaxed())
        lagNextPosition.storeRelaxed(LagMarkers.existing(in: buffer.lagMarkers)?.markers.first?.position ?? .max)
        lock.unlock()
        if due > 0 { lagReported.storeRelaxed(reported + due) }
        return due
    }

    /// The gap still unreported when the subscriber has ended (evicted,
    /// cancelled, its task cancelled), taken as reported: the end comes
    /// after it, so that the `.lagged` counts add up to `droppedCount`.
    /// `nil` if there is none. Exact: once `ended` is set, or it has been
    /// removed, no producer counts a drop for it (an eviction marks it
    /// skipped first, `end()` unregisters it first), and the acquire load
    /// sees every drop counted before.
    @inlinable
    func takeFinalLag() -> Int? {
        if Fault.endSkipsPendingLag { return nil }
        let reported = lagReported.loadRelaxed()
        let due = buffer.dropped.loadAcquire() - reported
        guard due > 0 else { return nil }
        lagReported.storeRelaxed(reported + due)
        return due
    }

    /// The end of an events reader whose task was cancelled: it ends the
    /// subscriber, then reports the gap still pending, if any, before `nil`
    /// (the next call finds it ended and returns `nil`).
    @inlinable
    func endEventsByConsumer() -> BroadcastEvent<Element>? {
        _ = endByConsumer()
        // A `cancel()` from another thread may have won the request and not
        // unregistered it yet: until then producers still count drops for
        // it. Removing it again is a no-op once it is out.
        storage?.remove(self)
        return takeFinalLag().map { .lagged($0) }
    }

    /// Whether the events reader has a gap left to report (it may be one
    /// still ahead of the reader: the look after waking sorts that out).
    @inlinable
    var hasUnreportedLag: Bool { buffer.dropped.loadAcquire() != lagReported.loadRelaxed() }

    /// `events`' `next()`: claims the consumer slot for the whole call, as
    /// `next(isolation:checkCancellation:)` does.
    @inlinable
    func nextEvent(isolation actor: isolated (any Actor)?, checkCancellation: Bool) async throws(Failure) -> BroadcastEvent<Element>? {
        // The slot is `cancel()`'s (or an eviction's) while it frees the
        // buffer: it has ended; its last gap still comes before the end
        // (`cancel()` does not touch `lagReported`).
        guard claimConsumer() else { return takeFinalLag().map { .lagged($0) } }
        if checkCancellation && !ignoresTaskCancellation && Task.isCancelled {
            defer { releaseConsumer() }
            return endEventsByConsumer()
        }
        switch pollEventClaimed() {
        case .event(let event):
            releaseConsumer()
            return event
        case .end:
            releaseConsumer()
            return nil
        case .failure(let error):
            releaseConsumer()
            throw error
        case .empty:
            return try await waitForEvent(isolation: actor)
        }
    }

    /// `waitForNext(isolation:)` for events: a moved dropped count is work
    /// too (capacity 0 drops while the reader is between looks).
    @inlinable
    func waitForEvent(isolation actor: isolated (any Actor)?) async throws(Failure) -> BroadcastEvent<Element>? {
        defer { releaseConsumer() }
        while true {
            await withTaskCancellationHandler {
                await withUnsafeContinuation(isolation: actor) { (continuation: UnsafeContinuation<Void, Never>) in
                    self.parking.park(continuation, parkedCount: self.storage?.parkedConsumers) {
                        self.buffer.hasElementsForConsumer || self.terminalHint.loadAcquire() != 0
                            || self.hasUnreportedLag
                    }
                }
            } onCancel: {
                self.parking.cancelHandler()
            }
            parking.unparked(parkedCount: storage?.parkedConsumers)
            if parking.isCancelled { return endEventsByConsumer() }
            switch pollEventClaimed() {
            case .event(let event): return event
            case .end: return nil
            case .failure(let error): throw error
            case .empty: continue
            }
        }
    }

    /// Appends up to `limit` events that are ready, without waiting and
    /// without taking the terminal event. Returns how many.
    @inlinable
    func takeBufferedEvents(upTo limit: Int, into events: inout [BroadcastEvent<Element>]) -> Int {
        guard limit > 0, claimConsumer() else { return 0 }
        defer { releaseConsumer() }
        var taken = 0
        // Once, as in `takeBuffered`: the tombstone shares the producer's line.
        if parking.isCancelled { return 0 }
        while taken < limit, case .event(let event) = pollEventClaimed(takeTerminal: false) {
            events.append(event)
            taken += 1
        }
        return taken
    }
}
