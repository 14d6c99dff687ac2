// A shared sequence fed by an asynchronous listener, its readiness, its
// shutdown, and sends kept out of the replay window.

extension BroadcastSequence {
    /// Creates a sequence fed by a listener that is set up and taken down
    /// asynchronously.
    ///
    /// `listen` runs in a task the library owns when `started` starts the
    /// sequence: it sets the listener up (awaiting what it needs, e.g. a
    /// connection), and returns the take-down, which the library awaits when
    /// the run stops (``BroadcastStart/whileSubscribed(stopAfter:)``), when
    /// the sequence finishes, or when it is released.
    ///
    /// ```swift
    /// let notifications = BroadcastSequence<Notification, Never>(started: .whileSubscribed()) { sink in
    ///     let connection = await database.connect()
    ///     await connection.listen("orders") { sink.send($0) }
    ///     sink.ready()                          // the LISTEN is in place
    ///     return { await connection.close() }
    /// }
    /// ```
    ///
    /// - A restart never begins before the previous take-down has returned:
    ///   one listener at a time, never two. <!-- restates: LISTEN-RESTART-WAITS -->
    /// - At a stop while `listen` still runs, its task is cancelled; its
    ///   take-down runs once it returns. <!-- restates: LISTEN-STOP-DURING-LISTEN -->
    /// - The take-down runs in a task that is not cancelled, so it can
    ///   await a clean close. <!-- restates: LISTEN-TAKEDOWN -->
    /// - ``upstreamStopped()`` returns once nothing of it runs. <!-- restates: LISTEN-UPSTREAM-STOPPED -->
    /// - The sink calls ``BroadcastSink/ready()`` once the listener is in
    ///   place; subscribers waiting in
    ///   ``BroadcastSequence/Subscription/upstreamReady()`` go on then.
    public convenience init(
        bufferingPolicy: BufferingPolicy = .unbounded, replay: Int = 0, started: BroadcastStart = .lazily,
        listen: @escaping @Sendable (_ sink: BroadcastSink<Element, Failure>) async -> @Sendable () async -> Void
    ) {
        self.init(
            bufferingPolicy: bufferingPolicy, replay: replay,
            sharing: Sharing(start: started, source: .asyncListener(listen: listen)))
    }

    /// Returns once nothing of this sequence's upstream runs: no `listen`,
    /// take-down, unregister or upstream task (after ``finish()`` at
    /// shutdown, for instance). While the upstream runs it waits until it
    /// stops. Returns at once for a sequence without an upstream, and when
    /// the task is cancelled.
    /// <!-- restates: LISTEN-UPSTREAM-STOPPED -->
    ///
    /// ```swift
    /// notifications.finish()
    /// await notifications.upstreamStopped()   // the connection is closed
    /// ```
    public func upstreamStopped() async {
        await storage.upstreamStopped()
    }

    /// Hands `element` to every current subscriber, as ``send(_:)`` does;
    /// with `replayable: false` the replay window keeps what it had, so a
    /// later subscriber never starts with it (an out-of-band event: a
    /// resync marker, a "you missed something").
    /// <!-- restates: SEQ-OUT-OF-BAND-NOT-REPLAYED -->
    ///
    /// ```swift
    /// feed.send(.resync, replayable: false)
    /// ```
    ///
    /// `send(_:)` is `send(_:replayable: true)`.
    @inlinable @discardableResult
    public func send(_ element: Element, replayable: Bool) -> BroadcastSendResult {
        storage.send(element, replayable: replayable)
    }
}

extension BroadcastSequence.Subscription {
    /// Waits until the listener feeding this subscriber is in place (its
    /// sink called ``BroadcastSink/ready()``): `true`; `false` if the
    /// sequence ended first, or once this subscriber has ended.
    /// <!-- restates: READY-FALSE -->
    ///
    /// ```swift
    /// let subscription = notifications.subscribe()
    /// guard try await subscription.upstreamReady() else { return }  // ended first
    /// try await database.execute("NOTIFY orders")                   // now heard
    /// ```
    ///
    /// - `true` at once for a sequence that has no listener (a plain one,
    ///   `init(upstream:)`, `broadcast()`): there is nothing to wait for. <!-- restates: READY-NO-LISTENER -->
    /// - The registration that serves this subscriber is the one running
    ///   when it subscribed, or the next one to start. A registration that
    ///   stopped before it subscribed (`whileSubscribed`) does not count:
    ///   the next one must call `ready()` again. <!-- restates: READY-TRUE -->
    /// - A subscriber still draining after the end: `true` if its
    ///   registration said ready before the end.
    /// - Also for a topic's subscription (``BroadcastTopics``' listener
    ///   forms): it waits for its topic's registration. <!-- restates: TOPIC-READY -->
    ///
    /// - Throws: `CancellationError` at once when the task is cancelled
    ///   while it waits. <!-- restates: READY-CANCEL -->
    public func upstreamReady() async throws(CancellationError) -> Bool {
        guard let storage = core.storage else { return true }  // no sequence behind it: nothing to wait for
        guard let ready = await storage.upstreamReady(for: core) else { throw CancellationError() }
        return ready
    }
}
