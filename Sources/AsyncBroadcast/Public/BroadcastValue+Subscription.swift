extension BroadcastValue {
    /// One subscriber of a ``BroadcastValue``: it holds at most one pending
    /// value, the latest one it has not returned yet.
    /// <!-- restates: VAL-AT-MOST-ONE-PENDING -->
    ///
    /// The subscriber ends, and leaves the value at once, when ``cancel()``
    /// is called, when the subscription and all its iterators are released,
    /// when the consuming task is cancelled, or when the value finished and
    /// the subscriber has taken the last value. <!-- restates: VAL-RELEASE-ENDS -->
    ///
    /// ```swift
    /// let subscription = status.subscribe()
    /// for await status in subscription { show(status) }
    /// ```
    ///
    /// One subscription has one consumer: two `next()` calls at once trap
    /// with a message, in release builds too. <!-- restates: MISUSE-CONCURRENT-NEXT -->
    public final class Subscription: AsyncSequence, Sendable {
        public typealias Element = Value

        @usableFromInline let core: ValueSubscriber<Value, Failure>

        @inlinable
        init(core: ValueSubscriber<Value, Failure>) {
            self.core = core
        }

        deinit {
            core.cancel()
        }

        /// Iterators share this subscription and keep it alive.
        @inlinable
        public func makeAsyncIterator() -> AsyncIterator {
            AsyncIterator(subscription: self)
        }

        /// Ends this subscriber now: it leaves the value, and `next()`
        /// returns `nil` (also to a consumer waiting in it). Idempotent:
        /// later calls return at once; a call made while another thread's
        /// first call is still running returns before that call has
        /// finished.
        /// <!-- restates: VAL-CANCEL -->
        ///
        /// ```swift
        /// subscription.cancel()
        /// ```
        public func cancel() {
            core.cancel()
        }

        /// Reads the latest unseen value, suspending until the value changes.
        public struct AsyncIterator: AsyncIteratorProtocol {
            public typealias Element = Value

            @usableFromInline let subscription: Subscription
            @usableFromInline var cancellationCheck = CancellationCheckCountdown()

            @usableFromInline init(subscription: Subscription) { self.subscription = subscription }

            /// The latest value this subscriber has not returned yet, waiting
            /// for a change if there is none; `nil` once it has ended.
            ///
            /// Throws the value's error once (after the last value) if it
            /// finished with `finish(throwing:)`. When the calling task is
            /// cancelled, the subscriber ends and this returns `nil`: at
            /// once if it is waiting, otherwise within 32 calls. <!-- restates: VAL-TASK-CANCEL -->
            ///
            /// ```swift
            /// var iterator = settings.subscribe().makeAsyncIterator()
            /// let current = await iterator.next()
            /// ```
            @inlinable
            public mutating func next() async throws(Failure) -> Value? {
                try await subscription.core.next(
                    isolation: nil as (any Actor)?,
                    checkCancellation: cancellationCheck.isDue())
            }

            /// Like ``next()``, but runs on `actor`:
            /// a `@MainActor` loop receives each value on the main actor. With Swift
            /// 6.3 a reader that has to wait may still switch executors around
            /// its suspension (one extra enqueue of its actor per wake-up), since
            /// the runtime runs the wait's cancellation-handler operation
            /// nonisolated; a value not yet seen is returned without
            /// leaving the actor.
            @inlinable
            public mutating func next(isolation actor: isolated (any Actor)?) async throws(Failure) -> Value? {
                try await subscription.core.next(isolation: actor, checkCancellation: cancellationCheck.isDue())
            }
        }
    }
}
