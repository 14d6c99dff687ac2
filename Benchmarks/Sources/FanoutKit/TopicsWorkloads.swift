// topics — keyed fan-out: `BroadcastTopics` against the peers a user would
// otherwise write (TopicsPeers.swift). `fanout-compare --filter topics` runs
// the three cells; each prints its own table. Every run checks its results.
//
// - topics: memory — K = 1,000,000 topics with one idle subscriber each
//   (`Int` and `String` topics, `Int` elements): allocator bytes and
//   allocations per topic + subscriber (MallocInterposer, requested bytes
//   allocated minus freed, as the idle-memory cell), the time to create them
//   (subscribe to K distinct topics) and to tear them down (cancel and
//   release every subscription, until the registry is empty). K = 100,000
//   runs first, so that the scale driver's estimate can skip a peer that
//   would not fit the budget at 1,000,000.
// - topics: fan-out — Centrifugo's shape scaled to this machine: S = 100,000
//   subscribers, each on a personal topic and on one of S/10 group topics of
//   10 (a reader task per subscription, 2·S); P = 1, 2, 4 producer threads
//   send to random topics; deliveries per second and the time of one send call.
// - topics: churn — threads subscribing to a random topic of a small space,
//   sending a marker to it, checking their own subscription holds it, and
//   cancelling, while a producer sends to random topics: cycles per second,
//   and the markers missed (the race of a hand-built dictionary of sequences).
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif
@_spi(Testing) import AsyncBroadcast
@preconcurrency import OpenCombine
import Synchronization

// MARK: Keys

/// A topic key the cells can make from an index.
protocol TopicKey: Hashable & Sendable {
    static var typeName: String { get }
    static func make(_ i: Int) -> Self
}

extension Int: TopicKey {  // `make` is Payload's: the index itself
    static var typeName: String { "Int" }
}

extension String: TopicKey {
    static var typeName: String { "String" }
    /// "topic:" + up to 7 digits: at most 13 UTF-8 bytes, so a small
    /// (inline) string: no allocation of its own.
    static func make(_ i: Int) -> String { "topic:\(i)" }
}

// MARK: 1. Memory: K topics with one idle subscriber each

/// Waits (sleeping 1 ms at a time) until `done()` or `seconds` have passed.
func waitUntil(seconds: Double, _ done: () async -> Bool) async -> Bool {
    let deadline = nowNanos() &+ UInt64(seconds * 1e9)
    while true {
        if await done() { return true }
        if nowNanos() > deadline { return false }
        try? await Task.sleep(for: .milliseconds(1))
    }
}

/// Fills in one memory run's numbers: bytes and allocations per topic (if
/// metered), creation and teardown time.
func memoryNumbers(_ run: inout ScaleRun, k: Int, counts: ByteCounts?, create: UInt64, teardown: UInt64) {
    if let c = counts {
        run.extra["bytes"] = Double(c.bytes - c.freedBytes) / Double(k)
        run.extra["allocs"] = Double(c.mallocs - c.frees) / Double(k)
    }
    run.extra["create"] = Double(create)
    run.extra["teardown"] = Double(teardown)
}

func memoryOurs<T: TopicKey>(_ keys: [T], meter: ByteMeter?) async -> ScaleRun {
    var run = ScaleRun()
    let k = keys.count
    let topics = BroadcastTopics<T, Int, Never>()
    var subs: [BroadcastTopics<T, Int, Never>.Subscription] = []
    subs.reserveCapacity(k)
    meter?.start()
    let t0 = nowNanos()
    for key in keys { subs.append(topics.subscribe(to: key)) }
    let t1 = nowNanos()
    let counts = meter?.stop()
    if topics.topicCount != k { run.error = "topicCount \(topics.topicCount) after subscribing to \(k) topics" }
    let t2 = nowNanos()
    for s in subs { s.cancel() }
    subs.removeAll()
    let empty = await waitUntil(seconds: 10) { topics.topicCount == 0 }
    let t3 = nowNanos()
    if !empty, run.error == nil { run.error = "topicCount \(topics.topicCount) 10 s after cancelling all, expected 0" }
    memoryNumbers(&run, k: k, counts: counts, create: t1 &- t0, teardown: t3 &- t2)
    return run
}

func memoryLockDict<T: TopicKey>(_ keys: [T], meter: ByteMeter?) async -> ScaleRun {
    var run = ScaleRun()
    let k = keys.count
    let peer = LockSequencesTopics<T>()
    var handles: [LockSequencesTopics<T>.Handle] = []
    handles.reserveCapacity(k)
    meter?.start()
    let t0 = nowNanos()
    for key in keys { handles.append(peer.subscribe(to: key)) }
    let t1 = nowNanos()
    let counts = meter?.stop()
    if peer.topicCount != k { run.error = "\(peer.topicCount) sequences after subscribing to \(k) topics" }
    let t2 = nowNanos()
    for (i, h) in handles.enumerated() { peer.cancel(h, of: keys[i]) }
    handles.removeAll()
    let t3 = nowNanos()
    if peer.topicCount != 0, run.error == nil { run.error = "\(peer.topicCount) sequences left after cancelling all" }
    memoryNumbers(&run, k: k, counts: counts, create: t1 &- t0, teardown: t3 &- t2)
    return run
}

func memoryActor<T: TopicKey>(_ keys: [T], meter: ByteMeter?) async -> ScaleRun {
    var run = ScaleRun()
    let k = keys.count
    let peer = ActorStreamTopics<T>()
    var streams: [AsyncStream<Int>] = []
    streams.reserveCapacity(k)
    meter?.start()
    let t0 = nowNanos()
    for key in keys { streams.append(await peer.subscribe(to: key).stream) }
    let t1 = nowNanos()
    let counts = meter?.stop()
    let live = await peer.topicCount
    if live != k { run.error = "\(live) topics after subscribing to \(k)" }
    let t2 = nowNanos()
    streams.removeAll()  // each stream's termination removes its continuation, in a task
    let empty = await waitUntil(seconds: 60) { await peer.topicCount == 0 }
    let t3 = nowNanos()
    if !empty, run.error == nil { run.error = "\(await peer.topicCount) topics 60 s after releasing every stream, expected 0" }
    memoryNumbers(&run, k: k, counts: counts, create: t1 &- t0, teardown: t3 &- t2)
    return run
}

func memoryCombine<T: TopicKey>(_ keys: [T], meter: ByteMeter?) async -> ScaleRun {
    var run = ScaleRun()
    let k = keys.count
    let peer = CombineTopics<T>()
    let box = SinkBox()
    var cancellables: [AnyCancellable] = []
    cancellables.reserveCapacity(k)
    meter?.start()
    let t0 = nowNanos()
    for key in keys { cancellables.append(peer.subscribe(to: key) { box.tally.add($0) }) }
    let t1 = nowNanos()
    let counts = meter?.stop()
    if peer.topicCount != k { run.error = "\(peer.topicCount) subjects after subscribing to \(k) topics" }
    let t2 = nowNanos()
    for (i, c) in cancellables.enumerated() { peer.cancel(c, of: keys[i]) }
    cancellables.removeAll()
    let t3 = nowNanos()
    if peer.topicCount != 0, run.error == nil { run.error = "\(peer.topicCount) subjects left after cancelling all" }
    memoryNumbers(&run, k: k, counts: counts, create: t1 &- t0, teardown: t3 &- t2)
    return run
}

/// Diagnostics for the breakdown: K plain `BroadcastSequence`s with one
/// subscriber each (no registry), and one sequence with K subscribers.
func memorySequences(_ k: Int, meter: ByteMeter?) async -> ScaleRun {
    var run = ScaleRun()
    var sequences: [BroadcastSequence<Int, Never>] = []
    var subs: [BroadcastSequence<Int, Never>.Subscription] = []
    sequences.reserveCapacity(k)
    subs.reserveCapacity(k)
    meter?.start()
    let t0 = nowNanos()
    for _ in 0..<k {
        let s = BroadcastSequence<Int, Never>()
        sequences.append(s)
        subs.append(s.subscribe())
    }
    let t1 = nowNanos()
    let counts = meter?.stop()
    if let i = sequences.firstIndex(where: { $0.subscriberCount != 1 }) { run.error = "sequence \(i) has \(sequences[i].subscriberCount) subscribers" }
    let t2 = nowNanos()
    for s in subs { s.cancel() }
    subs.removeAll()
    sequences.removeAll()
    let t3 = nowNanos()
    memoryNumbers(&run, k: k, counts: counts, create: t1 &- t0, teardown: t3 &- t2)
    return run
}

func memoryOneTopic(_ k: Int, meter: ByteMeter?) async -> ScaleRun {
    var run = ScaleRun()
    let topics = BroadcastTopics<Int, Int, Never>()
    var subs: [BroadcastTopics<Int, Int, Never>.Subscription] = []
    subs.reserveCapacity(k)
    meter?.start()
    let t0 = nowNanos()
    for _ in 0..<k { subs.append(topics.subscribe(to: 0)) }
    let t1 = nowNanos()
    let counts = meter?.stop()
    if topics.subscriberCount(of: 0) != k || topics.topicCount != 1 {
        run.error = "\(topics.subscriberCount(of: 0)) subscribers on \(topics.topicCount) topics, expected \(k) on 1"
    }
    let t2 = nowNanos()
    for s in subs { s.cancel() }
    subs.removeAll()
    let t3 = nowNanos()
    if topics.topicCount != 0, run.error == nil { run.error = "topicCount \(topics.topicCount) after cancelling all" }
    memoryNumbers(&run, k: k, counts: counts, create: t1 &- t0, teardown: t3 &- t2)
    return run
}

let diagSequences = "(diagnostic) K × BroadcastSequence + 1 subscriber, no registry"
let diagOneTopic = "(diagnostic) BroadcastTopics, 1 topic with K subscribers"

extension ScaleContext {
    func memoryCells<T: TopicKey>(_: T.Type, keys: [T], meter: ByteMeter?, diagnostics: Bool) -> [ScaleCell] {
        var cells = [
            ScaleCell(peer: TopicsPeerName.ours) { await memoryOurs(keys, meter: meter) },
            ScaleCell(peer: TopicsPeerName.lockDict) { await memoryLockDict(keys, meter: meter) },
            ScaleCell(peer: TopicsPeerName.actor) { await memoryActor(keys, meter: meter) },
            ScaleCell(peer: TopicsPeerName.combine) { await memoryCombine(keys, meter: meter) },
        ]
        if diagnostics {
            let k = keys.count
            cells.append(ScaleCell(peer: diagSequences) { await memorySequences(k, meter: meter) })
            cells.append(ScaleCell(peer: diagOneTopic) { await memoryOneTopic(k, meter: meter) })
        }
        return cells
    }

    func topicsMemoryTable(_ o: CompareOptions) async -> [String] {
        let counts: [Int]
        if let n = plan.onlyN, n > 0 {
            counts = [n]
        } else {
            counts = plan.smoke ? [20_000] : [100_000, 1_000_000]
        }
        let runs = plan.smoke ? 1 : Swift.min(plan.reps, 3)
        let meter = o.byteMeter
        // (K, key type) → (metered runs, timed runs)
        var table: [(k: Int, key: String, bytes: [PeerRuns], timed: [PeerRuns])] = []
        func measure<T: TopicKey>(_: T.Type, _ k: Int) async {
            let keys = (0..<k).map { T.make($0) }
            let diag = T.self == Int.self
            var bytes: [PeerRuns] = []
            if let meter {
                bytes = await interleave(.topicsMemory, n: k, tag: " \(T.typeName) bytes", runs: 1,
                                         memoryCells(T.self, keys: keys, meter: meter, diagnostics: diag))
            }
            let timed = await interleave(.topicsMemory, n: k, tag: " \(T.typeName)", runs: runs,
                                         memoryCells(T.self, keys: keys, meter: nil, diagnostics: diag))
            table.append((k, T.typeName, bytes, timed))
        }
        for k in counts {
            await measure(Int.self, k)
            await measure(String.self, k)
        }
        var out: [String] = []
        func p(_ s: String = "") { out.append(s) }
        p("")
        p("#### \(ScaleWorkload.topicsMemory.rawValue): K topics, one idle subscriber each (`Int` elements)")
        p("")
        p("| K | topic | peer | bytes per topic + subscriber | allocations per topic | create µs per topic (median) | min | teardown µs per topic (median) | min | runs |")
        p("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|")
        for (k, key, bytes, timed) in table {
            for pr in timed {
                if pr.skipped {
                    p("| \(grouped(k)) | \(key) | \(pr.peer) | | | not run | | | | 0 |")
                    continue
                }
                let metered = bytes.first { $0.peer == pr.peer && !$0.skipped }?.runs.first
                let b = metered?.extra["bytes"].map { fmt($0, 0) } ?? "–"
                let a = metered?.extra["allocs"].map { fmt($0, 2) } ?? "–"
                let create = pr.runs.compactMap { $0.extra["create"] }.map { $0 / Double(k) / 1e3 }
                let down = pr.runs.compactMap { $0.extra["teardown"] }.map { $0 / Double(k) / 1e3 }
                var name = pr.peer
                if let e = pr.error ?? bytes.first(where: { $0.peer == pr.peer })?.error { name += " **WRONG: \(e)**" }
                p("| \(grouped(k)) | \(key) | \(name) | \(b) | \(a) | \(fmt(median(create), 2)) | \(fmt(create.min() ?? .nan, 2)) "
                    + "| \(fmt(median(down), 2)) | \(fmt(down.min() ?? .nan, 2)) | \(pr.runs.count) |")
            }
        }
        p("")
        p("Each run subscribes once to each of K distinct topics (`Int` keys 0..<K, or `String` keys \"topic:0\"…, at most "
            + "13 bytes: small strings, no allocation of their own; made before the clock starts), keeps every "
            + "subscription without reading it, then cancels and releases them all. Bytes: "
            + (meter.map { "\($0.source)" } ?? "not measured (no malloc interposer)")
            + ", allocated minus freed over the K subscribes, / K, in one separate untimed run per peer (so the "
            + "subscriptions, the peer's dictionaries and their growth, and the per-topic objects are all included; "
            + "requested sizes, the allocator's rounding and headers come on top). Allocations: net live allocations / K. "
            + "Create: the K subscribes, / K; teardown: cancelling and releasing every subscription until the registry is "
            + "empty (AsyncBroadcast: `topicCount` 0; actor+AsyncStream: releasing the streams, whose `onTermination` tasks "
            + "remove them, until the actor's dictionary is empty), / K. Median and minimum of \(runs) timed run(s), "
            + "peers interleaved. Peers: AsyncBroadcast `BroadcastTopics` (`subscribe(to:)`, `cancel()`); "
            + "lock+[Topic: BroadcastSequence] (a `Mutex` around the dictionary, get-or-create under it, `subscribe()` "
            + "outside; cancel, then remove the topic under the lock if its `subscriberCount` is 0); actor+AsyncStream "
            + "(an `AsyncStream` and its dictionary entry per subscriber); OpenCombine dictionary (a `PassthroughSubject` "
            + "per topic, a `sink` per subscriber). The diagnostic rows split AsyncBroadcast's bytes: K plain "
            + "`BroadcastSequence`s with one subscriber each, and one topic with K subscribers (a subscriber alone). "
            + "Checked: K topics live after subscribing (`topicCount`; the peers' dictionaries), 0 after the teardown.")
        return out
    }
}

// MARK: 2. Fan-out: Centrifugo's shape

/// The sends of one fan-out configuration, made before any run: every
/// producer's topics, and what each topic must receive.
///
/// Two shapes. `topics`: Centrifugo's, S subscribers each on a personal
/// topic and on one of S/10 group topics of 10 (topics 0..<S personal,
/// S..<S+G groups). `sequences`: K sparse broadcasters (plain
/// `BroadcastSequence`s) of 1 (even index) or 2 (odd index) subscribers.
/// Either way the subscriptions are numbered in topic order, each topic's
/// contiguous (`firstSubscription`), so a peer finds a topic's members by index.
final class FanoutSends: Sendable {
    enum Shape: Sendable {
        case topics
        case sequences
    }
    let shape: Shape
    let subscribers: Int
    let groups: Int
    let producers: Int
    let topicCount: Int
    let shift: Int
    let mask: Int
    /// Per producer: the topic of each of its sends.
    let plan: [[Int32]]
    let expectedCount: [Int32]
    let expectedSum: [Int]
    let deliveries: Int
    let sends: Int
    /// Topic t's subscriptions are `firstSubscription[t] ..< firstSubscription[t + 1]`.
    let firstSubscription: [Int32]
    /// The topic of each subscription.
    let topicOfSubscription: [Int32]

    /// `subscribers`: S for `.topics`, K (the sequences) for `.sequences`.
    init(subscribers s: Int, producers p: Int, sends m: Int, shape: Shape = .topics) {
        self.shape = shape
        subscribers = s
        switch shape {
        case .topics:
            groups = (s + 9) / 10
            topicCount = s + groups
        case .sequences:
            groups = 0
            topicCount = s
        }
        producers = p
        shift = Swift.max(1, Int.bitWidth - (topicCount - 1).leadingZeroBitCount)
        mask = (1 << shift) - 1
        let per = m / p
        sends = per * p
        // The topics cell's draws are the ones it always had.
        var rng = SplitMix(seed: (shape == .topics ? 0x70_1c5 : 0x5ba_25e) &+ UInt64(p))
        var plan: [[Int32]] = []
        var count = [Int32](repeating: 0, count: topicCount)
        var sum = [Int](repeating: 0, count: topicCount)
        for q in 0..<p {
            var topics = [Int32]()
            topics.reserveCapacity(per)
            for i in 0..<per {
                let t = Int(rng.next() % UInt64(topicCount))
                topics.append(Int32(t))
                count[t] += 1
                sum[t] &+= Self.key(producer: q, index: i, topic: t, producers: p, shift: shift)
            }
            plan.append(topics)
        }
        self.plan = plan
        expectedCount = count
        expectedSum = sum
        var first = [Int32](repeating: 0, count: topicCount + 1)
        var topicOf: [Int32] = []
        var d = 0
        for t in 0..<topicCount {
            let members = Self.members(of: t, subscribers: s, shape: shape)
            first[t + 1] = first[t] + Int32(members)
            for _ in 0..<members { topicOf.append(Int32(t)) }
            d += Int(count[t]) * members
        }
        firstSubscription = first
        topicOfSubscription = topicOf
        deliveries = d
    }

    @inline(__always)
    static func key(producer q: Int, index i: Int, topic t: Int, producers p: Int, shift: Int) -> Int {
        ((i &* p &+ q) << shift) | t
    }
    @inline(__always)
    func key(producer q: Int, index i: Int) -> (key: Int, topic: Int) {
        let t = Int(plan[q][i])
        return (Self.key(producer: q, index: i, topic: t, producers: producers, shift: shift), t)
    }
    static func members(of topic: Int, subscribers s: Int, shape: Shape) -> Int {
        switch shape {
        case .topics:
            if topic < s { return 1 }
            let g = topic - s
            return Swift.min(10, s - g * 10)
        case .sequences:
            return 1 + (topic & 1)
        }
    }
    /// `.topics`: 0..<S personal (topic j), S..<2S group (topic S + (j−S)/10).
    var subscriptionCount: Int { topicOfSubscription.count }
    @inline(__always) func topic(ofSubscription j: Int) -> Int { Int(topicOfSubscription[j]) }
    /// The subscription the deliberate fault (FANOUT_SCALE_FAULT=1) miscounts:
    /// the first one that is sent anything, so that the fault always shows.
    var faultySubscription: Int {
        (0..<subscriptionCount).first { expectedCount[topic(ofSubscription: $0)] > 0 } ?? 0
    }
}

/// What one subscription received.
struct KeyTally: Sendable {
    var count = 0
    var sum = 0
    var foreign = 0
    var outOfOrder = 0
    var last = SIMD4<Int>(repeating: -1)

    @inline(__always)
    mutating func add(_ key: Int, topic: Int, shift: Int, mask: Int, producers: Int) {
        count &+= 1
        sum &+= key
        if key & mask != topic { foreign &+= 1 }
        let seq = key >> shift
        let q = seq & (producers - 1)
        if seq <= last[q] { outOfOrder &+= 1 }
        last[q] = seq
    }

    func check(_ sends: FanoutSends, topic t: Int) -> String? {
        if foreign > 0 { return "\(foreign) elements of other topics" }
        if count != Int(sends.expectedCount[t]) || sum != sends.expectedSum[t] {
            return "count \(count)/\(sends.expectedCount[t]), sum \(sum)/\(sends.expectedSum[t])"
        }
        if outOfOrder > 0 { return "\(outOfOrder) elements out of their producer's order" }
        return nil
    }
}

enum TopicSend: Sendable {
    /// From P pthreads.
    case thread(@Sendable (_ key: Int, _ topic: Int) -> Void)
    /// From P tasks (the actor peer: `await` needs a task).
    case task(@Sendable (_ key: Int, _ topic: Int) async -> Void)
}

/// Runs the producers of `sends`; returns (start, each producer's send times).
func runTopicProducers(_ sends: FanoutSends, _ send: TopicSend) async -> (start: UInt64, times: [CallTimes]) {
    let p = sends.producers
    let per = sends.sends / p
    let times = (0..<p).map { _ in CallTimes(capacity: per) }
    let ready = Counter()
    let go = Flag()
    let finished = Counter()
    switch send {
    case .thread(let send):
        for q in 0..<p {
            let t = times[q]
            spawnThread {
                ready.increment()
                while !go.isSet { sched_yield() }
                for i in 0..<per {
                    let (key, topic) = sends.key(producer: q, index: i)
                    let a = nowNanos()
                    send(key, topic)
                    t.record(nowNanos() &- a)
                }
                finished.increment()
            }
        }
        while ready.current < p { try? await Task.sleep(for: .microseconds(20)) }
        let start = nowNanos()
        go.set()
        while finished.current < p { try? await Task.sleep(for: .microseconds(200)) }
        return (start, times)
    case .task(let send):
        let start = nowNanos()
        await withTaskGroup(of: Void.self) { group in
            for q in 0..<p {
                let t = times[q]
                group.addTask {
                    for i in 0..<per {
                        let (key, topic) = sends.key(producer: q, index: i)
                        let a = nowNanos()
                        await send(key, topic)
                        t.record(nowNanos() &- a)
                    }
                }
            }
        }
        return (start, times)
    }
}

/// The fan-out run for peers whose subscribers are `AsyncSequence`s read by
/// a task each: subscribe all (in `FanoutSends`' subscription order), start
/// the readers, send, wait until every reader has its expected count, finish,
/// check every reader's count, sum, topic and order.
func runTopicsFanout<S: AsyncSequence & Sendable>(
    _ sends: FanoutSends, setupStart: UInt64, streams: [S], send: TopicSend,
    finish: @escaping @Sendable () async -> Void, meter: ByteMeter? = nil, beat: @escaping @Sendable () -> Void
) async -> ScaleRun where S.Element == Int, S.Failure == Never {
    let n = streams.count
    let ready = Latch(n)
    let reached = Counter()
    let stamps = Slots<UInt64>(n, 0)
    let shift = sends.shift, mask = sends.mask, producers = sends.producers
    let faultyIndex = sends.faultySubscription
    var readers: [Task<KeyTally, Never>] = []
    readers.reserveCapacity(n)
    for (j, stream) in streams.enumerated() {
        let topic = sends.topic(ofSubscription: j)
        let want = Int(sends.expectedCount[topic])
        // FANOUT_SCALE_FAULT=1: one subscription (the first sent anything)
        // counts its first element twice.
        let faulty = scaleFault && j == faultyIndex
        readers.append(Task.detached {
            var iterator = stream.makeAsyncIterator()
            var tally = KeyTally()
            var done = want == 0
            if done { reached.increment() }
            ready.arrive()
            while let key = await iterator.next(isolation: nil) {
                tally.add(key, topic: topic, shift: shift, mask: mask, producers: producers)
                if faulty && tally.count == 1 { tally.count += 1 }
                if !done && tally.count >= want {
                    done = true
                    stamps[j] = nowNanos()
                    reached.increment()
                }
            }
            return tally
        })
    }
    await ready.wait()
    var run = ScaleRun(setupNanos: nowNanos() &- setupStart)
    beat()
    meter?.start()
    let cpu0 = processCPUNanos()
    let (start, times) = await runTopicProducers(sends, send)
    let all = await waitUntil(seconds: 60) { reached.current >= n }
    run.extra["cpu"] = Double(processCPUNanos() &- cpu0)
    if let counts = meter?.stop() { run.extra["allocs"] = Double(counts.mallocs) }
    var end: UInt64 = start
    for j in 0..<n where stamps[j] > end { end = stamps[j] }
    await finish()
    var tallies: [KeyTally] = []
    tallies.reserveCapacity(n)
    for r in readers { tallies.append(await r.value) }
    if !all { run.error = "\(n - reached.current) of \(n) readers did not get their elements within 60 s" }
    for (j, t) in tallies.enumerated() where run.error == nil {
        if let e = t.check(sends, topic: sends.topic(ofSubscription: j)) { run.error = "subscription \(j): \(e)" }
    }
    run.deliveriesPerSecond = Double(sends.deliveries) / (Double(end &- start) / 1e9)
    run.sendCallNanos = times.flatMap(\.samples)
    return run
}

/// The CPU time of the whole process (every thread).
func processCPUNanos() -> UInt64 {
    var t = timespec()
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t)
    return UInt64(t.tv_sec) * 1_000_000_000 + UInt64(t.tv_nsec)
}

/// One run's rate on standard error (the table has only median, min, max).
func logFanoutRun(_ peer: String, _ run: ScaleRun) -> ScaleRun {
    log("    \(peer): \(fmt(run.deliveriesPerSecond / 1e6, 3)) M deliveries/s, CPU \(fmt((run.extra["cpu"] ?? .nan) / 1e9, 2)) s, set-up \(fmt(Double(run.setupNanos) / 1e9, 2)) s\(run.error.map { " WRONG: " + $0 } ?? "")")
    return run
}

func fanoutOurs(_ sends: FanoutSends, meter: ByteMeter? = nil, beat: @escaping @Sendable () -> Void) async -> ScaleRun {
    let setupStart = nowNanos()
    let topics = BroadcastTopics<Int, Int, Never>()
    let subs = (0..<sends.subscriptionCount).map { topics.subscribe(to: sends.topic(ofSubscription: $0)) }
    var run = await runTopicsFanout(sends, setupStart: setupStart, streams: subs,
                                    send: .thread { key, topic in topics.send(key, to: topic) },
                                    finish: { topics.finish() }, meter: meter, beat: beat)
    if topics.topicCount != 0, run.error == nil { run.error = "topicCount \(topics.topicCount) after finish()" }
    return run
}

func fanoutLockDict(_ sends: FanoutSends, beat: @escaping @Sendable () -> Void) async -> ScaleRun {
    let setupStart = nowNanos()
    let peer = LockSequencesTopics<Int>()
    let subs = (0..<sends.subscriptionCount).map { peer.subscribe(to: sends.topic(ofSubscription: $0)).subscription }
    return await runTopicsFanout(sends, setupStart: setupStart, streams: subs,
                                 send: .thread { key, topic in peer.send(key, to: topic) },
                                 finish: { peer.finishAll() }, beat: beat)
}

func fanoutActor(_ sends: FanoutSends, beat: @escaping @Sendable () -> Void) async -> ScaleRun {
    let setupStart = nowNanos()
    let peer = ActorStreamTopics<Int>()
    var streams: [AsyncStream<Int>] = []
    streams.reserveCapacity(sends.subscriptionCount)
    for j in 0..<sends.subscriptionCount { streams.append(await peer.subscribe(to: sends.topic(ofSubscription: j)).stream) }
    return await runTopicsFanout(sends, setupStart: setupStart, streams: streams,
                                 send: .task { key, topic in await peer.publish(key, to: topic) },
                                 finish: { await peer.finishAll() }, beat: beat)
}

/// OpenCombine: a sink per subscription, called on the producer's thread
/// (OpenCombine serialises the calls into one subscriber).
func fanoutCombine(_ sends: FanoutSends, beat: @escaping @Sendable () -> Void) async -> ScaleRun {
    let setupStart = nowNanos()
    let peer = CombineTopics<Int>()
    let n = sends.subscriptionCount
    let tallies = Slots<KeyTally>(n, KeyTally())
    let shift = sends.shift, mask = sends.mask, producers = sends.producers
    var cancellables: [AnyCancellable] = []
    cancellables.reserveCapacity(n)
    for j in 0..<n {
        let topic = sends.topic(ofSubscription: j)
        cancellables.append(peer.subscribe(to: topic) { key in
            tallies.base[j].add(key, topic: topic, shift: shift, mask: mask, producers: producers)
        })
    }
    var run = ScaleRun(setupNanos: nowNanos() &- setupStart)
    beat()
    let cpu0 = processCPUNanos()
    let (start, times) = await runTopicProducers(sends, .thread { key, topic in peer.send(key, to: topic) })
    let end = nowNanos()
    run.extra["cpu"] = Double(processCPUNanos() &- cpu0)
    for j in 0..<n where run.error == nil {
        if let e = tallies[j].check(sends, topic: sends.topic(ofSubscription: j)) { run.error = "subscription \(j): \(e)" }
    }
    peer.finishAll()
    withExtendedLifetime(cancellables) {}
    run.deliveriesPerSecond = Double(sends.deliveries) / (Double(end &- start) / 1e9)
    run.sendCallNanos = times.flatMap(\.samples)
    return run
}

extension ScaleContext {
    func topicsFanoutTable(_ o: CompareOptions) async -> [String] {
        let s = plan.onlyN.map { Swift.max($0, 10) } ?? (plan.smoke ? 2_000 : 100_000)
        let m = plan.smoke ? 1 << 13 : 1 << 19
        let producerCounts = [1, 2, 4]
        let runs = plan.smoke ? 1 : plan.reps
        let watchdog = self.watchdog
        let meter = o.byteMeter
        var table: [(p: Int, sends: FanoutSends, runs: [PeerRuns], allocs: [String: Double])] = []
        // One untimed run per peer first: the first runs of a process pay for
        // growing the heap to 200,000 reader tasks. AsyncBroadcast's and the
        // floor's count allocations. In smoke, only those two.
        var allocs: [String: Double] = [:]
        do {
            let sends = FanoutSends(subscribers: s, producers: 1, sends: m)
            let label = "\(ScaleWorkload.topicsFanout.rawValue) warm-up"
            let beat: @Sendable () -> Void = { watchdog.beat(label) }
            log("· \(label), N = \(grouped(s))")
            var warm: [(String, @Sendable () async -> ScaleRun)] = [
                (TopicsPeerName.ours, { await fanoutOurs(sends, meter: meter, beat: beat) }),
                (wakeFloorName, { await fanoutFloor(sends, meter: meter, beat: beat) }),
            ]
            if !plan.smoke {
                let more: [(String, @Sendable () async -> ScaleRun)] = [
                    (TopicsPeerName.lockDict, { await fanoutLockDict(sends, beat: beat) }),
                    (TopicsPeerName.actor, { await fanoutActor(sends, beat: beat) }),
                    (TopicsPeerName.combine, { await fanoutCombine(sends, beat: beat) }),
                ]
                warm += more
            }
            for (peer, run) in warm where plan.wants(peer) {
                beat()
                let r = logFanoutRun(peer + " (warm-up)", await run())
                if let e = r.error { failures.append("\(label), \(peer): \(e)") }
                if let a = r.extra["allocs"] { allocs[peer] = a / Double(sends.deliveries) }
            }
        }
        for pc in producerCounts {
            let sends = FanoutSends(subscribers: s, producers: pc, sends: m)
            let label = "\(ScaleWorkload.topicsFanout.rawValue) P=\(pc)"
            let beat: @Sendable () -> Void = { watchdog.beat(label) }
            let r = await interleave(.topicsFanout, n: s, work: Double(sends.deliveries), tag: " P=\(pc)", runs: runs, [
                ScaleCell(peer: TopicsPeerName.ours) { logFanoutRun(TopicsPeerName.ours, await fanoutOurs(sends, beat: beat)) },
                ScaleCell(peer: wakeFloorName) { logFanoutRun(wakeFloorName, await fanoutFloor(sends, beat: beat)) },
                ScaleCell(peer: TopicsPeerName.lockDict) { logFanoutRun(TopicsPeerName.lockDict, await fanoutLockDict(sends, beat: beat)) },
                ScaleCell(peer: TopicsPeerName.actor) { logFanoutRun(TopicsPeerName.actor, await fanoutActor(sends, beat: beat)) },
                ScaleCell(peer: TopicsPeerName.combine) { logFanoutRun(TopicsPeerName.combine, await fanoutCombine(sends, beat: beat)) },
            ])
            table.append((pc, sends, r, pc == 1 ? allocs : [:]))
        }
        var out: [String] = []
        func p(_ s: String = "") { out.append(s) }
        let first = table[0].sends
        p("")
        p("#### \(ScaleWorkload.topicsFanout.rawValue): \(grouped(s)) subscribers, each on a personal topic and on one of "
            + "\(grouped(first.groups)) group topics of 10; P producers send to random topics")
        p("")
        for line in fanoutRows(table, ours: TopicsPeerName.ours) { p(line) }
        p("")
        p("Topics: `Int`, personal 0..<\(grouped(s)), groups \(grouped(s))..<\(grouped(first.topicCount)); "
            + "\(grouped(first.subscriptionCount)) subscriptions (unbounded), each read by its own task (OpenCombine: a `sink` "
            + "per subscription, called on the sender's thread). M = \(grouped(first.sends)) sends per run, split evenly over "
            + "P producers, each to a topic drawn uniformly from all \(grouped(first.topicCount)) (the same draws for every peer; "
            + "\(grouped(first.deliveries)) deliveries at P = 1, about 1.8 per send). Producers are pthreads (P > 2 oversubscribes the 2 "
            + "cores, which also run the reader tasks), except for actor+AsyncStream, whose `await publish` needs a task: "
            + "there they are P tasks on the cooperative pool. Floor: the same subscriptions as slots (a `Mutex` around the "
            + "pending elements and the continuation), each read by a task parked on a bare `UnsafeContinuation<Void, Never>` "
            + "inside `withTaskCancellationHandler`; a send appends to each member's slot under its lock and resumes it after "
            + "(no registry: a topic's members are found by index). "
            + fanoutColumnsNote + " One untimed warm-up run per peer (P = 1) comes first. Checked: every subscription "
            + "received exactly the count and sum of the elements sent to its topic (each element carries its topic, "
            + "producer and index), none of another topic, each producer's in order.")
        return out
    }
}

// MARK: 3. Churn: subscribe, marker, cancel on random topics while sending

/// One churner's tallies.
final class ChurnCounts: @unchecked Sendable {
    var cycles = 0
    var missed = 0
    var foreign = 0
    init() {}
}

/// Elements: producer keys `(i << 16) | topic` (non-negative); a marker is
/// `-((cycle·R + r) << 16 | topic) − 1`.
@inline(__always) func churnTopic(of key: Int) -> Int { (key >= 0 ? key : -(key + 1)) & 0xFFFF }
@inline(__always) func churnMarker(cycle: Int, churner r: Int, churners: Int, topic: Int) -> Int {
    -(((cycle &* churners &+ r) << 16) | topic) - 1
}

/// Drains `subscription` without waiting; whether it held `marker`.
@inline(__always)
func drainForMarker(_ subscription: BroadcastSequence<Int, Never>.Subscription, marker: Int, topic: Int, counts: ChurnCounts) -> Bool {
    while true {
        switch subscription.poll() {
        case .element(let e):
            if churnTopic(of: e) != topic { counts.foreign += 1 }
            if e == marker { return true }
        case .empty, .end, .failure:
            return false
        }
    }
}

struct ChurnResult {
    var counts: [ChurnCounts]
    var sent: Int
    var window: UInt64
}

/// R churner threads and one producer thread, released together for `seconds`.
func churnThreads(
    churners r: Int, topics: Int, seconds: Double,
    send: @escaping @Sendable (_ key: Int, _ topic: Int) -> Void,
    cycle: @escaping @Sendable (_ churner: Int, _ cycle: Int, _ topic: Int, _ counts: ChurnCounts) -> Void
) async -> ChurnResult {
    let go = Flag(), stop = Flag()
    let ready = Counter(), finished = Counter()
    let counts = (0..<r).map { _ in ChurnCounts() }
    let sent = Holder<Int>()
    spawnThread {
        ready.increment()
        var rng = SplitMix(seed: 0xc4a5)
        while !go.isSet { sched_yield() }
        var i = 0
        while !stop.isSet {
            let t = Int(rng.next() % UInt64(topics))
            send((i << 16) | t, t)
            i += 1
        }
        sent.value = i
        finished.increment()
    }
    for k in 0..<r {
        let c = counts[k]
        spawnThread {
            ready.increment()
            var rng = SplitMix(seed: 0x5eed &+ UInt64(k))
            while !go.isSet { sched_yield() }
            var n = 0
            while !stop.isSet {
                cycle(k, n, Int(rng.next() % UInt64(topics)), c)
                n += 1
            }
            c.cycles = n
            finished.increment()
        }
    }
    while ready.current < r + 1 { try? await Task.sleep(for: .microseconds(20)) }
    let t0 = nowNanos()
    go.set()
    try? await Task.sleep(for: .nanoseconds(Int(seconds * 1e9)))
    stop.set()
    let window = nowNanos() &- t0
    while finished.current < r + 1 { try? await Task.sleep(for: .microseconds(200)) }
    return ChurnResult(counts: counts, sent: sent.value ?? 0, window: window)
}

func churnNumbers(_ run: inout ScaleRun, _ c: ChurnResult) {
    run.windowNanos = c.window
    run.registrations = c.counts.map(\.cycles).reduce(0, +)
    run.sends = c.sent
    run.extra["missed"] = Double(c.counts.map(\.missed).reduce(0, +))
    let foreign = c.counts.map(\.foreign).reduce(0, +)
    if foreign > 0 { run.error = "\(foreign) elements of another topic received" }
}

func churnOurs(topics t: Int, churners r: Int, seconds: Double) async -> ScaleRun {
    var run = ScaleRun()
    let topics = BroadcastTopics<Int, Int, Never>()
    let c = await churnThreads(
        churners: r, topics: t, seconds: seconds,
        send: { key, topic in topics.send(key, to: topic) },
        cycle: { k, n, topic, counts in
            let s = topics.subscribe(to: topic)
            let marker = churnMarker(cycle: n, churner: k, churners: r, topic: topic)
            topics.send(marker, to: topic)
            if !drainForMarker(s, marker: marker, topic: topic, counts: counts) { counts.missed += 1 }
            s.cancel()
        })
    churnNumbers(&run, c)
    let missed = Int(run.extra["missed"] ?? 0)
    if missed > 0, run.error == nil { run.error = "\(missed) markers sent after subscribe(to:) returned never reached the subscriber" }
    if topics.topicCount != 0, run.error == nil { run.error = "topicCount \(topics.topicCount) after every subscriber left" }
    return run
}

func churnLockDict(topics t: Int, churners r: Int, seconds: Double, insideLock: Bool) async -> ScaleRun {
    var run = ScaleRun()
    let peer = LockSequencesTopics<Int>(insideLock: insideLock)
    let c = await churnThreads(
        churners: r, topics: t, seconds: seconds,
        send: { key, topic in peer.send(key, to: topic) },
        cycle: { k, n, topic, counts in
            let h = peer.subscribe(to: topic)
            let marker = churnMarker(cycle: n, churner: k, churners: r, topic: topic)
            peer.send(marker, to: topic)
            if !drainForMarker(h.subscription, marker: marker, topic: topic, counts: counts) { counts.missed += 1 }
            peer.cancel(h, of: topic)
        })
    churnNumbers(&run, c)
    // The missed markers are this peer's known defect (reported, not a failure).
    if peer.topicCount != 0, run.error == nil { run.error = "\(peer.topicCount) sequences left after every subscriber left" }
    return run
}

/// What the OpenCombine churner's sink saw (called on any sender's thread).
final class MarkerBox: Sendable {
    let seen = Atomic<Int>(0)
    let foreign = Atomic<Int>(0)
    init() {}
}

func churnCombine(topics t: Int, churners r: Int, seconds: Double) async -> ScaleRun {
    var run = ScaleRun()
    let peer = CombineTopics<Int>()
    let boxes = (0..<r).map { _ in MarkerBox() }
    let c = await churnThreads(
        churners: r, topics: t, seconds: seconds,
        send: { key, topic in peer.send(key, to: topic) },
        cycle: { k, n, topic, counts in
            let box = boxes[k]
            let marker = churnMarker(cycle: n, churner: k, churners: r, topic: topic)
            let cancellable = peer.subscribe(to: topic) { e in
                if churnTopic(of: e) != topic { box.foreign.wrappingAdd(1, ordering: .relaxed) }
                if e == marker { box.seen.store(marker, ordering: .relaxed) }
            }
            peer.send(marker, to: topic)
            if box.seen.load(ordering: .relaxed) != marker { counts.missed += 1 }
            peer.cancel(cancellable, of: topic)
        })
    for (k, box) in boxes.enumerated() { c.counts[k].foreign += box.foreign.load(ordering: .relaxed) }
    churnNumbers(&run, c)
    let missed = Int(run.extra["missed"] ?? 0)
    if missed > 0, run.error == nil { run.error = "\(missed) markers never reached their subscriber" }
    if peer.topicCount != 0, run.error == nil { run.error = "\(peer.topicCount) subjects left after every subscriber left" }
    return run
}

extension ActorStreamTopics {
    /// `publish` that also tells whether subscriber `id` was among those it
    /// yielded to (the checker's question, asked in the same actor turn).
    func publish(_ element: Int, to topic: Topic, reaching id: Int) -> Bool {
        publish(element, to: topic)
        return topics[topic]?[id] != nil
    }
}

/// The actor peer: churners and producer are tasks (every call is an `await`).
func churnActor(topics t: Int, churners r: Int, seconds: Double) async -> ScaleRun {
    var run = ScaleRun()
    let peer = ActorStreamTopics<Int>()
    let stop = Flag()
    let counts = (0..<r).map { _ in ChurnCounts() }
    let t0 = nowNanos()
    let producer = Task.detached { () -> Int in
        var rng = SplitMix(seed: 0xc4a5)
        var i = 0
        while !stop.isSet {
            let topic = Int(rng.next() % UInt64(t))
            await peer.publish((i << 16) | topic, to: topic)
            i += 1
        }
        return i
    }
    let churners = (0..<r).map { k in
        Task.detached {
            let c = counts[k]
            var rng = SplitMix(seed: 0x5eed &+ UInt64(k))
            var n = 0
            while !stop.isSet {
                let topic = Int(rng.next() % UInt64(t))
                let (stream, id) = await peer.subscribe(to: topic)
                let marker = churnMarker(cycle: n, churner: k, churners: r, topic: topic)
                if await peer.publish(marker, to: topic, reaching: id) {
                    // Yielded to this stream: it is buffered, so reading does not wait.
                    var iterator = stream.makeAsyncIterator()
                    while let e = await iterator.next() {
                        if churnTopic(of: e) != topic { c.foreign += 1 }
                        if e == marker { break }
                    }
                } else {
                    c.missed += 1
                }
                n += 1
                // Releasing the stream (end of scope) terminates it: onTermination removes it in a task.
            }
            c.cycles = n
        }
    }
    try? await Task.sleep(for: .nanoseconds(Int(seconds * 1e9)))
    stop.set()
    let window = nowNanos() &- t0
    let sent = await producer.value
    for c in churners { await c.value }
    churnNumbers(&run, ChurnResult(counts: counts, sent: sent, window: window))
    let missed = Int(run.extra["missed"] ?? 0)
    if missed > 0, run.error == nil { run.error = "\(missed) markers never reached their subscriber" }
    let empty = await waitUntil(seconds: 10) { await peer.topicCount == 0 }
    if !empty, run.error == nil { run.error = "\(await peer.topicCount) topics left 10 s after every subscriber left" }
    return run
}

extension ScaleContext {
    func topicsChurnTable(_ o: CompareOptions) async -> [String] {
        let spaces = plan.smoke ? [8] : [8, 1_024]
        let r = 2
        let seconds = plan.smoke ? 0.25 : 2.0
        let runs = plan.smoke ? 1 : Swift.min(plan.reps, 3)
        var table: [(t: Int, runs: [PeerRuns])] = []
        for t in spaces {
            table.append((t, await interleave(.topicsChurn, n: t, tag: " T=\(t)", runs: runs, [
                ScaleCell(peer: TopicsPeerName.ours) { await churnOurs(topics: t, churners: r, seconds: seconds) },
                ScaleCell(peer: TopicsPeerName.lockDict) { await churnLockDict(topics: t, churners: r, seconds: seconds, insideLock: false) },
                ScaleCell(peer: TopicsPeerName.lockDictInside) { await churnLockDict(topics: t, churners: r, seconds: seconds, insideLock: true) },
                ScaleCell(peer: TopicsPeerName.actor) { await churnActor(topics: t, churners: r, seconds: seconds) },
                ScaleCell(peer: TopicsPeerName.combine) { await churnCombine(topics: t, churners: r, seconds: seconds) },
            ])))
        }
        var out: [String] = []
        func p(_ s: String = "") { out.append(s) }
        p("")
        p("#### \(ScaleWorkload.topicsChurn.rawValue): R = \(r) threads subscribe to a random topic of T, send it a marker, "
            + "check they got it, cancel; one thread sends to random topics meanwhile")
        p("")
        p("| T | peer | runs | cycles/s (median) | min | max | producer sends/s (median) | markers missed (race), all runs | of cycles |")
        p("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
        for (t, runs) in table {
            for pr in runs {
                if pr.skipped {
                    p("| \(t) | \(pr.peer) | 0 | not run | | | | | |")
                    continue
                }
                let rates = pr.runs.map { Double($0.registrations) / (Double($0.windowNanos) / 1e9) }
                let sends = pr.runs.map { Double($0.sends) / (Double($0.windowNanos) / 1e9) }
                let missed = pr.runs.map { Int($0.extra["missed"] ?? 0) }.reduce(0, +)
                let cycles = pr.runs.map(\.registrations).reduce(0, +)
                let peer = pr.error.map { "\(pr.peer) **WRONG: \($0)**" } ?? pr.peer
                p("| \(t) | \(peer) | \(pr.runs.count) | \(grouped(Int(median(rates)))) | \(grouped(Int(rates.min()!))) "
                    + "| \(grouped(Int(rates.max()!))) | \(grouped(Int(median(sends)))) | **\(grouped(missed))** | \(grouped(cycles)) |")
            }
        }
        p("")
        p("A cycle: `subscribe(to:)` a topic drawn uniformly from T (`Int` topics 0..<T, so with \(r) churners topics are "
            + "created and dropped all the time), send that topic a marker unique to this cycle, read the own subscription "
            + "without waiting (`poll()`, SPI) until the marker or empty, `cancel()` (the peer's cancel: lock+dict removes the "
            + "topic if its sequence's `subscriberCount` is 0; OpenCombine counts down and removes at 0). Meanwhile one producer "
            + "sends `(i << 16) | topic` to random topics without pause. \(r) churner pthreads + 1 producer pthread on the 2 "
            + "CPUs, \(fmt(seconds, 2)) s per run (actor+AsyncStream: all tasks, and its check is in the same actor turn as the "
            + "marker's publish: whether the subscriber's continuation was among those yielded to; the marker is then read "
            + "from the stream). Markers missed: a marker sent after `subscribe` returned that its subscriber never got "
            + "(the race of a hand-built dictionary: a subscriber that registered on a sequence just removed from the "
            + "dictionary is on a sequence no send reaches); its sum over all runs, and all cycles of all runs. A miss is a "
            + "wrong result for every peer except lock+[Topic: BroadcastSequence] (subscribe outside the lock), whose known "
            + "defect it is; \"subscribe inside the lock\" is the same peer calling `subscribe()` while holding the "
            + "dictionary lock, which closes that window. Also checked: no element of another topic, and the registry "
            + "empty once every churner has left.")
        return out
    }
}
