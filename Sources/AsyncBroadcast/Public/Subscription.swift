extension BroadcastSequence {
    /// One subscriber of a ``BroadcastSequence``: its own buffer, read by one
    /// consumer.
    ///
    /// The subscriber ends, and is removed from the sequence at once, when
    /// ``cancel()`` is called, when the subscription and all its iterators
    /// are released, or when the sequence finished and the buffer is
    /// drained. <!-- restates: SEQ-END-WAYS --> When the consuming task is cancelled, it ends as soon as the
    /// consumer notices: if it is waiting in `next()`, it is woken at once and
    /// leaves when its task runs again; otherwise within at most 32 of its
    /// `next()` calls, so at most 31 more elements (see ``AsyncIterator/next()``). <!-- restates: SEQ-TASK-CANCEL-32 -->
    ///
    /// ```swift
    /// let subscription = sequence.subscribe(bufferingPolicy: .bufferingOldest(3))
    /// for await value in subscription { await slowWork(value) }
    /// print("dropped", subscription.droppedCount)
    /// ```
    ///
    /// One subscription has one consumer. Calling `next()` from two tasks at
    /// once is a programmer error: the second call finds the consumer slot
    /// taken (it is claimed atomically for the whole call, suspension
    /// included) and traps with a message, in release builds too, before it
    /// touches anything. <!-- restates: MISUSE-CONCURRENT-NEXT -->
    public final class Subscription: AsyncSequence, Sendable {
        @usableFromInline let core: SubscriberCore<Element, Failure>

        @inlinable
        init(core: SubscriberCore<Element, Failure>) {
            self.core = core
        }

        deinit {
            core.cancel()
        }

        /// Iterators share this subscription's buffer and keep it alive.
        @inlinable
        public func makeAsyncIterator() -> AsyncIterator {
            AsyncIterator(subscription: self)
        }

        /// Ends this subscriber now: it leaves the sequence, its buffer is
        /// freed, and `next()` returns `nil` (also to a consumer waiting in
        /// it). Idempotent: later calls return at once, without taking any
        /// lock; a call made while another thread's first call is still in
        /// progress returns before that call has finished.
        /// <!-- restates: SEQ-CANCEL-IDEMPOTENT -->
        @inlinable
        public func cancel() {
            core.cancel()
        }

        /// How many elements this subscriber's policy has dropped so far.
        public var droppedCount: Int { core.droppedCount }

        /// The elements this subscriber holds unread right now: how far its
        /// consumer lags behind the producers.
        ///
        /// A snapshot: while producers send and the consumer reads, it is a
        /// count this subscriber really held at one moment during the call
        /// (never negative, never more than its policy lets it hold: its
        /// capacity, or the replay it started with if that is larger; only
        /// `send` to a full `.bounded` subscriber goes past its capacity), <!-- restates: SEQ-BUFFEREDCOUNT-IN-BOUNDS -->
        /// and it may be out of date as soon as it returns. Replay counts
        /// like any other element. Once the subscriber has ended
        /// (``cancel()``, its task's cancellation noticed, or the end of the
        /// sequence taken) it is 0. <!-- restates: SEQ-BUFFEREDCOUNT --> For `.unbounded`, `.bounded` and
        /// `.bufferingOldest` it reads the producer's and the consumer's
        /// positions without a lock, and takes the sequence lock once only
        /// if producers pushed between its reads four times in a row;
        /// `.bufferingNewest` reads under the subscriber's lock.
        ///
        /// ```swift
        /// let subscription = sequence.subscribe(bufferingPolicy: .bounded(256))
        /// if subscription.bufferedCount > 200 { closeSlowClient() }  // it keeps falling behind
        /// ```
        public var bufferedCount: Int { core.bufferedCount }

        /// Reads a ``Subscription``'s buffer, suspending while it is empty.
        public struct AsyncIterator: AsyncIteratorProtocol {
            @usableFromInline let subscription: Subscription
            @usableFromInline var cancellationCheck = CancellationCheckCountdown()

            @usableFromInline init(subscription: Subscription) { self.subscription = subscription }

            /// The next element, or `nil` once the subscriber has ended.
            ///
            /// Throws the sequence's error once (after the buffer is drained)
            /// if it finished with `finish(throwing:)`. <!-- restates: SEQ-FINISH-DRAIN-THEN-END -->
            ///
            /// When the calling task is cancelled, the subscriber ends as
            /// with ``Subscription/cancel()`` and this returns `nil` (never
            /// throws). A call waiting for an element notices at once;
            /// otherwise the cancellation flag is read on the first call and
            /// then every 32 calls, so at most 31 more elements arrive after
            /// the cancellation. <!-- restates: SEQ-TASK-CANCEL-NO-ERROR -->
            @inlinable
            public mutating func next() async throws(Failure) -> Element? {
                try await subscription.core.next(isolation: nil as (any Actor)?, checkCancellation: cancellationCheck.isDue())
            }

            /// Like ``next()``, but runs on `actor`:
            /// a `@MainActor` loop receives each element on the main actor. With Swift
            /// 6.3 a reader that has to wait may still switch executors around
            /// its suspension (one extra enqueue of its actor per wake-up), since
            /// the runtime runs the wait's cancellation-handler operation
            /// nonisolated; an element already buffered is returned without
            /// leaving the actor.
            ///
            /// `for await` calls this method where the platform's
            /// `AsyncIteratorProtocol` has it (macOS 15, iOS 18, tvOS 18,
            /// watchOS 11, and Linux); on older Apple systems the loop calls
            /// ``next()`` instead, which may resume off the actor. Calling
            /// this method directly works on every supported system.
            @inlinable
            public mutating func next(isolation actor: isolated (any Actor)?) async throws(Failure) -> Element? {
                try await subscription.core.next(isolation: actor, checkCancellation: cancellationCheck.isDue())
            }

            /// Waits only while nothing is ready, then appends up to `limit`
            /// elements, in order, to `buffer` and returns how many.
            ///
            /// It suspends as ``next()`` does while the subscriber holds
            /// nothing; once an element is there it takes it and every
            /// element already buffered behind it, up to `limit`, without
            /// suspending again. <!-- restates: SEQ-BATCH-READ --> It returns 0 once the subscription has
            /// ended: at the end, or after the sequence's error was thrown
            /// (the error is thrown by the call that finds it first, after
            /// everything before it was returned). Each call reads the task's
            /// cancellation flag: a cancelled consumer's call ends the
            /// subscriber as ``Subscription/cancel()`` does and returns 0. <!-- restates: SEQ-BATCH-READ-CANCEL -->
            ///
            /// ```swift
            /// var batch: [Event] = []
            /// var iterator = subscription.makeAsyncIterator()
            /// while try await iterator.next(upTo: 64, into: &batch) > 0 {
            ///     try await socket.write(encode(batch))   // one write per batch
            ///     batch.removeAll(keepingCapacity: true)
            /// }
            /// ```
            ///
            /// A `limit` below 1 traps with a message naming it. <!-- restates: MISUSE-BATCH-LIMIT -->
            @inlinable
            public mutating func next(upTo limit: Int, into buffer: inout [Element]) async throws(Failure) -> Int {
                try await next(upTo: limit, into: &buffer, isolation: nil)
            }

            /// ``next(upTo:into:)`` running on `actor`, as ``next(isolation:)``.
            @inlinable
            public mutating func next(
                upTo limit: Int, into buffer: inout [Element],
                isolation actor: isolated (any Actor)?
            ) async throws(Failure) -> Int {
                if limit < 1 { misuse("next(upTo:into:) needs a limit of at least 1 (got \(limit))") }
                // One look at the cancellation flag per batch; `next` then
                // takes its usual look at the next single call's turn.
                cancellationCheck.callsLeft = 0
                guard
                    let first = try await subscription.core.next(
                        isolation: actor, checkCancellation: cancellationCheck.isDue())
                else { return 0 }
                buffer.append(first)
                return 1 + subscription.core.takeBuffered(upTo: limit - 1, into: &buffer)
            }
        }
    }
}
