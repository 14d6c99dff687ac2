/// The latest value, broadcast: each subscriber starts with the current
/// value, then sees its changes, conflated.
///
/// Use it for state that many observers follow: an authentication state,
/// settings, a connection status. A subscriber never receives a stale
/// backlog: one that falls behind gets the latest value, and it never gets
/// the same change twice. <!-- restates: VAL-NEVER-TWICE --> ``value`` reads the current value synchronously.
///
/// ```swift
/// let auth = BroadcastValue(AuthState.signedOut)
///
/// Task { @MainActor in
///     for await state in auth { render(state) }   // signedOut first, then changes
/// }
///
/// auth.send(.signedIn(user))
/// auth.update { state in state = state.refreshed() }   // atomic read-modify-write
/// print(auth.value)
/// ```
///
/// When `Value` is `Equatable`, a ``send(_:)`` or ``update(_:)`` that
/// leaves the value equal to the current one is not a change: it wakes
/// nobody and no subscriber sees it. (This is found at run time, so it
/// holds in generic code too.) <!-- restates: VAL-EQUAL-NOT-CHANGE -->
///
/// ``finish()`` ends the value: subscribers receive the last value they
/// have not seen, then `nil`. Releasing the last reference to a
/// `BroadcastValue` finishes it the same way. <!-- restates: VAL-DEINIT-FINISHES -->
public final class BroadcastValue<Value: Sendable, Failure: Error>: AsyncSequence, Sendable {
    public typealias Element = Value
    public typealias AsyncIterator = Subscription.AsyncIterator

    @usableFromInline let storage: ValueStorage<Value, Failure>

    @inlinable
    init(initial: Value) {
        storage = ValueStorage(value: initial)
    }

    /// Creates a value that can end with an error of type `Failure`.
    ///
    /// ```swift
    /// let connection = BroadcastValue(ConnectionState.connecting, throwing: ConnectionError.self)
    /// connection.finish(throwing: .refused)
    /// ```
    @inlinable
    public convenience init(_ initial: Value, throwing: Failure.Type) {
        self.init(initial: initial)
    }

    deinit {
        storage.finish(.finished)
    }

    // MARK: Reading

    /// The current value. Never suspends; a short lock, no waiting on
    /// subscribers.
    ///
    /// ```swift
    /// if case .signedIn = auth.value { showInbox() }
    /// ```
    @inlinable
    public var value: Value { storage.value }

    // MARK: Changing

    /// Replaces the value and wakes the subscribers waiting for a change.
    ///
    /// Never suspends. After ``finish()`` it is ignored: the value is final. <!-- restates: VAL-FINISH-IGNORED -->
    /// The replaced value is released after the value's lock, so its
    /// `deinit` may use this `BroadcastValue`. <!-- restates: VAL-REPLACED-AFTER-LOCK -->
    ///
    /// ```swift
    /// settings.send(Settings(theme: .dark))
    /// ```
    @inlinable
    public func send(_ newValue: Value) {
        storage.send(newValue)
    }

    /// Changes the value in place, atomically: no other ``send(_:)`` or
    /// `update` runs between reading and writing. Returns what `body`
    /// returns.
    /// <!-- restates: VAL-UPDATE-ATOMIC -->
    ///
    /// ```swift
    /// let newCount = counter.update { count in
    ///     count += 1
    ///     return count
    /// }
    /// ```
    ///
    /// `body` runs under the value's lock, so it must be short and must not
    /// use this `BroadcastValue` (not even ``value``): such a call from the
    /// same thread traps with a message instead of deadlocking. <!-- restates: MISUSE-VALUE-REENTRY --> If `body`
    /// throws, what it changed before throwing is kept and published, and
    /// the error is rethrown. <!-- restates: VAL-UPDATE-ATOMIC -->
    ///
    /// The previous value is kept until the lock is released, so that it
    /// can be compared (when `Value` is `Equatable`) and released outside
    /// the lock; for a collection mutated in place this costs a
    /// copy-on-write copy. After ``finish()``, `body` runs on a copy that is
    /// discarded: the value is final. <!-- restates: VAL-FINISH-IGNORED -->
    @inlinable @discardableResult
    public func update<R, E: Error>(_ body: (inout Value) throws(E) -> R) throws(E) -> R {
        try storage.update(body)
    }

    /// Ends the value. Each subscriber receives the last value it has not
    /// seen (if any), then `nil`. Only the first `finish` or
    /// ``finish(throwing:)`` counts; later changes are ignored.
    /// <!-- restates: VAL-FINISH-LAST-VALUE -->
    public func finish() {
        storage.finish(.finished)
    }

    /// Ends the value with `error`. Each subscriber receives the last value
    /// it has not seen (if any), then throws `error` once, then returns
    /// `nil`. Only the first `finish` counts.
    /// <!-- restates: VAL-FINISH-LAST-VALUE -->
    public func finish(throwing error: Failure) {
        storage.finish(.failed(error))
    }

    /// The number of subscribers that have not ended.
    ///
    /// After `finish`, a subscriber that has already seen the last value
    /// leaves at once; one that has not counts until it takes it. <!-- restates: VAL-COUNT-AFTER-FINISH -->
    public var subscriberCount: Int { storage.subscriberCount }

    /// Whether `finish()` or `finish(throwing:)` has been called.
    public var isFinished: Bool { storage.isFinished }

    // MARK: Subscribing

    /// Registers a subscriber now, holding the current value: its first
    /// `next()` returns the current value (or a newer one, if the value has
    /// changed since), so no change is lost between reading and subscribing.
    /// <!-- restates: VAL-SUBSCRIBE-ATOMIC -->
    ///
    /// ```swift
    /// let changes = settings.subscribe()
    /// Task { for await settings in changes { apply(settings) } }
    /// ```
    ///
    /// From a cancelled task, or after `finish`, the subscription is not
    /// registered: it yields the current value once, then ends (with the
    /// value's error, if it failed). <!-- restates: VAL-UNREGISTERED-SUBSCRIBE -->
    @inlinable
    public func subscribe() -> Subscription {
        Subscription(core: storage.subscribe())
    }

    /// `subscribe().makeAsyncIterator()`: each `for await` loop over the
    /// value is its own subscriber, starting when the loop starts.
    /// <!-- restates: VAL-LOOP-SUBSCRIBES -->
    @inlinable
    public func makeAsyncIterator() -> Subscription.AsyncIterator {
        subscribe().makeAsyncIterator()
    }
}

extension BroadcastValue where Failure == Never {
    /// Creates a value that never fails.
    ///
    /// ```swift
    /// let isOnline = BroadcastValue(false)
    /// isOnline.send(true)
    /// ```
    @inlinable
    public convenience init(_ initial: Value) {
        self.init(initial: initial)
    }
}
