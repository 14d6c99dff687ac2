/// What a listener callback feeds: the sink handed to the `register`
/// closure of ``BroadcastSequence/init(bufferingPolicy:replay:started:register:)``.
///
/// Call it from any thread, at any time: inside `register` itself, from the
/// listener's own queue, even after the listener was unregistered. It never
/// suspends and never blocks on a subscriber. <!-- restates: SHARE-SINK-NEVER-WAITS -->
///
/// ```swift
/// let locations = BroadcastSequence<Location, Never>(started: .whileSubscribed()) { sink in
///     let token = manager.addObserver { location in sink.send(location) }
///     return { manager.removeObserver(token) }
/// }
/// ```
///
/// Each `register` call gets its own sink. Once that registration is
/// stopped (its unregister closure has been, or is about to be, called) or
/// the sequence has finished, the sink delivers nothing: a late callback is
/// harmless. <!-- restates: SHARE-STALE-SINK -->
public struct BroadcastSink<Element: Sendable, Failure: Error>: Sendable {
    @usableFromInline let storage: BroadcastStorage<Element, Failure>
    @usableFromInline let generation: UInt64

    @usableFromInline
    init(storage: BroadcastStorage<Element, Failure>, generation: UInt64) {
        self.storage = storage
        self.generation = generation
    }

    /// Hands `element` to every current subscriber, as
    /// ``BroadcastSequence/send(_:)`` does: a full `.bounded` subscriber
    /// still receives it (a callback cannot be made to wait).
    /// <!-- restates: SHARE-SINK-NEVER-WAITS -->
    ///
    /// After this sink's registration was stopped, or the sequence finished,
    /// delivers nothing and returns a result with `isFinished == true`. <!-- restates: SHARE-STALE-SINK -->
    @inlinable @discardableResult
    public func send(_ element: Element) -> BroadcastSendResult {
        storage.sinkSend(element, generation: generation)
    }

    /// Ends the sequence, as ``BroadcastSequence/finish()`` does, and stops
    /// this registration (its unregister closure is called). Ignored once
    /// the registration was stopped.
    /// <!-- restates: SHARE-UPSTREAM-END-FINISHES -->
    public func finish() {
        storage.runEnded(generation: generation, end: .finished, taskReturned: false)
    }

    /// Ends the sequence with `error`, as
    /// ``BroadcastSequence/finish(throwing:)`` does, and stops this
    /// registration. Ignored once the registration was stopped.
    public func finish(throwing error: Failure) {
        storage.runEnded(generation: generation, end: .failed(error), taskReturned: false)
    }

    /// Says this registration's listener is in place: subscribers waiting
    /// in ``BroadcastSequence/Subscription/upstreamReady()`` go on, and
    /// later ones do not wait. Idempotent; ignored once the registration
    /// stopped or the sequence finished.
    /// <!-- restates: READY-STALE-IGNORED -->
    ///
    /// ```swift
    /// let listener = try await connection.listen(on: "orders") { sink.send($0) }
    /// sink.ready()
    /// ```
    public func ready() {
        storage.sinkReady(generation: generation)
    }

    /// Hands `element` to every current subscriber, as ``send(_:)`` does;
    /// with `replayable: false` the replay window keeps what it had (see
    /// ``BroadcastSequence/send(_:replayable:)``).
    ///
    /// ```swift
    /// sink.send(.resync, replayable: false)   // after a reconnect: not for later subscribers
    /// ```
    @inlinable @discardableResult
    public func send(_ element: Element, replayable: Bool) -> BroadcastSendResult {
        storage.sinkSend(element, replayable: replayable, generation: generation)
    }
}
