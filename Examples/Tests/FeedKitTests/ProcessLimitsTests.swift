import FeedKit
import Testing

/// The caps on the whole process: every window's bytes together, live topics,
/// and the channel namespace.
@Suite struct HistoryBudgetTests {
    func window(_ budget: HistoryBudget, clock: TestClock) -> History {
        History(limits: HistoryLimits(messages: 1000, maximumAge: .seconds(60)), budget: budget, now: { clock.now })
    }

    @Test func theTotalStaysUnderTheCapAndTheOldestWindowsGoFirst() {
        let clock = TestClock()
        let each = message(1).bytes
        let budget = HistoryBudget(limit: 10 * each)
        let old = window(budget, clock: clock)
        let new = window(budget, clock: clock)
        for seq in 1...6 {
            old.append(message(seq))
            clock.advance(by: .milliseconds(1))
        }
        for seq in 1...6 {
            new.append(message(seq))
            clock.advance(by: .milliseconds(1))
        }
        #expect(budget.held <= budget.limit)
        #expect(budget.held == old.bytes + new.bytes)
        // Over the cap at the 11th message: trimmed down to the low-water mark, oldest first.
        #expect(new.count == 6)
        #expect(old.count < 6)
        #expect(reason(old.read(since: 0))?.contains("--history-bytes") == true)
        // What is still held is served.
        #expect(seqs(new.read(since: 0)) == Array(1...6))
        #expect(seqs(old.read(since: 6)) == [])
    }

    @Test func aWindowThatGoesGivesItsBytesBack() {
        let clock = TestClock()
        let budget = HistoryBudget(limit: 1 << 20)
        do {
            let gone = window(budget, clock: clock)
            for seq in 1...5 { gone.append(message(seq)) }
            #expect(budget.held == gone.bytes && budget.held > 0)
        }
        #expect(budget.held == 0)
    }

    @Test func localEvictionAndOutagesAreCounted() {
        let clock = TestClock()
        let budget = HistoryBudget(limit: 1 << 20)
        let small = History(limits: HistoryLimits(messages: 3, maximumAge: .seconds(60)), budget: budget, now: { clock.now })
        for seq in 1...10 { small.append(message(seq)) }
        #expect(budget.held == small.bytes && small.count == 3)
        small.markLost()
        #expect(budget.held == 0)
    }

    @Test func theDefaultIsSizedToTheMachine() {
        #expect(HistoryBudget.defaultLimit(physicalMemory: 24 << 30) == 192 << 20)
        #expect(HistoryBudget.defaultLimit(physicalMemory: 1 << 30) == 32 << 20)
        #expect(HistoryBudget.defaultLimit(physicalMemory: 1 << 40) == 1 << 30)
    }
}

@Suite struct RecoveryPagesTests {
    @Test func aLongWindowIsSentInPagesThenRecovered() {
        let sequencer = Sequencer(history: history(), epoch: 7)
        for seq in 1...10 { sequencer.history.append(message(seq)) }
        let phase = RecoveryPhase(request: RecoveryRequest(since: 2, epoch: 7), sequence: sequencer)
        var plan = phase.plan(pageLimit: 3)
        var texts = plan.frames.map { String(buffer: $0) }
        var pages = 1
        while let next = plan.next {
            plan = phase.page(after: next, through: plan.through, pageLimit: 3)
            texts += plan.frames.map { String(buffer: $0) }
            pages += 1
        }
        #expect(pages == 3)
        #expect(texts.first == #"{"type":"ready","epoch":7,"seq":10}"#)
        #expect(texts.last == #"{"type":"recovered","from":3,"to":10}"#)
        #expect(texts.count == 1 + 8 + 1)
        #expect(plan.through == 10)
    }

    @Test func aPageTheWindowLetGoOfIsAResync() {
        let sequencer = Sequencer(history: history(messages: 5), epoch: 7)
        for seq in 1...5 { sequencer.history.append(message(seq)) }
        let phase = RecoveryPhase(request: RecoveryRequest(since: 0, epoch: 7), sequence: sequencer)
        let plan = phase.plan(pageLimit: 2)
        #expect(plan.next == 2 && plan.frames.count == 3)
        // Meanwhile the window moves past seq 3.
        for seq in 6...9 { sequencer.history.append(message(seq)) }
        let page = phase.page(after: 2, through: plan.through, pageLimit: 2)
        #expect(page.next == nil && page.resyncReason != nil)
        #expect(page.frames.map { String(buffer: $0) } == [#"{"type":"resync","reason":"seq 3 is no longer held: the window starts at 5"}"#])
    }
}

@Suite struct TopicCapTests {
    @Test func aNewTopicIsRefusedAtTheCapAndALiveOneIsNot() {
        let sequencers = Sequencers(maximumTopics: 2)
        #expect(sequencers.admit("a") != nil)
        #expect(sequencers.admit("b") != nil)
        #expect(sequencers.admit("c") == nil)
        #expect(sequencers.admit("a") != nil)
        #expect(sequencers.refused == 1 && sequencers.count == 2)
        sequencers.release("b")
        #expect(sequencers.admit("c") != nil)
        // A LISTEN loop holds its topic without a cap: it runs only for an admitted topic.
        _ = sequencers.retain("c")
        #expect(sequencers.count == 2)
    }
}

@Suite struct ChannelNamespaceTests {
    @Test func aTopicIsAChannelInTheNamespace() throws {
        #expect(ChannelNamespace.default.channel(for: "feed") == "livefeed.feed")
        let namespace = try ChannelNamespace(prefix: "app_2")
        #expect(namespace.channel(for: "otherapp_jobs") == "app_2.otherapp_jobs")
    }

    @Test func theLongestChannelFitsPostgreSQL() throws {
        let prefix = String(repeating: "p", count: ChannelNamespace.maximumPrefixBytes)
        let topic = String(repeating: "t", count: FeedTopic.maximumLength)
        #expect(try ChannelNamespace(prefix: prefix).channel(for: topic).utf8.count == 63)
        #expect(throws: BadFeedQuery.self) { try ChannelNamespace(prefix: prefix + "p") }
    }

    @Test func aPrefixThatNeedsQuotingIsRefused() {
        for bad in ["", "a\"b", "a.b", "App", "a b", "a;b"] {
            #expect(throws: BadFeedQuery.self) { try ChannelNamespace(prefix: bad) }
        }
    }
}
