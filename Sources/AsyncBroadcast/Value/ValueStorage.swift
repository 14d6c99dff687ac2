/// The shared heart of a `BroadcastValue`: its lock around `ValueState`, and
/// the code that applies the state's effects after unlocking.
///
/// Subscribers keep the storage alive, not the public `BroadcastValue`, so
/// dropping the last reference to the value finishes it even while readers
/// wait. The storage→subscriber references (registry, parked list) form a
/// cycle that is broken when a subscriber leaves.
///
/// User code under the lock: only `update`'s body and `Value.==`, both run
/// through `ReentrantCallGuardedLock.runningUserCode`, so a call back into
/// this value from them traps instead of deadlocking. Replaced values and
/// values that lost a comparison are released after the lock (through
/// `Effects`), so their `deinit` may call back freely.
@usableFromInline
final class ValueStorage<Value: Sendable, Failure: Error>: @unchecked Sendable {
    @usableFromInline var state: ValueState<Value, Failure>
    /// Word 0 (the lock's owner, written around `update` bodies) and word 8
    /// (`finishedHint`, read by every `isFinished`) sit on separate cache
    /// lines, so readers polling `isFinished` do not slow down updates.
    @usableFromInline let block = AtomicBlock(wordCount: 9)
    @usableFromInline let lock: ReentrantCallGuardedLock
    /// 1 once finished: `isFinished` without the lock.
    @usableFromInline let finishedHint: AtomicInt
    @usableFromInline let pool = EffectsPool<Value>()
    /// `==` when `Value` is `Equatable` (found at run time, so that generic
    /// code gets it too), else `nil`: every send is a change.
    @usableFromInline let isEqual: ((Value, Value) -> Bool)?

    @inlinable
    init(value: Value) {
        state = ValueState(value: value)
        lock = ReentrantCallGuardedLock(
            mutex: block.lock, owner: block.word(0),
            misuseMessage: "BroadcastValue called back from inside its own update body or Value.== (both run under its lock; the call would deadlock)")
        finishedHint = block.word(8)
        isEqual = Fault.valueEqualIsChange ? nil : EqualityWitness.comparator(for: Value.self)
    }

    deinit {
        pool.destroy()
        block.destroy()
    }

    /// Every transition: `body` runs under the lock and records effects;
    /// then the invariants are checked, the lock released and the effects
    /// run (resumes, released values), in that order.
    @inlinable
    func withState<R>(_ body: (inout ValueState<Value, Failure>, inout Effects<Value>) -> R) -> R {
        var effects = Effects(pool: pool)
        lock.lock()
        let result = body(&state, &effects)
        state._checkInvariants()
        lock.unlock()
        effects.run()
        return result
    }

    // MARK: Producing

    @inlinable
    func send(_ newValue: Value) {
        // Returned out of the critical section, so that the value this send
        // replaces (or `newValue`, if it changes nothing) is released after
        // the lock, without recording it in `Effects`.
        let released: Value? = withState { state, effects in
            guard state.terminal == nil else { return nil }
            if let isEqual, lock.runningUserCode({ isEqual(state.value, newValue) }) { return nil }
            var replaced = newValue
            swap(&state.value, &replaced)
            state.changed(effects: &effects)
            return replaced
        }
        _ = consume released
    }

    @inlinable
    func update<R, E: Error>(_ body: (inout Value) throws(E) -> R) throws(E) -> R {
        // `previous` is kept until after the lock: compared below, and
        // released unlocked if the body replaced it.
        let (result, previous): (Result<R, E>, Value) = withState { state, effects in
            let previous = state.value
            guard state.terminal == nil else {
                // Final: the body runs on a copy that is then discarded.
                var copy = previous
                let outcome = lock.runningUserCode { () -> Result<R, E> in
                    do throws(E) { return .success(try body(&copy)) } catch { return .failure(error) }
                }
                effects.release(copy)
                return (outcome, previous)
            }
            let outcome = lock.runningUserCode { () -> Result<R, E> in
                do throws(E) { return .success(try body(&state.value)) } catch { return .failure(error) }
            }
            if let isEqual, lock.runningUserCode({ isEqual(previous, state.value) }) { return (outcome, previous) }
            state.changed(effects: &effects)
            return (outcome, previous)
        }
        _ = consume previous
        return try result.get()
    }

    @usableFromInline
    func finish(_ event: ValueTerminal<Failure>) {
        withState { state, effects in
            if state.finish(event, effects: &effects) { finishedHint.storeRelease(1) }
        }
    }

    // MARK: Consuming

    @inlinable
    func subscribe() -> ValueSubscriber<Value, Failure> {
        let cancelled = Task.isCancelled
        // A value known to be finished (final, so the hint cannot go back)
        // gets an ended subscriber straight away, not a registered one that
        // is then replaced.
        let endedAlready = cancelled || finishedHint.loadAcquire() != 0
        let subscriber = ValueSubscriber<Value, Failure>(storage: endedAlready ? nil : self)
        let registered: Bool = withState { state, _ in
            if cancelled || state.terminal != nil {
                subscriber.snapshot = state.value
                subscriber.snapshotTerminal = state.terminal ?? .finished
                return false
            }
            state.register(subscriber)
            return true
        }
        if registered || subscriber.storage == nil { return subscriber }
        // Finished between the hint and the lock (rare): created ended, it
        // reads only its snapshot.
        let ended = ValueSubscriber<Value, Failure>(storage: nil)
        ended.snapshot = subscriber.snapshot
        ended.snapshotTerminal = subscriber.snapshotTerminal
        return ended
    }

    @inlinable
    func take(for subscriber: ValueSubscriber<Value, Failure>, preparingToPark: Bool = true) -> PollOutcome<Value, Failure> {
        withState { state, _ in state.take(for: subscriber, preparingToPark: preparingToPark) }
    }

    @usableFromInline
    func hasWork(for subscriber: ValueSubscriber<Value, Failure>) -> Bool {
        lock.lock()
        defer { lock.unlock() }
        return state.hasWork(for: subscriber)
    }

    @usableFromInline
    func end(_ subscriber: ValueSubscriber<Value, Failure>) {
        withState { state, effects in state.end(subscriber, effects: &effects) }
    }

    // MARK: Queries

    @inlinable
    var value: Value {
        lock.lock()
        defer { lock.unlock() }
        return state.value
    }

    @usableFromInline
    var subscriberCount: Int {
        lock.lock()
        defer { lock.unlock() }
        return state.subscribers.count
    }

    @usableFromInline
    var isFinished: Bool {
        lock.trapIfHeldByThisThread()
        return finishedHint.loadAcquire() != 0
    }
}
