/// An `AsyncSequence` that delivers every element to every subscriber: a
/// 1-to-N broadcast for Swift Concurrency.
///
/// Producers call ``send(_:)`` (never waits) or ``emit(_:)`` (waits while a
/// `.bounded` subscriber is full) from any thread or task. Each subscriber
/// (each ``subscribe(bufferingPolicy:)`` call, and each `for await` loop over
/// the sequence itself) has its own buffer and receives, in order, every
/// element sent after it subscribed, as its ``BufferingPolicy`` allows. <!-- restates: SEQ-ORDER-SAME -->
///
/// ```swift
/// let events = BroadcastSequence(of: AppEvent.self)
///
/// Task { for await event in events { updateUI(event) } }     // subscriber 1
/// Task { for await event in events { log(event) } }          // subscriber 2
///
/// events.send(.message("hello"))
/// events.finish()
/// ```
///
/// Subscribing happens when the loop starts (`makeAsyncIterator()`). To be
/// sure not to miss anything sent right after, subscribe first and iterate
/// later:
///
/// ```swift
/// let subscription = events.subscribe()
/// Task { for await event in subscription { log(event) } }
/// events.send(.message("not missed"))
/// ```
///
/// The sequence finishes when ``finish()`` or ``finish(throwing:)`` is
/// called, or when its last reference goes away; subscribers then drain
/// what they hold and end. <!-- restates: SEQ-DEINIT-FINISHES -->
public final class BroadcastSequence<Element: Sendable, Failure: Error>: AsyncSequence, Sendable {
    public typealias BufferingPolicy = BroadcastBufferingPolicy
    public typealias AsyncIterator = Subscription.AsyncIterator

    @usableFromInline let storage: BroadcastStorage<Element, Failure>
    /// `storage.finish(.finished)`, made by the initializer the client
    /// called, and so specialized for its `Element` and `Failure`: `deinit`
    /// is generic code that is never specialized, and there an unspecialized
    /// `finish` spent most of a create-send-release cycle looking up generic
    /// metadata (1.2 of 2 µs; `fanout-compare --filter lifecycle`). Here,
    /// not in the storage, so that a topic of a `BroadcastTopics` (a storage
    /// without a sequence) does not pay its 16 bytes.
    @usableFromInline let finishWhenDropped: @Sendable (BroadcastStorage<Element, Failure>) -> Void

    /// Creates a broadcast sequence.
    ///
    /// - Parameters:
    ///   - bufferingPolicy: The policy of subscribers that do not pick their
    ///     own in ``subscribe(bufferingPolicy:)``.
    ///   - replay: How many of the most recent elements the sequence keeps
    ///     for new subscribers. A new subscriber receives all of them first,
    ///     whatever its policy (a smaller capacity does not cut the window); <!-- restates: SEQ-REPLAY-NOT-CUT -->
    ///     its policy governs what is sent afterwards. (For one result that
    ///     late waiters still get, use ``BroadcastPromise``; for a current
    ///     value, ``BroadcastValue``.)
    ///
    /// A negative `replay` or capacity, or `.bounded(0)`, traps with a
    /// message naming it, in every build configuration. <!-- restates: MISUSE-NEGATIVE-REPLAY -->
    @inlinable  // so that `finishWhenDropped` is the client's specialization
    public init(bufferingPolicy: BufferingPolicy = .unbounded, replay: Int = 0) {
        if replay < 0 { misuse("replay must not be negative (got \(replay))") }
        bufferingPolicy.validate(argument: "bufferingPolicy")
        storage = BroadcastStorage(defaultPolicy: bufferingPolicy, replay: replay)
        finishWhenDropped = { $0.finish(.finished) }
    }

    /// A shared sequence (see `BroadcastSequence+Sharing.swift`).
    @usableFromInline
    init(bufferingPolicy: BufferingPolicy, replay: Int, sharing: Sharing<Element, Failure>) {
        if replay < 0 { misuse("replay must not be negative (got \(replay))") }
        bufferingPolicy.validate(argument: "bufferingPolicy")
        storage = BroadcastStorage(defaultPolicy: bufferingPolicy, replay: replay, sharing: sharing)
        finishWhenDropped = { $0.finish(.finished) }
        if case .eagerly = sharing.start.mode { storage.startSharing() }
    }

    /// Creates a broadcast sequence of `Element` values that can fail with `Failure`.
    ///
    /// ```swift
    /// let downloads = BroadcastSequence(of: Data.self, throwing: NetworkError.self,
    ///                                   bufferingPolicy: .bounded(64))
    /// ```
    @inlinable
    public convenience init(
        of: Element.Type = Element.self, throwing: Failure.Type,
        bufferingPolicy: BufferingPolicy = .unbounded, replay: Int = 0
    ) {
        self.init(bufferingPolicy: bufferingPolicy, replay: replay)
    }

    deinit {
        finishWhenDropped(storage)
    }

    // MARK: Producing

    /// Hands `element` to every current subscriber, according to each one's
    /// policy, without waiting. A full `.bounded` subscriber still receives
    /// it (only ``emit(_:)`` waits). After `finish`, delivers nothing and
    /// returns a result with `isFinished == true`.
    /// <!-- restates: SEQ-BOUNDED-NEVER-DROPS -->
    /// <!-- restates: SEQ-COUNT-FINISHED -->
    @inlinable @discardableResult
    public func send(_ element: Element) -> BroadcastSendResult {
        storage.send(element)
    }

    /// Waits while any live `.bounded(n)` subscriber holds `n` or more unread
    /// elements, then delivers like ``send(_:)``.
    /// <!-- restates: SEQ-EMIT-WAITS-WHILE-FULL -->
    ///
    /// Returns at once when there is room. Waiting emitters are served in
    /// arrival order. <!-- restates: SEQ-EMIT-FIFO --> A subscriber that ends releases the emitters waiting on
    /// it; `finish` releases them with an `isFinished` result. <!-- restates: SEQ-EMIT-RELEASED-BY-FINISH -->
    ///
    /// - Throws: `CancellationError` if the task is cancelled while waiting;
    ///   then no subscriber receives the element. <!-- restates: SEQ-EMIT-CANCEL-NONE -->
    @inlinable @discardableResult
    public func emit(_ element: Element) async throws(CancellationError) -> BroadcastSendResult {
        try await storage.emit(element)
    }

    /// Ends the sequence. Each subscriber receives what it already holds,
    /// then `nil`. Only the first `finish` or `finish(throwing:)` counts.
    /// <!-- restates: SEQ-FINISH-FIRST-WINS -->
    @inlinable
    public func finish() {
        storage.finish(.finished)
    }

    /// Ends the sequence with `error`. Each subscriber receives what it
    /// already holds, then throws `error` once, then returns `nil`. Only the
    /// first `finish` or `finish(throwing:)` counts.
    /// <!-- restates: SEQ-FINISH-DRAIN-THEN-END -->
    @inlinable
    public func finish(throwing error: Failure) {
        storage.finish(.failed(error))
    }

    /// The number of subscribers that have not ended.
    ///
    /// After `finish`, a subscriber counts until it has drained its buffer
    /// (one that holds nothing when the sequence finishes leaves at once),
    /// or until it is cancelled or released. <!-- restates: SEQ-FINISH-IDLE-LEAVES -->
    public var subscriberCount: Int { storage.subscriberCount }

    /// Whether `finish()` or `finish(throwing:)` has been called.
    public var isFinished: Bool { storage.isFinished }

    // MARK: Consuming

    /// Registers a subscriber now: every element sent after this returns is
    /// buffered for it, whether or not it is iterated yet.
    /// <!-- restates: SEQ-SUBSCRIBE-REGISTERS -->
    ///
    /// - Parameter bufferingPolicy: This subscriber's policy; `nil` means the
    ///   sequence's default.
    ///
    /// From a cancelled task, or after `finish`, the subscription yields the
    /// replayed elements (if any), then ends (with the sequence's error, if
    /// it failed). <!-- restates: SEQ-UNREGISTERED-SUBSCRIBE -->
    @inlinable
    public func subscribe(bufferingPolicy: BufferingPolicy? = nil) -> Subscription {
        let policy = bufferingPolicy ?? storage.defaultPolicy
        policy.validate(argument: "subscribe(bufferingPolicy:)")
        return Subscription(core: storage.subscribe(policy: policy))
    }

    /// `subscribe().makeAsyncIterator()`: each `for await` loop over the
    /// sequence is its own subscriber, starting when the loop starts.
    /// <!-- restates: SEQ-LOOP-OWN-SUBSCRIBER -->
    @inlinable
    public func makeAsyncIterator() -> Subscription.AsyncIterator {
        subscribe().makeAsyncIterator()
    }
}

extension BroadcastSequence where Failure == Never {
    /// Creates a broadcast sequence that never fails.
    ///
    /// ```swift
    /// let ticks = BroadcastSequence(of: Int.self, bufferingPolicy: .bufferingNewest(1))
    /// ```
    @inlinable
    public convenience init(
        of: Element.Type = Element.self,
        bufferingPolicy: BufferingPolicy = .unbounded, replay: Int = 0
    ) {
        self.init(bufferingPolicy: bufferingPolicy, replay: replay)
    }
}
