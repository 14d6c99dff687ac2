import AsyncBroadcastTestSupport
import Foundation
import Testing
@_spi(Testing) @testable import AsyncBroadcast

/// `Subscription.bufferedCount`: the elements a subscriber holds unread.
@Suite struct BufferedCountTests {
    static let policies: [BroadcastBufferingPolicy] = [
        .unbounded, .bounded(2), .bufferingOldest(2), .bufferingNewest(2), .bufferingOldest(0), .bufferingNewest(0),
    ]

    /// What a subscriber of `policy` holds after `n` sends with no reader.
    static func held(after n: Int, _ policy: BroadcastBufferingPolicy) -> Int {
        switch policy {
        case .unbounded, .bounded: return n  // a full .bounded still receives from send
        case .bufferingOldest(let limit), .bufferingNewest(let limit): return min(n, limit)
        }
    }

    @Test(arguments: policies)
    func countsWhatIsUnreadAndFollowsEveryRead(policy: BroadcastBufferingPolicy) {
        let sequence = BroadcastSequence<Int, Never>()
        let subscription = sequence.subscribe(bufferingPolicy: policy)
        #expect(subscription.bufferedCount == 0)
        for i in 1...5 {
            sequence.send(i)
            #expect(subscription.bufferedCount == Self.held(after: i, policy), "after \(i) sends")
        }
        var left = Self.held(after: 5, policy)
        while pollOne(subscription) != nil {
            left -= 1
            #expect(subscription.bufferedCount == left)
        }
        #expect(left == 0)
    }

    @Test(arguments: policies)
    func isZeroOnceCancelledWhateverItHeld(policy: BroadcastBufferingPolicy) {
        let sequence = BroadcastSequence<Int, Never>()
        let subscription = sequence.subscribe(bufferingPolicy: policy)
        for i in 1...3 { sequence.send(i) }
        subscription.cancel()
        #expect(subscription.bufferedCount == 0)
    }

    @Test func countsReplayAndWhatIsLeftAfterFinishThenZeroOnceTheEndIsTaken() {
        let sequence = BroadcastSequence<Int, Never>(replay: 3)
        for i in 1...5 { sequence.send(i) }
        let subscription = sequence.subscribe(bufferingPolicy: .bounded(1))
        #expect(subscription.bufferedCount == 3)  // the replay window, past the capacity
        sequence.finish()
        #expect(subscription.bufferedCount == 3)  // not ended: it still has elements to read
        #expect(pollAll(subscription) == [3, 4, 5])
        #expect(subscription.bufferedCount == 0)
        let late = sequence.subscribe()  // after finish: the replay window, never registered
        #expect(late.bufferedCount == 3)
    }

    @Test func isZeroOnceTheTaskCancellationIsNoticed() async throws {
        let sequence = BroadcastSequence<Int, Never>()
        let subscription = sequence.subscribe()
        let reader = Task { () -> Int in
            var count = 0
            for await _ in subscription { count += 1 }
            return count
        }
        try await waitUntil("the reader waits") { subscription.isConsumerWaiting }
        reader.cancel()
        _ = try await withDeadline("the reader ends") { await reader.value }
        sequence.send(1)  // skipped: the subscriber has ended
        #expect(subscription.bufferedCount == 0)
    }

    /// While a producer sends and a reader reads, a snapshot is never
    /// negative and never more than what was sent.
    @Test func aSnapshotWhileSendingAndReadingStaysInBounds() async throws {
        let total = 20_000
        let sequence = BroadcastSequence<Int, Never>()
        let subscription = sequence.subscribe()
        let reader = Task.detached { () -> Int in
            var count = 0
            for await _ in subscription { count += 1 }
            return count
        }
        let sent = Locked(0)
        let producer = Task.detached {
            for i in 0..<total {
                sequence.send(i)
                sent.value = i + 1
            }
            sequence.finish()
        }
        var samples = 0
        var outOfBounds: [String] = []
        while sent.value < total {
            let count = subscription.bufferedCount
            let ceiling = sent.value + 1  // a send may be in flight
            if count < 0 || count > ceiling { outOfBounds.append("\(count) with \(ceiling - 1) sent") }
            samples += 1
            await Task.yield()
        }
        await producer.value
        let received = try await withDeadline("the reader drains") { await reader.value }
        #expect(received == total)
        #expect(outOfBounds.isEmpty, "\(outOfBounds.prefix(5))")
        #expect(subscription.bufferedCount == 0)
        #expect(samples > 0)
    }
}
