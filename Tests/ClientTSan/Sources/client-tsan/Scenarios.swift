@_spi(Testing) import AsyncBroadcast
import Foundation

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

// Each scenario builds its own sequences, runs its tasks and threads to the
// end, and records what went wrong in `failures`. ThreadSanitizer watches
// all of it; the checks here are only the basic results (every task ends,
// nothing is lost, duplicated, reordered or corrupted where the contract
// says so), not a full model (broadcast-stress and the fuzzers do that).

typealias Consumers = [Task<ConsumerResult, Never>]

func checkConsumer(_ failures: Failures, _ what: String, _ result: ConsumerResult) {
    for problem in result.problems { failures.record("\(what): \(problem)") }
    if result.threwTwice { failures.record("\(what): threw its error twice") }
}

// MARK: 1. send from several tasks and threads, a subscriber of each policy

func sendFanOut(seed: UInt64, failures: Failures, scale: Int) async {
    var rng = SplitMix64(seed: seed)
    let taskSources = 2, threadSources = 2
    let sources = taskSources + threadSources
    let perSource = 400 * scale
    let sequence = BroadcastSequence(of: Payload.self)
    let policies: [BroadcastBufferingPolicy] = [
        .unbounded, .bufferingOldest(8), .bufferingNewest(8), .bufferingOldest(0), .bufferingNewest(0), .bounded(4),
    ]
    let subscriptions = policies.map { sequence.subscribe(bufferingPolicy: $0) }
    var consumers: Consumers = []
    for (i, subscription) in subscriptions.enumerated() {
        let lossless = policies[i].isLossless, child = rng.split()
        consumers.append(Task.detached {
            await consume(subscription, sources: sources, lossless: lossless, slow: 5, rng: child)
        })
    }
    // A `for await` over the sequence itself joins when its loop starts.
    let loop = Task.detached { await consumeSequence(sequence, sources: sources) }

    let resultDrops = Counter()
    let badResults = Counter()
    @Sendable func record(_ result: BroadcastSendResult) {
        if result.isFinished || result.delivered + result.dropped < policies.count { badResults.increment() }
        resultDrops.increment(by: result.dropped)
    }
    await withTaskGroup(of: Void.self) { group in
        for source in 0..<taskSources {
            group.addTask {
                for i in 0..<perSource {
                    record(sequence.send(Payload(source: source, index: i)))
                    if i % 32 == 0 { await Task.yield() }
                }
            }
        }
        for source in taskSources..<sources {
            group.addTask {
                await onThread {
                    for i in 0..<perSource {
                        record(sequence.send(Payload(source: source, index: i)))
                        if i % 64 == 0 { sched_yield() }
                    }
                }
            }
        }
    }
    sequence.finish()

    let total = sources * perSource
    failures.check(badResults.value == 0, "fan-out: \(badResults.value) send results reported isFinished or too few subscribers")
    var subscriberDrops = 0
    for (i, consumer) in consumers.enumerated() {
        let result = await consumer.value
        let policy = policies[i].name
        checkConsumer(failures, "fan-out \(policy)", result)
        let dropped = subscriptions[i].droppedCount
        subscriberDrops += dropped
        failures.check(result.thrown == nil, "fan-out \(policy): threw")
        failures.check(result.received + dropped == total,
                       "fan-out \(policy): received \(result.received) + dropped \(dropped) != sent \(total)")
        if policies[i].isLossless {
            failures.check(result.received == total, "fan-out \(policy): received \(result.received) of \(total)")
        }
    }
    let looped = await loop.value
    checkConsumer(failures, "fan-out for-await over the sequence", looped)
    failures.check(subscriberDrops == resultDrops.value,
                   "fan-out: subscribers dropped \(subscriberDrops) but the send results say \(resultDrops.value)")
    failures.check(sequence.subscriberCount == 0, "fan-out: subscriberCount \(sequence.subscriberCount) after the end")
}

// MARK: 2. ping-pong: one element at a time, each one waking a parked consumer

/// One subscriber of `policy`; the producer sends element `i` only once the
/// consumer has read `i - 1` and parked in `next()`. So every element wakes a
/// parked consumer, resuming its continuation from another thread. When the
/// consumer's thread is preempted between publishing its continuation and
/// suspending on it (the producer spins on `isConsumerWaiting`, which turns
/// true right at the publication), the resume lands before the suspension.
/// That is the hand-over ThreadSanitizer must see as synchronized; the Swift
/// runtime's false positive swiftlang/swift#57803 lives exactly there, for
/// continuations that carry a value (`UnsafeContinuation<T, Never>` with a
/// non-Void `T`).
func pingPongPair(policy: BroadcastBufferingPolicy, cycles: Int, failures: Failures, fromThread: Bool) async {
    let sequence = BroadcastSequence(of: Payload.self)
    let subscription = sequence.subscribe(bufferingPolicy: policy)
    let progress = Counter()
    let consumer = Task.detached { await consume(subscription, sources: 1, lossless: true, progress: progress) }
    let payloads = (0..<cycles).map { Payload(source: 0, index: $0) }  // allocated up front: a quick send
    let what = "ping-pong (\(fromThread ? "thread" : "task")) \(policy.name)"
    let stuck = Flag()
    @Sendable func sent(_ i: Int, _ result: BroadcastSendResult) {
        if result.delivered != 1 || result.dropped != 0 || result.isFinished {
            failures.record("\(what): send \(i) delivered \(result.delivered), dropped \(result.dropped)")
        }
    }
    if fromThread {
        await onThread {
            for i in 0..<cycles {
                guard spinUntil({ progress.value == i && subscription.isConsumerWaiting }) else {
                    failures.record("\(what): the consumer did not read \(i - 1) and park (read \(progress.value))")
                    stuck.set()
                    break
                }
                sent(i, sequence.send(payloads[i]))
            }
            sequence.finish()
        }
    } else {
        for i in 0..<cycles {
            guard await waitUntil({ progress.value == i && subscription.isConsumerWaiting }) else {
                failures.record("\(what): the consumer did not read \(i - 1) and park (read \(progress.value))")
                stuck.set()
                break
            }
            sent(i, sequence.send(payloads[i]))
        }
        sequence.finish()
    }
    let result = await consumer.value
    checkConsumer(failures, what, result)
    if !stuck.isSet { failures.check(result.received == cycles, "\(what): received \(result.received) of \(cycles)") }
    failures.check(subscription.droppedCount == 0, "\(what): dropped \(subscription.droppedCount)")
}

let pingPongPolicies: [BroadcastBufferingPolicy] = [.unbounded, .bufferingNewest(1), .bufferingOldest(1), .bounded(1)]

/// Many short episodes (a fresh sequence, consumer task and producer thread
/// each), two pairs at a time: on a 2-core machine this hit the window above
/// far more often than a few long episodes, or than adding CPU-burning
/// threads (measured against a library whose continuations carry a value:
/// a report after ~0.5 s of this scenario on average).
func pingPongWakes(seed: UInt64, failures: Failures, scale: Int, fromThread: Bool) async {
    var rng = SplitMix64(seed: seed)
    let cycles = 25
    let episodes = (fromThread ? 100 : 20) * scale
    let pairs = fromThread ? 2 : 1
    for _ in 0..<episodes {
        await withTaskGroup(of: Void.self) { group in
            for _ in 0..<pairs {
                let policy = pingPongPolicies[rng.below(pingPongPolicies.count)]
                group.addTask { await pingPongPair(policy: policy, cycles: cycles, failures: failures, fromThread: fromThread) }
            }
        }
        if failures.count > 0 { return }
    }
}

// MARK: 3. emit into .bounded subscribers: emitters and consumers take turns

func emitPingPong(seed: UInt64, failures: Failures, scale: Int) async {
    var rng = SplitMix64(seed: seed)
    let emitters = 2
    let perEmitter = 500 * scale
    let sequence = BroadcastSequence(of: Payload.self, bufferingPolicy: .bounded(1))
    let policies: [BroadcastBufferingPolicy?] = [nil, .bounded(2), .unbounded]
    let subscriptions = policies.map { sequence.subscribe(bufferingPolicy: $0) }
    var consumers: Consumers = []
    for (i, subscription) in subscriptions.enumerated() {
        let child = rng.split()
        consumers.append(Task.detached {
            await consume(subscription, sources: emitters, lossless: true, slow: i == 0 ? 20 : 0, rng: child)
        })
    }
    await withTaskGroup(of: Void.self) { group in
        for source in 0..<emitters {
            group.addTask {
                for i in 0..<perEmitter {
                    do {
                        let result = try await sequence.emit(Payload(source: source, index: i))
                        if result.isFinished || result.delivered != policies.count {
                            failures.record("emit ping-pong: emit \(i) delivered \(result.delivered), isFinished \(result.isFinished)")
                        }
                    } catch {
                        failures.record("emit ping-pong: an emit of a task never cancelled threw")
                        return
                    }
                }
            }
        }
    }
    failures.check(sequence.waitingEmitterCount == 0, "emit ping-pong: \(sequence.waitingEmitterCount) emitters still waiting")
    sequence.finish()
    for (i, consumer) in consumers.enumerated() {
        let result = await consumer.value
        let what = "emit ping-pong \(policies[i]?.name ?? ".bounded(1)")"
        checkConsumer(failures, what, result)
        failures.check(result.received == emitters * perEmitter, "\(what): received \(result.received) of \(emitters * perEmitter)")
    }
}

/// A thread makes room (`poll()`) soon after an emitter queues, so the
/// emitter's continuation is resumed from another thread, sometimes while
/// the emitter is still on its way into the suspension.
func emitPair(count: Int, delay: Int, failures: Failures, rng: SplitMix64) async {
    let sequence = BroadcastSequence(of: Payload.self, bufferingPolicy: .bounded(1))
    let subscription = sequence.subscribe()
    let emitterDone = Flag()
    let payloads = (0..<count).map { Payload(source: 0, index: $0) }
    let emitter = Task.detached {
        for i in 0..<count {
            do {
                let result = try await sequence.emit(payloads[i])
                if result.isFinished || result.delivered != 1 {
                    failures.record("emit wakes: emit \(i) delivered \(result.delivered), isFinished \(result.isFinished)")
                }
            } catch {
                failures.record("emit wakes: an emit of a task never cancelled threw")
                break
            }
        }
        emitterDone.set()
    }
    await onThread {
        var rng = rng
        var expected = 0
        while expected < count {
            guard spinUntil({ sequence.waitingEmitterCount > 0 || emitterDone.isSet }) else {
                failures.record("emit wakes: no emitter waiting and the emitter not done after element \(expected)")
                return
            }
            // The emitter is queued; it may not have parked yet. Read after a
            // random moment, so that some reads land while it is parking.
            busyWait(rng.below(delay))
            switch subscription.poll() {
            case .element(let payload):
                if !payload.isIntact || payload.index != expected {
                    failures.record("emit wakes: read index \(payload.index), expected \(expected)")
                    return
                }
                expected += 1
            case .empty:
                if emitterDone.isSet {
                    failures.record("emit wakes: the emitter is done, but only \(expected) of \(count) arrived")
                    return
                }
            case .end, .failure:
                failures.record("emit wakes: the subscription ended early")
                return
            }
        }
    }
    await emitter.value
    sequence.finish()
    if case .end = subscription.poll() {} else { failures.record("emit wakes: no end after finish") }
}

func emitWakesFromThread(seed: UInt64, failures: Failures, scale: Int) async {
    var rng = SplitMix64(seed: seed)
    let count = 25
    let episodes = 20 * scale
    let pairs = 2
    let delay = 500
    for _ in 0..<episodes {
        await withTaskGroup(of: Void.self) { group in
            for _ in 0..<pairs {
                let child = rng.split()
                group.addTask { await emitPair(count: count, delay: delay, failures: failures, rng: child) }
            }
        }
        if failures.count > 0 { return }
    }
}

// MARK: 4. cancelling waiting emitters

func cancelledEmitters(seed: UInt64, failures: Failures, scale: Int) async {
    var rng = SplitMix64(seed: seed)
    for k in 0..<(40 * scale) {
        let sequence = BroadcastSequence(of: Payload.self)
        let subscription = sequence.subscribe(bufferingPolicy: .bounded(1))
        sequence.send(Payload(source: 0, index: 0))  // full now
        let victim = Task.detached { () -> Bool in
            do {
                _ = try await sequence.emit(Payload(source: 1, index: 0))
                return true
            } catch {
                return false
            }
        }
        if !(await waitUntil { sequence.waitingEmitterCount == 1 }) {
            failures.record("cancelled emitters #\(k): the first emit does not wait (waitingEmitterCount \(sequence.waitingEmitterCount))")
        }
        let survivor = Task.detached { () -> BroadcastSendResult? in
            try? await sequence.emit(Payload(source: 2, index: 0))
        }
        if !(await waitUntil { sequence.waitingEmitterCount == 2 }) {
            failures.record("cancelled emitters #\(k): the second emit does not wait (waitingEmitterCount \(sequence.waitingEmitterCount))")
        }
        let racing = rng.chance(60)
        let reader: Task<ConsumerResult, Never>
        let victimDelivered: Bool
        if racing {
            // The reader makes room while another thread cancels the victim.
            let childSeed = rng.split()
            let canceller = startThread {
                var child = childSeed
                busyWait(child.below(3000))
                victim.cancel()
            }
            reader = Task.detached { await consume(subscription, sources: 3, lossless: false) }
            victimDelivered = await victim.value
            await canceller.value
        } else {
            victim.cancel()
            victimDelivered = await victim.value
            failures.check(!victimDelivered, "cancelled emitters #\(k): a cancelled waiting emit returned instead of throwing")
            if !(await waitUntil { sequence.waitingEmitterCount == 1 }) {
                failures.record("cancelled emitters #\(k): the cancelled emit still counts as waiting")
            }
            reader = Task.detached { await consume(subscription, sources: 3, lossless: false) }
        }
        let survived = await survivor.value
        failures.check(survived?.delivered == 1, "cancelled emitters #\(k): the other emit ended with \(String(describing: survived))")
        sequence.finish()
        let result = await reader.value
        checkConsumer(failures, "cancelled emitters #\(k)", result)
        let expected = [1, victimDelivered ? 1 : 0, 1]
        failures.check(result.receivedPerSource == expected,
                       "cancelled emitters #\(k)\(racing ? " (racing)" : ""): received \(result.receivedPerSource), expected \(expected)")
    }
}

// MARK: 5. cancel() racing a parked next()

func cancelRacingNext(seed: UInt64, failures: Failures, scale: Int) async {
    var rng = SplitMix64(seed: seed)
    for k in 0..<(40 * scale) {
        let sequence = BroadcastSequence(of: Payload.self)
        let policy = everyPolicy[rng.below(everyPolicy.count)]
        let subscription = sequence.subscribe(bufferingPolicy: policy)
        let consumer = Task.detached { await consume(subscription, sources: 1, lossless: false) }
        let sends = rng.below(4)
        let mode = rng.below(3)
        switch mode {
        case 0:  // parked, then cancelled from another thread
            for i in 0..<sends { sequence.send(Payload(source: 0, index: i)) }
            if !(await waitUntil { subscription.isConsumerWaiting }) {
                failures.record("cancel/next #\(k) \(policy.name): the consumer never parked")
            }
            await onThread { subscription.cancel() }
        case 1:  // a thread cancels while this task sends and the consumer parks and wakes
            let childSeed = rng.split()
            let canceller = startThread {
                var child = childSeed
                busyWait(child.below(4000))
                subscription.cancel()
            }
            for i in 0..<(sends + 4) {
                sequence.send(Payload(source: 0, index: i))
                await Task.yield()
            }
            await canceller.value
        default:  // two cancels at once, racing a send that wakes the parked consumer
            _ = await waitUntil(within: 1) { subscription.isConsumerWaiting }
            let canceller = startThread { subscription.cancel() }
            sequence.send(Payload(source: 0, index: 0))
            subscription.cancel()
            await canceller.value
        }
        let after = sequence.send(Payload(source: 0, index: 1_000))
        failures.check(after.delivered == 0 && after.dropped == 0,
                       "cancel/next #\(k) \(policy.name): a send after cancel() returned reached the subscriber")
        failures.check(sequence.subscriberCount == 0, "cancel/next #\(k): subscriberCount \(sequence.subscriberCount) after cancel()")
        let result = await consumer.value
        checkConsumer(failures, "cancel/next #\(k) \(policy.name) mode \(mode)", result)
        failures.check(result.lastIndex[0] < 1_000, "cancel/next #\(k): received an element sent after cancel()")
    }
}

// MARK: 6. task cancellation of parked and of busy consumers

func taskCancellation(seed: UInt64, failures: Failures, scale: Int) async {
    var rng = SplitMix64(seed: seed)
    for k in 0..<(15 * scale) {
        let quiet = BroadcastSequence(of: Payload.self, throwing: Boom.self)
        let busy = BroadcastSequence(of: Payload.self)
        let quietSubscriptions = (0..<2).map { _ in
            quiet.subscribe(bufferingPolicy: everyPolicy[rng.below(everyPolicy.count)])
        }
        let busyPolicies: [BroadcastBufferingPolicy] = [.unbounded, .bounded(4), .bufferingNewest(2)]
        let busySubscriptions = busyPolicies.map { busy.subscribe(bufferingPolicy: $0) }
        let progress = busyPolicies.map { _ in Counter() }
        var consumers: Consumers = quietSubscriptions.map { subscription in
            Task.detached { await consume(subscription, sources: 1, lossless: false) }
        }
        for (i, subscription) in busySubscriptions.enumerated() {
            let counter = progress[i], child = rng.split()
            consumers.append(Task.detached {
                await consume(subscription, sources: 1, lossless: busyPolicies[i].isLossless, progress: counter, slow: 30, rng: child)
            })
        }
        let stop = Flag()
        let producer = startThread {
            var i = 0
            while !stop.isSet && i < 100_000 {
                busy.send(Payload(source: 0, index: i))
                i += 1
                if i % 16 == 0 { sched_yield() }
            }
        }
        let ready = await waitUntil {
            quietSubscriptions.allSatisfy(\.isConsumerWaiting) && progress.allSatisfy { $0.value >= 10 }
        }
        failures.check(ready, "task cancellation #\(k): consumers not parked/busy: \(progress.map(\.value))")
        // A send that may wake a parked consumer just as its task is cancelled.
        let waker = rng.chance(50) ? startThread { quiet.send(Payload(source: 0, index: 0)) } : nil
        var cancellers: [Task<Void, Never>] = []
        for consumer in consumers.shuffled(using: &rng) {
            if rng.chance(50) {
                cancellers.append(startThread { consumer.cancel() })
            } else {
                consumer.cancel()
            }
        }
        for (i, consumer) in consumers.enumerated() {
            let result = await consumer.value
            let what = "task cancellation #\(k) \(i < 2 ? "parked" : "busy \(busyPolicies[i - 2].name)")"
            checkConsumer(failures, what, result)
            failures.check(result.thrown == nil, "\(what): a cancelled consumer threw")
        }
        failures.check(quiet.subscriberCount == 0 && busy.subscriberCount == 0,
                       "task cancellation #\(k): subscriberCount \(quiet.subscriberCount), \(busy.subscriberCount) after every consumer ended")
        stop.set()
        await producer.value
        await waker?.value
        for canceller in cancellers { await canceller.value }
    }
}

// MARK: 7. finish and finish(throwing:) racing sends and emits

func finishRacingSends(seed: UInt64, failures: Failures, scale: Int) async {
    var rng = SplitMix64(seed: seed)
    for k in 0..<(6 * scale) {
        let sequence = BroadcastSequence(of: Payload.self, throwing: Boom.self)
        let policies: [BroadcastBufferingPolicy] = [.unbounded, .bufferingNewest(4), .bufferingOldest(4), .bounded(2)]
        let subscriptions = policies.map { sequence.subscribe(bufferingPolicy: $0) }
        var consumers: Consumers = []
        for (i, subscription) in subscriptions.enumerated() {
            let child = rng.split()
            consumers.append(Task.detached {
                await consume(subscription, sources: 3, lossless: policies[i].isLossless, slow: i == 3 ? 10 : 0, rng: child)
            })
        }
        let accepted = (0..<3).map { _ in Counter() }
        let sendsSoFar = Counter()
        let cap = 1_500
        var producers: [Task<Void, Never>] = []
        for source in 0..<2 {
            producers.append(startThread {
                var i = 0
                while i < cap {
                    let result = sequence.send(Payload(source: source, index: i))
                    if result.isFinished {
                        if result.delivered != 0 || result.dropped != 0 {
                            failures.record("finish race: a send reporting isFinished counted \(result)")
                        }
                        break
                    }
                    i += 1
                    sendsSoFar.increment()
                }
                accepted[source].store(i)
            })
        }
        producers.append(Task.detached {
            var i = 0
            while i < cap {
                do {
                    let result = try await sequence.emit(Payload(source: 2, index: i))
                    if result.isFinished { break }
                    i += 1
                } catch {
                    failures.record("finish race: an emit of a task never cancelled threw")
                    break
                }
            }
            accepted[2].store(i)
        })
        let throwing = rng.chance(50)
        let target = rng.below(cap)
        let finisher = startThread {
            _ = spinUntil { sendsSoFar.value >= target }
            if throwing { sequence.finish(throwing: Boom(code: k)) } else { sequence.finish() }
            // Only the first finish counts.
            if throwing { sequence.finish() } else { sequence.finish(throwing: Boom(code: -1)) }
        }
        await finisher.value
        for producer in producers { await producer.value }
        let late = sequence.send(Payload(source: 0, index: cap))
        failures.check(late.isFinished && late.delivered == 0, "finish race: a send after finish returned \(late)")
        let lateEmit = try? await sequence.emit(Payload(source: 0, index: cap))
        failures.check(lateEmit?.isFinished == true, "finish race: an emit after finish returned \(String(describing: lateEmit))")

        let expectedError = throwing ? Boom(code: k) : nil
        let perSource = accepted.map(\.value)
        let total = perSource.reduce(0, +)
        for (i, consumer) in consumers.enumerated() {
            let result = await consumer.value
            let what = "finish race #\(k) \(policies[i].name)"
            checkConsumer(failures, what, result)
            failures.check(result.thrown == expectedError,
                           "\(what): ended with \(String(describing: result.thrown)), expected \(String(describing: expectedError))")
            let dropped = subscriptions[i].droppedCount
            if policies[i].isLossless {
                failures.check(result.receivedPerSource == perSource,
                               "\(what): received \(result.receivedPerSource), but the accepted sends were \(perSource)")
            } else {
                failures.check(result.received + dropped == total,
                               "\(what): received \(result.received) + dropped \(dropped) != accepted \(total)")
            }
        }
    }
}

// MARK: 8. the last reference to the sequence goes away while consumers wait

/// Subscribes consumers and lets the sequence go when this returns (or when
/// the thread it was handed to ends).
func spawnAndDrop(rng: inout SplitMix64, failures: Failures, k: Int, sends: Int) async -> (Consumers, Task<Void, Never>?) {
    let sequence = BroadcastSequence(of: Payload.self, throwing: Boom.self)
    let policies: [BroadcastBufferingPolicy] = [.unbounded, .bufferingOldest(8), .bufferingNewest(8), .bounded(8)]
    var consumers: Consumers = []
    var subscriptions: [BroadcastSequence<Payload, Boom>.Subscription] = []
    for _ in 0..<3 {
        let subscription = sequence.subscribe(bufferingPolicy: policies[rng.below(policies.count)])
        subscriptions.append(subscription)
        consumers.append(Task.detached { await consume(subscription, sources: 1, lossless: true) })
    }
    switch rng.below(3) {
    case 0:  // send, wait until everyone is parked, drop it here
        for i in 0..<sends { sequence.send(Payload(source: 0, index: i)) }
        let parked = await waitUntil { subscriptions.allSatisfy(\.isConsumerWaiting) }
        failures.check(parked, "last reference #\(k): consumers never parked")
        return (consumers, nil)
    case 1:  // a thread holds the last reference: it sends, then lets go
        _ = await waitUntil(within: 1) { subscriptions.allSatisfy(\.isConsumerWaiting) }
        let holder = startThread {
            for i in 0..<sends { sequence.send(Payload(source: 0, index: i)) }
        }
        return (consumers, holder)
    default:  // drop it while the consumers are still starting
        for i in 0..<sends { sequence.send(Payload(source: 0, index: i)) }
        return (consumers, nil)
    }
}

func lastReferenceDropped(seed: UInt64, failures: Failures, scale: Int) async {
    var rng = SplitMix64(seed: seed)
    for k in 0..<(25 * scale) {
        let sends = rng.below(6)
        let (consumers, holder) = await spawnAndDrop(rng: &rng, failures: failures, k: k, sends: sends)
        for consumer in consumers {
            let result = await consumer.value
            checkConsumer(failures, "last reference #\(k)", result)
            failures.check(result.thrown == nil, "last reference #\(k): threw, but a released sequence finishes normally")
            failures.check(result.received == sends, "last reference #\(k): received \(result.received) of \(sends)")
        }
        await holder?.value
    }
}
