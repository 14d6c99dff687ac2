extension BroadcastSequence.Subscription {
    /// One event of ``events``: an element, or a `.lagged(n)` gap.
    ///
    /// ```swift
    /// let event: BroadcastSequence<Int, Never>.Subscription.Event = .lagged(3)
    /// ```
    public typealias Event = BroadcastEvent<Element>

    /// This subscription read as events: its elements, with `.lagged(n)`
    /// where its policy dropped `n`.
    ///
    /// Where each gap sits (see "Lag in-band" in Semantics.md):
    /// `.bufferingOldest` drops new elements while full, so the gap comes
    /// after every element held at that moment and before the next one
    /// accepted; `.bufferingNewest` drops its oldest, so the gap comes just
    /// before the element that is now its oldest; capacity 0 drops when no
    /// reader waits, so the gap comes after what it holds. <!-- restates: EVENTS-GAP-CAPACITY-ZERO --> A gap still
    /// pending at the end is delivered before the end, whatever ended it
    /// (the sequence's end, an eviction, `cancel()`, the task's
    /// cancellation); once the stream has ended, the `.lagged` counts add up
    /// to ``droppedCount``. <!-- restates: EVENTS-LAGGED-SUM -->
    ///
    /// It is the same consumer as the subscription: iterating both at once
    /// traps (one consumer rule). Reading some elements with the plain
    /// iterator and then as events works; gaps the plain reads passed are
    /// reported at the first events read after them. <!-- restates: EVENTS-SWITCH -->
    ///
    /// ```swift
    /// let subscription = quotes.subscribe(bufferingPolicy: .bufferingNewest(100))
    /// for await event in subscription.events {
    ///     switch event {
    ///     case .element(let quote): render(quote)
    ///     case .lagged(let missed): render(gap: missed)
    ///     }
    /// }
    /// ```
    @inlinable
    public var events: Events { Events(subscription: self) }

    /// A subscription read as events (``BroadcastSequence/Subscription/events``).
    public struct Events: AsyncSequence, Sendable {
        /// What it yields: ``BroadcastSequence/Subscription/Event``.
        ///
        /// ```swift
        /// for await event in subscription.events { if case .lagged(let n) = event { print(n) } }
        /// ```
        public typealias Element = Event

        @usableFromInline let subscription: BroadcastSequence.Subscription

        @usableFromInline init(subscription: BroadcastSequence.Subscription) { self.subscription = subscription }

        /// An iterator over the subscription's events; it keeps the
        /// subscription alive.
        @inlinable
        public func makeAsyncIterator() -> AsyncIterator {
            AsyncIterator(subscription: subscription)
        }

        /// Reads a subscription's events, suspending while there is none.
        public struct AsyncIterator: AsyncIteratorProtocol {
            /// What ``next()`` returns: ``BroadcastSequence/Subscription/Event``.
            ///
            /// ```swift
            /// let event: BroadcastEvent<Int>? = await iterator.next()
            /// ```
            public typealias Element = Event

            @usableFromInline let subscription: BroadcastSequence.Subscription
            @usableFromInline var cancellationCheck = CancellationCheckCountdown()

            @usableFromInline init(subscription: BroadcastSequence.Subscription) { self.subscription = subscription }

            /// The next event, or `nil` once the subscriber has ended;
            /// errors, ending and cancellation as
            /// ``BroadcastSequence/Subscription/AsyncIterator/next()``.
            ///
            /// ```swift
            /// var iterator = subscription.events.makeAsyncIterator()
            /// if case .lagged(let n)? = await iterator.next() { print("missed", n) }
            /// ```
            @inlinable
            public mutating func next() async throws(Failure) -> Event? {
                try await subscription.core.nextEvent(
                    isolation: nil as (any Actor)?,
                    checkCancellation: cancellationCheck.isDue())
            }

            /// Like ``next()``, but runs on `actor`, as
            /// ``BroadcastSequence/Subscription/AsyncIterator/next(isolation:)`` does.
            ///
            /// ```swift
            /// @MainActor func show(_ events: BroadcastSequence<Int, Never>.Subscription.Events) async {
            ///     var iterator = events.makeAsyncIterator()
            ///     while let event = await iterator.next(isolation: MainActor.shared) { print(event) }
            /// }
            /// ```
            @inlinable
            public mutating func next(isolation actor: isolated (any Actor)?) async throws(Failure) -> Event? {
                try await subscription.core.nextEvent(isolation: actor, checkCancellation: cancellationCheck.isDue())
            }

            /// The batch read with lag in-band: waits only while nothing is
            /// ready, then appends up to `limit` events, in order, to
            /// `buffer` and returns how many; 0 once ended. Errors, ending
            /// and cancellation as
            /// ``BroadcastSequence/Subscription/AsyncIterator/next(upTo:into:)``;
            /// a `limit` below 1 traps with a message naming it.
            /// <!-- restates: MISUSE-BATCH-LIMIT -->
            ///
            /// ```swift
            /// var batch: [BroadcastEvent<Message>] = []
            /// var iterator = subscription.events.makeAsyncIterator()
            /// while try await iterator.next(upTo: 64, into: &batch) > 0 {
            ///     try await socket.write(encode(batch))  // gaps travel with the messages
            ///     batch.removeAll(keepingCapacity: true)
            /// }
            /// ```
            @inlinable
            public mutating func next(upTo limit: Int, into buffer: inout [Event]) async throws(Failure) -> Int {
                try await next(upTo: limit, into: &buffer, isolation: nil)
            }

            /// ``next(upTo:into:)`` running on `actor`, as ``next(isolation:)``.
            ///
            /// ```swift
            /// var batch: [BroadcastEvent<Int>] = []
            /// _ = await iterator.next(upTo: 16, into: &batch, isolation: MainActor.shared)
            /// ```
            @inlinable
            public mutating func next(
                upTo limit: Int, into buffer: inout [Event],
                isolation actor: isolated (any Actor)?
            ) async throws(Failure) -> Int {
                if limit < 1 { misuse("next(upTo:into:) needs a limit of at least 1 (got \(limit))") }
                cancellationCheck.callsLeft = 0
                guard
                    let first = try await subscription.core.nextEvent(
                        isolation: actor, checkCancellation: cancellationCheck.isDue())
                else { return 0 }
                buffer.append(first)
                return 1 + subscription.core.takeBufferedEvents(upTo: limit - 1, into: &buffer)
            }
        }
    }
}
