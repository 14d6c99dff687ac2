// `BroadcastTopics` with an asynchronous listener per topic, and sends
// kept out of a topic's replay window.

extension BroadcastTopics {
    /// Creates a set of topics, each fed by an asynchronous listener while
    /// it is live.
    ///
    /// `listen(topic, sink)` runs in a task the library owns when `topic`
    /// gains its first subscriber: it sets the listener up, awaiting what
    /// it needs, and returns the take-down. The library awaits the
    /// take-down once the topic's last subscriber has been gone for
    /// `stopAfter`, at ``finish(topic:)``, when the listener ends the topic
    /// (``BroadcastSink/finish()``), or when everything finishes. If that
    /// stop comes while `listen` still runs, its task is cancelled and its
    /// take-down runs once it returns. A topic's next `listen` never starts
    /// before its previous take-down has returned. <!-- restates: TOPIC-LISTEN-SERIAL -->
    ///
    /// ```swift
    /// // One PostgreSQL LISTEN per channel that has clients.
    /// let channels = BroadcastTopics<String, Notification, Never>(stopAfter: .seconds(5)) { channel, sink in
    ///     let connection = await pool.connection()
    ///     try? await connection.execute("LISTEN \(channel)")
    ///     connection.onNotification { sink.send($0) }
    ///     sink.ready()                      // subscribers waiting in upstreamReady() go on
    ///     return { await connection.close() }
    /// }
    /// ```
    ///
    /// The take-down runs in a task that is not cancelled. A negative
    /// `stopAfter` traps with a message naming it.
    @available(macOS 13, iOS 16, tvOS 16, watchOS 9, *)
    public convenience init(
        bufferingPolicy: BufferingPolicy = .unbounded, replay: Int = 0, stopAfter: Duration = .zero,
        listen: @escaping @Sendable (_ topic: Topic, _ sink: BroadcastSink<Element, Failure>) async -> @Sendable () async -> Void
    ) {
        self.init(
            bufferingPolicy: bufferingPolicy, replay: replay,
            started: .whileSubscribed(stopAfter: stopAfter), source: .listen(listen))
    }

    /// The asynchronous listener form with the delay's clock given (tests drive a manual one).
    @available(macOS 13, iOS 16, tvOS 16, watchOS 9, *)
    @_spi(Testing)
    public convenience init<C: Clock>(
        bufferingPolicy: BufferingPolicy = .unbounded, replay: Int = 0, stopAfter: C.Duration, clock: C,
        listen: @escaping @Sendable (_ topic: Topic, _ sink: BroadcastSink<Element, Failure>) async -> @Sendable () async -> Void
    ) {
        self.init(
            bufferingPolicy: bufferingPolicy, replay: replay,
            started: .whileSubscribed(stopAfter: stopAfter, clock: clock), source: .listen(listen))
    }

    /// Returns once no topic's listener runs: no `register` or `listen`,
    /// no unregister or take-down, also of topics that ``finish()`` has let
    /// go of. At shutdown, after ``finish()``, it waits until every
    /// listener is taken down. A run counts from the moment a topic decides
    /// to start it (before `register` or `listen` is called), so a
    /// `listenersStopped()` after `finish()` also waits for a `listen` whose
    /// task has not run yet. While a listener runs it waits until none
    /// does (a live topic whose start waits for its previous take-down does
    /// not count until it starts). Returns at once for topics without a listener, and when the
    /// task is cancelled.
    /// <!-- restates: TOPIC-LISTENERS-STOPPED -->
    ///
    /// ```swift
    /// channels.finish()
    /// await channels.listenersStopped()   // every LISTEN connection closed
    /// ```
    public func listenersStopped() async {
        await registry.activity.waitUntilIdle()
    }

    /// Hands `element` to every current subscriber of `topic`, as
    /// ``send(_:to:)`` does; with `replayable: false` the topic's replay
    /// window keeps what it had, so a later subscriber never starts with
    /// it (an out-of-band event: a resync marker, a "you missed something").
    /// <!-- restates: SEQ-OUT-OF-BAND-NOT-REPLAYED -->
    ///
    /// ```swift
    /// channels.send(.resync, to: channel, replayable: false)
    /// ```
    ///
    /// `send(_:to:)` is `send(_:to:replayable: true)`.
    @inlinable @discardableResult
    public func send(_ element: Element, to topic: Topic, replayable: Bool) -> BroadcastSendResult {
        registry.send(element, to: topic, replayable: replayable)
    }
}
