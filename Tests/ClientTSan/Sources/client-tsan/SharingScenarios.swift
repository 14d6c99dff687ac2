@_spi(Testing) import AsyncBroadcast
import Foundation
import Synchronization

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

// Shared upstreams (an AsyncSequence iterated by the library's task, a
// listener fed from its own threads), subscriberCounts and send(contentsOf:),
// hammered from tasks and OS threads. The checks are the contract's basics:
// a subscriber sees the elements of one run only, in order (without gaps
// where its policy is lossless); every run that starts is stopped, once;
// nothing outlives the sequence.

// MARK: - Reading a shared sequence

/// What one subscriber of a shared sequence saw.
///
/// A subscriber keeps the subscriber count above zero for as long as it
/// exists, so the run that is current when it joins is never stopped under
/// it: everything it receives comes from that one run. An element of
/// another run is one the library delivered after stopping its run.
struct SharedReader: Sendable {
    /// Payload sources per run: run `r` sends from sources
    /// `r * sourcesPerRun ..< (r + 1) * sourcesPerRun`.
    let sourcesPerRun: Int
    let lossless: Bool
    var received = 0
    var run: Int?
    var lastIndex: [Int: Int] = [:]
    var problems: [String] = []
    var ended = false
    var thrown: Boom?

    init(sourcesPerRun: Int, lossless: Bool) {
        self.sourcesPerRun = sourcesPerRun
        self.lossless = lossless
    }

    mutating func take(_ payload: Payload) {
        received += 1
        guard payload.isIntact, payload.source >= 0 else {
            problem("payload (\(payload.source), \(payload.index)) is corrupt")
            return
        }
        let run = payload.source / sourcesPerRun
        if let first = self.run, first != run {
            problem("an element of run \(run) after elements of run \(first): a stopped run's element was delivered")
        }
        if self.run == nil { self.run = run }
        if let last = lastIndex[payload.source],
           payload.index <= last || (lossless && payload.index != last + 1) {
            problem("source \(payload.source): index \(payload.index) after \(last)\(lossless ? " (lossless policy)" : "")")
        }
        lastIndex[payload.source] = payload.index
    }

    mutating func problem(_ message: String) {
        if problems.count < 3 { problems.append(message) }
    }
}

/// Reads up to `count` elements (all of them when `nil`); counts each in
/// `consumed` and `progress`.
func readShared<Failure: Error>(
    _ iterator: inout BroadcastSequence<Payload, Failure>.Subscription.AsyncIterator,
    count: Int?,
    into reader: inout SharedReader,
    consumed: Counter? = nil,
    progress: Counter? = nil
) async {
    var read = 0
    while count.map({ read < $0 }) ?? true {
        do {
            guard let payload = try await iterator.next() else {
                reader.ended = true
                return
            }
            reader.take(payload)
            read += 1
            consumed?.increment()
            progress?.increment()
        } catch {
            if reader.thrown != nil { reader.problem("threw twice") }
            reader.thrown = error as? Boom
            if reader.thrown == nil { reader.problem("threw \(error), not a Boom") }
        }
    }
}

func checkReader(_ failures: Failures, _ what: String, _ reader: SharedReader) {
    for problem in reader.problems { failures.record("\(what): \(problem)") }
}

/// Subscribers that join and leave a shared sequence over and over: each
/// one reads a few elements, then leaves by `cancel()`, by being released,
/// by its task being cancelled, or by breaking out of a `for await` over
/// the sequence itself. `joins` counts each subscriber once it is
/// registered (a listener's threads wait for consumption or a new joiner).
func churnShared<Failure: Error>(
    _ sequence: BroadcastSequence<Payload, Failure>,
    lifetimes: Int,
    policies: [BroadcastBufferingPolicy],
    defaultIsLossless: Bool,
    sourcesPerRun: Int,
    joins: Counter? = nil,
    consumed: Counter? = nil,
    rng: SplitMix64,
    failures: Failures,
    what: String
) async {
    var rng = rng
    for life in 0..<lifetimes {
        let policy = policies[rng.below(policies.count)]
        let wanted = 1 + rng.below(10)
        let mode = rng.below(4)
        let label = "\(what) life \(life) mode \(mode)"
        switch mode {
        case 0, 1:  // read, then cancel() (0) or let go (1)
            let subscription = sequence.subscribe(bufferingPolicy: policy)
            joins?.increment()
            var reader = SharedReader(sourcesPerRun: sourcesPerRun, lossless: policy.isLossless)
            var iterator = subscription.makeAsyncIterator()
            await readShared(&iterator, count: wanted, into: &reader, consumed: consumed)
            if mode == 0 {
                subscription.cancel()
                if case .some(.some) = try? await iterator.next() {
                    failures.record("\(label) \(policy.name): an element after cancel()")
                }
            }
            checkReader(failures, "\(label) \(policy.name)", reader)
            failures.check(!reader.ended && reader.received == wanted,
                           "\(label) \(policy.name): ended after \(reader.received) of \(wanted) elements while the sequence lives")
        case 2:  // a consumer task, cancelled after a random number of elements
            let subscription = sequence.subscribe(bufferingPolicy: policy)
            joins?.increment()
            let progress = Counter()
            let lossless = policy.isLossless
            let consumer = Task.detached { () -> SharedReader in
                var reader = SharedReader(sourcesPerRun: sourcesPerRun, lossless: lossless)
                var iterator = subscription.makeAsyncIterator()
                await readShared(&iterator, count: nil, into: &reader, consumed: consumed, progress: progress)
                return reader
            }
            let before = rng.below(wanted + 1)
            if !(await waitUntil { progress.value >= before }) {
                failures.record("\(label) \(policy.name): the consumer read \(progress.value) of \(before) elements")
            }
            consumer.cancel()
            let reader = await consumer.value
            checkReader(failures, "\(label) \(policy.name)", reader)
            failures.check(reader.ended, "\(label) \(policy.name): a cancelled consumer's loop did not end")
        default:  // iterating the sequence itself, as `for await` does; left by dropping the iterator
            var reader = SharedReader(sourcesPerRun: sourcesPerRun, lossless: defaultIsLossless)
            var iterator = sequence.makeAsyncIterator()
            joins?.increment()
            await readShared(&iterator, count: wanted, into: &reader, consumed: consumed)
            checkReader(failures, "\(label) for-await", reader)
            failures.check(!reader.ended && reader.received == wanted,
                           "\(label) for-await: ended after \(reader.received) of \(wanted) elements while the sequence lives")
        }
        // Sometimes a pause, so that the count drops to zero between lives.
        if rng.chance(30) { for _ in 0..<rng.below(4) { await Task.yield() } }
    }
}

/// A start mode for a shared sequence: stop at once, stop after a short
/// delay on the real clock (subscribers arriving race the stop timer), or
/// never stop.
func pickStart(_ rng: inout SplitMix64, lazily: Bool) -> (BroadcastStart, String) {
    switch rng.below(lazily ? 3 : 2) {
    case 0: return (.whileSubscribed(), ".whileSubscribed()")
    case 1: return (.whileSubscribed(stopAfter: .microseconds(200)), ".whileSubscribed(200 µs)")
    default: return (.lazily, ".lazily")
    }
}

/// Counts itself in `live` while it exists: an upstream iteration that
/// outlives its sequence keeps the count above zero.
final class LiveToken: Sendable {
    let live: Counter
    init(_ live: Counter) {
        self.live = live
        live.increment()
    }
    deinit { live.increment(by: -1) }
}

/// Elements consumed and subscribers joined, over all subscribers of one
/// sequence. A paced source waits until one of them moves: buffers stay
/// small, and with nobody listening the source idles (as a quiet socket
/// does) until its run is stopped.
final class Demand: Sendable {
    let consumed = Counter()
    let joins = Counter()
    var mark: (Int, Int) { (consumed.value, joins.value) }
}

/// An endless upstream of `Payload(source: run, index: 0, 1, ...)`, one
/// element per scheduling turn. Some runs honour cancellation: each
/// element waits for `demand` to move, so they idle when nobody consumes,
/// and end only when their task is cancelled: a run left unstopped never
/// ends. The others
/// ignore cancellation, as many real upstreams do, and never idle: the
/// library must drop the element that follows the stop and let the task go.
struct Ticker: AsyncSequence, Sendable {
    let run: Int
    let honoursCancellation: Bool
    let demand: Demand
    let live: Counter

    func makeAsyncIterator() -> Iterator {
        Iterator(run: run, honoursCancellation: honoursCancellation, demand: demand, token: LiveToken(live))
    }

    struct Iterator: AsyncIteratorProtocol {
        let run: Int
        let honoursCancellation: Bool
        let demand: Demand
        let token: LiveToken
        var index = 0
        var mark: (Int, Int)?

        mutating func next() async -> Payload? {
            await Task.yield()
            if honoursCancellation {
                if let mark {
                    while !Task.isCancelled && demand.mark == mark { await Task.yield() }
                }
                mark = demand.mark
                if Task.isCancelled { return nil }
            }
            index += 1
            return Payload(source: run, index: index - 1)
        }
    }
}

// MARK: 14. a shared upstream, subscribers churning, runs stopping and restarting

func sharedUpstreamChurn(seed: UInt64, failures: Failures, scale: Int) async {
    var rng = SplitMix64(seed: seed)
    for k in 0..<(3 * scale) {
        let liveIterations = Counter()
        let (final, full) = await sharedUpstreamRound(k: k, lifetimes: 12 * scale, rng: rng.split(), failures: failures,
                                                      liveIterations: liveIterations)
        // The sequence is gone: the final reader drains and ends, the full
        // subscriber holds the one element the blocked upstream could not
        // follow with another, and no iteration is left.
        let what = "shared upstream #\(k) after release"
        let ended = await waitUntil { final.done.isSet }
        failures.check(ended, "\(what): the reader did not end once the sequence was released")
        if !ended { final.task.cancel() }
        let reader = await final.task.value
        checkReader(failures, what, reader)
        failures.check(reader.ended && reader.thrown == nil, "\(what): the reader did not end normally")
        switch full.poll() {
        case .element(let payload):
            failures.check(payload.index == reader.lastIndex.values.max(),
                           "\(what): the full subscriber holds index \(payload.index), the reader's last is \(reader.lastIndex)")
        default:
            failures.record("\(what): the full subscriber holds nothing")
        }
        if case .end = full.poll() {} else { failures.record("\(what): the full subscriber does not end after its one element") }
        let gone = await waitUntil { liveIterations.value == 0 }
        failures.check(gone, "\(what): \(liveIterations.value) upstream iterations outlive their sequence")
        if failures.count > 0 { return }
    }
}

struct FinalReader: Sendable {
    let task: Task<SharedReader, Never>
    let done: Flag
}

/// Every reference to the sequence lives in this call: when it returns,
/// the sequence is released with a reader parked and the upstream waiting
/// on a full `.bounded(1)` subscriber.
private func sharedUpstreamRound(k: Int, lifetimes: Int, rng: SplitMix64, failures: Failures, liveIterations: Counter)
    async -> (FinalReader, BroadcastSequence<Payload, Never>.Subscription) {
    var rng = rng
    let calls = Counter()
    let demand = Demand()
    let (start, startName) = pickStart(&rng, lazily: false)
    let what = "shared upstream #\(k) \(startName)"
    let sequence = BroadcastSequence<Payload, Never>(bufferingPolicy: .bounded(2), started: start, upstream: {
        let run = calls.increment() - 1
        return Ticker(run: run, honoursCancellation: run % 2 == 0, demand: demand, live: liveIterations)
    })
    let policies: [BroadcastBufferingPolicy] = [.unbounded, .bounded(1), .bounded(3), .bufferingNewest(1), .bufferingOldest(2)]
    await withTaskGroup(of: Void.self) { group in
        for lane in 0..<4 {
            let child = rng.split()
            group.addTask {
                await churnShared(sequence, lifetimes: lifetimes, policies: policies, defaultIsLossless: true,
                                  sourcesPerRun: 1, joins: demand.joins, consumed: demand.consumed,
                                  rng: child, failures: failures, what: "\(what) lane \(lane)")
            }
        }
    }
    // Everyone left: the run is stopped (at once, or when the timer fires),
    // once per start, and its task has returned (an idle run only returns
    // once cancelled).
    let stopped = await waitUntil {
        let counters = sequence.sharingCounters
        return sequence.subscriberCount == 0 && !counters.isRunning && counters.liveUpstreamTasks == 0
            && counters.liveTimerTasks == 0
    }
    let counters = sequence.sharingCounters
    failures.check(stopped, "\(what): after every subscriber left: \(counters), subscriberCount \(sequence.subscriberCount)")
    failures.check(counters.starts >= 1 && counters.starts == counters.stops,
                   "\(what): \(counters.starts) starts, \(counters.stops) stops")
    failures.check(calls.value == counters.starts, "\(what): upstream() called \(calls.value) times for \(counters.starts) starts")

    // A reader first, so that it holds everything the full subscriber got.
    let reader = sequence.subscribe(bufferingPolicy: .unbounded)
    let full = sequence.subscribe(bufferingPolicy: .bounded(1))
    demand.joins.increment()
    let done = Flag()
    let task = Task.detached { () -> SharedReader in
        var result = SharedReader(sourcesPerRun: 1, lossless: true)
        var iterator = reader.makeAsyncIterator()
        await readShared(&iterator, count: nil, into: &result, consumed: demand.consumed)
        done.set()
        return result
    }
    let blocked = await waitUntil { sequence.waitingEmitterCount == 1 }
    failures.check(blocked, "\(what): the upstream does not wait on a full .bounded(1) subscriber")
    withExtendedLifetime(sequence) {}
    return (FinalReader(task: task, done: done), full)
}

// MARK: 15. a listener fed from its own threads; unregister racing the callbacks

/// The listener of one sequence, as the library drives it: each `register`
/// starts `threadsPerRun` threads that call the sink until unregistered
/// (and a few times after), plus one send inside `register` itself.
final class ThreadedListener: Sendable {
    let threadsPerRun = 2
    var sourcesPerRun: Int { threadsPerRun + 1 }
    let failures: Failures
    let what: String
    let registrations = Counter()
    let unregistrations = Counter()
    let liveThreads = Counter()
    /// Elements read by any subscriber, and subscribers joined: the threads
    /// pause after each burst until one of them moves.
    let consumed = Counter()
    let joins = Counter()
    /// Sends made after their registration's unregister had begun.
    let lateSends = Counter()
    let finishRequested = Flag()
    let shutdown = Flag()
    /// Inside `register` or an unregister closure.
    private let busy = Atomic<Bool>(false)
    /// Between a `register` and its unregister.
    private let active = Atomic<Bool>(false)

    init(failures: Failures, what: String) {
        self.failures = failures
        self.what = what
    }

    private func enter(_ call: String) {
        if busy.exchange(true, ordering: .sequentiallyConsistent) {
            failures.record("\(what): \(call) runs while another register or unregister runs")
        }
    }

    private func leave() { busy.store(false, ordering: .sequentiallyConsistent) }

    func register(_ sink: BroadcastSink<Payload, Boom>) -> @Sendable () -> Void {
        enter("register")
        defer { leave() }
        if active.exchange(true, ordering: .sequentiallyConsistent) {
            failures.record("\(what): register called again before the previous registration's unregister")
        }
        let run = registrations.increment() - 1
        let stopped = Flag()
        let unregisterCalls = Counter()
        sink.send(Payload(source: run * sourcesPerRun + threadsPerRun, index: 0))
        for t in 0..<threadsPerRun {
            liveThreads.increment()
            let thread = Thread { [self] in
                feed(sink, source: run * sourcesPerRun + t, finisher: t == 0 ? run : nil, stopped: stopped)
                liveThreads.increment(by: -1)
            }
            thread.start()
        }
        return { [self] in
            enter("unregister")
            defer { leave() }
            if unregisterCalls.increment() != 1 {
                failures.record("\(what): the unregister closure of registration \(run) called \(unregisterCalls.value) times")
            }
            if !active.exchange(false, ordering: .sequentiallyConsistent) {
                failures.record("\(what): unregister of registration \(run) while no registration is active")
            }
            stopped.set()
            unregistrations.increment()
        }
    }

    /// One listener thread: sends in bursts of 16, pausing after each until
    /// a subscriber consumed or joined (so buffers stay small), until
    /// unregistered; then a few late sends, which must be ignored.
    private func feed(_ sink: BroadcastSink<Payload, Boom>, source: Int, finisher run: Int?, stopped: Flag) {
        var index = 0
        var late = 0
        var burst = 0
        var mark = (consumed.value, joins.value)
        var finished = false
        while !shutdown.isSet {
            let isLate = stopped.isSet
            if isLate {
                if late == 3 { break }
                late += 1
            }
            if let run, !finished, finishRequested.isSet {
                finished = true
                sink.finish(throwing: Boom(code: run))
            }
            let result = sink.send(Payload(source: source, index: index))
            index += 1
            if isLate {
                lateSends.increment()
                if !result.isFinished || result.delivered != 0 || result.dropped != 0 {
                    failures.record("\(what): source \(source): a send after unregister began returned \(result)")
                }
                continue
            }
            burst += 1
            if burst == 16 {
                burst = 0
                while !stopped.isSet && !shutdown.isSet && !(run != nil && !finished && finishRequested.isSet)
                    && consumed.value == mark.0 && joins.value == mark.1 {
                    sched_yield()
                }
                mark = (consumed.value, joins.value)
            }
        }
    }
}

func listenerThreads(seed: UInt64, failures: Failures, scale: Int) async {
    var rng = SplitMix64(seed: seed)
    for k in 0..<(3 * scale) {
        let throwing = rng.chance(50)
        let listener = ThreadedListener(failures: failures, what: "listener #\(k)")
        let final = await listenerRound(k: k, lifetimes: 10 * scale, rng: rng.split(), listener: listener,
                                        throwing: throwing, failures: failures)
        let what = "listener #\(k) after \(throwing ? "sink.finish(throwing:)" : "release")"
        let ended = await waitUntil { final.done.isSet }
        failures.check(ended, "\(what): the final reader did not end")
        if !ended { final.task.cancel() }
        let reader = await final.task.value
        checkReader(failures, what, reader)
        failures.check(reader.ended, "\(what): the final reader's loop did not end")
        if throwing {
            // The current registration's first thread finished it.
            let expected = Boom(code: listener.registrations.value - 1)
            failures.check(reader.thrown == expected,
                           "\(what): the reader ended with \(String(describing: reader.thrown)), expected \(expected)")
        } else {
            failures.check(reader.thrown == nil, "\(what): a released sequence threw \(String(describing: reader.thrown))")
        }
        // Every registration was unregistered once, and its threads, late
        // sends included, are done.
        let quiet = await waitUntil {
            listener.liveThreads.value == 0 && listener.unregistrations.value == listener.registrations.value
        }
        failures.check(quiet, "\(what): \(listener.registrations.value) registrations, \(listener.unregistrations.value) unregistered, \(listener.liveThreads.value) threads still sending")
        if !quiet {
            listener.shutdown.set()
            _ = await waitUntil { listener.liveThreads.value == 0 }
        }
        failures.check(listener.lateSends.value > 0 || !quiet, "\(what): no thread sent after its unregister")
        if failures.count > 0 { return }
    }
}

/// Every reference to the sequence lives in this call: when it returns,
/// the sequence is released with the listener's threads still sending.
private func listenerRound(k: Int, lifetimes: Int, rng: SplitMix64, listener: ThreadedListener, throwing: Bool,
                           failures: Failures) async -> FinalReader {
    var rng = rng
    let (start, startName) = pickStart(&rng, lazily: true)
    let what = "listener #\(k) \(startName)"
    let sequence = BroadcastSequence<Payload, Boom>(bufferingPolicy: .bounded(2), started: start, register: { sink in
        listener.register(sink)
    })
    // `.bounded` too is lossless here: a sink never waits, it delivers.
    let policies: [BroadcastBufferingPolicy] = [.unbounded, .bounded(1), .bounded(4), .bufferingNewest(2), .bufferingOldest(2)]
    let sourcesPerRun = listener.sourcesPerRun
    await withTaskGroup(of: Void.self) { group in
        for lane in 0..<3 {
            let child = rng.split()
            group.addTask {
                await churnShared(sequence, lifetimes: lifetimes, policies: policies, defaultIsLossless: true,
                                  sourcesPerRun: sourcesPerRun, joins: listener.joins, consumed: listener.consumed,
                                  rng: child, failures: failures, what: "\(what) lane \(lane)")
            }
        }
    }
    let stopsWhenEmpty = startName != ".lazily"
    let settled = await waitUntil {
        let counters = sequence.sharingCounters
        return sequence.subscriberCount == 0 && counters.liveTimerTasks == 0
            && counters.isRunning != stopsWhenEmpty
            && listener.unregistrations.value == counters.stops
    }
    let counters = sequence.sharingCounters
    failures.check(settled, "\(what): after every subscriber left: \(counters), \(listener.unregistrations.value) unregistered")
    failures.check(listener.registrations.value == counters.starts,
                   "\(what): register called \(listener.registrations.value) times for \(counters.starts) starts")

    // The last subscriber: the sequence goes (or the sink finishes it)
    // while the threads are sending.
    let subscription = sequence.subscribe(bufferingPolicy: .unbounded)
    listener.joins.increment()
    let progress = Counter()
    let done = Flag()
    let task = Task.detached { () -> SharedReader in
        var result = SharedReader(sourcesPerRun: sourcesPerRun, lossless: true)
        var iterator = subscription.makeAsyncIterator()
        await readShared(&iterator, count: nil, into: &result, consumed: listener.consumed, progress: progress)
        done.set()
        return result
    }
    let flowing = await waitUntil { progress.value >= 5 }
    failures.check(flowing, "\(what): the last subscriber received \(progress.value) elements")
    if throwing {
        listener.finishRequested.set()
        let finished = await waitUntil { sequence.isFinished }
        failures.check(finished, "\(what): sink.finish(throwing:) did not finish the sequence")
    }
    withExtendedLifetime(sequence) {}
    return FinalReader(task: task, done: done)
}

// MARK: 16. an eager upstream that throws; subscribers joining from threads drain the error

/// `count` payloads (indices 0...), then `Boom(code:)`. Waits for `gate`
/// first, so that the run is started with no subscriber and the test
/// chooses who is there when elements flow.
struct Countdown: AsyncSequence, Sendable {
    let count: Int
    let code: Int
    let gate: Flag

    func makeAsyncIterator() -> Iterator { Iterator(count: count, code: code, gate: gate) }

    struct Iterator: AsyncIteratorProtocol {
        let count: Int
        let code: Int
        let gate: Flag
        var index = 0

        mutating func next() async throws(Boom) -> Payload? {
            while !gate.isSet && !Task.isCancelled { await Task.yield() }
            if index == count { throw Boom(code: code) }
            index += 1
            return Payload(source: 0, index: index - 1)
        }
    }
}

func eagerUpstreamThrows(seed: UInt64, failures: Failures, scale: Int) async {
    var rng = SplitMix64(seed: seed)
    for k in 0..<(8 * scale) {
        let count = 10 + rng.below(30)
        let gate = Flag()
        let calls = Counter()
        let what = "eager upstream #\(k)"
        // The replay window holds every element: each subscriber, whenever
        // it joins, receives all of them, then the error.
        let sequence = BroadcastSequence<Payload, Boom>(bufferingPolicy: .bounded(2), replay: count, started: .eagerly, upstream: {
            calls.increment()
            return Countdown(count: count, code: k, gate: gate)
        })
        let atInit = sequence.sharingCounters
        failures.check(atInit.starts == 1 && atInit.isRunning, "\(what): not started by init: \(atInit)")

        let policies: [BroadcastBufferingPolicy] = [.bounded(1), .unbounded, .bounded(3), .bufferingNewest(2)]
        var policiesSeen = policies
        var subscriptions = policies.map { sequence.subscribe(bufferingPolicy: $0) }
        // One subscriber leaves early: an eager run does not stop for that.
        let leaver = sequence.subscribe(bufferingPolicy: .bounded(1))
        let leaverTask = Task.detached { () -> Int in
            var read = 0
            do {
                for try await _ in leaver {
                    read += 1
                    if read == 2 { leaver.cancel() }
                }
            } catch {
                read = -1  // the error came before the cancel took effect
            }
            return read
        }
        // Others join from OS threads at random moments while elements flow.
        let joined = Locked<[(BroadcastSequence<Payload, Boom>.Subscription, BroadcastBufferingPolicy)]>([])
        let joiners = (0..<2).map { j in
            let childSeed = rng.split()
            return startThread {
                var child = childSeed
                busyWait(child.below(20_000))
                let policy: BroadcastBufferingPolicy = j == 0 ? .bounded(1) : .bufferingOldest(1)
                let subscription = sequence.subscribe(bufferingPolicy: policy)
                joined.withLock { $0.append((subscription, policy)) }
            }
        }
        var consumers: Consumers = subscriptions.enumerated().map { i, subscription in
            let child = rng.split()
            let lossless = policies[i].isLossless
            return Task.detached { await consume(subscription, sources: 1, lossless: lossless, slow: 20, rng: child) }
        }
        let loop = Task.detached { await consumeSequence(sequence, sources: 1) }
        if rng.chance(50) { gate.set() } else { await onThread { gate.set() } }
        for joiner in joiners { await joiner.value }
        for (subscription, policy) in joined.withLock({ $0 }) {
            subscriptions.append(subscription)
            policiesSeen.append(policy)
            let lossless = policy.isLossless
            consumers.append(Task.detached { await consume(subscription, sources: 1, lossless: lossless) })
        }
        let expected = Boom(code: k)
        for (i, consumer) in consumers.enumerated() {
            let result = await consumer.value
            let label = "\(policiesSeen[i].name)\(i < policies.count ? "" : " joined from a thread")"
            checkConsumer(failures, "\(what) \(label)", result)
            failures.check(result.thrown == expected, "\(what) \(label): ended with \(String(describing: result.thrown)), expected \(expected)")
            let dropped = subscriptions[i].droppedCount
            failures.check(result.received + dropped == count,
                           "\(what) \(label): received \(result.received) + dropped \(dropped) of \(count) elements")
            if policiesSeen[i].isLossless {
                failures.check(result.received == count, "\(what) \(label): received \(result.received) of \(count)")
            }
        }
        let looped = await loop.value
        checkConsumer(failures, "\(what) for-await", looped)
        failures.check(looped.thrown == expected && looped.received == count,
                       "\(what) for-await: received \(looped.received) of \(count), ended with \(String(describing: looped.thrown))")
        let leaverRead = await leaverTask.value
        failures.check(leaverRead == 2, "\(what): the early leaver read \(leaverRead) elements, cancelling itself at 2")
        // A subscriber after the end gets the window, then the error.
        let late = await consume(sequence.subscribe(), sources: 1, lossless: true)
        checkConsumer(failures, "\(what) after the end", late)
        failures.check(late.received == count && late.thrown == expected,
                       "\(what) after the end: received \(late.received) of \(count), ended with \(String(describing: late.thrown))")
        // The run ended once: one upstream() call, its task gone.
        let over = await waitUntil {
            let counters = sequence.sharingCounters
            return counters.liveUpstreamTasks == 0 && !counters.isRunning
        }
        let counters = sequence.sharingCounters
        failures.check(over && counters.starts == 1 && counters.stops == 1 && calls.value == 1,
                       "\(what): after the error: \(counters), upstream() called \(calls.value) times")
        if failures.count > 0 { return }
    }
}
