import FeedKit
import Synchronization
import Testing

/// A clock the test moves by hand: age eviction without a sleep.
final class TestClock: Sendable {
    private let milliseconds = Atomic<Int>(0)
    var now: Duration { .milliseconds(milliseconds.load(ordering: .relaxed)) }
    func advance(by duration: Duration) {
        let (seconds, attoseconds) = duration.components
        milliseconds.add(Int(seconds) * 1000 + Int(attoseconds / 1_000_000_000_000_000), ordering: .relaxed)
    }
}

func history(messages: Int = 1000, seconds: Int = 60, clock: TestClock = TestClock()) -> History {
    History(limits: HistoryLimits(messages: messages, maximumAge: .seconds(seconds)), now: { clock.now })
}

func message(_ seq: Int) -> FeedMessage { FeedMessage(seq: seq, payload: "m\(seq)", receivedAt: 0) }

func seqs(_ read: History.Read) -> [Int]? {
    if case .covered(let messages, _) = read { return messages.map(\.seq) }
    return nil
}

func reason(_ read: History.Read) -> String? {
    if case .notCovered(_, let reason) = read { return reason }
    return nil
}

/// The per-topic window behind `since=`: what it serves, and when it must say resync.
@Suite struct HistoryTests {
    @Test func itServesEverythingAfterSince() {
        let window = history()
        for seq in 1...10 { window.append(message(seq)) }
        #expect(seqs(window.read(since: 7)) == [8, 9, 10])
        #expect(seqs(window.read(since: 0)) == Array(1...10))
        // Nothing missed: covered, with no message.
        #expect(seqs(window.read(since: 10)) == [])
        #expect(window.last == 10)
    }

    @Test func aSinceAheadOfTheTopicIsRefused() {
        let window = history()
        for seq in 1...3 { window.append(message(seq)) }
        #expect(reason(window.read(since: 4))?.contains("ahead") == true)
    }

    @Test func theCountEvictsTheOldest() {
        let window = history(messages: 5)
        for seq in 1...12 { window.append(message(seq)) }
        #expect(window.count == 5)
        #expect(seqs(window.read(since: 7)) == [8, 9, 10, 11, 12])
        // 7 is gone: a client that had only 6 missed it.
        #expect(reason(window.read(since: 6))?.contains("seq 7 is no longer held: the window starts at 8") == true)
        #expect(seqs(window.read(since: 0)) == nil)
    }

    @Test func ageEvictsOnAppendAndOnRead() {
        let clock = TestClock()
        let window = history(seconds: 60, clock: clock)
        window.append(message(1))
        clock.advance(by: .seconds(30))
        window.append(message(2))
        clock.advance(by: .seconds(30))
        // Exactly 60 s old: still held.
        #expect(seqs(window.read(since: 0)) == [1, 2])
        clock.advance(by: .milliseconds(1))
        // Message 1 is past 60 s: a reader that needs it is told to resync...
        #expect(seqs(window.read(since: 0)) == nil)
        #expect(window.count == 1)
        // ...one that had it is not.
        #expect(seqs(window.read(since: 1)) == [2])
        window.append(message(3))  // an append evicts as well
        clock.advance(by: .seconds(31))
        window.append(message(4))
        #expect(window.count == 2)
        #expect(seqs(window.read(since: 2)) == [3, 4])
        #expect(seqs(window.read(since: 1)) == nil)
    }

    @Test func anOutageEndsRecoveryAcrossIt() {
        let window = history()
        for seq in 1...5 { window.append(message(seq)) }
        window.markLost()
        // Even a client that had 5 missed the notifications lost after it.
        #expect(seqs(window.read(since: 5)) == nil)
        #expect(seqs(window.read(since: 3)) == nil)
        window.append(message(6))
        window.append(message(7))
        #expect(seqs(window.read(since: 6)) == [7])
        #expect(seqs(window.read(since: 5)) == nil)
    }

    @Test func historyOffServesOnlyAClientThatMissedNothing() {
        let window = History(limits: .off)
        for seq in 1...3 { window.append(message(seq)) }
        #expect(window.count == 0)
        #expect(seqs(window.read(since: 3)) == [])
        #expect(reason(window.read(since: 2))?.contains("keeps no history") == true)
        #expect(HistoryLimits(messages: 0).isEnabled == false)
        #expect(HistoryLimits(maximumAge: .zero).isEnabled == false)
    }

    @Test func theWindowIsBoundedByCountAndTheLargestMessage() {
        let limits = HistoryLimits()
        #expect(limits.messages == 1000 && limits.maximumAge == .seconds(60))
        #expect(limits.largestBytes == 1000 * 16_544)
        let window = history(messages: 3)
        let big = String(repeating: "\"", count: PublishBody.maximumBytes)
        for seq in 1...10 { window.append(FeedMessage(seq: seq, payload: big, receivedAt: 0)) }
        #expect(window.bytes <= 3 * FeedMessage.largestBytes)
    }
}

/// A connection's first frames for each kind of request.
@Suite struct RecoveryPhaseTests {
    func texts(_ plan: RecoveryPhase.Plan) -> [String] { plan.frames.map { String(buffer: $0) } }

    func sequencer(messages: Int = 1000) -> Sequencer {
        let sequencer = Sequencer(history: history(messages: messages), epoch: 42)
        for seq in 1...6 { sequencer.history.append(message(seq)) }
        return sequencer
    }

    @Test func aNewClientGetsReadyWithTheEpochAndLastSeq() {
        let plan = RecoveryPhase(request: nil, sequence: sequencer()).plan()
        #expect(texts(plan) == [#"{"type":"ready","epoch":42,"seq":6}"#])
        #expect(plan.through == 0)
    }

    @Test func aReturningClientGetsWhatItMissedThenRecovered() {
        let plan = RecoveryPhase(request: RecoveryRequest(since: 4, epoch: 42), sequence: sequencer()).plan()
        #expect(texts(plan) == [
            #"{"type":"ready","epoch":42,"seq":6}"#,
            #"{"type":"message","seq":5,"sent":0,"body":"m5"}"#,
            #"{"type":"message","seq":6,"sent":0,"body":"m6"}"#,
            #"{"type":"recovered","from":5,"to":6}"#,
        ])
        #expect(plan.through == 6 && plan.recovered == 2 && plan.resyncReason == nil)
    }

    @Test func anotherEpochOrALostSeqIsAResync() {
        let other = RecoveryPhase(request: RecoveryRequest(since: 4, epoch: 41), sequence: sequencer()).plan()
        #expect(other.through == 0 && other.frames.count == 2)
        #expect(texts(other)[1].hasPrefix(#"{"type":"resync","reason":"epoch 41 is not"#))
        let evicted = RecoveryPhase(request: RecoveryRequest(since: 1, epoch: 42), sequence: sequencer(messages: 3)).plan()
        #expect(evicted.through == 0)
        #expect(texts(evicted)[1] == #"{"type":"resync","reason":"seq 2 is no longer held: the window starts at 4"}"#)
    }
}

/// `since` and `epoch` come together, as integers, or the query is a 400.
@Suite struct RecoveryQueryTests {
    func parse(_ pairs: [(String, String)]) throws(BadFeedQuery) -> FeedQuery {
        try FeedQuery(parameters: pairs.map { (name: $0.0, value: $0.1) })
    }

    @Test func sinceAndEpochParse() throws {
        #expect(try parse([("since", "17"), ("epoch", "99")]).recovery == RecoveryRequest(since: 17, epoch: 99))
        #expect(try parse([("since", "0"), ("epoch", "1")]).recovery == RecoveryRequest(since: 0, epoch: 1))
        #expect(try parse([]).recovery == nil)
    }

    @Test(arguments: [
        ([("since", "5")], "since without epoch"),
        ([("epoch", "5")], "epoch without since"),
        ([("since", "-1"), ("epoch", "5")], "negative"),
        ([("since", "x"), ("epoch", "5")], "not an integer"),
        ([("since", "99999999999999999999"), ("epoch", "5")], "not an integer"),
        ([("since", "1"), ("epoch", "0")], "not positive"),
        ([("since", "1"), ("epoch", "1.5")], "not an integer"),
    ])
    func badValuesAreRefusedWithAReason(pairs: [(String, String)], reason: String) {
        #expect {
            _ = try parse(pairs)
        } throws: { error in
            guard let error = error as? BadFeedQuery else { return false }
            return error.reason.contains(reason) && !error.reason.contains("\n")
        }
    }
}
