import Testing
@_spi(Testing) @testable import AsyncBroadcast

/// The patterns the product grew from: UI and logger fan-out, one-shot readiness, error streams, listener bridging.
@Suite struct SeedScenarioTests {
    @Test func twoSubscribersReceiveIdenticalValues() async throws {
        let channel = BroadcastSequence(of: String.self)
        let a = channel.subscribe()
        let b = channel.subscribe()
        let readerA = Task { try await drain(a) }
        let readerB = Task { try await drain(b) }
        for word in ["hello", "world", "!"] { channel.send(word) }
        channel.finish()
        #expect(try await readerA.value == ["hello", "world", "!"])
        #expect(try await readerB.value == ["hello", "world", "!"])
    }

    // claims: SEQ-END-ISOLATED
    @Test func oneSubscriberLeavesEarlyWhileTheOtherContinues() async throws {
        let channel = BroadcastSequence(of: String.self)
        let early = channel.subscribe()
        let stayer = channel.subscribe()
        channel.send("first")
        // The early subscriber reads one value and goes away.
        let leaver = Task {
            var iterator = early.makeAsyncIterator()
            return await iterator.next()
        }
        #expect(await leaver.value == "first")
        early.cancel()
        #expect(channel.subscriberCount == 1)
        channel.send("second")
        channel.finish()
        #expect(try await drain(stayer) == ["first", "second"])
    }

    @Test func cancellingOneConsumerTaskAfterTenOfTwenty() async throws {
        let channel = BroadcastSequence(of: Int.self)
        let subA = channel.subscribe()
        let subB = channel.subscribe()
        let consumerA = Task { try await drain(subA) }
        let consumerB = Task {
            var received: [Int] = []
            for await value in subB { received.append(value) }
            return received
        }
        for i in 1...10 {
            channel.send(i)
        }
        // B has read all ten and waits for the eleventh: cancel it there.
        try await waitUntil("B parked after 10") { subB.isConsumerWaiting && subB.isBufferEmptyForTesting }
        consumerB.cancel()
        let bValues = try await withDeadline("cancelled consumer ends") { await consumerB.value }
        #expect(bValues == Array(1...10))
        #expect(channel.subscriberCount == 1)
        for i in 11...20 { channel.send(i) }
        channel.finish()
        #expect(try await consumerA.value == Array(1...20))
    }

    // claims: SEQ-UNREGISTERED-SUBSCRIBE
    @Test func subscribingFromACancelledTaskEndsAtOnce() async throws {
        let channel = BroadcastSequence(of: Int.self)
        let values = try await withDeadline("subscription from cancelled task") {
            await Task {
                withUnsafeCurrentTask { $0?.cancel() }
                var received: [Int] = []
                for await value in channel { received.append(value) }
                return received
            }.value
        }
        #expect(values == [])
        #expect(channel.subscriberCount == 0)
        #expect(channel.send(1).delivered == 0)
    }

    // claims: SEQ-UNREGISTERED-SUBSCRIBE
    @Test func subscribingFromACancelledTaskStillYieldsReplay() async throws {
        let channel = BroadcastSequence(of: Int.self, replay: 2)
        channel.send(1); channel.send(2); channel.send(3)
        let values = try await withDeadline("replay from cancelled task") {
            await Task {
                withUnsafeCurrentTask { $0?.cancel() }
                var received: [Int] = []
                for await value in channel { received.append(value) }
                return received
            }.value
        }
        #expect(values == [2, 3])
        #expect(channel.subscriberCount == 0)
    }

    @Test func perSubscriberPolicyOverride() async throws {
        let channel = BroadcastSequence(of: Int.self, bufferingPolicy: .bufferingNewest(10))
        let regular = channel.subscribe()
        let slow = channel.subscribe(bufferingPolicy: .bufferingOldest(3))
        for i in 1...20 { channel.send(i) }
        channel.finish()
        #expect(try await drain(regular) == Array(11...20))
        #expect(regular.droppedCount == 10)
        #expect(try await drain(slow) == [1, 2, 3])
        #expect(slow.droppedCount == 17)
    }

    @Test func replayIsAOneShotReadySignalForLateWaiters() async throws {
        let ready = BroadcastSequence<Void, any Error>(replay: 1)
        let earlyWaiter = Task { () async throws -> Bool in
            for try await _ in ready { return true }
            return false
        }
        try await waitUntil("early waiter subscribed") { ready.subscriberCount == 1 }
        ready.send(())
        ready.finish()
        #expect(try await earlyWaiter.value)
        // Late waiters, after the signal and after finish, still see it.
        for _ in 0..<3 {
            var iterator = ready.makeAsyncIterator()
            #expect(try await iterator.next() != nil)
            #expect(try await iterator.next() == nil)
        }
    }

    // claims: SEQ-REPLAY-THEN-END
    @Test func replayedFailureReachesLateWaiters() async throws {
        let ready = BroadcastSequence(of: Void.self, throwing: TestError.self, replay: 1)
        ready.finish(throwing: TestError(code: 7))
        var iterator = ready.makeAsyncIterator()
        await #expect(throws: TestError(code: 7)) { _ = try await iterator.next() }
        #expect(try await iterator.next() == nil)
    }

    struct DisplayError: Error {}
    struct StorageError: Error {}

    @Test func errorBroadcastWithTypeFiltering() async throws {
        let errors = BroadcastSequence<any Error, Never>()
        let display = errors.subscribe()
        let log = errors.subscribe()
        let displayed = Task {
            var count = 0
            for await error in display where error is DisplayError { count += 1 }
            return count
        }
        let logged = Task {
            var count = 0
            for await _ in log { count += 1 }
            return count
        }
        errors.send(DisplayError())
        errors.send(StorageError())
        errors.send(DisplayError())
        errors.finish()
        #expect(await displayed.value == 2)
        #expect(await logged.value == 3)
    }
}

extension BroadcastSequence.Subscription {
    /// True when nothing is buffered (checked without consuming).
    var isBufferEmptyForTesting: Bool { core.isBufferEmpty }
}
