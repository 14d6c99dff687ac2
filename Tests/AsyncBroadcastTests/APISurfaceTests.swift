import AsyncBroadcast
import Testing

/// Compiles every declaration of the public contract with its exact signature, so
/// a rename, a dropped default argument or a changed type fails the build.
/// Each line is a typed reference or a call spelled as the contract spells it.
@Suite struct APISurfaceTests {
    struct NetworkError: Error {}

    @Test func everyDeclarationHasItsContractSignature() async throws {
        // BroadcastBufferingPolicy: Sendable, Hashable, four cases.
        let policies: [BroadcastBufferingPolicy] = [.unbounded, .bufferingOldest(1), .bufferingNewest(1), .bounded(1)]
        #expect(Set(policies).count == 4)
        requireSendableHashable(BroadcastBufferingPolicy.self)

        // BroadcastSendResult: three stored properties.
        var result = BroadcastSendResult()
        result.delivered = 1
        result.dropped = 2
        result.isFinished = false
        requireSendableHashable(BroadcastSendResult.self)

        // The initializers, spelled as the contract's usage line.
        let a = BroadcastSequence<Int, Never>()
        let b = BroadcastSequence(of: Int.self)
        let c = BroadcastSequence(of: [UInt8].self, throwing: NetworkError.self, bufferingPolicy: .bounded(64))
        let d = BroadcastSequence<Void, any Error>(replay: 1)
        let e = BroadcastSequence<Int, NetworkError>(bufferingPolicy: .unbounded, replay: 0)
        let _: BroadcastSequence<Int, Never>.BufferingPolicy = .unbounded
        requireAsyncSequence(a)
        requireSendable(a)

        // Producer side.
        let send: (Int) -> BroadcastSendResult = b.send
        let emit: (Int) async throws(CancellationError) -> BroadcastSendResult = b.emit
        let finish: () -> Void = b.finish
        let finishThrowing: (NetworkError) -> Void = e.finish(throwing:)
        let count: Int = b.subscriberCount
        let finished: Bool = b.isFinished
        _ = (send, emit, finish, finishThrowing, count, finished)

        // Consumer side.
        let subscription: BroadcastSequence<Int, Never>.Subscription = b.subscribe(bufferingPolicy: nil)
        let defaulted = b.subscribe()
        var iterator: BroadcastSequence<Int, Never>.Subscription.AsyncIterator = subscription.makeAsyncIterator()
        var loopIterator: BroadcastSequence<Int, Never>.AsyncIterator = b.makeAsyncIterator()
        requireAsyncSequence(subscription)
        requireSendable(subscription)
        let dropped: Int = subscription.droppedCount
        let buffered: Int = subscription.bufferedCount  // v3
        _ = (dropped, buffered)

        _ = b.send(7)
        let first: Int? = await iterator.next()
        #expect(first == 7)
        let throwingSubscription = e.subscribe()
        var throwingIterator = throwingSubscription.makeAsyncIterator()
        e.finish(throwing: NetworkError())
        do throws(NetworkError) {
            _ = try await throwingIterator.next(isolation: nil)
            Issue.record("expected the typed error")
        } catch {
            // `error` is statically a NetworkError: typed throws(Failure).
            let typed: NetworkError = error
            _ = typed
        }
        subscription.cancel()
        defaulted.cancel()
        b.finish()
        #expect(await loopIterator.next() == 7)  // its own subscriber since makeAsyncIterator()
        #expect(await loopIterator.next() == nil)
        _ = (c, d)
    }

    @Test func everyLagAndEvictionDeclarationHasItsContractSignature() async throws {  // v5, A and B
        // BroadcastEvent: Sendable; Equatable/Hashable when Element is.
        let events: [BroadcastEvent<Int>] = [.element(1), .lagged(2)]
        #expect(Set(events).count == 2)
        requireSendableHashable(BroadcastEvent<Int>.self)

        let sequence = BroadcastSequence(of: Int.self, throwing: NetworkError.self)
        let subscription = sequence.subscribe(bufferingPolicy: .bufferingOldest(1))
        let view: BroadcastSequence<Int, NetworkError>.Subscription.Events = subscription.events
        requireAsyncSequence(view)
        requireSendable(view)
        var iterator: BroadcastSequence<Int, NetworkError>.Subscription.Events.AsyncIterator = view.makeAsyncIterator()
        sequence.send(1)
        sequence.send(2)
        let first: BroadcastEvent<Int>? = try await iterator.next()
        #expect(first == .element(1))
        let second: BroadcastEvent<Int>? = try await iterator.next(isolation: nil)
        #expect(second == .lagged(1))
        sequence.finish()
        var batch: [BroadcastEvent<Int>] = []
        let read: Int = try await iterator.next(upTo: 4, into: &batch)
        #expect(read == 0)

        // BroadcastEviction: Sendable, Hashable; four ways to make one.
        requireSendableHashable(BroadcastEviction.self)
        let limits: [BroadcastEviction] = [.never, .hardLimit(1), .softLimit(1, for: .seconds(1)),
                                           .limits(hard: 2, soft: 1, for: .seconds(1))]
        #expect(Set(limits).count == 4)
        let plain = BroadcastSequence(of: Int.self)
        let evicting: BroadcastSequence<Int, Never>.Subscription = plain.subscribe(bufferingPolicy: nil, eviction: .hardLimit(1))
        let defaulted = plain.subscribe(eviction: .never)
        let topics = BroadcastTopics<String, Int, Never>()
        let member: BroadcastTopics<String, Int, Never>.Subscription = topics.subscribe(to: "a", bufferingPolicy: nil, eviction: .hardLimit(1))
        let defaultedMember = topics.subscribe(to: "a", eviction: .never)
        let isEvicted: Bool = evicting.isEvicted
        #expect(!isEvicted && !defaulted.isEvicted && !member.isEvicted && !defaultedMember.isEvicted)
        var result = BroadcastSendResult()
        result.evicted = 1
        let evicted: Int = result.evicted
        #expect(evicted == 1)
    }

    @Test func everyValueDeclarationHasItsContractSignature() async throws {
        let a = BroadcastValue(1)
        let b = BroadcastValue(1, throwing: NetworkError.self)
        let c = BroadcastValue<String, any Error>("x", throwing: (any Error).self)
        requireAsyncSequence(a)
        requireSendable(a)
        let _: BroadcastValue<Int, Never>.Element.Type = Int.self
        let current: Int = a.value
        let send: (Int) -> Void = a.send
        let updated: Int = a.update { (value: inout Int) -> Int in value += 1; return value }
        a.update { $0 += 1 }  // discardable
        do throws(NetworkError) {
            try b.update { (_: inout Int) throws(NetworkError) -> Void in throw NetworkError() }
            Issue.record("expected the typed error")
        } catch {
            let typed: NetworkError = error
            _ = typed
        }
        let finish: () -> Void = a.finish
        let finishThrowing: (NetworkError) -> Void = b.finish(throwing:)
        let count: Int = a.subscriberCount
        let finished: Bool = a.isFinished
        _ = (current, send, updated, finish, finishThrowing, count, finished, c)

        let subscription: BroadcastValue<Int, Never>.Subscription = a.subscribe()
        requireAsyncSequence(subscription)
        requireSendable(subscription)
        var iterator: BroadcastValue<Int, Never>.Subscription.AsyncIterator = subscription.makeAsyncIterator()
        var loopIterator: BroadcastValue<Int, Never>.AsyncIterator = a.makeAsyncIterator()
        #expect(await iterator.next() == 3)
        a.send(4)
        #expect(await iterator.next(isolation: nil) == 4)
        #expect(await loopIterator.next() == 4)
        subscription.cancel()
        #expect(await iterator.next() == nil)
        a.finish()
        #expect(await loopIterator.next() == nil)

        var throwingIterator = b.subscribe().makeAsyncIterator()
        #expect(try await throwingIterator.next() == 1)
        b.finish(throwing: NetworkError())
        do throws(NetworkError) {
            _ = try await throwingIterator.next()
            Issue.record("expected the typed error")
        } catch {
            let typed: NetworkError = error
            _ = typed
        }
    }

    @Test func everyPromiseDeclarationHasItsContractSignature() async throws {
        let a = BroadcastPromise<Int, NetworkError>()
        let b = BroadcastPromise(of: Int.self, throwing: NetworkError.self)
        let c = BroadcastPromise<Void, any Error>()
        requireSendable(a)
        let succeed: (Int) -> Bool = a.succeed
        let fail: (NetworkError) -> Bool = b.fail
        let pending: Result<Int, NetworkError>? = a.result
        #expect(pending == nil)
        #expect(succeed(5))
        #expect(!a.succeed(6))
        #expect(fail(NetworkError()))
        #expect(try await a.value == 5)
        await #expect(throws: NetworkError.self) { try await b.value }
        #expect(c.succeed())
        #expect(!c.succeed())
        try await c.value
    }

    @Test func everySharingDeclarationHasItsContractSignature() async throws {
        // BroadcastStart: Sendable, three ways to start.
        let starts: [BroadcastStart] = [.eagerly, .lazily, .whileSubscribed(), .whileSubscribed(stopAfter: .seconds(1))]
        requireSendable(starts)

        // AsyncSequence.broadcast, typed by the upstream's Failure.
        let upstream = AsyncStream<Int> { continuation in
            continuation.yield(1)
            continuation.finish()
        }
        let shared: BroadcastSequence<Int, Never> = upstream.broadcast(bufferingPolicy: .unbounded, replay: 0, started: .lazily)
        let defaulted: BroadcastSequence<Int, Never> = upstream.broadcast()

        // init(upstream:) and init(register:), with every argument and defaulted.
        let fromUpstream = BroadcastSequence<Int, NetworkError>(bufferingPolicy: .bounded(4), replay: 1, started: .eagerly,
                                                                upstream: { AsyncThrowingNeverStream() })
        let fromUpstreamDefaulted = BroadcastSequence<Int, Never> { AsyncStream<Int> { $0.finish() } }
        let register: @Sendable (BroadcastSink<Int, NetworkError>) -> @Sendable () -> Void = { sink in
            let send: (Int) -> BroadcastSendResult = sink.send
            let finish: () -> Void = sink.finish
            let finishThrowing: (NetworkError) -> Void = sink.finish(throwing:)
            _ = (send, finish, finishThrowing)
            return {}
        }
        let fromListener = BroadcastSequence<Int, NetworkError>(bufferingPolicy: .unbounded, replay: 0, started: .lazily,
                                                                register: register)
        let fromListenerDefaulted = BroadcastSequence<Int, Never> { _ in {} }
        requireSendable(BroadcastSink<Int, Never>?.none)

        // subscriberCounts is a BroadcastValue<Int, Never>.Subscription.
        let counts: BroadcastValue<Int, Never>.Subscription = fromListener.subscriberCounts
        var countsIterator = counts.makeAsyncIterator()
        #expect(await countsIterator.next() == 0)

        // send(contentsOf:) takes any Sequence and sums the results.
        let batch: BroadcastSendResult = fromListener.send(contentsOf: [1, 2, 3])
        let lazyBatch = fromListener.send(contentsOf: (0..<3).lazy.map { $0 * 2 })
        #expect(batch == BroadcastSendResult() && lazyBatch == BroadcastSendResult())
        _ = (shared, defaulted, fromUpstream, fromUpstreamDefaulted, fromListenerDefaulted)
    }

    /// Contract v4: `BroadcastTopics` and the batch read, with the
    /// signatures ../API.md gives them (as function values where they have
    /// no defaulted arguments, so a changed signature fails to compile).
    @available(macOS 13, iOS 16, tvOS 16, watchOS 9, *)
    @Test func everyTopicsDeclarationHasItsContractSignature() async throws {
        typealias Topics = BroadcastTopics<String, Int, NetworkError>
        requireSendable(Topics?.none)
        let _: Topics.BufferingPolicy.Type = BroadcastBufferingPolicy.self
        let _: Topics.Subscription.Type = BroadcastSequence<Int, NetworkError>.Subscription.self
        let topics = Topics(bufferingPolicy: .unbounded, replay: 0)
        let defaulted = BroadcastTopics<String, Int, Never>()
        let register: @Sendable (String, BroadcastSink<Int, NetworkError>) -> @Sendable () -> Void = { _, _ in {} }
        let listening = Topics(bufferingPolicy: .bounded(4), replay: 1, stopAfter: .zero, register: register)
        let listeningDefaulted = BroadcastTopics<String, Int, Never> { _, _ in {} }

        let subscription: Topics.Subscription = topics.subscribe(to: "a", bufferingPolicy: nil)
        let subscribeDefaulted = topics.subscribe(to: "a")
        let send: (Int, String) -> BroadcastSendResult = topics.send(_:to:)
        let sendBatch: BroadcastSendResult = topics.send(contentsOf: [1, 2], to: "a")
        let emit: (Int, String) async throws(CancellationError) -> BroadcastSendResult = topics.emit(_:to:)
        let finishTopic: (String) -> Void = topics.finish(topic:)
        let finish: () -> Void = topics.finish
        let finishThrowing: (NetworkError) -> Void = topics.finish(throwing:)
        let count: (String) -> Int = topics.subscriberCount(of:)
        let topicCount: Int = topics.topicCount
        #expect(send(1, "a") == BroadcastSendResult(delivered: 2))
        #expect(sendBatch == BroadcastSendResult(delivered: 4))
        #expect(try await emit(3, "a") == BroadcastSendResult(delivered: 2))
        #expect(count("a") == 2 && topicCount == 1)

        // The batch read on the iterator.
        var iterator = subscription.makeAsyncIterator()
        var batch: [Int] = []
        let read: Int = try await iterator.next(upTo: 8, into: &batch)
        #expect(read == 4 && batch == [1, 2, 1, 3], "\(batch)")
        finishTopic("a")
        finishThrowing(NetworkError())
        finish()
        _ = (subscribeDefaulted, defaulted, listening, listeningDefaulted)
    }

    /// A typed-failure upstream for the surface test (never yields).
    struct AsyncThrowingNeverStream: AsyncSequence, Sendable {
        typealias Element = Int
        typealias Failure = NetworkError
        struct AsyncIterator: AsyncIteratorProtocol {
            mutating func next() async throws(NetworkError) -> Int? { nil }
        }
        func makeAsyncIterator() -> AsyncIterator { AsyncIterator() }
    }

    /// Contract v5, sections C, D and E: readiness, asynchronous listeners,
    /// out-of-band sends.
    @available(macOS 13, iOS 16, tvOS 16, watchOS 9, *)
    @Test func everyV5SharingDeclarationHasItsContractSignature() async throws {
        // C. BroadcastSink.ready(), Subscription.upstreamReady().
        let ready: (BroadcastSink<Int, NetworkError>) -> () -> Void = { $0.ready }
        let upstreamReady: (BroadcastSequence<Int, NetworkError>.Subscription) -> () async throws(CancellationError) -> Bool
            = { $0.upstreamReady }
        _ = (ready, upstreamReady)

        // D. init(listen:) with every argument and defaulted, upstreamStopped().
        let listen: @Sendable (BroadcastSink<Int, NetworkError>) async -> @Sendable () async -> Void = { sink in
            sink.ready()
            return {}
        }
        let listening = BroadcastSequence<Int, NetworkError>(bufferingPolicy: .bounded(2), replay: 1,
                                                             started: .whileSubscribed(), listen: listen)
        let listeningDefaulted = BroadcastSequence<Int, Never>(listen: { _ in {} })
        let stopped: () async -> Void = listening.upstreamStopped
        #expect(try await listening.subscribe().upstreamReady() == true)
        listening.finish()
        await stopped()
        _ = listeningDefaulted

        typealias Topics = BroadcastTopics<String, Int, NetworkError>
        let topicListen: @Sendable (String, BroadcastSink<Int, NetworkError>) async -> @Sendable () async -> Void = { _, _ in {} }
        let topics = Topics(bufferingPolicy: .unbounded, replay: 1, stopAfter: .zero, listen: topicListen)
        let topicsDefaulted = BroadcastTopics<String, Int, Never>(listen: { _, _ in {} })
        let listenersStopped: () async -> Void = topics.listenersStopped
        topics.finish()
        await listenersStopped()
        _ = topicsDefaulted

        // E. send(_:replayable:) on the sequence, the sink and the topics.
        let sequenceSend: (Int, Bool) -> BroadcastSendResult = listening.send(_:replayable:)
        let sinkSend: (BroadcastSink<Int, NetworkError>) -> (Int, Bool) -> BroadcastSendResult = { $0.send(_:replayable:) }
        let topicsSend: (Int, String, Bool) -> BroadcastSendResult = topics.send(_:to:replayable:)
        _ = (sequenceSend, sinkSend, topicsSend)
        _ = listening.send(1, replayable: false)
        _ = topics.send(1, to: "a", replayable: false)
    }

    func requireSendableHashable<T: Sendable & Hashable>(_: T.Type) {}
    func requireSendable<T: Sendable>(_: T) {}
    func requireAsyncSequence<S: AsyncSequence>(_: S) {}
}
