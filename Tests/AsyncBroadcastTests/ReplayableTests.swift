import Testing
@_spi(Testing) @testable import AsyncBroadcast

/// `send(_:replayable: false)`: delivered like `send`, kept out of the
/// replay window (which keeps what it had).
@Suite struct ReplayableTests {
    typealias Shared = BroadcastSequence<Int, Never>

    // claims: SEQ-OUT-OF-BAND-NOT-REPLAYED
    @Test func anOutOfBandElementIsDeliveredButNotReplayed() {
        let shared = Shared(replay: 2)
        let current = shared.subscribe()
        shared.send(1)
        #expect(shared.send(2, replayable: false) == BroadcastSendResult(delivered: 1))
        shared.send(3)
        #expect(pollAll(current) == [1, 2, 3])
        #expect(pollAll(shared.subscribe()) == [1, 3])
    }

    // claims: SEQ-OUT-OF-BAND-NOT-REPLAYED
    @Test func theWindowKeepsWhatItHad() {
        let shared = Shared(replay: 1)
        shared.send(1)
        shared.send(2, replayable: false)
        shared.send(3, replayable: false)
        #expect(pollAll(shared.subscribe()) == [1])
        shared.send(4, replayable: true)
        #expect(pollAll(shared.subscribe()) == [4])
    }

    @Test func afterFinishItDeliversNothing() {
        let shared = Shared(replay: 1)
        shared.finish()
        #expect(shared.send(1, replayable: false).isFinished)
    }

    // claims: SEQ-OUT-OF-BAND-NOT-REPLAYED
    @Test func aSinksOutOfBandElementIsNotReplayed() {
        let sink = Locked<BroadcastSink<Int, Never>?>(nil)
        let shared = Shared(replay: 4, started: .eagerly) { newSink in
            sink.withLock { $0 = newSink }
            return {}
        }
        let current = shared.subscribe()
        sink.value!.send(1)
        #expect(sink.value!.send(-1, replayable: false).delivered == 1)
        sink.value!.send(2)
        #expect(pollAll(current) == [1, -1, 2])
        #expect(pollAll(shared.subscribe()) == [1, 2])
    }

    // claims: SEQ-OUT-OF-BAND-NOT-REPLAYED
    @Test func aTopicsOutOfBandElementIsNotReplayed() {
        let topics = BroadcastTopics<String, Int, Never>(replay: 2)
        let current = topics.subscribe(to: "a")
        topics.send(1, to: "a")
        #expect(topics.send(-1, to: "a", replayable: false).delivered == 1)
        #expect(topics.send(-1, to: "b", replayable: false).delivered == 0, "a topic that is not live got it")
        #expect(pollAll(current) == [1, -1])
        #expect(pollAll(topics.subscribe(to: "a")) == [1])
        #expect(pollAll(topics.subscribe(to: "b")) == [], "a topic that was not live kept it")
    }
}
