// Sharing one upstream with every subscriber: an `AsyncSequence` iterated by
// a task the library owns, or a callback listener.

extension BroadcastSequence {
    /// Creates a sequence fed by a fresh upstream each time `started` starts it.
    ///
    /// The library iterates the upstream in a task of its own, once for all
    /// subscribers, and delivers each element as ``emit(_:)`` does: a full
    /// `.bounded` subscriber makes the upstream wait; the other policies
    /// never do. <!-- restates: SHARE-LOSSY-NEVER-WAIT --> When the upstream ends, the sequence finishes; when it
    /// throws, the sequence finishes with that error. <!-- restates: SHARE-UPSTREAM-END-FINISHES --> Releasing the sequence
    /// (or calling ``finish()``) cancels the iteration. <!-- restates: SHARE-RELEASE-STOPS -->
    ///
    /// `upstream` is called inside that task, once per start: once with
    /// `.eagerly` and `.lazily`, again at each restart with
    /// ``BroadcastStart/whileSubscribed(stopAfter:)``. <!-- restates: SHARE-UPSTREAM-IN-LIBRARY-TASK -->
    ///
    /// ```swift
    /// let prices = BroadcastSequence(bufferingPolicy: .bufferingNewest(16),
    ///                                started: .whileSubscribed(stopAfter: .seconds(2))) {
    ///     exchange.priceFeed(for: "ACME")   // a new connection per start
    /// }
    /// ```
    ///
    /// An upstream that ignores task cancellation is only let go at its
    /// next element (which is then dropped) or at its end. <!-- restates: SHARE-IGNORES-CANCELLATION -->
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @inlinable
    public convenience init<Upstream: AsyncSequence & Sendable>(
        bufferingPolicy: BufferingPolicy = .unbounded, replay: Int = 0, started: BroadcastStart = .lazily,
        upstream: @escaping @Sendable () -> Upstream
    ) where Upstream.Element == Element, Upstream.Failure == Failure {
        self.init(
            bufferingPolicy: bufferingPolicy, replay: replay,
            sharing: Sharing(start: started, source: .typed(upstream)))
    }

    /// Creates a sequence fed by a callback API: `register` is called when
    /// `started` starts the sequence, and returns the closure that removes
    /// the listener.
    ///
    /// ```swift
    /// let snapshots = BroadcastSequence<Snapshot, StoreError>(started: .whileSubscribed()) { sink in
    ///     let registration = document.addSnapshotListener { snapshot, error in
    ///         if let snapshot { sink.send(snapshot) } else if let error { sink.finish(throwing: error) }
    ///     }
    ///     return { registration.remove() }
    /// }
    /// ```
    ///
    /// The unregister closure is called exactly once per `register` call:
    /// when the run stops (``BroadcastStart/whileSubscribed(stopAfter:)``),
    /// when the sequence finishes (``BroadcastSink/finish()``, ``finish()``)
    /// or when it is released. <!-- restates: SHARE-UNREGISTER-ONCE --> `register` and unregister closures never run
    /// at the same time as each other, and never while the library holds a
    /// lock. <!-- restates: SHARE-REGISTER-ALTERNATE --> They normally run on the thread that caused the start or stop
    /// (the first subscriber's, the last one's, the one releasing the
    /// sequence) or in the stop timer's task; when another thread is
    /// already starting or stopping a run, that thread performs the next
    /// start or stop too, right after its current one. <!-- restates: SHARE-ONE-RECONCILER -->
    @inlinable
    public convenience init(
        bufferingPolicy: BufferingPolicy = .unbounded, replay: Int = 0, started: BroadcastStart = .lazily,
        register: @escaping @Sendable (_ sink: BroadcastSink<Element, Failure>) -> @Sendable () -> Void
    ) {
        self.init(
            bufferingPolicy: bufferingPolicy, replay: replay,
            sharing: Sharing(start: started, source: .listener(register: register)))
    }

    /// ``subscriberCount`` as it changes: the current count first, then each
    /// change.
    ///
    /// Conflated like any ``BroadcastValue``: a reader that falls behind
    /// gets the latest count, never the same change twice. <!-- restates: SEQ-COUNTS-FOLLOW --> It may get the
    /// count it already had when the changes it missed cancel out (0, then
    /// 0 again after a subscriber came and went): read each value as "the
    /// count now". It ends
    /// once the sequence has finished and its last subscriber is gone (the
    /// count can no longer change). <!-- restates: SEQ-COUNTS-END --> Each access is a new subscription; it
    /// does not count as a subscriber of this sequence, nor keep it alive. <!-- restates: SEQ-COUNTS-NOT-SUBSCRIBER -->
    ///
    /// ```swift
    /// // Start expensive work only while someone listens.
    /// for await count in events.subscriberCounts {
    ///     count > 0 ? sensor.start() : sensor.stop()
    /// }
    /// ```
    public var subscriberCounts: BroadcastValue<Int, Never>.Subscription {
        storage.subscriberCountsValue().subscribe()
    }

    /// Sends each element in order, as consecutive ``send(_:)`` calls would,
    /// taking the sequence lock once for the whole batch: no other
    /// producer's element lands in between. Each subscriber's buffer takes
    /// the batch in one step, and a waiting reader is woken once, after it,
    /// so a batch costs a fraction of as many single sends.
    /// <!-- restates: SEQ-BATCH-ATOMIC -->
    /// <!-- restates: SEQ-BATCH-ONE-WAKE -->
    ///
    /// The result sums the counts over the elements. After `finish`, delivers
    /// nothing and returns a result with `isFinished == true`. <!-- restates: SEQ-BATCH-RESULT-SUM -->
    ///
    /// ```swift
    /// events.send(contentsOf: parsedFrame.events)
    /// ```
    ///
    /// The elements are gathered before the lock is taken (an `Array`'s own
    /// storage is used as is), so `elements` may be any sequence, even one
    /// that computes its elements or calls back into this one. <!-- restates: SEQ-BATCH-NO-USER-CODE-UNDER-LOCK -->
    @inlinable @discardableResult
    public func send<S: Sequence>(contentsOf elements: S) -> BroadcastSendResult where S.Element == Element {
        if let result = elements.withContiguousStorageIfAvailable({ storage.send(batch: $0) }) { return result }
        return ContiguousArray(elements).withUnsafeBufferPointer { storage.send(batch: $0) }
    }
}

extension BroadcastSequence where Failure == any Error {
    /// ``init(bufferingPolicy:replay:started:upstream:)-55nxr`` for systems without
    /// typed `AsyncSequence` failures, and for upstreams whose failure is
    /// not `any Error`: the upstream is iterated with the untyped `next()`
    /// and its error is delivered as `any Error`.
    /// <!-- restates: SHARE-UNTYPED-ERROR -->
    ///
    /// `AsyncSequence.Failure` exists from macOS 15 / iOS 18 / tvOS 18 /
    /// watchOS 11 / visionOS 2 on. This overload needs only what macOS 10.15
    /// / iOS 13 have, and the same call site compiles on both sides: where
    /// the typed initializer is available, Swift prefers it.
    ///
    /// ```swift
    /// let lines = BroadcastSequence<String, any Error>(started: .whileSubscribed()) {
    ///     url.lines
    /// }
    /// ```
    @inlinable @_disfavoredOverload
    public convenience init<Upstream: AsyncSequence & Sendable>(
        bufferingPolicy: BufferingPolicy = .unbounded, replay: Int = 0, started: BroadcastStart = .lazily,
        upstream: @escaping @Sendable () -> Upstream
    ) where Upstream.Element == Element {
        self.init(
            bufferingPolicy: bufferingPolicy, replay: replay,
            sharing: Sharing(start: started, source: .untyped(upstream)))
    }
}

extension AsyncSequence where Self: Sendable, Element: Sendable {
    /// `broadcast(bufferingPolicy:replay:started:)` for systems without
    /// typed `AsyncSequence` failures (before macOS 15 / iOS 18 / tvOS 18 /
    /// watchOS 11 / visionOS 2): the shared sequence fails with `any Error`.
    /// Where the typed form is available, Swift prefers it.
    @inlinable @_disfavoredOverload
    public func broadcast(
        bufferingPolicy: BroadcastBufferingPolicy = .unbounded, replay: Int = 0,
        started: BroadcastStart = .lazily
    ) -> BroadcastSequence<Element, any Error> {
        BroadcastSequence<Element, any Error>(
            bufferingPolicy: bufferingPolicy, replay: replay,
            sharing: Sharing(start: started, source: .untyped { self }))
    }
}

extension AsyncSequence where Self: Sendable, Element: Sendable {
    /// Iterates this sequence once, for every subscriber.
    ///
    /// ```swift
    /// let messages = socket.messages.broadcast(bufferingPolicy: .bounded(64))
    /// Task { for try await message in messages { render(message) } }
    /// Task { for try await message in messages { log(message) } }
    /// ```
    ///
    /// The same as `BroadcastSequence(bufferingPolicy:replay:started:) { self }`.
    /// With ``BroadcastStart/whileSubscribed(stopAfter:)``, each restart
    /// iterates this same sequence again (`makeAsyncIterator()` again): for
    /// a single-pass sequence such as `AsyncStream`, that iteration ends at
    /// once, which finishes the shared sequence. <!-- restates: SHARE-BROADCAST-SINGLE-PASS --> To restart with a fresh
    /// source, use ``BroadcastSequence/init(bufferingPolicy:replay:started:upstream:)-55nxr``
    /// with a closure that creates one.
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @inlinable
    public func broadcast(
        bufferingPolicy: BroadcastBufferingPolicy = .unbounded, replay: Int = 0,
        started: BroadcastStart = .lazily
    ) -> BroadcastSequence<Element, Failure> {
        BroadcastSequence(bufferingPolicy: bufferingPolicy, replay: replay, started: started) { self }
    }
}
