import Testing
@_spi(Testing) @testable import AsyncBroadcast

// claims: SEQ-NOTHING-BEFORE-SUBSCRIBE
@Suite struct SendTests {
    @Test func subscriberReceivesOnlyElementsSentAfterSubscribing() {
        let sequence = BroadcastSequence(of: Int.self)
        sequence.send(1)
        let subscription = sequence.subscribe()
        sequence.send(2)
        sequence.send(3)
        #expect(pollAll(subscription) == [2, 3])
    }

    // claims: SEQ-SUBSCRIBE-REGISTERS
    @Test func subscribeRegistersImmediatelyEvenIfNeverIterated() {
        let sequence = BroadcastSequence(of: Int.self)
        let subscription = sequence.subscribe()
        #expect(sequence.subscriberCount == 1)
        let result = sequence.send(42)
        #expect(result == BroadcastSendResult(delivered: 1, dropped: 0, isFinished: false))
        #expect(pollAll(subscription) == [42])
    }

    // claims: SEQ-NIL-POLICY-DEFAULT
    @Test func nilPolicyMeansTheSequenceDefault() {
        let sequence = BroadcastSequence(of: Int.self, bufferingPolicy: .bufferingOldest(1))
        let subscription = sequence.subscribe(bufferingPolicy: nil)
        sequence.send(1)
        #expect(sequence.send(2) == BroadcastSendResult(delivered: 0, dropped: 1))
        #expect(pollAll(subscription) == [1])
    }

    // claims: SEQ-LOOP-OWN-SUBSCRIBER
    @Test func eachForAwaitLoopIsItsOwnSubscriber() async throws {
        let sequence = BroadcastSequence(of: Int.self)
        var first = sequence.makeAsyncIterator()
        var second = sequence.makeAsyncIterator()
        #expect(sequence.subscriberCount == 2)
        sequence.send(7)
        #expect(await first.next() == 7)
        #expect(await second.next() == 7)
    }

    // claims: SEQ-OLDEST-KEEPS-FIRST, SEQ-COUNT-DROPPED, SEQ-DROPPEDCOUNT-EXACT
    @Test func bufferingOldestCountsDroppedOnly() {
        let sequence = BroadcastSequence(of: Int.self)
        let subscription = sequence.subscribe(bufferingPolicy: .bufferingOldest(2))
        #expect(sequence.send(1) == BroadcastSendResult(delivered: 1, dropped: 0))
        #expect(sequence.send(2) == BroadcastSendResult(delivered: 1, dropped: 0))
        #expect(sequence.send(3) == BroadcastSendResult(delivered: 0, dropped: 1))
        #expect(subscription.droppedCount == 1)
        #expect(pollAll(subscription) == [1, 2])
    }

    // claims: SEQ-NEWEST-KEEPS-LAST, SEQ-COUNT-DROPPED, SEQ-DROPPEDCOUNT-EXACT
    @Test func bufferingNewestCountsDeliveredAndDropped() {
        let sequence = BroadcastSequence(of: Int.self)
        let subscription = sequence.subscribe(bufferingPolicy: .bufferingNewest(2))
        sequence.send(1)
        sequence.send(2)
        #expect(sequence.send(3) == BroadcastSendResult(delivered: 1, dropped: 1))
        #expect(subscription.droppedCount == 1)
        #expect(pollAll(subscription) == [2, 3])
    }

    /// Crosses the ring's power-of-two boundaries many times, reading in
    /// between, and checks droppedCount against a plain model.
    // claims: SEQ-OLDEST-KEEPS-FIRST, SEQ-NEWEST-KEEPS-LAST, SEQ-DROPPEDCOUNT-EXACT
    @Test(arguments: [1, 2, 3, 4, 5, 7, 8, 9, 16, 17])
    func dropCountsAcrossRingWrapAround(capacity: Int) {
        for newest in [true, false] {
            let sequence = BroadcastSequence(of: Int.self)
            let policy: BroadcastBufferingPolicy = newest ? .bufferingNewest(capacity) : .bufferingOldest(capacity)
            let subscription = sequence.subscribe(bufferingPolicy: policy)
            var model: [Int] = []
            var modelDropped = 0
            var received: [Int] = []
            var modelReceived: [Int] = []
            for i in 0..<200 {
                sequence.send(i)
                if model.count < capacity {
                    model.append(i)
                } else {
                    modelDropped += 1
                    if newest { model.removeFirst(); model.append(i) }
                }
                if i % 7 == 3 {  // read a couple now and then
                    for _ in 0..<2 {
                        if case .element(let e) = subscription.poll() { received.append(e) }
                        if !model.isEmpty { modelReceived.append(model.removeFirst()) }
                    }
                }
            }
            received += pollAll(subscription)
            modelReceived += model
            #expect(received == modelReceived, "policy \(policy)")
            #expect(subscription.droppedCount == modelDropped, "policy \(policy)")
        }
    }

    // claims: SEQ-CAPACITY-ZERO, SEQ-COUNT-DROPPED
    @Test func capacityZeroDropsUnlessAReaderWaits() async throws {
        for policy in [BroadcastBufferingPolicy.bufferingNewest(0), .bufferingOldest(0)] {
            let sequence = BroadcastSequence(of: Int.self)
            let subscription = sequence.subscribe(bufferingPolicy: policy)
            #expect(sequence.send(1) == BroadcastSendResult(delivered: 0, dropped: 1))
            let reader = Task {
                var iterator = subscription.makeAsyncIterator()
                return await iterator.next()
            }
            try await waitUntil("reader parked") { subscription.isConsumerWaiting }
            #expect(sequence.send(2) == BroadcastSendResult(delivered: 1, dropped: 0))
            #expect(try await withDeadline("handed element") { await reader.value } == 2)
            #expect(subscription.droppedCount == 1)
        }
    }

    // claims: SEQ-BOUNDED-NEVER-DROPS, SEQ-COUNT-DELIVERED, SEQ-NO-LOSS
    @Test func fullBoundedSubscriberStillGetsSentElements() {
        let sequence = BroadcastSequence(of: Int.self)
        let subscription = sequence.subscribe(bufferingPolicy: .bounded(2))
        for i in 1...5 {
            #expect(sequence.send(i) == BroadcastSendResult(delivered: 1, dropped: 0))
        }
        #expect(pollAll(subscription) == [1, 2, 3, 4, 5])
        #expect(subscription.droppedCount == 0)
    }

    /// Interleaves sends and reads so the lock-free buffer wraps around its
    /// segments and grows while partly read, for each lock-free policy.
    // claims: SEQ-NO-LOSS, SEQ-OLDEST-KEEPS-FIRST
    @Test(arguments: [BroadcastBufferingPolicy.unbounded, .bounded(3), .bounded(100), .bufferingOldest(70), .bufferingOldest(1000)])
    func lockFreeBufferWrapsAndGrowsWithoutLoss(policy: BroadcastBufferingPolicy) {
        let sequence = BroadcastSequence(of: Int.self)
        let subscription = sequence.subscribe(bufferingPolicy: policy)
        var model: [Int] = []
        var received: [Int] = []
        var modelReceived: [Int] = []
        var modelDropped = 0
        var limit = Int.max
        if case .bufferingOldest(let n) = policy { limit = n }
        var next = 0
        for round in 0..<300 {
            for _ in 0..<(round * 7 % 23) {
                sequence.send(next)
                if model.count < limit { model.append(next) } else { modelDropped += 1 }
                next += 1
            }
            for _ in 0..<(round * 5 % 19) {
                if case .element(let e) = subscription.poll() { received.append(e) }
                if !model.isEmpty { modelReceived.append(model.removeFirst()) }
            }
        }
        received += pollAll(subscription)
        modelReceived += model
        #expect(received == modelReceived)
        #expect(subscription.droppedCount == modelDropped)
    }

    // claims: SEQ-UNBOUNDED-KEEPS-ALL, SEQ-NO-LOSS
    @Test func unboundedLosesNothingAcrossGrowth() {
        let sequence = BroadcastSequence(of: Int.self)
        let subscription = sequence.subscribe()
        for i in 0..<10_000 { sequence.send(i) }
        #expect(pollAll(subscription) == Array(0..<10_000))
        #expect(subscription.droppedCount == 0)
    }

    // claims: SEQ-COUNT-DELIVERED, SEQ-COUNT-DROPPED, SEQ-SLOW-NEVER-AFFECTS-OTHERS
    @Test func sendCountsAcrossMixedSubscribers() {
        let sequence = BroadcastSequence(of: Int.self)
        let subscriptions = [
            sequence.subscribe(bufferingPolicy: .unbounded),
            sequence.subscribe(bufferingPolicy: .bufferingOldest(1)),
            sequence.subscribe(bufferingPolicy: .bufferingNewest(1)),
            sequence.subscribe(bufferingPolicy: .bounded(1)),
        ]
        #expect(sequence.send(1) == BroadcastSendResult(delivered: 4, dropped: 0))
        #expect(sequence.send(2) == BroadcastSendResult(delivered: 3, dropped: 2))
        #expect(subscriptions.map(\.droppedCount) == [0, 1, 1, 0])
    }

    // claims: SEQ-ORDER-SAME
    @Test func elementsArriveInOrderNeverTwice() async throws {
        let sequence = BroadcastSequence(of: Int.self)
        let subscription = sequence.subscribe()
        let reader = Task { try await drain(subscription) }
        for i in 0..<5_000 { sequence.send(i) }
        sequence.finish()
        #expect(try await reader.value == Array(0..<5_000))
    }

    // claims: SEQ-ORDER-SAME
    @Test func fourConcurrentProducersGiveEverySubscriberTheSameOrder() async throws {
        let sequence = BroadcastSequence(of: Int.self)
        let subscriptions = (0..<3).map { _ in sequence.subscribe() }
        let readers = subscriptions.map { subscription in Task { try await drain(subscription) } }
        await withTaskGroup(of: Void.self) { group in
            for producer in 0..<4 {
                group.addTask {
                    for i in 0..<2_000 { sequence.send(producer * 10_000 + i) }
                }
            }
        }
        sequence.finish()
        var results: [[Int]] = []
        for reader in readers { results.append(try await reader.value) }
        #expect(results[0].count == 8_000)
        #expect(results[1] == results[0])
        #expect(results[2] == results[0])
        for producer in 0..<4 {  // each producer's own elements stay in order
            let mine = results[0].filter { $0 / 10_000 == producer }
            #expect(mine == (0..<2_000).map { producer * 10_000 + $0 })
        }
    }

    // claims: SEQ-SEND-NEVER-WAITS, SEQ-SLOW-NEVER-AFFECTS-OTHERS
    @Test func sendNeverSuspendsAndNeverWaitsOnAConsumer() {
        // A synchronous context: send compiles and returns without a reader.
        let sequence = BroadcastSequence(of: Int.self)
        let subscription = sequence.subscribe(bufferingPolicy: .bounded(1))
        for i in 0..<100 { sequence.send(i) }
        #expect(pollAll(subscription).count == 100)
    }
}
