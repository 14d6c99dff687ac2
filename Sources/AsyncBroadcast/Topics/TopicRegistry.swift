internal import _CAtomics  // `cab_processor_count`

/// The topics of a `BroadcastTopics`: one sequence (a *generation*) per
/// live topic, in shards so that topics do not contend.
///
/// ## Lifetime of a topic
///
/// | state | `live[topic]` | `retiring[topic]` | how it is left |
/// |---|---|---|---|
/// | **absent** | – | – | `subscribe(to:)` → *live* (a new generation) |
/// | **live** | the generation | – | its last subscriber leaves (and, with a listener, its run has stopped after `stopAfter`) → *absent*; `finish(topic:)` or its listener's `sink.finish()` → *absent* or *stopping* |
/// | **stopping** (listener form) | – or a new generation, not started | finished generations whose run has not stopped | their unregister closures return → *absent*, or the new generation starts → *live* |
///
/// The rules that make it safe:
/// - A generation is made live, reserved by a subscribe and taken out of
///   `live` only under its shard's lock. It is retired as idle only after
///   it has finished itself because it was idle (no subscriber, nothing
///   running, starting, stopping or lingering), checked under its sequence
///   lock with no shard lock held. A subscribe registers under the sequence
///   lock too, so it either lands on a generation that stays live, or finds
///   it finished and starts again: it never returns a subscriber of a
///   generation being dropped.
/// - No shard lock is held while a sequence lock is taken (`ShardLock`
///   checks it under the internal checks).
/// - Sends look the generation up under the shard lock and send outside it;
///   a send that raced a retirement finds its generation finished and
///   reports nothing delivered.
/// - A new generation of a topic whose previous ones are still stopping
///   (listener form) is created with its start blocked, and started when
///   the last of them has stopped: a topic's `register` never overlaps its
///   previous unregister.
/// - Nothing here runs user code or resumes a continuation while holding a
///   shard lock: follow-ups (a `register` call, a listener's start) run
///   after it is released, and a retired generation is released outside it
///   (its replay elements' deinitializers run there).
///
/// A generation tells the registry when it may have become idle or stopped
/// (`BroadcastStorage.topicObserver`); the registry rechecks under its
/// locks, so a stale or repeated notice does nothing.
@usableFromInline
final class TopicRegistry<Topic: Hashable & Sendable, Element: Sendable, Failure: Error>: @unchecked Sendable {
    @usableFromInline typealias Storage = BroadcastStorage<Element, Failure>

    /// A listener's `register`, and how long a topic outlives its last
    /// subscriber.
    @usableFromInline
    struct Listener: Sendable {
        @usableFromInline let start: BroadcastStart
        @usableFromInline let source: Source
        /// Counts a run in `activity` when a generation decides to start it.
        @usableFromInline let startDecided: @Sendable () -> Void

        /// A callback listener, or an asynchronous one.
        @usableFromInline
        enum Source: Sendable {
            case register(@Sendable (Topic, BroadcastSink<Element, Failure>) -> @Sendable () -> Void)
            case listen(@Sendable (Topic, BroadcastSink<Element, Failure>) async -> @Sendable () async -> Void)
        }

        /// Wraps the user's closures so that `activity` counts what runs.
        init(start: BroadcastStart, source: Source, activity: ListenerActivity) {
            self.start = start
            self.startDecided = { activity.enter() }
            switch source {
            case .register(let register): self.source = .register(activity.counting(register))
            case .listen(let listen): self.source = .listen(activity.counting(listen))
            }
        }

        /// What feeds `topic`'s sequence.
        @inlinable
        func sharedSource(for topic: Topic) -> SharedSource<Element, Failure> {
            switch source {
            case .register(let register): return .listener { sink in register(topic, sink) }
            case .listen(let listen): return .asyncListener { sink in await listen(topic, sink) }
            }
        }
    }

    /// What every generation's notice reaches the registry through: one per
    /// registry, held weakly, so a generation that outlives the registry
    /// (its subscribers still draining) finds nobody to tell.
    @usableFromInline
    final class Handle: @unchecked Sendable {
        @usableFromInline weak var registry: TopicRegistry?
        @usableFromInline init() {}
    }

    /// One shard: its lock and the topics that hash to it.
    @usableFromInline
    final class Shard: @unchecked Sendable {
        @usableFromInline let lock = ShardLock()
        /// The live generation of each topic (guarded by `lock`).
        @usableFromInline var live: [Topic: Storage] = [:]
        /// Finished generations whose run has not stopped yet (listener
        /// form only; guarded by `lock`).
        @usableFromInline var retiring: [Topic: [Storage]] = [:]
        /// `finish()` has run over this shard (guarded by `lock`).
        @usableFromInline var isFinished = false

        @usableFromInline init() {}
        deinit { lock.destroy() }
    }

    @usableFromInline let shards: [Shard]
    @usableFromInline let shardMask: Int
    @usableFromInline let defaultPolicy: BroadcastBufferingPolicy
    @usableFromInline let replay: Int
    @usableFromInline let listener: Listener?
    /// Set once, by the first `finish`: 1 after it began.
    @usableFromInline let finishedFlag = AtomicInt(0)
    /// The sequence new subscribers get after `finish` (guarded by `endLock`).
    @usableFromInline var ended: Storage?
    @usableFromInline let endLock = Lock()
    @usableFromInline let handle = Handle()
    /// What `listenersStopped()` waits for.
    let activity: ListenerActivity
    /// Tests only (`_runAfterSubscribeUnlocks`): runs in `subscribe(to:)`
    /// right after its shard lock is released, where another thread's send,
    /// subscribe or finish can come in. Set before the registry is shared.
    @usableFromInline nonisolated(unsafe) var afterSubscribeUnlock: (@Sendable () -> Void)?
    /// Tests only (`_runBetweenNoticePhases`): runs in `generationChanged`
    /// after it has asked its generation (idle? stopped?) and before it
    /// acts on the answers under the shard lock. Set before the registry is
    /// shared.
    @usableFromInline nonisolated(unsafe) var betweenNoticePhases: (@Sendable (_ retiredAsIdle: Bool) -> Void)?

    @usableFromInline
    init(
        defaultPolicy: BroadcastBufferingPolicy, replay: Int, start: BroadcastStart? = nil,
        source: Listener.Source? = nil
    ) {
        self.defaultPolicy = defaultPolicy
        self.replay = replay
        let activity = ListenerActivity()
        self.activity = activity
        if let start, let source {
            self.listener = Listener(start: start, source: source, activity: activity)
        } else {
            self.listener = nil
        }
        let count = Self.shardCount
        shards = (0..<count).map { _ in Shard() }
        shardMask = count - 1
        handle.registry = self
    }

    deinit {
        finishedFlag.destroy()
        endLock.destroy()
    }

    /// A power of two, at least 64 and four per core: two producers on
    /// different topics rarely share a shard's lock.
    static var shardCount: Int {
        let wanted = Swift.max(64, 4 * Int(cab_processor_count()))
        return 1 << (Int.bitWidth - (wanted - 1).leadingZeroBitCount)
    }

    @inlinable
    func shard(for topic: Topic) -> Shard {
        shards[topic.hashValue & shardMask]
    }

    @inlinable var isFinished: Bool { finishedFlag.loadAcquire() != 0 }

    // MARK: Generations

    // The lifecycle below is inlinable: a client's specialization then
    // creates, retires and checks generations without a generic metadata
    // lookup per call (unspecialized, they took about 40 % of a
    // subscribe-to-a-new-topic + cancel cycle).

    /// A new sequence for `topic` (shard lock held). Its notices capture the
    /// registry's handle and the topic: one small context per topic.
    @inlinable
    func makeGeneration(for topic: Topic, startBlocked: Bool) -> Storage {
        let handle = handle
        let observer: @Sendable (Storage) -> Void = { storage in
            handle.registry?.generationChanged(storage, topic: topic)
        }
        guard let listener else {
            return Storage(defaultPolicy: defaultPolicy, replay: replay, topicObserver: observer)
        }
        let sharing = Sharing<Element, Failure>(
            start: listener.start, source: listener.sharedSource(for: topic),
            startDecided: listener.startDecided)
        return Storage(
            defaultPolicy: defaultPolicy, replay: replay, sharing: sharing,
            startBlocked: startBlocked, topicObserver: observer)
    }

    /// The live generation of `topic` for a subscriber (shard lock held):
    /// the current one, or a new one if there is none or it has finished
    /// (its listener ended it). Returns a finished generation to look at
    /// once the lock is released.
    @inlinable
    func generationForSubscriber(_ topic: Topic, in shard: Shard) -> (Storage, retired: Storage?) {
        var retired: Storage? = nil
        if let current = shard.live[topic] {
            guard current.hasFinished else { return (current, nil) }
            retired = current
            if current.retiredWhileIdle {
                // Its last notice finished it as idle and will take it out
                // of `live`: nothing of it runs, so the new generation does
                // not wait for it (its `register` runs in this subscribe).
                shard.live[topic] = nil
            } else {
                retire(current, topic, in: shard)
            }
        }
        let stopping = !(shard.retiring[topic]?.isEmpty ?? true)
        let fresh = makeGeneration(for: topic, startBlocked: stopping && !Fault.topicStartsUnblocked)
        shard.live[topic] = fresh
        return (fresh, retired)
    }

    /// Takes `storage`, `topic`'s live generation, out of `live`; a
    /// listener's, whose run may still be stopping, waits in `retiring`
    /// until it has (shard lock held).
    @inlinable
    func retire(_ storage: Storage, _ topic: Topic, in shard: Shard) {
        shard.live[topic] = nil
        if listener != nil { shard.retiring[topic, default: []].append(storage) }
    }

    /// The notice of a generation (see `BroadcastStorage.topicObserver`):
    /// retires it if it is live and idle; clears it from `retiring` once its
    /// run has stopped, and then starts the topic's next generation.
    ///
    /// The generation is asked (under its sequence lock) with no shard lock
    /// held, and the registry acts on the answers under the shard lock
    /// afterwards: a shard lock is never held while waiting for a sequence
    /// lock (a send to a thousand subscribers), which would hold up every
    /// topic of the shard. Acting on an answer after the sequence lock is
    /// released is safe because each answer acted on is final:
    /// - retired: this notice finished the generation itself, so it is
    ///   finished whatever happens next. A subscribe that reserved it in
    ///   between finds it finished when it registers and starts again
    ///   (`subscribe(to:)`), as after a listener's `sink.finish()`; one
    ///   that found it finished in `live` retires it itself.
    /// - finished, and a run stopped: never undone (a finished generation
    ///   starts no run).
    /// - busy, or a run not stopped yet: what ends them (a last cancel, a
    ///   subscribe's end, a run's stop) sends another notice.
    @inlinable
    func generationChanged(_ storage: Storage, topic: Topic) {
        let shard = shard(for: topic)
        if Fault.topicRetiresUnderShardLock { return generationChangedUnderShardLock(storage, topic: topic) }
        // A generation a subscribe has reserved is busy: that subscribe
        // looks again when it is done. (One reserved after this look may be
        // retired all the same: its registration then finds it finished
        // and starts again.)
        let candidate = shard.lock.withLock { shard.live[topic] === storage && storage.pendingSubscribes == 0 }
        let retirement = candidate ? storage.retireIfIdle() : nil
        // Whether its run has stopped matters only for a generation that is
        // or may go into `retiring`: not for one this notice retired as idle
        // (never there), nor for one it found busy (if a subscribe retires it
        // meanwhile, that subscribe sends the notice that looks).
        let stopped: Bool
        switch retirement {
        case .retired?, .busy?: stopped = false
        case .finished?, nil: stopped = storage.runHasStopped
        }
        if let hook = betweenNoticePhases {
            if case .retired? = retirement { hook(true) } else { hook(false) }
        }
        var unblock: Storage? = nil
        var release: Storage? = nil
        var movedToRetiring = false
        shard.lock.withLock {
            if shard.live[topic] === storage {
                if Fault.topicRetiresBusy {
                    release = shard.live.removeValue(forKey: topic)
                    return
                }
                switch retirement {
                case nil, .busy?:
                    return
                case .retired?:
                    // Nothing runs or stops any more: it does not wait in
                    // `retiring`.
                    release = shard.live.removeValue(forKey: topic)
                    return
                case .finished?:
                    // Its listener ended it: out of `live`, and waiting in
                    // `retiring` until its run has stopped (checked below).
                    retire(storage, topic, in: shard)
                    movedToRetiring = listener != nil
                }
            }
            guard stopped, var stopping = shard.retiring[topic],
                let index = stopping.firstIndex(where: { $0 === storage })
            else { return }
            release = stopping.remove(at: index)
            if stopping.isEmpty {
                shard.retiring[topic] = nil
                unblock = shard.live[topic]
            } else {
                shard.retiring[topic] = stopping
            }
        }
        unblock?.unblockStart()
        withExtendedLifetime(release) {}
        // Its run stopped after `stopped` was read, and that stop's notice
        // found it still live (reserved by a subscribe, so not looked at):
        // nobody else would take it out of `retiring`. Once out of `live`,
        // a later stop's notice finds it there.
        if movedToRetiring && !stopped && storage.runHasStopped { generationChanged(storage, topic: topic) }
    }

    /// `TOPIC_RETIRES_UNDER_SHARD_LOCK`: the notice as it was, asking the
    /// generation under the shard lock (the internal checks trap).
    @inlinable
    func generationChangedUnderShardLock(_ storage: Storage, topic: Topic) {
        let shard = shard(for: topic)
        var release: Storage? = nil
        shard.lock.withLock {
            guard shard.live[topic] === storage, storage.pendingSubscribes == 0 else { return }
            if case .retired = storage.retireIfIdle() { release = shard.live.removeValue(forKey: topic) }
        }
        withExtendedLifetime(release) {}
    }

    // MARK: Subscribing

    /// A subscriber of `topic`'s live generation (created if needed).
    ///
    /// The shard lock only picks (or creates) the generation and reserves
    /// it (`pendingSubscribes`): the registration itself takes the
    /// generation's sequence lock after the shard lock is released, so a
    /// subscribe never waits for a sequence lock (a long send) while other
    /// topics of its shard wait for it. A notice that finds a generation
    /// reserved leaves it alone (`generationChanged`); one that looked
    /// before the reservation may still retire it, and the registration
    /// then finds it finished and starts again.
    ///
    /// Two rules close the windows between the shard lock and the return:
    /// - A subscribe from a cancelled task (decided once, here) never
    ///   creates a generation: with none live it gets a subscriber that ends
    ///   at once. A generation stored as live for it and retired only after
    ///   the lock was released would take sends into its replay window
    ///   meanwhile, for a real subscriber arriving then to start with.
    /// - The subscribe completes under the shard lock, after its follow-up
    ///   (a listener's `register`) has run: if a `finish(topic:)` retired its
    ///   generation meanwhile (before or after the registration), the
    ///   subscriber is let go unseen and the subscribe starts again on the
    ///   live generation. So a subscribe never
    ///   returns a subscriber that a `finish(topic:)` which began before its
    ///   return has ended; one that takes the shard lock after this check
    ///   ends it as it ends every subscriber of the topic. A generation its
    ///   own listener ended (`sink.finish()`, even inside this subscribe's
    ///   `register`) keeps the subscriber: it drains and ends, as the
    ///   listener asked (starting again would call `register` forever).
    ///   A subscriber that did not register (its generation had finished)
    ///   starts again at once: the next subscriber starts the topic afresh.
    @inlinable
    func subscribe(
        to topic: Topic, policy: BroadcastBufferingPolicy,
        eviction: SubscriberEviction? = nil
    ) -> SubscriberCore<Element, Failure> {
        let shard = shard(for: topic)
        let fromCancelledTask = Task.isCancelled
        var eviction = eviction
        while true {
            shard.lock.lock()
            if shard.isFinished {
                shard.lock.unlock()
                return endedSubscriber(policy: policy)
            }
            let reserved: Storage?
            var retired: Storage? = nil
            let cancelledPath = fromCancelledTask && !Fault.cancelledSubscribeGoesLive
            if cancelledPath {
                // The live generation's replay window, then the end.
                reserved = shard.live[topic].flatMap { $0.hasFinished ? nil : $0 }
            } else {
                let generation = generationForSubscriber(topic, in: shard)
                reserved = generation.0
                retired = generation.retired
            }
            reserved?.pendingSubscribes += 1
            shard.lock.unlock()
            guard let storage = reserved else {
                afterSubscribeUnlock?()
                return cancelledSubscriber(policy: policy)
            }
            let (subscriber, registered, followUp) = storage.subscribeDeferringFollowUp(
                policy: policy, eviction: eviction, fromCancelledTask: fromCancelledTask)
            afterSubscribeUnlock?()
            if !cancelledPath, let followUp, !followUp.isEmpty { storage.apply(followUp) }
            if let retired { generationChanged(retired, topic: topic) }
            shard.lock.lock()
            storage.pendingSubscribes -= 1
            let finishedAsTopic = storage.finishedAsTopic
            // A notice that found it busy only for the reservation was not
            // acted on; a generation made for a subscriber that did not
            // register (a cancelled task under the fault, or one its
            // listener finished meanwhile) may be idle or stopped.
            let recheck = storage.pendingSubscribes == 0 && (!registered || storage.subscriberCount == 0)
            shard.lock.unlock()
            if recheck { generationChanged(storage, topic: topic) }
            if fromCancelledTask || Fault.subscribeIgnoresFinish { return subscriber }
            if registered && !finishedAsTopic { return subscriber }
            // Finished before this subscribe completed: let it go (what it
            // held was sent before the return, which a subscriber may miss)
            // and join the topic's live generation, or start one.
            subscriber.cancel()
            eviction = eviction?.renewed()
        }
    }

    /// A subscribe from a cancelled task to a topic that is not live: a
    /// subscriber that ends at once, of a sequence no registry holds.
    @inlinable
    func cancelledSubscriber(policy: BroadcastBufferingPolicy) -> SubscriberCore<Element, Failure> {
        makeEndedStorage(.finished).subscribeDeferringFollowUp(policy: policy, fromCancelledTask: true).subscriber
    }

    /// A finished sequence that no registry holds, for subscribers that end
    /// at once. With a listener it is a listener's sequence that never
    /// starts: its subscribers' `upstreamReady()` is `false`, not the plain
    /// `true`.
    @inlinable
    func makeEndedStorage(_ event: BroadcastState<Element, Failure>.Terminal) -> Storage {
        let sharing = listener.map { _ in Sharing<Element, Failure>(start: .lazily, source: .listener { _ in {} }) }
        let storage = Storage(defaultPolicy: defaultPolicy, replay: 0, sharing: sharing)
        storage.finish(event)
        return storage
    }

    /// After `finish`: a subscriber that ends at once, with the end.
    @inlinable
    func endedSubscriber(policy: BroadcastBufferingPolicy) -> SubscriberCore<Element, Failure> {
        // Set before any shard is marked finished.
        guard let storage = endLock.withLock({ ended }) else {
            internalInconsistency("a finished topic shard without the ended sequence")
        }
        return storage.subscribeDeferringFollowUp(policy: policy).subscriber
    }

    // MARK: Sending

    /// `topic`'s live generation, if any.
    @inlinable
    func liveGeneration(_ topic: Topic) -> Storage? {
        let shard = shard(for: topic)
        shard.lock.lock()
        let storage = shard.live[topic]
        shard.lock.unlock()
        return storage
    }

    /// What a send to a topic that is not live reports.
    @inlinable
    var notLive: BroadcastSendResult { isFinished ? .finished : BroadcastSendResult() }

    @inlinable
    func send(_ element: Element, to topic: Topic, replayable: Bool = true) -> BroadcastSendResult {
        guard let storage = liveGeneration(topic) else { return notLive }
        let result = storage.send(element, replayable: replayable)
        // Retired meanwhile: the topic was not live when the send took effect.
        return result.isFinished ? notLive : result
    }

    @inlinable
    func send(batch: UnsafeBufferPointer<Element>, to topic: Topic) -> BroadcastSendResult {
        guard let storage = liveGeneration(topic) else { return notLive }
        let result = storage.send(batch: batch)
        return result.isFinished ? notLive : result
    }

    @inlinable
    func emit(_ element: Element, to topic: Topic) async throws(CancellationError) -> BroadcastSendResult {
        guard let storage = liveGeneration(topic) else { return notLive }
        let result = try await storage.emit(element)
        return result.isFinished ? notLive : result
    }

    // MARK: Finishing

    /// `finish(topic:)`: the live generation ends (its subscribers drain,
    /// then end; its listener is unregistered); the next subscriber starts
    /// a new one.
    @inlinable
    func finish(topic: Topic) {
        let shard = shard(for: topic)
        let storage: Storage? = shard.lock.withLock {
            guard let storage = shard.live[topic] else { return nil }
            retire(storage, topic, in: shard)
            storage.finishedAsTopic = true
            return storage
        }
        guard let storage else { return }
        storage.finish(.finished)
        generationChanged(storage, topic: topic)
    }

    /// `finish()` / `finish(throwing:)`: every topic ends; later subscribers
    /// end at once, later sends deliver nothing. The first call wins.
    @usableFromInline
    func finishAll(_ event: BroadcastState<Element, Failure>.Terminal) {
        let first: Bool = endLock.withLock {
            guard ended == nil else { return false }
            ended = makeEndedStorage(event)
            finishedFlag.storeRelease(1)
            return true
        }
        guard first else { return }
        for shard in shards {
            let (live, retiring): ([Storage], [Storage]) = shard.lock.withLock {
                shard.isFinished = true
                defer {
                    shard.live = [:]
                    shard.retiring = [:]
                }
                return (Array(shard.live.values), shard.retiring.values.flatMap { $0 })
            }
            for storage in live { storage.finish(event) }
            withExtendedLifetime(retiring) {}
        }
    }

    // MARK: Queries

    @inlinable
    func subscriberCount(of topic: Topic) -> Int {
        liveGeneration(topic)?.subscriberCount ?? 0
    }

    @usableFromInline
    var topicCount: Int {
        shards.reduce(0) { total, shard in total + shard.lock.withLock { shard.live.count } }
    }
}
