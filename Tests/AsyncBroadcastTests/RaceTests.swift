import Testing
@_spi(Testing) @testable import AsyncBroadcast

/// Races the events that can resume a parked consumer or a waiting emitter.
/// Each round must end (a lost wake-up trips the deadline) and the runtime
/// traps if a continuation is resumed twice. Run under TSan in CI.
// claims: SEQ-CANCEL-IDEMPOTENT, DRF-RESUME-ONCE
@Suite struct RaceTests {
    @Test(arguments: [BroadcastBufferingPolicy.unbounded, .bufferingNewest(2), .bounded(1)])
    func wakeCancelFinishAndCancelRaceOnAParkedConsumer(policy: BroadcastBufferingPolicy) async throws {
        for round in 0..<200 {
            let sequence = BroadcastSequence(of: Int.self, throwing: TestError.self)
            let subscription = sequence.subscribe(bufferingPolicy: policy)
            let consumer = Task { () -> [Int] in
                var received: [Int] = []
                do {
                    for try await value in subscription { received.append(value) }
                } catch {}
                return received
            }
            try await waitUntil("parked") { subscription.isConsumerWaiting }
            await withTaskGroup(of: Void.self) { group in
                group.addTask { sequence.send(round) }
                if round % 2 == 0 { group.addTask { consumer.cancel() } }
                if round % 3 == 0 { group.addTask { subscription.cancel() } }
                if round % 5 == 0 { group.addTask { sequence.finish(throwing: TestError(code: round)) } }
                group.addTask { sequence.finish() }
            }
            let received = try await withDeadline("consumer ends, round \(round)") { await consumer.value }
            #expect(received.count <= 1)
            #expect(received.allSatisfy { $0 == round })
            #expect(sequence.subscriberCount == 0)
        }
    }

    // claims: SEQ-EMIT-CANCEL-NONE, DRF-RESUME-ONCE
    @Test func emitterCancellationRacesItsRelease() async throws {
        for round in 0..<200 {
            let counter = LiveCounter()
            let sequence = BroadcastSequence(of: Payload.self)
            let bounded = sequence.subscribe(bufferingPolicy: .bounded(1))
            let watcher = sequence.subscribe()
            sequence.send(Payload(-1, counter))
            let emitter = Task { () -> Bool in
                do {
                    try await sequence.emit(Payload(round, counter))
                    return true
                } catch {
                    return false
                }
            }
            try await waitUntil("emitter waiting") { sequence.waitingEmitterCount == 1 }
            await withTaskGroup(of: Void.self) { group in
                group.addTask { emitter.cancel() }
                group.addTask { _ = bounded.poll() }  // makes room: releases the emitter
                if round % 4 == 0 { group.addTask { sequence.finish() } }
            }
            let delivered = try await withDeadline("emitter ends, round \(round)") { await emitter.value }
            let watched = pollAll(watcher).map(\.value)
            // All or nothing: delivered means the watcher got it too.
            #expect(watched.contains(round) == delivered || sequence.isFinished && !delivered)
            if !delivered { #expect(!watched.contains(round)) }
            _ = pollAll(bounded)
            bounded.cancel()
            watcher.cancel()
            #expect(counter.live == 0)
        }
    }

    @Test func concurrentProducersAndAConsumerThatLeaves() async throws {
        for round in 0..<50 {
            let sequence = BroadcastSequence(of: Int.self)
            let stayer = sequence.subscribe(bufferingPolicy: .unbounded)
            let leaver = sequence.subscribe(bufferingPolicy: round % 2 == 0 ? .bounded(2) : .bufferingNewest(2))
            let stayerTask = Task { try await drain(stayer) }
            let leaverTask = Task { () -> Int in
                var count = 0
                for await _ in leaver {
                    count += 1
                    if count == 10 { break }
                }
                leaver.cancel()  // leaving the loop alone keeps the subscription alive
                return count
            }
            try await withDeadline("producers, round \(round)") {
                await withTaskGroup(of: Void.self) { group in
                    for producer in 0..<3 {
                        group.addTask {
                            for i in 0..<300 { _ = try? await sequence.emit(producer * 1000 + i) }
                        }
                    }
                }
            }
            sequence.finish()  // a .bufferingNewest leaver may see fewer than 10 and wait for more
            _ = try await withDeadline("leaver ends, round \(round)") { await leaverTask.value }
            let received = try await stayerTask.value
            #expect(received.count == 900)
            for producer in 0..<3 {
                let mine = received.filter { $0 / 1000 == producer }
                #expect(mine == (0..<300).map { producer * 1000 + $0 })
            }
        }
    }
}
