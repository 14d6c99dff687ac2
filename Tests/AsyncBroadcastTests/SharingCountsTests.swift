import Foundation
import Testing
@_spi(Testing) @testable import AsyncBroadcast

/// `subscriberCounts`: SHARING 12. Test names start with the sentence they
/// check.
@Suite struct SharingCountsTests {
    /// Reads a counts subscription until it ends, into `seen`.
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    static func watch(_ counts: BroadcastValue<Int, Never>.Subscription, into seen: Locked<[Int]>) -> Task<Void, Never> {
        Task {
            for await count in counts { seen.withLock { $0.append(count) } }
        }
    }

    // claims: SEQ-COUNTS-FOLLOW
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s12CountsStartWithTheCurrentCount() async throws {
        let shared = BroadcastSequence<Int, Never>(started: .lazily) { _ in {} }
        let subscriptions = [shared.subscribe(), shared.subscribe()]
        #expect(try await take(1, from: shared.subscriberCounts) == [2])
        _ = subscriptions
    }

    // claims: SEQ-COUNTS-FOLLOW
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s12CountsThenFollowEachChange() async throws {
        let shared = BroadcastSequence<Int, Never>(started: .whileSubscribed()) { _ in {} }
        let counts = shared.subscriberCounts
        #expect(counts.poll().element == 0)
        let first = shared.subscribe()
        #expect(counts.poll().element == 1)
        let second = shared.subscribe()
        #expect(counts.poll().element == 2)
        first.cancel()
        #expect(counts.poll().element == 1, "a subscriber leaving was not reported")
        second.cancel()
        #expect(counts.poll().element == 0, "the last subscriber leaving was not reported")
        #expect(counts.poll().isEmpty, "no change, nothing to read")
        // And to a reader parked in next().
        let reader = Task { try await take(1, from: counts) }
        try await waitUntil("the reader parked") { counts.isConsumerWaiting }
        let third = shared.subscribe()
        #expect(try await withDeadline("the parked reader") { try await reader.value } == [1])
        _ = third
    }

    // claims: SEQ-COUNTS-FOLLOW
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s12ASlowReaderGetsTheLatestCount() async throws {
        let shared = BroadcastSequence<Int, Never>(started: .lazily) { _ in {} }
        let counts = shared.subscriberCounts
        #expect(counts.poll().element == 0)
        let subscriptions = (0..<10).map { _ in shared.subscribe() }
        subscriptions[0].cancel()
        #expect(counts.poll().element == 9, "not the latest count")
        #expect(counts.poll().isEmpty)
    }

    /// Whatever happens between two reads, a reader never gets the count it
    /// got last time: the count changing and coming back is no news.
    ///
    /// Conflated by change, like any `BroadcastValue`: a reader that missed
    /// 0 → 1 → 0 gets the latest count (0, the one it had) once, and never
    /// the same change twice.
    // claims: SEQ-COUNTS-FOLLOW
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s12AReaderGetsTheLatestCountNeverTheSameChangeTwice() async throws {
        let shared = BroadcastSequence<Int, Never>(started: .whileSubscribed()) { _ in {} }
        let counts = shared.subscriberCounts
        #expect(counts.poll().element == 0)
        #expect(counts.poll().isEmpty, "the first count came twice")
        // Up and back down between two reads: the latest count, once.
        shared.subscribe().cancel()
        #expect(counts.poll().element == 0)
        #expect(counts.poll().isEmpty, "the same change came twice")
        let kept = shared.subscribe()
        #expect(counts.poll().element == 1)
        shared.subscribe().cancel()
        #expect(counts.poll().element == 1)
        #expect(counts.poll().isEmpty, "the same change came twice")
        kept.cancel()
        #expect(counts.poll().element == 0)
        #expect(counts.poll().isEmpty)
    }

    // claims: SEQ-COUNTS-END
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s12CountsEndAfterFinishOnceTheCountReachesZero() async throws {
        let shared = BroadcastSequence<Int, Never>(started: .lazily) { sink in
            sink.send(1)
            return {}
        }
        let holding = shared.subscribe()  // holds the element sent in register
        let seen = Locked<[Int]>([])
        let reader = Self.watch(shared.subscriberCounts, into: seen)
        try await waitUntil("the reader saw 1") { seen.value == [1] }
        shared.finish()
        // The subscriber still holds an element: it counts, the counts go on.
        #expect(shared.subscriberCount == 1)
        #expect(drainNow(shared.subscriberCounts) == nil, "the counts ended while a subscriber still counted")
        #expect(pollAll(holding) == [1])
        #expect(holding.poll().isEnd)
        try #require(drainNow(shared.subscriberCounts) == [0], "the drained subscriber's leaving did not end the counts")
        try await withDeadline("the counts end") { await reader.value }
        #expect(seen.value == [1, 0])
        // A new reader gets the final count, then the end.
        #expect(try await drain(shared.subscriberCounts) == [0])
    }

    // claims: SEQ-COUNTS-NOT-SUBSCRIBER
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s12CountsAreNotASubscriberAndDoNotStartALazySequence() async throws {
        let feed = Feed(of: Never.self)
        let shared = BroadcastSequence<Int, Never>(started: .lazily) { feed.make() }
        let counts = shared.subscriberCounts
        #expect(counts.poll().element == 0)
        #expect(shared.subscriberCount == 0)
        #expect(shared.sharingCounters.starts == 0)
    }

    // claims: SEQ-COUNTS-NOT-SUBSCRIBER
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s12CountsDoNotKeepTheSequenceAlive() async throws {
        let log = ListenerLog()
        var shared: BroadcastSequence<Int, Never>? = BroadcastSequence(started: .eagerly) { _ in
            log.record(.register) {}
            return { log.record(.unregister) {} }
        }
        let weak = WeakBox(shared)
        let counts = shared!.subscriberCounts
        shared = nil
        #expect(weak.isNil, "a subscriberCounts subscription kept the sequence alive")
        #expect(log.events == [.register, .unregister])
        #expect(try await drain(counts) == [0], "the counts of a released sequence end")
    }

    // claims: SEQ-COUNTS-FOLLOW
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s12CountsWorkOnAPlainSequence() async throws {
        let plain = BroadcastSequence(of: Int.self)
        let seen = Locked<[Int]>([])
        let reader = Self.watch(plain.subscriberCounts, into: seen)
        try await waitUntil("the reader saw 0") { seen.value == [0] }
        let subscription = plain.subscribe()
        try await waitUntil("the reader saw 1") { seen.value.last == 1 }
        subscription.cancel()
        try #require(plain.subscriberCounts.poll().element == 0, "the subscriber leaving was not reported")
        try await waitUntil("the reader saw 0 again") { seen.value.last == 0 }
        plain.finish()
        try await withDeadline("the counts end") { await reader.value }
        #expect(seen.value == [0, 1, 0])
    }

    /// 1000 subscribers join, 500 leave, from eight threads at once, while
    /// a reader watches: the count it ends on is the true one.
    // claims: SEQ-COUNTS-FOLLOW
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s12AThousandSubscribersJoiningAndLeavingEndOnTheTrueCount() async throws {
        for round in 0..<5 {
            let shared = BroadcastSequence<Int, Never>(started: .whileSubscribed()) { _ in {} }
            let seen = Locked<[Int]>([])
            let reader = Self.watch(shared.subscriberCounts, into: seen)
            try await waitUntil("round \(round): the reader started") { !seen.value.isEmpty }
            let kept = Locked<[BroadcastSequence<Int, Never>.Subscription]>([])
            try await raceOnThreads(8, "1000 subscribers, round \(round)") { thread in
                var mine: [BroadcastSequence<Int, Never>.Subscription] = []
                for index in 0..<125 {
                    let subscription = shared.subscribe()
                    if index % 2 == 0 { mine.append(subscription) } else { subscription.cancel() }
                }
                // Leave a few of the kept ones too: the last change may be a removal.
                for subscription in mine.suffix(2) { subscription.cancel() }
                kept.withLock { $0 += mine.dropLast(2) }
            }
            let truth = kept.value.count
            #expect(shared.subscriberCount == truth)
            try #require(shared.subscriberCounts.poll().element == truth,
                         "round \(round): subscriberCounts reports a stale count")
            try await waitUntil("round \(round): the reader caught up with \(truth) (it has \(seen.value.last ?? -1))") {
                seen.value.last == truth
            }
            shared.finish()
            for subscription in kept.value { subscription.cancel() }
            try await withDeadline("round \(round): the reader ends") { await reader.value }
            let values = seen.value
            #expect(values.last == 0)
            #expect(values.allSatisfy { (0...1000).contains($0) })
        }
    }
}

extension BroadcastSequence.Subscription.PollResult {
    var element: Element? {
        if case .element(let element) = self { return element }
        return nil
    }

    var isEmpty: Bool {
        if case .empty = self { return true }
        return false
    }
}

/// Everything a `BroadcastValue` subscription has now, up to its end;
/// `nil` if it has not ended.
func drainNow<Value>(_ subscription: BroadcastValue<Value, Never>.Subscription) -> [Value]? {
    var values: [Value] = []
    while true {
        switch subscription.poll() {
        case .element(let value): values.append(value)
        case .end: return values
        case .empty, .failure: return nil
        }
    }
}
