/// One result for many waiters: a latch, a readiness signal.
///
/// The first ``succeed(_:)`` or ``fail(_:)`` wins; later calls return
/// `false` and change nothing. Every waiter, early or late, gets the same
/// result: waiters that come after completion get it at once.
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
/// cancelled waiters.
///
/// A task waiting in ``value`` holds a reference to the promise, so a
/// promise cannot go away under its waiters; if nobody is left to complete
/// it, its waiters wait until their tasks are cancelled.
public final class BroadcastPromise<Value: Sendable, Failure: Error>: @unchecked Sendable {
    // Guarded by `lock`. Completion swaps the waiters out and resumes them
    // after unlocking; no user code runs under the lock.
    @usableFromInline var result_: Result<Value, Failure>?
    @usableFromInline var waiters = WaiterTable()
    @usableFromInline let lock = Lock()

    /// Creates a promise that nobody has completed yet.
    ///
    /// ```swift
    /// let token = BroadcastPromise<String, any Error>()
    /// ```
    public init() {}

    /// Creates a promise of a `Value` that can fail with `Failure`.
    ///
    /// ```swift
    /// let config = BroadcastPromise(of: Config.self, throwing: ConfigError.self)
    /// ```
    public convenience init(of: Value.Type = Value.self, throwing: Failure.Type) {
        self.init()
    }

    deinit {
        lock.destroy()
    }

    // MARK: Completing

    /// Completes the promise with `value`, resuming every waiter. Returns
    /// `false` (and changes nothing) if it was already completed.
    ///
    /// ```swift
    /// config.succeed(loadedConfig)
    /// ```
    @discardableResult
    public func succeed(_ value: Value) -> Bool {
        complete(.success(value))
    }

    /// Completes the promise with `error`, which every waiter throws.
    /// Returns `false` (and changes nothing) if it was already completed.
    ///
    /// ```swift
    /// config.fail(.missing)
    /// ```
    @discardableResult
    public func fail(_ error: Failure) -> Bool {
        complete(.failure(error))
    }

    @usableFromInline
    func complete(_ outcome: Result<Value, Failure>) -> Bool {
        lock.lock()
        guard result_ == nil else {
            lock.unlock()
            return false
        }
        result_ = outcome
        let continuations = waiters.takeAllWaiting()
        waiters._checkInvariants()
        lock.unlock()
        for continuation in continuations { Parking.resume(continuation) }
        return true
    }

    // MARK: Reading

    /// The result, or `nil` while the promise is not completed. Never
    /// suspends.
    ///
    /// ```swift
    /// if case .success(let config)? = configPromise.result { use(config) }
    /// ```
    public var result: Result<Value, Failure>? {
        lock.lock()
        defer { lock.unlock() }
        return result_
    }

    /// The value, waiting for it if needed; throws the promise's `Failure`,
    /// or `CancellationError` if the task is cancelled while it waits.
    ///
    /// Once the promise is completed this returns (or throws) at once, also
    /// from a cancelled task.
    ///
    /// ```swift
    /// let config = try await configPromise.value
    /// ```
    public var value: Value {
        get async throws {
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
            return try collect(at: slot)
        }
    }

    @usableFromInline
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
    @usableFromInline
    func cancelWaiter(at slot: Int) {
        lock.lock()
        let continuation = waiters.cancel(at: slot)
        lock.unlock()
        if let continuation { Parking.resume(continuation) }
    }

    @usableFromInline
    func collect(at slot: Int) throws -> Value {
        lock.lock()
        if waiters.collectCancelled(at: slot) {
            waiters._checkInvariants()
            lock.unlock()
            throw CancellationError()
        }
        if case .reserved = waiters.slots[slot] {
            waiters.free(slot)  // completed before the waiter could store itself
        }
        waiters._checkInvariants()
        guard let outcome = result_ else {
            lock.unlock()
            internalInconsistency("a promise waiter resumed without a result")
        }
        lock.unlock()
        return try outcome.get()
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
