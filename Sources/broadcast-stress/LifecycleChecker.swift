import AsyncBroadcast
import AsyncBroadcastTestSupport

// The checks of the lifecycle rounds (LifecycleRound): those made as a
// subscriber reads (LifecycleReading) and those made once every producer
// has finished (LifecycleChecker.checkStays). The list of what is checked
// is at the top of LifecycleRound.swift.

/// What a stayer saw, checked once every producer has finished.
struct StayRecord: Sendable {
    let topic: Int
    let description: String
    let neverDrops: Bool
    /// The topic's next sequence number right after subscribe(to:) returned.
    let firstAfterReturn: Int
    /// Each producer's sequence numbers received (`firstAfterReturn` on).
    let received: [Int: [Int]]
    let dropped: Int
    let evicted: Bool
    /// Ended by the round's finish() with no finish(topic:) of its topic
    /// begun since before it subscribed: it must have everything.
    let complete: Bool
}

/// What one subscriber read, checked as it reads.
struct LifecycleReading {
    let topic: Int
    let choice: LifecycleRoundRunner.Choice
    let initial: Int
    var lagSum = 0
    var count = 0
    var lastSeq: [Int: Int] = [:]
    var received: [Int: [Int]] = [:]
    var seqs: [Int] = []
    let firstAfterReturn: Int

    mutating func take(_ event: BroadcastEvent<LifeItem>, _ world: LifecycleWorld) {
        switch event {
        case .lagged(let n):
            if n <= 0 { world.report("lagged", "a .lagged(\(n)) on topic \(topic), \(choice.description)") }
            lagSum += n
        case .element(let item):
            count += 1
            if item.topic != topic {
                world.report("isolation", "a subscriber of topic \(topic) received an item of topic \(item.topic)")
            }
            guard item.source >= 0 else { return }
            seqs.append(item.seq)
            if let previous = lastSeq[item.source], item.seq <= previous {
                world.report("order", "producer \(item.source): item \(item.seq) after \(previous) on topic \(topic)")
            }
            lastSeq[item.source] = item.seq
            if item.seq >= firstAfterReturn { received[item.source, default: []].append(item.seq) }
        }
    }

    /// A hard-limited subscriber never holds more than its limit, or
    /// than the replay it started with.
    func checkHeld(_ subscription: LifecycleWorld.Topics.Subscription, _ world: LifecycleWorld) {
        guard let hard = choice.hard else { return }
        let held = subscription.bufferedCount
        if held > max(hard, initial) {
            world.report(
                "eviction: never more than the hard limit",
                "topic \(topic), \(choice.description): holds \(held), started with \(initial)")
        }
    }

    /// Once the events stream has ended.
    func checkEnd(_ subscription: LifecycleWorld.Topics.Subscription, _ world: LifecycleWorld, how: String) {
        let dropped = subscription.droppedCount
        let evicted = subscription.isEvicted
        if lagSum != dropped {
            world.report(
                "Σ lagged == droppedCount",
                "topic \(topic), \(choice.description), ended by \(how)\(evicted ? " (evicted)" : ""): .lagged counts add up to \(lagSum), droppedCount \(dropped)")
        }
        guard evicted else { return }
        world.evictions.withLock { $0 += 1 }
        if choice.hard == nil && choice.soft == nil {
            world.report("eviction: only with a limit", "topic \(topic), \(choice.description): evicted")
        }
        if let capacity = choice.capacity {
            let hardCannot = choice.hard.map { capacity <= $0 } ?? true
            let softCannot = choice.soft.map { capacity <= $0 && initial <= $0 } ?? true
            if hardCannot && softCannot {
                world.report(
                    "eviction: a lossy subscriber within its limits is never evicted",
                    "topic \(topic), \(choice.description), started holding \(initial): evicted, although its policy never lets a send make it hold more than its limit")
            }
        }
    }
}

enum LifecycleChecker {
    static func checkStays(_ world: LifecycleWorld) {
        // Each producer's items per topic, in order (increasing). A
        // record's share is the suffix from its first sequence number on,
        // found by binary search: thousands of records (stayers join again
        // after every finish(topic:)) must not each filter the whole log
        // (a round took over 20 s that way under ThreadSanitizer).
        var sentBy = [[[Int]]](repeating: [[Int]](repeating: [], count: world.plan.topics), count: world.plan.producers)
        for (producer, log) in world.sent.enumerated() {
            for (topic, seq) in log.value { sentBy[producer][topic].append(seq) }
        }
        func firstIndex(_ seqs: [Int], atLeast value: Int) -> Int {
            var low = 0, high = seqs.count
            while low < high {
                let mid = (low + high) / 2
                if seqs[mid] < value { low = mid + 1 } else { high = mid }
            }
            return low
        }
        for record in world.stays.value {
            var missing = 0
            for producer in 0..<world.plan.producers {
                let all = sentBy[producer][record.topic]
                let start = firstIndex(all, atLeast: record.firstAfterReturn)
                let expected = all[start...]
                let got = record.received[producer] ?? []
                if record.neverDrops {
                    if !expected.starts(with: got) {
                        let gap = zip(expected, got).first { $0 != $1 }.map { "item \($0.0) missing, \($0.1) received" } ?? "more than sent"
                        world.report(
                            "no missed send after subscribe(to:) returned",
                            "topic \(record.topic), \(record.description), producer \(producer): \(gap) (received \(got.count) of the \(expected.count) stamped from \(record.firstAfterReturn) on)")
                    } else if record.complete && got.count != expected.count {
                        world.report(
                            "no missed send after subscribe(to:) returned",
                            "topic \(record.topic), \(record.description), producer \(producer): ended by finish(), received \(got.count) of the \(expected.count) items stamped after its subscribe(to:) returned (first missing \(expected[start + got.count]))")
                    }
                } else {
                    // Received ones are distinct (each producer's order is
                    // checked as they arrive) and all from this suffix.
                    missing += expected.count - got.count
                }
            }
            if !record.neverDrops && record.complete && missing > record.dropped {
                world.report(
                    "no missed send after subscribe(to:) returned",
                    "topic \(record.topic), \(record.description): \(missing) items stamped after its subscribe(to:) returned never arrived, but droppedCount is \(record.dropped)")
            }
        }
        guard world.plan.listener == .none else { return }
        let unwatched = world.tracks.map { $0.value.unwatched }
        var reported = 0
        for (topic, seqs) in world.pendingUnwatched.value {
            for seq in seqs where unwatched[topic].contains(seq) {
                reported += 1
                if reported <= 2 {
                    world.report(
                        "a send to a topic that is not live keeps nothing",
                        "topic \(topic): a real subscriber received item \(seq), sent while no real subscriber existed or was subscribing (replay \(world.plan.replay))")
                }
            }
        }
    }
}
