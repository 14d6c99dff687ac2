/// One result for many waiters: a latch, a readiness signal.
///
/// The first ``succeed(_:)`` or ``fail(_:)`` wins; later calls return
/// `false` and change nothing. <!-- restates: PROM-FIRST-WINS --> Every waiter, early or late, gets the same
/// result: waiters that come after completion get it at once. <!-- restates: PROM-SAME-RESULT -->
///
/// ```swift
/// let ready = BroadcastPromise<Void, any Error>()
///
/// // Any number of tasks:
/// try await ready.value            // waits until ready (or throws its error)
///
/// // Once:
/// ready.succeed()                  // or: ready.fail(error)
/// ```
///
/// A waiter whose task is cancelled stops waiting at once with
/// `CancellationError` and is forgotten: a promise does not grow with
/// cancelled waiters. <!-- restates: PROM-NO-GROWTH -->
///
/// A task waiting in ``value`` holds a reference to the promise, so a
/// promise cannot go away under its waiters; if nobody is left to complete
/// it, its waiters wait until their tasks are cancelled. <!-- restates: PROM-LIFETIME -->
public final class BroadcastPromise<Value: Sendable, Failure: Error>: @unchecked Sendable {
    // `result_` and `waiters` are guarded by `lock`. `result_` is written
    // once, before `completed` is set (release); a reader that sees
    // `completed` (acquire) may read it without the lock, since it never
    // changes again. Completion takes the waiter table out and resumes the
    // waiters after unlocking; no user code runs under the lock.
    @usableFromInline var result_: Result<Value, Failure>?
    @usableFromInline var waiters = WaiterTable()
    @usableFromInline let block = AtomicBlock(wordCount: 1)
    @usableFromInline let lock: Lock
    @usableFromInline let completed: AtomicInt

    /// Creates a promise that nobody has completed yet.
    ///
    /// ```swift
    /// let token = BroadcastPromise<String, any Error>()
    /// ```
    public init() {
        lock = block.lock
        completed = block.word(0)
    }

    /// Creates a promise of a `Value` that can fail with `Failure`.
    ///
    /// ```swift
    /// let config = BroadcastPromise(of: Config.self, throwing: ConfigError.self)
    /// ```
    public convenience init(of: Value.Type = Value.self, throwing: Failure.Type) {
        self.init()
    }

    deinit {
        block.destroy()
    }

    // MARK: Completing

    /// Completes the promise with `value`, resuming every waiter. Returns
    /// `false` (and changes nothing) if it was already completed.
    /// <!-- restates: PROM-FIRST-WINS -->
    ///
    /// ```swift
    /// config.succeed(loadedConfig)
    /// ```
    @inlinable @discardableResult
    public func succeed(_ value: Value) -> Bool {
        complete(.success(value))
    }

    /// Completes the promise with `error`, which every waiter throws.
    /// Returns `false` (and changes nothing) if it was already completed.
    /// <!-- restates: PROM-FIRST-WINS -->
    ///
    /// ```swift
    /// config.fail(.missing)
    /// ```
    @inlinable @discardableResult
    public func fail(_ error: Failure) -> Bool {
        complete(.failure(error))
    }

    @inlinable
    func complete(_ outcome: Result<Value, Failure>) -> Bool {
        lock.lock()
        guard result_ == nil || Fault.promiseDoubleComplete else {
            lock.unlock()
            return false
        }
        result_ = outcome
        completed.storeRelease(1)
        // Waiters that have not stored their continuation yet, or that were
        // cancelled, see the result under the lock and never touch the
        // table again: it is taken whole.
        let table = waiters.takeAll()
        lock.unlock()
        table.resumeWaiting()
        return true
    }

    // MARK: Reading

    /// The result, or `nil` while the promise is not completed. Never
    /// suspends.
    /// <!-- restates: PROM-RESULT -->
    ///
    /// ```swift
    /// if case .success(let config)? = configPromise.result { use(config) }
    /// ```
    @inlinable
    public var result: Result<Value, Failure>? {
        if completed.loadAcquire() != 0 { return result_ }
        lock.lock()
        defer { lock.unlock() }
        return result_
    }

    /// The value, waiting for it if needed; throws the promise's `Failure`,
    /// or `CancellationError` if the task is cancelled while it waits.
    ///
    /// Once the promise is completed this returns (or throws) at once, also
    /// from a cancelled task. <!-- restates: PROM-VALUE-AT-ONCE -->
    ///
    /// ```swift
    /// let config = try await configPromise.value
    /// ```
    @inlinable
    public var value: Value {
        get async throws {
            if let outcome = completedResult() { return try outcome.get() }
            lock.lock()
            if let outcome = result_ {
                lock.unlock()
                return try outcome.get()
            }
            let slot = waiters.reserve()
            lock.unlock()
            await withTaskCancellationHandler {
                await withUnsafeContinuation { (continuation: UnsafeContinuation<Void, Never>) in
                    self.store(continuation, at: slot)
                }
            } onCancel: {
                self.cancelWaiter(at: slot)
            }
            if let outcome = completedResult() { return try outcome.get() }
            return try leaveCancelled(at: slot)
        }
    }

    /// The result without the lock, once completed.
    @inlinable
    func completedResult() -> Result<Value, Failure>? {
        completed.loadAcquire() != 0 ? result_ : nil
    }

    @inlinable
    func store(_ continuation: UnsafeContinuation<Void, Never>, at slot: Int) {
        lock.lock()
        if result_ == nil && waiters.store(continuation, at: slot) {
            lock.unlock()
            return
        }
        lock.unlock()
        Parking.resume(continuation)  // completed already, or cancelled first
    }

    /// The cancellation handler: takes no lock but ours, and resumes after
    /// releasing it.
    @inlinable
    func cancelWaiter(at slot: Int) {
        lock.lock()
        let continuation = result_ == nil ? waiters.cancel(at: slot) : nil
        lock.unlock()
        if let continuation { Parking.resume(continuation) }
    }

    /// Resumed, and not completed when it looked: it was cancelled. Frees
    /// its slot and throws, unless completion came first after all (then
    /// the table, its slot included, is gone, and it gets the result).
    @inlinable
    func leaveCancelled(at slot: Int) throws -> Value {
        lock.lock()
        if let outcome = result_ {
            lock.unlock()
            return try outcome.get()
        }
        let wasCancelled = waiters.collectCancelled(at: slot)
        waiters._checkInvariants()
        lock.unlock()
        if !wasCancelled { internalInconsistency("a promise waiter resumed while neither completed nor cancelled") }
        throw CancellationError()
    }
}

extension BroadcastPromise where Value == Void {
    /// Completes a `Void` promise: the "ready" signal.
    ///
    /// ```swift
    /// ready.succeed()
    /// ```
    @discardableResult
    public func succeed() -> Bool {
        succeed(())
    }
}
