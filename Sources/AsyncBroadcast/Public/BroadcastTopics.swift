/// Keyed fan-out: one broadcast per topic, live while it has subscribers.
///
/// Chat rooms, a document's editors, a user's notifications, a symbol's
/// quotes: each topic is its own ``BroadcastSequence``, created when its
/// first subscriber arrives and gone when its last one leaves, with the
/// same subscriptions, policies and guarantees.
///
/// ```swift
/// let rooms = BroadcastTopics<RoomID, ChatMessage, Never>(bufferingPolicy: .bufferingNewest(256))
///
/// let inbox = rooms.subscribe(to: room)          // the room is live from now on
/// Task { for await message in inbox { render(message) } }
///
/// rooms.send(ChatMessage(text: "hi"), to: room)  // every subscriber of `room`, nobody else
/// rooms.finish(topic: room)                      // the room closed: its subscribers drain, then end
/// ```
///
/// A topic is *live* from its first subscriber until its last one leaves
/// (with a listener, until it has been gone `stopAfter`). While it is live it
/// behaves exactly like a ``BroadcastSequence``: every subscriber gets every
/// element sent after it subscribed, through its own buffer and policy, and
/// a new subscriber starts with the topic's replay window. <!-- restates: TOPIC-AS-SEQUENCE --> A send to a topic
/// that is not live delivers to nobody, keeps nothing and reports
/// `delivered == 0`; the replay window lives and dies with the topic. <!-- restates: TOPIC-NOT-LIVE-KEEPS-NOTHING -->
///
/// Nothing sent to a topic after ``subscribe(to:bufferingPolicy:)`` returns
/// is missed by that subscriber, also when the subscribe races the topic's
/// last subscriber leaving, its `stopAfter` running out, or
/// ``finish(topic:)``: the subscriber lands on a topic that stays live, or
/// starts a new one. <!-- restates: TOPIC-SUBSCRIBE-FINISH-RACE --> Topics do not contend with each other: a send costs
/// O(that topic's subscribers), never O(topics), and producers on different
/// topics take different locks. A topic that has gone holds no memory. <!-- restates: TOPIC-GONE-FREED -->
///
/// When the last reference to a `BroadcastTopics` goes away, it finishes
/// (as ``finish()``): no subscriber is left waiting forever. <!-- restates: TOPIC-FINISH-ALL -->
public final class BroadcastTopics<Topic: Hashable & Sendable, Element: Sendable, Failure: Error>: Sendable {
    public typealias BufferingPolicy = BroadcastBufferingPolicy
    /// A subscription to one topic: the same type a ``BroadcastSequence``
    /// gives, with its policies, ``BroadcastSequence/Subscription/droppedCount``,
    /// ``BroadcastSequence/Subscription/bufferedCount`` and
    /// ``BroadcastSequence/Subscription/cancel()``.
    public typealias Subscription = BroadcastSequence<Element, Failure>.Subscription

    @usableFromInline let registry: TopicRegistry<Topic, Element, Failure>

    /// Creates a set of topics, each live while it has subscribers.
    ///
    /// - Parameters:
    ///   - bufferingPolicy: The policy of subscribers that do not pick their
    ///     own in ``subscribe(to:bufferingPolicy:)``.
    ///   - replay: How many of its most recent elements each live topic
    ///     keeps for its new subscribers (see
    ///     ``BroadcastSequence/init(bufferingPolicy:replay:)``).
    ///
    /// A negative `replay` or capacity, or `.bounded(0)`, traps with a
    /// message naming it, in every build configuration. <!-- restates: MISUSE-NEGATIVE-REPLAY -->
    ///
    /// ```swift
    /// let quotes = BroadcastTopics<String, Quote, Never>(bufferingPolicy: .bufferingNewest(1), replay: 1)
    /// ```
    public init(bufferingPolicy: BufferingPolicy = .unbounded, replay: Int = 0) {
        if replay < 0 { misuse("replay must not be negative (got \(replay))") }
        bufferingPolicy.validate(argument: "bufferingPolicy")
        registry = TopicRegistry(defaultPolicy: bufferingPolicy, replay: replay)
    }

    /// Creates a set of topics, each fed by a callback listener while it is
    /// live.
    ///
    /// `register(topic, sink)` is called when `topic` gains its first
    /// subscriber and returns the closure that removes the listener; that
    /// closure runs once the topic's last subscriber has been gone for
    /// `stopAfter` (a subscriber that comes back within it keeps the same
    /// listener), when ``finish(topic:)`` closes the topic, when the
    /// listener itself ends the topic (``BroadcastSink/finish()``), or when
    /// everything finishes. <!-- restates: TOPIC-REGISTER-LIFECYCLE --> A topic's `register` never runs at the same time
    /// as its previous unregister: a restart waits until the previous
    /// unregister has returned. Neither runs while the library holds a lock. <!-- restates: TOPIC-REGISTER-ALTERNATE -->
    ///
    /// ```swift
    /// // One PostgreSQL LISTEN per channel that has clients, dropped 5 s after the last one leaves.
    /// let channels = BroadcastTopics<String, Notification, Never>(stopAfter: .seconds(5)) { channel, sink in
    ///     let listener = database.listen(on: channel) { sink.send($0) }
    ///     return { listener.stop() }
    /// }
    /// ```
    ///
    /// Elements the listener sends while its topic has no subscriber (during
    /// `stopAfter`) reach only the replay window. <!-- restates: TOPIC-STOPAFTER-REPLAY-ONLY --> A negative `stopAfter`
    /// traps with a message naming it.
    @available(macOS 13, iOS 16, tvOS 16, watchOS 9, *)
    public convenience init(
        bufferingPolicy: BufferingPolicy = .unbounded, replay: Int = 0, stopAfter: Duration = .zero,
        register: @escaping @Sendable (_ topic: Topic, _ sink: BroadcastSink<Element, Failure>) -> @Sendable () -> Void
    ) {
        self.init(
            bufferingPolicy: bufferingPolicy, replay: replay,
            started: .whileSubscribed(stopAfter: stopAfter), register: register)
    }

    /// The listener form with the delay's clock given (tests drive a manual one).
    @available(macOS 13, iOS 16, tvOS 16, watchOS 9, *)
    @_spi(Testing)
    public convenience init<C: Clock>(
        bufferingPolicy: BufferingPolicy = .unbounded, replay: Int = 0, stopAfter: C.Duration, clock: C,
        register: @escaping @Sendable (_ topic: Topic, _ sink: BroadcastSink<Element, Failure>) -> @Sendable () -> Void
    ) {
        self.init(
            bufferingPolicy: bufferingPolicy, replay: replay,
            started: .whileSubscribed(stopAfter: stopAfter, clock: clock), register: register)
    }

    convenience init(
        bufferingPolicy: BufferingPolicy, replay: Int, started: BroadcastStart,
        register: @escaping @Sendable (_ topic: Topic, _ sink: BroadcastSink<Element, Failure>) -> @Sendable () -> Void
    ) {
        self.init(bufferingPolicy: bufferingPolicy, replay: replay, started: started, source: .register(register))
    }

    init(
        bufferingPolicy: BufferingPolicy, replay: Int, started: BroadcastStart,
        source: TopicRegistry<Topic, Element, Failure>.Listener.Source
    ) {
        if replay < 0 { misuse("replay must not be negative (got \(replay))") }
        bufferingPolicy.validate(argument: "bufferingPolicy")
        registry = TopicRegistry(defaultPolicy: bufferingPolicy, replay: replay, start: started, source: source)
    }

    deinit {
        registry.finishAll(.finished)
    }

    // MARK: Consuming

    /// Registers a subscriber of `topic` now, making the topic live if it
    /// was not: every element sent to `topic` after this returns is buffered
    /// for it, whether or not it is iterated yet.
    /// <!-- restates: TOPIC-AS-SEQUENCE -->
    ///
    /// ```swift
    /// let subscription = rooms.subscribe(to: room, bufferingPolicy: .bounded(64))
    /// for await message in subscription { try await socket.write(message) }
    /// ```
    ///
    /// - Parameters:
    ///   - topic: The topic to follow.
    ///   - bufferingPolicy: This subscriber's policy; `nil` means the
    ///     default given at creation.
    ///
    /// From a cancelled task the subscription yields the topic's replay
    /// window (if the topic is live), then ends; it does not make the topic
    /// live. <!-- restates: TOPIC-CANCELLED-NOT-LIVE --> After ``finish()`` it ends at once (with the error, after
    /// ``finish(throwing:)``).
    @inlinable
    public func subscribe(to topic: Topic, bufferingPolicy: BufferingPolicy? = nil) -> Subscription {
        let policy = bufferingPolicy ?? registry.defaultPolicy
        policy.validate(argument: "subscribe(to:bufferingPolicy:)")
        return Subscription(core: registry.subscribe(to: topic, policy: policy))
    }

    // MARK: Producing

    /// Hands `element` to every current subscriber of `topic`, according to
    /// each one's policy, without waiting, as ``BroadcastSequence/send(_:)``
    /// does. A topic that is not live gets nothing and keeps nothing:
    /// `delivered == 0`.
    /// <!-- restates: TOPIC-NOT-LIVE-KEEPS-NOTHING -->
    ///
    /// ```swift
    /// let result = rooms.send(message, to: room)
    /// if result.delivered == 0 { /* nobody is in the room */ }
    /// ```
    ///
    /// After ``finish()`` it delivers nothing and returns a result with
    /// `isFinished == true`.
    @inlinable @discardableResult
    public func send(_ element: Element, to topic: Topic) -> BroadcastSendResult {
        registry.send(element, to: topic)
    }

    /// Sends each element to `topic` in order, as consecutive
    /// ``send(_:to:)`` calls would, in one step: no other producer's element
    /// lands in between (see ``BroadcastSequence/send(contentsOf:)``). The
    /// result sums the counts over the elements.
    /// <!-- restates: SEQ-BATCH-ATOMIC -->
    ///
    /// ```swift
    /// rooms.send(contentsOf: history, to: room)
    /// ```
    @inlinable @discardableResult
    public func send<S: Sequence>(contentsOf elements: S, to topic: Topic) -> BroadcastSendResult
    where S.Element == Element {
        if let result = elements.withContiguousStorageIfAvailable({ registry.send(batch: $0, to: topic) }) {
            return result
        }
        return ContiguousArray(elements).withUnsafeBufferPointer { registry.send(batch: $0, to: topic) }
    }

    /// Waits while any `.bounded(n)` subscriber of `topic` holds `n` or more
    /// unread elements, then delivers like ``send(_:to:)`` (see
    /// ``BroadcastSequence/emit(_:)``). A topic that is not live gets
    /// nothing, at once.
    /// <!-- restates: TOPIC-NOT-LIVE-KEEPS-NOTHING -->
    ///
    /// ```swift
    /// try await rooms.emit(message, to: room)   // slows down to the slowest .bounded member
    /// ```
    ///
    /// - Throws: `CancellationError` if the task is cancelled while waiting;
    ///   then no subscriber receives the element. <!-- restates: SEQ-EMIT-CANCEL-NONE -->
    @inlinable @discardableResult
    public func emit(_ element: Element, to topic: Topic) async throws(CancellationError) -> BroadcastSendResult {
        try await registry.emit(element, to: topic)
    }

    // MARK: Finishing

    /// Closes `topic`: its current subscribers receive what they hold, then
    /// `nil`; with a listener, its unregister closure runs now (not after
    /// `stopAfter`). The topic is no longer live and its replay window is
    /// gone; the next ``subscribe(to:bufferingPolicy:)`` starts it afresh
    /// (with a listener: a new `register` call, once the unregister has
    /// returned).
    /// <!-- restates: TOPIC-FINISH-ONE -->
    ///
    /// ```swift
    /// rooms.finish(topic: room)   // the room closed
    /// ```
    @inlinable
    public func finish(topic: Topic) {
        registry.finish(topic: topic)
    }

    /// Ends every topic and refuses new ones: each subscriber receives what
    /// it holds, then `nil`; later subscribers end at once; later sends
    /// deliver nothing and report `isFinished`. Only the first `finish()` or
    /// `finish(throwing:)` counts.
    /// <!-- restates: TOPIC-FINISH-ALL -->
    public func finish() {
        registry.finishAll(.finished)
    }

    /// Ends every topic with `error`: each subscriber receives what it
    /// holds, then throws `error` once, then returns `nil`; later
    /// subscribers throw it at once. Only the first `finish()` or
    /// `finish(throwing:)` counts.
    /// <!-- restates: TOPIC-FINISH-ALL -->
    public func finish(throwing error: Failure) {
        registry.finishAll(.failed(error))
    }

    // MARK: Queries

    /// The subscribers of `topic` that have not ended; 0 if it is not live.
    @inlinable
    public func subscriberCount(of topic: Topic) -> Int {
        registry.subscriberCount(of: topic)
    }

    /// How many topics are live now (a listener's topic counts during its
    /// `stopAfter`). O(shards), not O(topics).
    public var topicCount: Int {
        registry.topicCount
    }

    /// Whether ``finish()`` or ``finish(throwing:)`` has been called.
    public var isFinished: Bool {
        registry.isFinished
    }
}
