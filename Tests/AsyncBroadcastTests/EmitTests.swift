import Testing
@_spi(Testing) @testable import AsyncBroadcast

// claims: SEQ-EMIT-WAITS-WHILE-FULL
@Suite struct EmitTests {
    @Test func emitReturnsAtOnceWhenThereIsRoom() async throws {
        let sequence = BroadcastSequence(of: Int.self)
        let bounded = sequence.subscribe(bufferingPolicy: .bounded(2))
        let other = sequence.subscribe()
        #expect(try await sequence.emit(1) == BroadcastSendResult(delivered: 2, dropped: 0))
        #expect(try await sequence.emit(2) == BroadcastSendResult(delivered: 2, dropped: 0))
        #expect(pollAll(bounded) == [1, 2])
        #expect(pollAll(other) == [1, 2])
    }

    // claims: SEQ-EMIT-WAITS-WHILE-FULL, SEQ-BOUNDED-NEVER-DROPS
    @Test func emitWaitsWhileABoundedSubscriberIsFull() async throws {
        let sequence = BroadcastSequence(of: Int.self)
        let bounded = sequence.subscribe(bufferingPolicy: .bounded(2))
        let watcher = sequence.subscribe()
        try await sequence.emit(1)
        try await sequence.emit(2)
        let emitter = Task { try await sequence.emit(3) }
        try await waitUntil("emitter waiting") { sequence.waitingEmitterCount == 1 }
        // Nobody has the element while the emitter waits.
        #expect(pollAll(watcher) == [1, 2])
        #expect(bounded.poll().isElement(1))
        let result = try await withDeadline("emitter released") { try await emitter.value }
        #expect(result == BroadcastSendResult(delivered: 2, dropped: 0))
        #expect(pollAll(bounded) == [2, 3])
        #expect(pollAll(watcher) == [3])
    }

    // claims: SEQ-EMIT-WAITS-WHILE-FULL
    @Test func emitWaitsOnASubscriberThatSendOverFilled() async throws {
        let sequence = BroadcastSequence(of: Int.self)
        let bounded = sequence.subscribe(bufferingPolicy: .bounded(2))
        for i in 1...4 { sequence.send(i) }
        let emitter = Task { try await sequence.emit(5) }
        try await waitUntil("emitter waiting") { sequence.waitingEmitterCount == 1 }
        _ = bounded.poll()  // 3 left: still full
        _ = bounded.poll()  // 2 left: still full
        #expect(sequence.waitingEmitterCount == 1)
        _ = bounded.poll()  // 1 left: room
        _ = try await withDeadline("emitter released") { try await emitter.value }
        #expect(pollAll(bounded) == [4, 5])
    }

    // claims: SEQ-EMIT-WAITS-WHILE-FULL
    @Test func emitWaitsUntilEveryFullSubscriberHasRoom() async throws {
        let sequence = BroadcastSequence(of: Int.self)
        let subscribers = (0..<3).map { _ in sequence.subscribe(bufferingPolicy: .bounded(1)) }
        sequence.send(1)  // every subscriber is full
        let emitter = Task { try await sequence.emit(2) }
        try await waitUntil("emitter waiting") { sequence.waitingEmitterCount == 1 }
        // Each read makes room in one subscriber only; the emitter must wait
        // for the last one, in whatever order they drain.
        _ = subscribers[2].poll()
        #expect(sequence.waitingEmitterCount == 1)
        _ = subscribers[0].poll()
        #expect(sequence.waitingEmitterCount == 1)
        _ = subscribers[1].poll()
        _ = try await withDeadline("emitter released") { try await emitter.value }
        for subscriber in subscribers { #expect(pollAll(subscriber) == [2]) }
    }

    @Test func emitterWaitsForAFullSubscriberThatReadWhileNobodyWaited() async throws {
        let sequence = BroadcastSequence(of: Int.self)
        let early = sequence.subscribe(bufferingPolicy: .bounded(1))
        let late = sequence.subscribe(bufferingPolicy: .bounded(1))
        sequence.send(1)              // both full, both marked
        _ = early.poll()              // room again, while no emitter waited to hear of it
        let emitter = Task { try await sequence.emit(2) }
        try await waitUntil("emitter waiting") { sequence.waitingEmitterCount == 1 }
        _ = late.poll()               // the last full one drains: the emitter goes
        _ = try await withDeadline("emitter released") { try await emitter.value }
        #expect(pollAll(early) == [2])
        #expect(pollAll(late) == [2])
    }

    @Test func aWakingConsumerReleasesTheEmitter() async throws {
        let sequence = BroadcastSequence(of: Int.self)
        let bounded = sequence.subscribe(bufferingPolicy: .bounded(1))
        let reader = Task { try await drain(bounded) }
        let producer = Task {
            for i in 0..<1_000 { try await sequence.emit(i) }
            sequence.finish()
        }
        try await withDeadline("producer done") { try await producer.value }
        #expect(try await reader.value == Array(0..<1_000))
        #expect(bounded.droppedCount == 0)
    }

    // claims: SEQ-EMIT-CANCEL-NONE
    @Test func cancelledWaitingEmitterThrowsAndNobodyReceives() async throws {
        let counter = LiveCounter()
        let sequence = BroadcastSequence(of: Payload.self)
        let bounded = sequence.subscribe(bufferingPolicy: .bounded(1))
        let watcher = sequence.subscribe()
        try await sequence.emit(Payload(1, counter))
        let emitter = Task { try await sequence.emit(Payload(2, counter)) }
        try await waitUntil("emitter waiting") { sequence.waitingEmitterCount == 1 }
        emitter.cancel()
        await #expect(throws: CancellationError.self) {
            try await withDeadline("cancelled emitter") { try await emitter.value }
        }
        #expect(sequence.waitingEmitterCount == 0)
        #expect(pollAll(bounded).map(\.value) == [1])
        #expect(pollAll(watcher).map(\.value) == [1])
        #expect(counter.live == 0)
    }

    // claims: SEQ-EMIT-CANCEL-NONE
    @Test func emitFromACancelledTaskThatMustWaitThrowsAtOnce() async throws {
        let sequence = BroadcastSequence(of: Int.self)
        let bounded = sequence.subscribe(bufferingPolicy: .bounded(1))
        sequence.send(0)
        let outcome = try await withDeadline("emit from cancelled task") {
            await Task {
                withUnsafeCurrentTask { $0?.cancel() }
                do { try await sequence.emit(1); return "delivered" } catch { return "cancelled" }
            }.value
        }
        #expect(outcome == "cancelled")
        #expect(pollAll(bounded) == [0])
    }

    // claims: SEQ-EMIT-RELEASED-BY-END, SEQ-END-EFFECTS
    @Test(arguments: ["cancel", "release", "taskCancel"])
    func aBoundedSubscriberThatEndsReleasesWaitingEmitters(how: String) async throws {
        let sequence = BroadcastSequence(of: Int.self)
        var bounded: BroadcastSequence<Int, Never>.Subscription? = sequence.subscribe(bufferingPolicy: .bounded(1))
        let other = sequence.subscribe()
        sequence.send(0)
        let emitter = Task { try await sequence.emit(1) }
        try await waitUntil("emitter waiting") { sequence.waitingEmitterCount == 1 }
        switch how {
        case "cancel":
            bounded?.cancel()
        case "release":
            bounded = nil
        default:
            // Its consumer's task is cancelled: `next()` from a cancelled
            // task ends the subscriber as `cancel()` does (discarding what
            // it held) and returns nil.
            let subscription = bounded!
            let held = try await withDeadline("next from cancelled task") {
                await Task {
                    withUnsafeCurrentTask { $0?.cancel() }
                    var iterator = subscription.makeAsyncIterator()
                    return await iterator.next()
                }.value
            }
            #expect(held == nil)
        }
        let result = try await withDeadline("emitter released") { try await emitter.value }
        #expect(result.isFinished == false)
        #expect(pollAll(other) == [0, 1])
        _ = bounded
    }

    // claims: SEQ-EMIT-FIFO
    @Test func waitingEmittersAreServedInArrivalOrder() async throws {
        let sequence = BroadcastSequence(of: Int.self)
        let bounded = sequence.subscribe(bufferingPolicy: .bounded(1))
        sequence.send(0)
        var emitters: [Task<BroadcastSendResult, any Error>] = []
        for i in 1...5 {
            emitters.append(Task { try await sequence.emit(i) })
            try await waitUntil("emitter \(i) waiting") { sequence.waitingEmitterCount == i }
        }
        var received: [Int] = []
        for _ in 0...5 {
            let next = try await take(1, from: bounded)
            received += next
        }
        #expect(received == [0, 1, 2, 3, 4, 5])
        for emitter in emitters { _ = try await withDeadline("emitter") { try await emitter.value } }
    }

    // claims: SEQ-EMIT-RELEASED-BY-FINISH
    @Test func finishReleasesWaitingEmittersWithIsFinished() async throws {
        let sequence = BroadcastSequence(of: Int.self)
        let bounded = sequence.subscribe(bufferingPolicy: .bounded(1))
        sequence.send(0)
        let emitter = Task { try await sequence.emit(1) }
        try await waitUntil("emitter waiting") { sequence.waitingEmitterCount == 1 }
        sequence.finish()
        let result = try await withDeadline("emitter released by finish") { try await emitter.value }
        #expect(result == BroadcastSendResult(delivered: 0, dropped: 0, isFinished: true))
        #expect(pollAll(bounded) == [0])
        #expect(try await sequence.emit(2).isFinished)
    }

    // claims: SEQ-EMIT-ONLY-BOUNDED, SEQ-SLOW-NEVER-AFFECTS-OTHERS
    @Test func emitWithoutBoundedSubscribersNeverWaits() async throws {
        let sequence = BroadcastSequence(of: Int.self)
        let subscription = sequence.subscribe(bufferingPolicy: .bufferingOldest(1))
        for i in 0..<10 { try await sequence.emit(i) }
        #expect(pollAll(subscription) == [0])
        #expect(subscription.droppedCount == 9)
    }
}

extension BroadcastSequence.Subscription.PollResult where Element: Equatable {
    func isElement(_ expected: Element) -> Bool {
        if case .element(let element) = self { return element == expected }
        return false
    }
}
