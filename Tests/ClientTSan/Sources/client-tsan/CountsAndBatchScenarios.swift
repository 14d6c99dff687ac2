@_spi(Testing) import AsyncBroadcast
import Foundation

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

// subscriberCounts read while subscribers come and go, and send(contentsOf:)
// from several producers at once.

// MARK: 17. subscriberCounts readers while subscribers churn

/// What one `subscriberCounts` reader saw.
struct CountsReading: Sendable {
    var reads = 0
    var last: Int?
    var ended = false
    var problems: [String] = []
}

/// Reads `counts` to its end, publishing each count in `latest`.
func readCounts(_ counts: BroadcastValue<Int, Never>.Subscription, latest: Counter, limit: Int,
                slow: Bool, rng: SplitMix64) async -> CountsReading {
    var reading = CountsReading()
    var rng = rng
    for await count in counts {
        if !(0...limit).contains(count), reading.problems.count < 3 {
            reading.problems.append("count \(count) outside 0...\(limit)")
        }
        reading.last = count
        reading.reads += 1
        latest.store(count)
        if slow { for _ in 0..<rng.below(6) { await Task.yield() } }
    }
    reading.ended = true
    return reading
}

func subscriberCountsChurn(seed: UInt64, failures: Failures, scale: Int) async {
    var rng = SplitMix64(seed: seed)
    for k in 0..<(4 * scale) {
        // A plain sequence, or a shared one whose runs start and stop with
        // the count (membership changes then also drive the reconciler).
        let shared = k % 2 == 1
        let what = "subscriberCounts #\(k)\(shared ? " shared" : "")"
        let sequence: BroadcastSequence<Payload, Never> = shared
            ? BroadcastSequence(started: .whileSubscribed(), register: { sink in
                sink.send(Payload(source: 0, index: 0))
                return {}
            })
            : BroadcastSequence(of: Payload.self)
        let lanes = 3, perLane = 2, stable = 3
        let limit = max(lanes * perLane, stable)
        let latest = (0..<4).map { _ in Counter(-1) }
        let done = latest.map { _ in Flag() }
        let readers = latest.enumerated().map { i, counter in
            let counts = sequence.subscriberCounts
            let child = rng.split(), flag = done[i]
            return Task.detached { () -> CountsReading in
                let reading = await readCounts(counts, latest: counter, limit: limit, slow: i == 3, rng: child)
                flag.set()
                return reading
            }
        }
        // A reader that leaves early, by dropping its subscription.
        let leaver = Task.detached { () -> Int in
            var read = 0
            for await _ in sequence.subscriberCounts {
                read += 1
                if read == 3 { break }
            }
            return read
        }
        await withTaskGroup(of: Void.self) { group in
            for lane in 0..<lanes {
                let child = rng.split()
                group.addTask {
                    await countsLane(sequence, lifetimes: 20 * scale, rng: child, failures: failures, what: "\(what) lane \(lane)")
                }
            }
        }
        failures.check(sequence.subscriberCount == 0, "\(what): subscriberCount \(sequence.subscriberCount) after every lane left")
        // Known counts: every reader reaches each of them.
        var held = (0..<stable).map { _ in sequence.subscribe() }
        var fresh = sequence.subscriberCounts.makeAsyncIterator()
        let first = await fresh.next()
        failures.check(first == stable, "\(what): a new subscriberCounts starts at \(String(describing: first)), the count is \(stable)")
        let reachedStable = await waitUntil { latest.allSatisfy { $0.value == stable } }
        failures.check(reachedStable, "\(what): readers' latest counts \(latest.map(\.value)), expected \(stable)")
        held[0].cancel()
        let second = held[1]
        await onThread { second.cancel() }
        let reachedOne = await waitUntil { latest.allSatisfy { $0.value == 1 } }
        failures.check(reachedOne, "\(what): readers' latest counts \(latest.map(\.value)) after two cancels, expected 1")
        held.removeAll()  // the last one leaves by release
        let reachedZero = await waitUntil { latest.allSatisfy { $0.value == 0 } }
        failures.check(reachedZero, "\(what): readers' latest counts \(latest.map(\.value)) once everyone left, expected 0")
        // Finished with nobody left: the count is final, every reader ends.
        sequence.finish()
        for (i, reader) in readers.enumerated() {
            let ended = await waitUntil { done[i].isSet }
            failures.check(ended, "\(what) reader \(i): subscriberCounts did not end after finish with nobody left")
            if !ended { reader.cancel() }
            let reading = await reader.value
            for problem in reading.problems { failures.record("\(what) reader \(i): \(problem)") }
            failures.check(reading.ended && reading.last == 0,
                           "\(what) reader \(i): ended \(reading.ended), last count \(String(describing: reading.last))")
        }
        let leftEarly = await leaver.value
        failures.check(leftEarly <= 3, "\(what): the early reader read \(leftEarly) counts")
        var late = sequence.subscriberCounts.makeAsyncIterator()
        let lateFirst = await late.next()
        let lateSecond = await late.next()
        failures.check(lateFirst == 0 && lateSecond == nil,
                       "\(what): after the end subscriberCounts gave \(String(describing: lateFirst)), \(String(describing: lateSecond))")
        if failures.count > 0 { return }
    }
}

/// One lane: holds up to two subscribers at a time, each leaving by
/// `cancel()`, release, task cancellation of a parked consumer, or a
/// `for await` loop over the sequence that is cancelled; plus subscribes
/// from cancelled tasks, which do not count.
private func countsLane(_ sequence: BroadcastSequence<Payload, Never>, lifetimes: Int, rng: SplitMix64,
                        failures: Failures, what: String) async {
    var rng = rng
    for life in 0..<lifetimes {
        let two = rng.chance(40)
        var held: [BroadcastSequence<Payload, Never>.Subscription] = [sequence.subscribe(bufferingPolicy: .bufferingNewest(1))]
        if two { held.append(sequence.subscribe(bufferingPolicy: .bounded(1))) }
        if rng.chance(20) { await Task.yield() }
        switch rng.below(5) {
        case 0:
            for subscription in held.shuffled(using: &rng) { subscription.cancel() }
        case 1:
            held.removeAll()
        case 2:
            let consumers = held.map { subscription in
                Task.detached { () -> Int in
                    var read = 0
                    for await _ in subscription { read += 1 }
                    return read
                }
            }
            if rng.chance(50) {
                let parked = await waitUntil { held.allSatisfy(\.isConsumerWaiting) }
                failures.check(parked, "\(what) life \(life): consumers never parked")
            }
            held.removeAll()
            for consumer in consumers { consumer.cancel() }
            for consumer in consumers { _ = await consumer.value }
        case 3:
            held.removeAll()
            let loop = Task.detached { () -> Bool in
                for await _ in sequence {}
                return true
            }
            if rng.chance(50) { await Task.yield() }
            loop.cancel()
            failures.check(await loop.value, "\(what) life \(life): a cancelled for-await loop did not end")
        default:
            let cancelled = Task.detached { () -> Bool in
                withUnsafeCurrentTask { $0?.cancel() }
                let subscription = sequence.subscribe()
                var iterator = subscription.makeAsyncIterator()
                return await iterator.next() == nil
            }
            failures.check(await cancelled.value, "\(what) life \(life): a subscription from a cancelled task did not end at once")
            held.removeAll()
        }
        _ = held
    }
}

// MARK: 18. send(contentsOf:) from several producers into parked readers

/// One lossless reader's check of batch atomicity: source `s` sends
/// batches of `batchSizes[s]` consecutive indices, so an element that does
/// not start a batch must follow its predecessor directly.
func readBatches(_ subscription: BroadcastSequence<Payload, Never>.Subscription, batchSizes: [Int],
                 rng: SplitMix64) async -> ConsumerResult {
    var result = ConsumerResult(sources: batchSizes.count)
    var rng = rng
    var previous: Payload?
    for await payload in subscription {
        result.take(payload, lossless: true, keep: false)
        if payload.isIntact, payload.source < batchSizes.count, payload.index % batchSizes[payload.source] != 0,
           !(previous?.source == payload.source && previous?.index == payload.index - 1), result.problems.count < 3 {
            result.problems.append("(\(payload.source), \(payload.index)) follows \(previous.map { "(\($0.source), \($0.index))" } ?? "nothing"): another element landed inside a batch")
        }
        previous = payload
        if rng.chance(10) { await Task.yield() }
    }
    return result
}

func sendContentsOf(seed: UInt64, failures: Failures, scale: Int) async {
    var rng = SplitMix64(seed: seed)
    for k in 0..<(4 * scale) {
        let what = "send(contentsOf:) #\(k)"
        let sequence = BroadcastSequence(of: Payload.self)
        let taskSources = 2, threadSources = 2
        let sources = taskSources + threadSources
        let batches = 60 * scale
        let batchSizes = (0..<sources).map { _ in 1 + rng.below(6) }
        let policies: [BroadcastBufferingPolicy] = [.unbounded, .bounded(2), .bufferingNewest(8), .bufferingOldest(8)]
        let subscriptions = policies.map { sequence.subscribe(bufferingPolicy: $0) }
        let consumers: Consumers = subscriptions.enumerated().map { i, subscription in
            let child = rng.split()
            if policies[i].isLossless {
                return Task.detached { await readBatches(subscription, batchSizes: batchSizes, rng: child) }
            }
            return Task.detached { await consume(subscription, sources: sources, lossless: false, slow: 10, rng: child) }
        }
        let parked = await waitUntil { subscriptions.allSatisfy(\.isConsumerWaiting) }
        failures.check(parked, "\(what): the readers never parked")

        let resultDrops = Counter()
        let badResults = Counter()
        /// Sends batch `b` of `source` as an Array, a slice, or a lazy
        /// sequence that computes its elements and calls back into the
        /// sequence while the library gathers them.
        @Sendable func sendBatch(_ source: Int, _ b: Int, _ shape: Int) {
            let size = batchSizes[source]
            let indices = (b * size)..<((b + 1) * size)
            let result: BroadcastSendResult
            switch shape {
            case 0: result = sequence.send(contentsOf: indices.map { Payload(source: source, index: $0) })
            case 1: result = sequence.send(contentsOf: indices.map { Payload(source: source, index: $0) }[...])
            default:
                result = sequence.send(contentsOf: indices.lazy.map { index in
                    _ = sequence.subscriberCount
                    return Payload(source: source, index: index)
                })
            }
            if result.isFinished || result.delivered + result.dropped < size * policies.count { badResults.increment() }
            resultDrops.increment(by: result.dropped)
        }
        await withTaskGroup(of: Void.self) { group in
            for source in 0..<taskSources {
                let child = rng.split()
                group.addTask {
                    var rng = child
                    for b in 0..<batches {
                        sendBatch(source, b, rng.below(3))
                        if rng.chance(20) { await Task.yield() }
                    }
                }
            }
            for source in taskSources..<sources {
                let child = rng.split()
                group.addTask {
                    await onThread {
                        var rng = child
                        for b in 0..<batches {
                            sendBatch(source, b, rng.below(3))
                            if rng.chance(20) { sched_yield() }
                        }
                    }
                }
            }
        }
        sequence.finish()
        let late = sequence.send(contentsOf: [Payload(source: 0, index: batches * batchSizes[0])])
        failures.check(late.isFinished && late.delivered == 0 && late.dropped == 0,
                       "\(what): a batch after finish returned \(late)")
        failures.check(badResults.value == 0, "\(what): \(badResults.value) batch results reported isFinished or too few deliveries")

        let perSource = batchSizes.map { $0 * batches }
        let total = perSource.reduce(0, +)
        var subscriberDrops = 0
        for (i, consumer) in consumers.enumerated() {
            let result = await consumer.value
            let label = "\(what) \(policies[i].name)"
            checkConsumer(failures, label, result)
            let dropped = subscriptions[i].droppedCount
            subscriberDrops += dropped
            failures.check(result.received + dropped == total, "\(label): received \(result.received) + dropped \(dropped) != sent \(total)")
            if policies[i].isLossless {
                failures.check(result.receivedPerSource == perSource, "\(label): received \(result.receivedPerSource), sent \(perSource)")
            }
        }
        failures.check(subscriberDrops == resultDrops.value,
                       "\(what): subscribers dropped \(subscriberDrops), the batch results say \(resultDrops.value)")
        if failures.count > 0 { return }
    }
}
