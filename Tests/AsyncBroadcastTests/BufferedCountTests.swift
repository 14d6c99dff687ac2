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

    // claims: SEQ-BUFFEREDCOUNT
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

    // claims: SEQ-BUFFEREDCOUNT
    @Test(arguments: policies)
    func isZeroOnceCancelledWhateverItHeld(policy: BroadcastBufferingPolicy) {
        let sequence = BroadcastSequence<Int, Never>()
        let subscription = sequence.subscribe(bufferingPolicy: policy)
        for i in 1...3 { sequence.send(i) }
        subscription.cancel()
        #expect(subscription.bufferedCount == 0)
    }

    // claims: SEQ-BUFFEREDCOUNT
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

    // claims: SEQ-BUFFEREDCOUNT
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

    /// A capped subscriber whose reader keeps up, observed from another
    /// thread while a producer sends without pause: every snapshot is a
    /// count that existed, so never negative and never above what the policy
    /// lets the subscriber hold (its capacity, or the replay it started
    /// with). Two separate loads of head and tail are not a snapshot: an
    /// observer held up between them subtracts a head that is stale by
    /// everything read meanwhile (`-DASYNCBROADCAST_FAULT_TORN_BUFFERED_COUNT`;
    /// seen here at 1-25 per million samples, up to tens of thousands).
    /// Bounded by samples and by time, and stops at the first count out of
    /// bounds.
    /// The last case reads under the sequence lock only (no lock-free try):
    /// the fallback for producers too fast for a lock-free snapshot.
    /// One case at a time: each keeps three threads busy for 2 s.
    // claims: SEQ-BUFFEREDCOUNT-IN-BOUNDS
    @Test(.serialized, arguments: [
        (BroadcastBufferingPolicy.bufferingOldest(1), 0, false, 4),
        (.bufferingOldest(16), 0, false, 4),
        (.bufferingOldest(2), 4, false, 4),
        (.bounded(1), 0, true, 4),
        (.bounded(4), 0, true, 4),
        (.bufferingOldest(1), 0, false, 0),
    ])
    func aSnapshotWhileTheReaderKeepsUpNeverExceedsWhatThePolicyAllows(
        policy: BroadcastBufferingPolicy, replay: Int, emits: Bool, lockFreeAttempts: Int
    ) async throws {
        let capacity: Int
        switch policy {
        case .bufferingOldest(let n), .bufferingNewest(let n), .bounded(let n): capacity = n
        case .unbounded: capacity = .max
        }
        let ceiling = max(capacity, replay)
        let sequence = BroadcastSequence<Int, Never>(replay: replay)
        for i in 0..<replay { sequence.send(-1 - i) }
        let subscription = sequence.subscribe(bufferingPolicy: policy)
        let stop = Locked(false)
        let producerStopped = Locked(false)
        // The emitter is a task (`emit` is async; it suspends whenever the
        // subscriber is full). The reader and a sender are threads: a task
        // whose buffer never runs dry never suspends, and would hold one of
        // the cooperative pool's threads (two here) for the whole test.
        let emitter: Task<Void, Never>? = emits ? Task.detached {
            var i = 0
            while !stop.value {
                do { try await sequence.emit(i) } catch { break }
                i += 1
            }
            producerStopped.value = true
        } : nil
        let found = Locked<(samples: Int, outOfBounds: [Int])>((0, []))
        try await raceOnThreads(3, "an observer reading bufferedCount, a reader, a sender") { role in
            if role == 1 {
                // Reads everything, until the producer has stopped.
                while true {
                    if case .element = subscription.poll() { continue }
                    if producerStopped.value { break }
                }
                return
            }
            if role == 2 {
                if emits { return }
                var i = 0
                while !stop.value {
                    sequence.send(i)
                    i += 1
                }
                producerStopped.value = true
                return
            }
            defer { stop.value = true }
            let samplesWanted = 2_000_000
            let deadline = ContinuousClock.now + .seconds(2)
            var samples = 0
            var outOfBounds: [Int] = []
            while samples < samplesWanted {
                let count = lockFreeAttempts == 4
                    ? subscription.bufferedCount : subscription.core.observedCount(lockFreeAttempts: lockFreeAttempts)
                if count < 0 || count > ceiling {
                    outOfBounds.append(count)
                    if outOfBounds.count == 5 { break }
                }
                samples += 1
                if samples % 256 == 0 && ContinuousClock.now > deadline { break }
            }
            found.value = (samples, outOfBounds)
        }
        await emitter?.value
        print("bufferedCount snapshot, \(policy), replay \(replay), \(lockFreeAttempts) lock-free tries: \(found.value.samples) samples, out of [0, \(ceiling)]: \(found.value.outOfBounds)")
        #expect(found.value.outOfBounds.isEmpty,
                "bufferedCount returned \(found.value.outOfBounds) with \(policy) and replay \(replay) (at most \(ceiling) can exist), in \(found.value.samples) samples")
        #expect(found.value.samples > 1_000)  // (tens of thousands under TSan, millions in a plain build)
    }

    /// While a producer sends and a reader reads, a snapshot is never
    /// negative and never more than what was sent.
    // claims: SEQ-BUFFEREDCOUNT-IN-BOUNDS
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
