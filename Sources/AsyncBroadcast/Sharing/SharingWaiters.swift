/// Tasks waiting for a shared sequence's upstream to reach a state
/// (`Subscription.upstreamReady()`, `upstreamStopped()`), guarded by the
/// sequence lock.
///
/// The promise's `WaiterTable`, with rounds: whatever may change what they
/// wait for wakes the whole table (`takeAll()`) and starts a new round, and
/// each waiter rechecks its own condition under the lock, waiting again in
/// the new round if it still holds. A waiter's ticket names its round, so a
/// stale ticket (the table it reserved in was taken) never touches the
/// current table: its continuation is resumed by whoever took that table,
/// or at once if it had not stored it yet (the tombstone case, as in
/// `BroadcastPromise`).
@usableFromInline
struct SharingWaiters {
    @usableFromInline
    struct Ticket: Sendable {
        @usableFromInline let slot: Int
        @usableFromInline let round: UInt64
        @inlinable init(slot: Int, round: UInt64) {
            self.slot = slot
            self.round = round
        }
    }

    @usableFromInline var table = WaiterTable()
    @usableFromInline var round: UInt64 = 0

    @inlinable init() {}

    @inlinable var isEmpty: Bool { table.occupied == 0 }

    @inlinable
    mutating func reserve() -> Ticket {
        Ticket(slot: table.reserve(), round: round)
    }

    /// `false`: the ticket's round is over or it was cancelled; the caller
    /// resumes the continuation at once (unlocked).
    @inlinable
    mutating func store(_ continuation: UnsafeContinuation<Void, Never>, _ ticket: Ticket) -> Bool {
        ticket.round == round && table.store(continuation, at: ticket.slot)
    }

    /// The cancellation handler's part: the continuation to resume
    /// (unlocked), if the waiter is suspended in the current round.
    @inlinable
    mutating func cancel(_ ticket: Ticket) -> UnsafeContinuation<Void, Never>? {
        ticket.round == round ? table.cancel(at: ticket.slot) : nil
    }

    /// The waiter is running again: frees its slot if it is still in the
    /// current round (then it was resumed by its cancellation).
    @inlinable
    mutating func leave(_ ticket: Ticket) {
        guard ticket.round == round else { return }
        if !table.collectCancelled(at: ticket.slot) {
            internalInconsistency("a sharing waiter resumed in its round without being cancelled")
        }
    }

    /// Every waiter, to resume once the lock is released; a new round.
    @inlinable
    mutating func takeAll() -> WaiterTable {
        round &+= 1
        return table.takeAll()
    }

    /// `takeAll()` into `effects` (resumed after the section), if anyone waits.
    @inlinable
    mutating func wakeAll<Element>(into effects: inout Effects<Element>) {
        guard !isEmpty else { return }
        for slot in takeAll().slots {
            if case .waiting(let continuation) = slot { effects.resume(continuation) }
        }
    }

    @inlinable
    func _checkInvariants() {
        table._checkInvariants()
    }
}

/// Which of the sharing state's waiter tables.
@usableFromInline
enum SharingWait: Sendable {
    case ready
    case stopped
}

extension BroadcastStorage {
    /// Waits until `check` (run under the sequence lock) returns a value;
    /// `nil` if the task is cancelled first. `check` must return a value
    /// for a plain sequence (no sharing state).
    @inlinable
    func waitForSharing<R>(_ which: SharingWait, _ check: (inout BroadcastState<Element, Failure>) -> R?) async -> R? {
        while true {
            lock.lock()
            if let outcome = check(&state) {
                lock.unlock()
                return outcome
            }
            if Task.isCancelled || state.sharing == nil {
                lock.unlock()
                return nil
            }
            let ticket = state.sharing!.withWaiters(which) { $0.reserve() }
            lock.unlock()
            await withTaskCancellationHandler {
                await withUnsafeContinuation { (continuation: UnsafeContinuation<Void, Never>) in
                    // The lock is taken inside the closure, never across it.
                    let stored = lock.withLock { state.sharing!.withWaiters(which) { $0.store(continuation, ticket) } }
                    if !stored { Parking.resume(continuation) }
                }
            } onCancel: {
                let continuation = lock.withLock { state.sharing!.withWaiters(which) { $0.cancel(ticket) } }
                if let continuation { Parking.resume(continuation) }
            }
            lock.withLock { state.sharing!.withWaiters(which) { $0.leave(ticket) } }
        }
    }
}

extension SharingState {
    @inlinable
    func withWaiters<R>(_ which: SharingWait, _ body: (inout SharingWaiters) -> R) -> R {
        switch which {
        case .ready: return body(&readinessWaiters)
        case .stopped: return body(&stoppedWaiters)
        }
    }
}
