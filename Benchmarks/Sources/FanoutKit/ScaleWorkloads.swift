// The scale cells (issue 20, "Measure first"): what happens at thousands to
// a hundred thousand subscribers, against the peers that can run there.
// `fanout-compare --filter scale` runs them alone; they print their own
// tables. Every cell checks what its readers got, like the other cells.
//
// - scale: throughput — unbounded `Int`, one producer task, every subscriber
//   a task reading every element; ns per delivery (first send until the last
//   reader saw the end, / M·N) and the producer's own cost: the time spent
//   inside `send` calls (a clock read either side of each call) / sends.
// - scale: wake storm — N reader tasks parked in `next()`, one `send`; the
//   time until the last reader has the element (a clock reading taken by each
//   reader as it returns from `next()`). Parked: each reader counts itself
//   just before it calls `next()`; when all N have, a settle of 1 ms + 10 ns
//   per reader; for AsyncBroadcast the driver then also waits until every
//   subscription reports its consumer suspended (`isConsumerWaiting`, SPI),
//   and counts the storms where the settle was not enough.
// - scale: registration — one `subscribe()` and one `cancel()` timed while a
//   producer task sends as fast as it can to N subscribers that do not read
//   (`.bufferingNewest(1)`, so the producer never waits and nothing grows).
// - scale: idle memory — bytes from the allocator (MallocInterposer: requested
//   bytes allocated minus bytes freed, so a buffer that grew counts once) per
//   subscription that holds nothing, for `Int` and a 64-byte struct, per policy.
// - scale: producers — P = 1, 2, 4, 8 threads (pthreads, not tasks: on 2
//   cores the cooperative pool has 2 threads, so P tasks that never suspend
//   would mostly take turns) sending concurrently to N reader tasks.
// - scale: value wake — the wake storm for `BroadcastValue`: N readers parked
//   after reading the current value, one `send`, until all have read it.
//
// A peer that is too slow for a cell at some N is skipped there, and at every
// larger N, with the reason printed: its run time there is estimated from the
// last two smaller N (set-up and the rest, each grown at the rate measured
// between them, at least linearly) and compared with a budget per run.
//
// FANOUT_SCALE_FAULT=1 is a deliberate fault: reader 0 of every task-based
// throughput run ignores one element, so the check must fail (and in the
// topics fan-out cell, subscription 0 counts its first element twice).
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

// MARK: Allocator bytes

/// Allocator counters over a measured window.
public struct ByteCounts: Sendable {
    public var mallocs: Int
    public var bytes: Int
    public var frees: Int
    public var freedBytes: Int
    public init(mallocs: Int, bytes: Int, frees: Int, freedBytes: Int) {
        self.mallocs = mallocs
        self.bytes = bytes
        self.frees = frees
        self.freedBytes = freedBytes
    }
}

/// Counts allocated and freed bytes (provided by the front end: MallocInterposer).
public struct ByteMeter: Sendable {
    public var source: String
    public var start: @Sendable () -> Void
    public var stop: @Sendable () -> ByteCounts
    public init(source: String, start: @escaping @Sendable () -> Void, stop: @escaping @Sendable () -> ByteCounts) {
        self.source = source
        self.start = start
        self.stop = stop
    }
}

// MARK: The plan

enum ScaleWorkload: String, CaseIterable {
    case throughput = "scale: throughput"
    case storm = "scale: wake storm"
    case registration = "scale: registration"
    case memory = "scale: idle memory"
    case producers = "scale: producers"
    case valueWake = "scale: value wake"
    case registrationStorm = "scale: registration storm"
    case lifecycle = "lifecycle: finish(), short-lived sequences, create + release"
    // BroadcastTopics (TopicsWorkloads.swift); `--filter topics` runs them.
    case topicsMemory = "topics: memory"
    case topicsFanout = "topics: fan-out"
    case topicsChurn = "topics: churn"
    // Plain sequences of 1-2 subscribers beside the wake floor (WakeFloor.swift).
    case sparseFanout = "sparse: fan-out"
}

/// The scale workloads the options select. With a filter, only one that
/// mentions "scale" selects them (so `--filter value` still means the value
/// workloads alone); `--n 0` selects none.
func scaleWorkloads(_ o: CompareOptions) -> [ScaleWorkload] {
    if o.onlyN == 0 { return [] }
    guard let f = o.filter?.lowercased() else { return ScaleWorkload.allCases }
    // `--filter storm` and `--filter lifecycle` name theirs; any other
    // filter must mention "scale" (so `--filter value` is not "scale: value wake").
    if f == "storm" { return [.registrationStorm] }
    if !f.contains("scale") { return ScaleWorkload.allCases.filter { !$0.rawValue.hasPrefix("scale") && $0.rawValue.contains(f) } }
    return ScaleWorkload.allCases.filter { $0.rawValue.contains(f) }
}

let scaleFault: Bool = {
    guard let v = getenv("FANOUT_SCALE_FAULT") else { return false }
    let s = String(cString: v)
    return !s.isEmpty && s != "0"
}()

struct ScalePlan {
    var smoke: Bool
    var reps: Int
    /// Seconds one run of one peer may take.
    var budget: Double
    var ns: [Int]
    var producerNs: [Int]
    var producerCounts = [1, 2, 4, 8]
    var idleCount: Int
    var peerWords: [String]?
    /// `--n N`, if given.
    var onlyN: Int?

    init(_ o: CompareOptions) {
        smoke = o.smoke
        reps = o.reps
        budget = o.scaleBudget ?? (o.smoke ? 20 : 30)
        if let n = o.onlyN, n > 0 {
            ns = [n]
            producerNs = [n]
        } else {
            ns = o.smoke ? [64, 1024] : [64, 1024, 16_384, 100_000]
            producerNs = [16, 1024]
        }
        idleCount = o.smoke ? 1_000 : 10_000
        peerWords = o.peerFilter?.lowercased().split(separator: ",").map(String.init)
        onlyN = o.onlyN
    }

    /// Timed runs per peer at N: fewer at large N.
    func runs(_ n: Int) -> Int {
        if smoke { return 1 }
        if n <= 1024 { return reps }
        if n <= 16_384 { return Swift.min(reps, 3) }
        return Swift.min(reps, 2)
    }
    /// One untimed warm-up run per peer first (not above N = 1,024: too long).
    func warmUp(_ n: Int) -> Bool { !smoke && n <= 1024 }
    /// M, elements per throughput run: about 2^20 deliveries, at least 256
    /// elements (64 from N = 65,536 up).
    func elements(_ n: Int) -> Int {
        if smoke { return Swift.max((1 << 16) / n, 64) }
        return Swift.max((1 << 20) / n, n >= 65_536 ? 64 : 256)
    }
    /// Storms (one send each) per wake-storm or value-wake run.
    func rounds(_ n: Int) -> Int {
        if smoke { return 5 }
        return n <= 64 ? 100 : n <= 1024 ? 50 : n <= 16_384 ? 20 : 10
    }
    func settleNanos(_ n: Int) -> UInt64 { 1_000_000 + UInt64(n) * 10 }
    /// subscribe+cancel samples per registration run, and its time limit.
    func registrationSamples(_ n: Int) -> Int {
        if smoke { return 200 }
        return n <= 1024 ? 10_000 : n <= 16_384 ? 3_000 : 1_000
    }
    var registrationSeconds: Double { smoke ? 0.3 : 5 }
    /// Elements per many-producers run (a multiple of 8): about 2^20 deliveries.
    func producerElements(_ n: Int) -> Int {
        let d = smoke ? 1 << 16 : 1 << 20
        return Swift.max(d / n / 8 * 8, 64)
    }
    func wants(_ peer: String) -> Bool {
        guard let words = peerWords else { return true }
        let p = peer.lowercased()
        return words.contains { p.contains($0) }
    }
}

// MARK: Helpers

/// Per-reader slots, each written by one reader and read by the driver after
/// a synchronising counter or latch.
final class Slots<T>: @unchecked Sendable {
    let base: UnsafeMutablePointer<T>
    let count: Int
    init(_ count: Int, _ initial: T) {
        self.count = count
        base = .allocate(capacity: Swift.max(count, 1))
        base.initialize(repeating: initial, count: count)
    }
    deinit {
        base.deinitialize(count: count)
        base.deallocate()
    }
    subscript(i: Int) -> T {
        get { base[i] }
        set { base[i] = newValue }
    }
}

final class ThreadBody: @unchecked Sendable {
    let body: @Sendable () -> Void
    init(_ body: @escaping @Sendable () -> Void) { self.body = body }
}

/// Starts a detached pthread running `body`.
func spawnThread(_ body: @escaping @Sendable () -> Void) {
    let raw = Unmanaged.passRetained(ThreadBody(body)).toOpaque()
    var thread = pthread_t()
    pthread_create(&thread, nil, { raw in
        #if canImport(Darwin)
        let box = Unmanaged<ThreadBody>.fromOpaque(raw).takeRetainedValue()
        #else
        let box = Unmanaged<ThreadBody>.fromOpaque(raw!).takeRetainedValue()
        #endif
        box.body()
        return nil
    }, raw)
    pthread_detach(thread)
}

func grouped(_ n: Int) -> String {
    let s = String(n)
    guard n >= 1000 else { return s }
    var out = ""
    for (i, ch) in s.enumerated() {
        if i > 0 && (s.count - i) % 3 == 0 { out += "," }
        out.append(ch)
    }
    return out
}

func micros(_ ns: Double) -> String {
    if ns.isNaN { return "–" }
    let us = ns / 1000
    if us >= 1000 { return fmt(us, 0) }
    if us >= 10 { return fmt(us, 1) }
    return fmt(us, 2)
}

/// Half-open nanosecond samples → (p50, p99, max).
func spread(_ xs: [UInt64]) -> (Double, Double, Double) {
    let s = xs.sorted()
    return (percentile(s, 0.50), percentile(s, 0.99), s.last.map { Double($0) } ?? .nan)
}

// MARK: One run, and the driver's bookkeeping

struct ScaleRun: Sendable {
    var error: String? = nil
    /// Subscribing, starting the readers, until all are ready.
    var setupNanos: UInt64 = 0
    /// The whole run, set by the driver.
    var wallNanos: UInt64 = 0
    /// A time-capped part of the run (registration's sampling window).
    var fixedNanos: UInt64 = 0
    // throughput
    var nsPerDelivery: Double = .nan
    var producerNsPerSend: Double = .nan
    // storms
    var storms: [UInt64] = []
    var readerMedians: [UInt64] = []
    var sendCalls: [UInt64] = []
    var lateParks = 0
    // registration
    var subscribeNanos: [UInt64] = []
    var cancelNanos: [UInt64] = []
    /// A storm's `subscribe()` calls alone (`subscribeNanos` holds its pairs).
    var stormSubscribeNanos: [UInt64] = []
    var sends = 0
    var windowNanos: UInt64 = 0
    /// The producer's time per send before the measuring started.
    var quietSendNanos: Double = .nan
    // producers (and the lifecycle cells' rates)
    var deliveriesPerSecond: Double = .nan
    // registration storm (and the lifecycle cells' finish() calls)
    var sendCallNanos: [UInt64] = []
    var worstSendNanos: UInt64 = 0
    var senderCPUNanos: UInt64 = 0
    var registrations = 0
    var worstRegistrationNanos: UInt64 = 0
    /// Named numbers of cells with their own table (the topics cells).
    var extra: [String: Double] = [:]
}

struct ScaleCell {
    var peer: String
    var run: @Sendable () async -> ScaleRun
}

struct PeerRuns {
    var peer: String
    var runs: [ScaleRun] = []
    /// Why it did not run (or stopped early).
    var note: String? = nil
    var error: String? = nil
    var skipped: Bool { runs.isEmpty }
}

final class ScaleContext {
    let plan: ScalePlan
    let watchdog: Watchdog
    var failures: [String] = []
    var notes: [String] = []
    /// workload|peer → why it does not run at larger N.
    var tooSlow: [String: String] = [:]
    /// workload|peer → (N, set-up ns, rest ns): the largest over its runs at that N.
    var history: [String: [(n: Int, work: Double, setup: Double, rest: Double, fixed: Double)]] = [:]

    init(plan: ScalePlan, watchdog: Watchdog) {
        self.plan = plan
        self.watchdog = watchdog
    }

    /// Seconds one run at `n` (doing `work` units: deliveries, wake-ups)
    /// should take, from the runs at smaller N: set-up grown with N at the
    /// rate measured between the last two N (at least linearly, at most
    /// quadratically), the rest with the work and its cost per unit grown
    /// at the measured rate (not below constant); time-capped parts as they were.
    func estimate(_ key: String, _ n: Int, work: Double) -> (seconds: Double, why: String)? {
        guard let h = history[key], let last = h.last, last.n < n else { return nil }
        let f = Double(n) / Double(last.n)
        var aS = 1.0, g = 0.0
        var from = ""
        if h.count >= 2 {
            let prev = h[h.count - 2]
            let span = log(Double(last.n) / Double(prev.n))
            aS = Swift.min(Swift.max(log(Swift.max(last.setup, 1) / Swift.max(prev.setup, 1)) / span, 1), 2)
            let perLast = Swift.max(last.rest, 1) / last.work
            let perPrev = Swift.max(prev.rest, 1) / prev.work
            g = Swift.min(Swift.max(log(perLast / perPrev) / span, 0), 1)
            from = "; growth measured from N = \(grouped(prev.n)): set-up ∝ N^\(fmt(aS, 2)), cost per unit of work ∝ N^\(fmt(g, 2))"
        }
        let est = (last.setup * pow(f, aS) + last.rest * (work / last.work) * pow(f, g) + last.fixed) / 1e9
        let why = "estimated \(fmt(est, 0)) s per run at N = \(grouped(n)) > budget \(fmt(plan.budget, 0)) s "
            + "(at N = \(grouped(last.n)) a run took \(fmt(last.setup / 1e9, 2)) s to set up + \(fmt((last.rest + last.fixed) / 1e9, 2)) s\(from))"
        return (est, why)
    }

    /// Runs `cells` at `n`, interleaved: per round every peer once, rotating
    /// who goes first; a warm-up round first at small N.
    func interleave(_ w: ScaleWorkload, n: Int, work: Double? = nil, tag: String = "", runs: Int? = nil,
                    _ cells: [ScaleCell]) async -> [PeerRuns] {
        let work = work ?? Double(n)
        let cells = cells.filter { plan.wants($0.peer) }
        var out = cells.map { PeerRuns(peer: $0.peer) }
        var active: [Int] = []
        func key(_ i: Int) -> String { "\(w.rawValue)\(tag)|\(cells[i].peer)" }
        let place = "\(w.rawValue)\(tag), N = \(grouped(n))"
        for i in cells.indices {
            if let why = tooSlow[key(i)] {
                out[i].note = "not run: " + why
                notes.append("\(place), \(cells[i].peer): not run: \(why)")
                continue
            }
            if let e = estimate(key(i), n, work: work), e.seconds > plan.budget {
                let why = e.why
                tooSlow[key(i)] = "too slow at N = \(grouped(n)) (\(why))"
                out[i].note = "not run: " + why
                notes.append("\(place), \(cells[i].peer): not run: \(why)")
                continue
            }
            active.append(i)
        }
        log("· \(place): \(active.map { cells[$0].peer }.joined(separator: ", "))")

        func once(_ i: Int) async -> ScaleRun {
            watchdog.beat("\(place), \(cells[i].peer)")
            let t0 = nowNanos()
            var r = await cells[i].run()
            r.wallNanos = nowNanos() &- t0
            if let e = r.error, out[i].error == nil {
                out[i].error = e
                failures.append("\(place), \(cells[i].peer): \(e)")
            }
            return r
        }
        if plan.warmUp(n) {
            for i in active { _ = await once(i) }
        }
        let count = runs ?? plan.runs(n)
        var stopped = Set<Int>()
        for rep in 0..<count {
            for k in active.indices {
                let i = active[(k + rep) % active.count]
                if stopped.contains(i) { continue }
                let r = await once(i)
                out[i].runs.append(r)
                let seconds = Double(r.wallNanos) / 1e9
                if seconds > plan.budget {
                    let why = "a run at N = \(grouped(n)) took \(fmt(seconds, 1)) s > budget \(fmt(plan.budget, 0)) s"
                    tooSlow[key(i)] = why
                    if rep < count - 1 {
                        stopped.insert(i)
                        out[i].note = "stopped after \(rep + 1) of \(count) runs: \(why)"
                        notes.append("\(place), \(cells[i].peer): stopped after \(rep + 1) of \(count) runs: \(why)")
                    }
                }
            }
        }
        for i in active where !out[i].runs.isEmpty {
            let setup = out[i].runs.map { Double($0.setupNanos) }.max() ?? 0
            let fixed = out[i].runs.map { Double($0.fixedNanos) }.max() ?? 0
            let rest = out[i].runs.map { Double($0.wallNanos &- $0.setupNanos &- Swift.min($0.fixedNanos, $0.wallNanos &- $0.setupNanos)) }.max() ?? 0
            history[key(i), default: []].append((n, work, setup, rest, fixed))
        }
        return out
    }
}

// MARK: Peer names

let scaleOurs = BroadcastPeer<Int>.name
let scaleValueOurs = BroadcastValuePeer.name
let scaleLock = LockStreamPeer<Int>.name
let scaleCombine = CombinePeer.name
let scaleFloorName = "floor: N continuations resumed"

// MARK: 1. Throughput

/// `consume` (Workloads.swift) with the deliberate fault: ignores element `skip`.
@inline(never)
func consumeFaulty<S: AsyncSequence>(_ sequence: S, ready: Latch, skip: Int) async -> Tally
where S.Element == Int, S.Failure == Never {
    var iterator = sequence.makeAsyncIterator()
    ready.arrive()
    var tally = Tally()
    while let element = await iterator.next(isolation: nil) {
        if element == skip { continue }
        tally.add(element)
    }
    tally.end = nowNanos()
    return tally
}

/// One producer task sends 0..<m to `n` reader tasks (unbounded).
func runScaleFanout<P: AsyncPeer>(_: P.Type, subscribers n: Int, elements m: Int) async -> ScaleRun where P.Element == Int {
    let setupStart = nowNanos()
    let peer = P(policy: .unbounded)
    let ready = Latch(n)
    var streams: [P.Stream] = []
    streams.reserveCapacity(n)
    for _ in 0..<n { streams.append(await peer.subscribe()) }
    var consumers: [Task<Tally, Never>] = []
    consumers.reserveCapacity(n)
    for (i, stream) in streams.enumerated() {
        if scaleFault && i == 0 {
            consumers.append(Task.detached { await consumeFaulty(stream, ready: ready, skip: m / 2) })
        } else {
            consumers.append(Task.detached { await consume(stream, ready: ready) })
        }
    }
    streams.removeAll()
    await ready.wait()
    let setup = nowNanos() &- setupStart
    let producer = Task.detached { () -> (UInt64, UInt64) in
        let start = nowNanos()
        var inSend: UInt64 = 0
        for i in 0..<m {
            let a = nowNanos()
            await peer.send(i)
            inSend &+= nowNanos() &- a
        }
        await peer.finish()
        return (start, inSend)
    }
    let (start, inSend) = await producer.value
    var tallies: [Tally] = []
    tallies.reserveCapacity(n)
    for task in consumers { tallies.append(await task.value) }
    let end = tallies.map(\.end).max() ?? nowNanos()
    var run = ScaleRun(error: checkAll(tallies, .all(count: m, ordered: true)), setupNanos: setup)
    run.nsPerDelivery = Double(end &- start) / Double(m * n)
    run.producerNsPerSend = Double(inSend) / Double(m)
    return run
}

/// OpenCombine: `n` sinks, one producer task; delivery is synchronous, so
/// the producer's loop is the whole run.
func runScaleCombineFanout(subscribers n: Int, elements m: Int) async -> ScaleRun {
    let setupStart = nowNanos()
    let subject = PassthroughSubject<Int, Never>()
    let boxes = (0..<n).map { _ in SinkBox() }
    let cancellables = boxes.map { box in subject.sink { element in box.tally.add(element) } }
    let setup = nowNanos() &- setupStart
    let shared = UncheckedBox(value: subject)
    let (start, end, inSend) = await Task.detached { () -> (UInt64, UInt64, UInt64) in
        let subject = shared.value
        let start = nowNanos()
        var inSend: UInt64 = 0
        for i in 0..<m {
            let a = nowNanos()
            subject.send(i)
            inSend &+= nowNanos() &- a
        }
        return (start, nowNanos(), inSend)
    }.value
    subject.send(completion: .finished)
    withExtendedLifetime(cancellables) {}
    var run = ScaleRun(error: checkAll(boxes.map(\.tally), .all(count: m, ordered: true)), setupNanos: setup)
    run.nsPerDelivery = Double(end &- start) / Double(m * n)
    run.producerNsPerSend = Double(inSend) / Double(m)
    return run
}

// MARK: 2 and 6. Wake storms

/// One storm's numbers from the readers' clock readings.
func stormStats(_ stamps: Slots<UInt64>, t0: UInt64) -> (last: UInt64, median: UInt64, early: Bool) {
    var lat = [UInt64]()
    lat.reserveCapacity(stamps.count)
    var early = false
    for i in 0..<stamps.count {
        let s = stamps[i]
        if s < t0 { early = true }
        lat.append(s &- t0)
    }
    lat.sort()
    return (lat.last ?? 0, lat.isEmpty ? 0 : lat[lat.count / 2], early)
}

/// `streams.count` reader tasks; per round each counts itself, awaits
/// `next()`, takes the clock and checks it got `round + 1`. The driver waits
/// until all have counted themselves, lets them settle (and, with `parked`,
/// until it says all are suspended), sends `round + 1`, waits for all.
/// `skipInitial`: the first element is the current value (0), read first.
func runStorm<S: AsyncSequence & Sendable>(
    _ streams: [S], setupStart: UInt64, rounds: Int, settle: UInt64, skipInitial: Bool,
    send: @escaping @Sendable (Int) async -> Void, parked: (@Sendable () -> Bool)?, beat: @escaping @Sendable () -> Void
) async -> ScaleRun where S.Element == Int, S.Failure == Never {
    let n = streams.count
    let armed = Counter()
    let arrived = Counter()
    let armedAll = (0..<rounds).map { _ in Latch(1) }
    let arrivedAll = (0..<rounds).map { _ in Latch(1) }
    let stamps = Slots<UInt64>(n, 0)
    var readers: [Task<String?, Never>] = []
    readers.reserveCapacity(n)
    for (i, stream) in streams.enumerated() {
        readers.append(Task.detached { () -> String? in
            var iterator = stream.makeAsyncIterator()
            var error: String? = nil
            if skipInitial {
                let first = await iterator.next(isolation: nil)
                if first != 0 { error = "reader \(i): initial value \(first.map(String.init) ?? "missing"), expected 0" }
            }
            for r in 0..<rounds {
                if armed.next() == n * (r + 1) { armedAll[r].arrive() }
                let v = await iterator.next(isolation: nil)
                stamps[i] = nowNanos()
                if v != r + 1, error == nil {
                    error = "reader \(i), storm \(r): got \(v.map(String.init) ?? "the end"), expected \(r + 1)"
                }
                if arrived.next() == n * (r + 1) { arrivedAll[r].arrive() }
            }
            return error
        })
    }
    var run = ScaleRun()
    for r in 0..<rounds {
        await armedAll[r].wait()
        if r == 0 { run.setupNanos = nowNanos() &- setupStart }
        beat()
        try? await Task.sleep(for: .nanoseconds(Int(settle)))
        if let parked {
            var waits = 0
            while !parked() && waits < 50_000 {
                waits += 1
                try? await Task.sleep(for: .microseconds(100))
            }
            if waits > 0 { run.lateParks += 1 }
            if waits >= 50_000, run.error == nil { run.error = "storm \(r): readers never all parked" }
        }
        let t0 = nowNanos()
        await send(r + 1)
        let t1 = nowNanos()
        await arrivedAll[r].wait()
        let (last, med, early) = stormStats(stamps, t0: t0)
        if early, run.error == nil { run.error = "storm \(r): a reader woke before the send" }
        run.storms.append(last)
        run.readerMedians.append(med)
        run.sendCalls.append(t1 &- t0)
    }
    for task in readers {
        if let e = await task.value, run.error == nil { run.error = e }
    }
    if arrived.current != n * rounds, run.error == nil {
        run.error = "\(arrived.current) wake-ups, expected \(n * rounds)"
    }
    return run
}

/// The runtime's floor for a storm: N tasks suspended in
/// `withUnsafeContinuation`, the driver resumes each in a loop (no lock, no
/// buffer, nothing but the runtime's enqueue).
func runFloorStorm(subscribers n: Int, rounds: Int, settle: UInt64, beat: @escaping @Sendable () -> Void) async -> ScaleRun {
    let setupStart = nowNanos()
    let armed = Counter()
    let arrived = Counter()
    let armedAll = (0..<rounds).map { _ in Latch(1) }
    let arrivedAll = (0..<rounds).map { _ in Latch(1) }
    let stamps = Slots<UInt64>(n, 0)
    let continuations = Slots<UnsafeContinuation<Int, Never>?>(n, nil)
    var readers: [Task<String?, Never>] = []
    readers.reserveCapacity(n)
    for i in 0..<n {
        readers.append(Task.detached { () -> String? in
            var error: String? = nil
            for r in 0..<rounds {
                let v = await withUnsafeContinuation { (c: UnsafeContinuation<Int, Never>) in
                    continuations[i] = c
                    if armed.next() == n * (r + 1) { armedAll[r].arrive() }
                }
                stamps[i] = nowNanos()
                if v != r + 1, error == nil { error = "reader \(i), storm \(r): got \(v), expected \(r + 1)" }
                if arrived.next() == n * (r + 1) { arrivedAll[r].arrive() }
            }
            return error
        })
    }
    var run = ScaleRun()
    for r in 0..<rounds {
        await armedAll[r].wait()
        if r == 0 { run.setupNanos = nowNanos() &- setupStart }
        beat()
        try? await Task.sleep(for: .nanoseconds(Int(settle)))
        let t0 = nowNanos()
        for i in 0..<n { continuations[i]!.resume(returning: r + 1) }
        let t1 = nowNanos()
        await arrivedAll[r].wait()
        let (last, med, early) = stormStats(stamps, t0: t0)
        if early, run.error == nil { run.error = "storm \(r): a reader woke before the resume" }
        run.storms.append(last)
        run.readerMedians.append(med)
        run.sendCalls.append(t1 &- t0)
    }
    for task in readers {
        if let e = await task.value, run.error == nil { run.error = e }
    }
    return run
}

/// OpenCombine: N sinks take the clock when called; `send` calls them all
/// on the producer's thread. `initial`: a CurrentValueSubject's sinks get 0 first.
func runCombineStorm(subscribers n: Int, rounds: Int, settle: UInt64, value: Bool,
                     beat: @escaping @Sendable () -> Void) async -> ScaleRun {
    let setupStart = nowNanos()
    let stamps = Slots<UInt64>(n, 0)
    let boxes = (0..<n).map { _ in SinkBox() }
    let send: (Int) -> Void
    let cancellables: [AnyCancellable]
    let finish: () -> Void
    if value {
        let subject = CurrentValueSubject<Int, Never>(0)
        cancellables = (0..<n).map { i in
            let box = boxes[i]
            return subject.sink { v in
                stamps[i] = nowNanos()
                box.tally.add(v)
            }
        }
        send = { subject.send($0) }
        finish = { subject.send(completion: .finished) }
    } else {
        let subject = PassthroughSubject<Int, Never>()
        cancellables = (0..<n).map { i in
            let box = boxes[i]
            return subject.sink { v in
                stamps[i] = nowNanos()
                box.tally.add(v)
            }
        }
        send = { subject.send($0) }
        finish = { subject.send(completion: .finished) }
    }
    var run = ScaleRun(setupNanos: nowNanos() &- setupStart)
    let shared = UncheckedBox(value: send)
    let (storms, medians, calls, early) = await Task.detached { () -> ([UInt64], [UInt64], [UInt64], Bool) in
        var storms: [UInt64] = [], medians: [UInt64] = [], calls: [UInt64] = []
        var early = false
        for r in 0..<rounds {
            beat()
            try? await Task.sleep(for: .nanoseconds(Int(settle)))
            let t0 = nowNanos()
            shared.value(r + 1)
            let t1 = nowNanos()
            let (last, med, e) = stormStats(stamps, t0: t0)
            early = early || e
            storms.append(last)
            medians.append(med)
            calls.append(t1 &- t0)
        }
        return (storms, medians, calls, early)
    }.value
    finish()
    withExtendedLifetime(cancellables) {}
    run.storms = storms
    run.readerMedians = medians
    run.sendCalls = calls
    if early { run.error = "a sink ran before the send" }
    let expected = (value ? 0 : 1)...rounds
    for (i, box) in boxes.enumerated() {
        let t = box.tally
        if t.count != expected.count || !t.inOrder || t.last != rounds || t.sum != expected.reduce(0, +) {
            run.error = "sink \(i): \(t.count) values, last \(t.last), expected \(expected.count) values ending at \(rounds)"
            break
        }
    }
    return run
}

// MARK: 3. Registration while sending

/// One value, touched by one task at a time (the registration loop's
/// subscribe and cancel run on the same task).
final class Holder<T>: @unchecked Sendable {
    var value: T?
    init() {}
}

/// How far the producer has got (relaxed: only a rate is read from it).
final class Progress: Sendable {
    private let value = Atomic<Int>(0)
    init() {}
    @inline(__always) func set(_ v: Int) { value.store(v, ordering: .relaxed) }
    @inline(__always) var current: Int { value.load(ordering: .relaxed) }
}

/// Busy-waits `nanos` (the clock, no syscall on Linux).
@inline(never)
func spin(_ nanos: UInt64) {
    let until = nowNanos() &+ nanos
    while nowNanos() < until {}
}

/// Times `samples` subscribe+cancel pairs (at most `seconds`) while a
/// producer task sends 0, 1, 2, … as fast as it can to the `n` steady
/// subscribers. The producer's time per send is measured first, alone (20
/// ms); then, so that each call arrives at a random point of a send (not
/// just after the measuring task's previous call got the lock), each timed
/// call is preceded by a busy-wait drawn uniformly from [0, 2 × that time]
/// (at most 20 ms). `count` (if any) is checked after a pair every 16
/// pairs, outside the timed calls, and the gap after it is drawn too.
func registrationLoop(
    n: Int, samples: Int, seconds: Double,
    subscribe: @escaping @Sendable () -> Void, cancel: @escaping @Sendable () -> Void,
    count: (@Sendable () -> Int)?, send: @escaping @Sendable (Int) -> Void
) async -> (run: ScaleRun, sent: Int) {
    let done = Flag()
    let started = Latch(1)
    let progress = Progress()
    let producer = Task.detached { () -> Int in
        var i = 0
        started.arrive()
        while !done.isSet {
            send(i)
            i &+= 1
            progress.set(i)
        }
        return i
    }
    await started.wait()
    let run = await Task.detached { () -> ScaleRun in
        var run = ScaleRun()
        run.subscribeNanos.reserveCapacity(samples)
        run.cancelNanos.reserveCapacity(samples)
        // The producer alone: its time per send.
        let q0 = nowNanos(), s0 = progress.current
        spin(20_000_000)
        let q1 = nowNanos(), s1 = progress.current
        let period = Double(q1 &- q0) / Double(Swift.max(s1 - s0, 1))
        run.quietSendNanos = period
        let maxGap = UInt64(Swift.min(2 * period, 20_000_000))
        var rng = SplitMix(seed: 0x5ca1e)
        func gap() { if maxGap > 0 { spin(rng.next() % (maxGap + 1)) } }
        let begin = nowNanos()
        let sentBefore = progress.current
        let deadline = begin + UInt64(seconds * 1e9)
        for k in 0..<samples {
            if nowNanos() > deadline { break }
            gap()
            let t0 = nowNanos()
            subscribe()
            let t1 = nowNanos()
            let check = k % 16 == 15
            if check, let count, run.error == nil {
                let c = count()
                if c != n + 1 { run.error = "subscriberCount \(c) right after subscribe(), expected \(n + 1)" }
            }
            gap()
            let t2 = nowNanos()
            cancel()
            let t3 = nowNanos()
            if check, let count, run.error == nil {
                let c = count()
                if c != n { run.error = "subscriberCount \(c) right after cancel(), expected \(n)" }
            }
            run.subscribeNanos.append(t1 &- t0)
            run.cancelNanos.append(t3 &- t2)
        }
        run.windowNanos = nowNanos() &- begin
        run.sends = progress.current - sentBefore
        run.fixedNanos = run.windowNanos + 20_000_000
        return run
    }.value
    done.set()
    let sent = await producer.value
    return (run, sent)
}

/// A small deterministic generator for the gaps.
struct SplitMix {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9e37_79b9_7f4a_7c15
        var z = state
        z = (z ^ (z >> 30)) &* 0xbf58_476d_1ce4_e5b9
        z = (z ^ (z >> 27)) &* 0x94d0_49bb_1331_11eb
        return z ^ (z >> 31)
    }
}

func runRegistrationBroadcast(subscribers n: Int, samples: Int, seconds: Double) async -> ScaleRun {
    let setupStart = nowNanos()
    let sequence = BroadcastSequence<Int, Never>(bufferingPolicy: .bufferingNewest(1))
    let steady = (0..<n).map { _ in sequence.subscribe() }
    let setup = nowNanos() &- setupStart
    let slot = Holder<BroadcastSequence<Int, Never>.Subscription>()
    var (run, sent) = await registrationLoop(
        n: n, samples: samples, seconds: seconds,
        subscribe: { slot.value = sequence.subscribe() },
        cancel: {
            slot.value!.cancel()
            slot.value = nil
        },
        count: { sequence.subscriberCount },
        send: { _ = sequence.send($0) })
    run.setupNanos = setup
    sequence.finish()
    // Every steady subscriber holds exactly the last element sent.
    for (i, s) in steady.enumerated() where run.error == nil {
        var iterator = s.makeAsyncIterator()
        let first = await iterator.next(isolation: nil)
        let second = await iterator.next(isolation: nil)
        let expected: Int? = sent > 0 ? sent - 1 : nil
        if first != expected || second != nil || s.droppedCount != Swift.max(sent - 1, 0) {
            run.error = "steady subscriber \(i): got \(first.map(String.init) ?? "nil"), then \(second.map(String.init) ?? "nil"), "
                + "dropped \(s.droppedCount); expected \(expected.map(String.init) ?? "nil"), nil, \(Swift.max(sent - 1, 0)) of \(sent)"
        }
    }
    return run
}

func runRegistrationLock(subscribers n: Int, samples: Int, seconds: Double) async -> ScaleRun {
    let setupStart = nowNanos()
    let peer = LockStreamPeer<Int>(policy: .newest(1))
    let steady = (0..<n).map { _ in peer.makeStream() }
    let setup = nowNanos() &- setupStart
    let holder = Holder<AsyncStream<Int>>()
    var (run, sent) = await registrationLoop(
        n: n, samples: samples, seconds: seconds,
        subscribe: { holder.value = peer.makeStream() },
        cancel: { holder.value = nil },  // releasing the stream terminates it: onTermination removes it
        count: { peer.state.withLock { $0.continuations.count } },
        send: { peer.yield($0) })
    run.setupNanos = setup
    await peer.finish()
    for (i, s) in steady.enumerated() where run.error == nil {
        var iterator = s.makeAsyncIterator()
        let first = await iterator.next(isolation: nil)
        let second = await iterator.next(isolation: nil)
        let expected: Int? = sent > 0 ? sent - 1 : nil
        if first != expected || second != nil {
            run.error = "steady subscriber \(i): got \(first.map(String.init) ?? "nil"), then \(second.map(String.init) ?? "nil"); "
                + "expected \(expected.map(String.init) ?? "nil"), nil"
        }
    }
    return run
}

func runRegistrationCombine(subscribers n: Int, samples: Int, seconds: Double) async -> ScaleRun {
    let setupStart = nowNanos()
    let subject = PassthroughSubject<Int, Never>()
    let boxes = (0..<n).map { _ in SinkBox() }
    let cancellables = boxes.map { box in subject.sink { element in box.tally.add(element) } }
    let setup = nowNanos() &- setupStart
    let shared = UncheckedBox(value: subject)
    let slot = Holder<AnyCancellable>()
    var (run, sent) = await registrationLoop(
        n: n, samples: samples, seconds: seconds,
        subscribe: { slot.value = shared.value.sink { _ in } },
        cancel: {
            slot.value!.cancel()
            slot.value = nil
        },
        count: nil,
        send: { shared.value.send($0) })
    run.setupNanos = setup
    subject.send(completion: .finished)
    withExtendedLifetime(cancellables) {}
    if run.error == nil { run.error = checkAll(boxes.map(\.tally), .all(count: sent, ordered: true)) }
    return run
}

// MARK: 4. Idle memory

struct IdleBytes {
    var bytes: Double
    var mallocs: Double
    var error: String?
}

func idleBroadcast<E: Payload>(_: E.Type, policy: BroadcastBufferingPolicy, count k: Int, meter: ByteMeter) -> IdleBytes {
    let sequence = BroadcastSequence<E, Never>(bufferingPolicy: policy)
    var subscriptions: [BroadcastSequence<E, Never>.Subscription] = []
    subscriptions.reserveCapacity(k)
    meter.start()
    for _ in 0..<k { subscriptions.append(sequence.subscribe()) }
    let c = meter.stop()
    var error: String? = nil
    if sequence.subscriberCount != k { error = "subscriberCount \(sequence.subscriberCount), expected \(k)" }
    if let i = subscriptions.firstIndex(where: { $0.bufferedCount != 0 }), error == nil {
        error = "subscription \(i) holds \(subscriptions[i].bufferedCount) elements"
    }
    for s in subscriptions { s.cancel() }
    if sequence.subscriberCount != 0, error == nil { error = "subscriberCount \(sequence.subscriberCount) after cancelling all" }
    return IdleBytes(bytes: Double(c.bytes - c.freedBytes) / Double(k), mallocs: Double(c.mallocs - c.frees) / Double(k), error: error)
}

func idleLock<E: Payload>(_: E.Type, policy: Policy, count k: Int, meter: ByteMeter) -> IdleBytes {
    let peer = LockStreamPeer<E>(policy: policy)
    var streams: [AsyncStream<E>] = []
    streams.reserveCapacity(k)
    meter.start()
    for _ in 0..<k { streams.append(peer.makeStream()) }
    let c = meter.stop()
    let live = peer.state.withLock { $0.continuations.count }
    streams.removeAll()
    let after = peer.state.withLock { $0.continuations.count }
    let error = live != k ? "\(live) registered, expected \(k)" : after != 0 ? "\(after) left after releasing all" : nil
    return IdleBytes(bytes: Double(c.bytes - c.freedBytes) / Double(k), mallocs: Double(c.mallocs - c.frees) / Double(k), error: error)
}

func idleCombine<E: Payload>(_: E.Type, count k: Int, meter: ByteMeter) -> IdleBytes {
    let subject = PassthroughSubject<E, Never>()
    let box = SinkBox()
    var cancellables: [AnyCancellable] = []
    cancellables.reserveCapacity(k)
    meter.start()
    for _ in 0..<k { cancellables.append(subject.sink { box.tally.add($0.key) }) }
    let c = meter.stop()
    subject.send(E.make(0))
    let error = box.tally.count != k ? "\(box.tally.count) sinks called, expected \(k)" : nil
    subject.send(completion: .finished)
    cancellables.removeAll()
    return IdleBytes(bytes: Double(c.bytes - c.freedBytes) / Double(k), mallocs: Double(c.mallocs - c.frees) / Double(k), error: error)
}

// MARK: 5. Many producers

/// What one reader of a many-producers run saw: keys are `i·P + p` for
/// producer p's i-th element.
struct OrderTally: Sendable {
    var count = 0
    var sum = 0
    var hash: UInt64 = 0xcbf2_9ce4_8422_2325
    var inOrder = true
    var end: UInt64 = 0
    var last: [Int]
    let shift: Int
    let mask: Int

    init(producers p: Int) {
        last = [Int](repeating: -1, count: p)
        shift = p.trailingZeroBitCount
        mask = p - 1
    }

    @inline(__always)
    mutating func add(_ key: Int) {
        count &+= 1
        sum &+= key
        hash = (hash ^ UInt64(truncatingIfNeeded: key)) &* 0x100_0000_01b3
        let p = key & mask
        let i = key >> shift
        if i <= last[p] { inOrder = false }
        last[p] = i
    }
}

func runProducers<S: AsyncSequence & Sendable>(
    _ streams: [S], setupStart: UInt64, producers p: Int, elements m: Int,
    send: @escaping @Sendable (Int) -> Void, finish: @escaping @Sendable () async -> Void
) async -> ScaleRun where S.Element == Int, S.Failure == Never {
    let n = streams.count
    let ready = Latch(n)
    let readers = streams.map { stream in
        Task.detached { () -> OrderTally in
            var iterator = stream.makeAsyncIterator()
            ready.arrive()
            var t = OrderTally(producers: p)
            while let k = await iterator.next(isolation: nil) { t.add(k) }
            t.end = nowNanos()
            return t
        }
    }
    await ready.wait()
    var run = ScaleRun(setupNanos: nowNanos() &- setupStart)
    let threadsReady = Counter()
    let go = Flag()
    let finished = Counter()
    let allSent = Latch(1)
    let per = m / p
    for q in 0..<p {
        spawnThread {
            threadsReady.increment()
            while !go.isSet { sched_yield() }
            for i in 0..<per { send(i * p + q) }
            if finished.next() == p { allSent.arrive() }
        }
    }
    while threadsReady.current < p { try? await Task.sleep(for: .microseconds(20)) }
    let start = nowNanos()
    go.set()
    await allSent.wait()
    await finish()
    var tallies: [OrderTally] = []
    tallies.reserveCapacity(n)
    for r in readers { tallies.append(await r.value) }
    let end = tallies.map(\.end).max() ?? nowNanos()
    let total = per * p
    let sum = total * (total - 1) / 2
    for (i, t) in tallies.enumerated() {
        if t.count != total || t.sum != sum {
            run.error = "reader \(i): count \(t.count)/\(total), sum \(t.sum)/\(sum)"
        } else if !t.inOrder {
            run.error = "reader \(i): one producer's elements out of order"
        } else if t.hash != tallies[0].hash {
            run.error = "reader \(i): a different order from reader 0's"
        }
        if run.error != nil { break }
    }
    run.deliveriesPerSecond = Double(total * n) / (Double(end &- start) / 1e9)
    return run
}

// MARK: Cells

extension ScaleContext {
    func stormCells(_ n: Int, value: Bool) -> [ScaleCell] {
        let rounds = plan.rounds(n)
        let settle = plan.settleNanos(n)
        let watchdog = self.watchdog
        let label = "\(value ? ScaleWorkload.valueWake.rawValue : ScaleWorkload.storm.rawValue), N = \(grouped(n))"
        let beat: @Sendable () -> Void = { watchdog.beat(label) }
        var cells: [ScaleCell] = []
        if value {
            cells.append(ScaleCell(peer: scaleValueOurs) {
                let setupStart = nowNanos()
                let v = BroadcastValue<Int, Never>(0)
                let subs = (0..<n).map { _ in v.subscribe() }
                let run = await runStorm(subs, setupStart: setupStart, rounds: rounds, settle: settle, skipInitial: true,
                                         send: { v.send($0) }, parked: { subs.allSatisfy(\.isConsumerWaiting) }, beat: beat)
                v.finish()
                return run
            })
            cells.append(ScaleCell(peer: LockValuePeer.name) {
                let setupStart = nowNanos()
                let peer = LockValuePeer(0)
                var streams: [AsyncStream<Int>] = []
                streams.reserveCapacity(n)
                for _ in 0..<n { streams.append(await peer.subscribe()) }
                return await runStorm(streams, setupStart: setupStart, rounds: rounds, settle: settle, skipInitial: true,
                                      send: { await peer.send($0) }, parked: nil, beat: beat)
            })
            cells.append(ScaleCell(peer: CombineValueName.name + " + sink") {
                await runCombineStorm(subscribers: n, rounds: rounds, settle: settle, value: true, beat: beat)
            })
        } else {
            cells.append(ScaleCell(peer: scaleOurs) {
                let setupStart = nowNanos()
                let s = BroadcastSequence<Int, Never>(bufferingPolicy: .unbounded)
                let subs = (0..<n).map { _ in s.subscribe() }
                let run = await runStorm(subs, setupStart: setupStart, rounds: rounds, settle: settle, skipInitial: false,
                                         send: { _ = s.send($0) }, parked: { subs.allSatisfy(\.isConsumerWaiting) }, beat: beat)
                s.finish()
                return run
            })
            cells.append(ScaleCell(peer: scaleLock) {
                let setupStart = nowNanos()
                let peer = LockStreamPeer<Int>(policy: .unbounded)
                let streams = (0..<n).map { _ in peer.makeStream() }
                let run = await runStorm(streams, setupStart: setupStart, rounds: rounds, settle: settle, skipInitial: false,
                                         send: { peer.yield($0) }, parked: nil, beat: beat)
                await peer.finish()
                return run
            })
            cells.append(ScaleCell(peer: scaleCombine) {
                await runCombineStorm(subscribers: n, rounds: rounds, settle: settle, value: false, beat: beat)
            })
        }
        cells.append(ScaleCell(peer: scaleFloorName) {
            await runFloorStorm(subscribers: n, rounds: rounds, settle: settle, beat: beat)
        })
        return cells
    }
}

// MARK: The driver

struct ScaleReport {
    var lines: [String] = []
    var failures: [String] = []
}

/// Runs the selected scale workloads; returns what to print and what went wrong.
func runScale(_ o: CompareOptions, _ workloads: [ScaleWorkload], watchdog: Watchdog) async -> ScaleReport {
    let t0 = nowNanos()
    let plan = ScalePlan(o)
    let ctx = ScaleContext(plan: plan, watchdog: watchdog)
    var out: [String] = []
    func p(_ s: String = "") { out.append(s) }

    p("### Scale cells\(plan.smoke ? " (smoke: small N, one run each)" : "")")
    p("")
    // The topics cells (TopicsWorkloads.swift) say their own sizes and runs.
    if workloads.contains(where: { $0.rawValue.hasPrefix("scale") }) {
        p("Runs per peer and N: " + plan.ns.map { "N = \(grouped($0)): \(plan.runs($0))" }.joined(separator: ", ")
            + (plan.smoke ? "" : "; a warm-up run per peer first at N ≤ 1,024 only")
            + ". Peers interleaved (each round runs every peer once, rotating who goes first). "
            + "Budget per run: \(fmt(plan.budget, 0)) s (a peer estimated to take longer, from its runs at smaller N, is not run there).")
    } else {
        p("Peers interleaved (each round runs every peer once, rotating who goes first). "
            + "Budget per run: \(fmt(plan.budget, 0)) s (a peer estimated to take longer, from its runs at smaller N, is not run there).")
    }
    if scaleFault {
        p("")
        p("**FANOUT_SCALE_FAULT=1: deliberate fault: reader 0 of every task-based throughput run ignores one element "
            + "(topics: fan-out: subscription 0 counts its first element twice).**")
    }

    if workloads.contains(.throughput) {
        var table: [(n: Int, m: Int, runs: [PeerRuns])] = []
        for n in plan.ns {
            let m = plan.elements(n)
            let runs = await ctx.interleave(.throughput, n: n, work: Double(m * n), [
                ScaleCell(peer: scaleOurs) { await runScaleFanout(BroadcastPeer<Int>.self, subscribers: n, elements: m) },
                ScaleCell(peer: scaleLock) { await runScaleFanout(LockStreamPeer<Int>.self, subscribers: n, elements: m) },
                ScaleCell(peer: scaleCombine) { await runScaleCombineFanout(subscribers: n, elements: m) },
            ])
            table.append((n, m, runs))
        }
        p("")
        p("#### \(ScaleWorkload.throughput.rawValue): unbounded Int, one producer, every subscriber a task reading every element")
        p("")
        p("| N | M | peer | runs | median ns/delivery | min | × its N = \(grouped(plan.ns[0])) | producer ns/send (in send) | ÷ N | lock+AsyncStream ÷ this | OpenCombine ÷ this | set-up ms |")
        p("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        var base: [String: Double] = [:]
        for (n, m, runs) in table {
            let med = Dictionary(uniqueKeysWithValues: runs.map { r in (r.peer, median(r.runs.map(\.nsPerDelivery))) })
            for r in runs {
                if r.skipped {
                    p("| \(grouped(n)) | \(grouped(m)) | \(r.peer) | 0 | not run | | | | | | | |")
                    continue
                }
                let v = med[r.peer]!
                if n == plan.ns[0] { base[r.peer] = v }
                let growth = base[r.peer].map { n == plan.ns[0] ? "1.00×" : fmt(v / $0, 2) + "×" } ?? "–"
                let prod = median(r.runs.map(\.producerNsPerSend))
                let lock = med[scaleLock].map { $0.isNaN ? "–" : fmt($0 / v, 2) + "×" } ?? "–"
                let comb = med[scaleCombine].map { $0.isNaN ? "–" : fmt($0 / v, 2) + "×" } ?? "–"
                let peer = r.error.map { "\(r.peer) **WRONG: \($0)**" } ?? r.peer
                p("| \(grouped(n)) | \(grouped(m)) | \(peer) | \(r.runs.count) | \(fmtNs(v)) | \(fmtNs(r.runs.map(\.nsPerDelivery).min()!)) "
                    + "| \(growth) | \(fmtNs(prod)) | \(fmtNs(prod / Double(n))) | \(lock) | \(comb) "
                    + "| \(fmt(median(r.runs.map { Double($0.setupNanos) }) / 1e6, 1)) |")
            }
        }
        p("")
        p("ns/delivery: from the first send until the last reader has seen the end, / (M·N); median and minimum over the runs. "
            + "Producer ns/send: time inside the `send` calls (a clock read either side of each, about 20-40 ns included) / M; "
            + "÷ N: per subscriber. OpenCombine: synchronous sinks (no tasks), so its producer's loop is the whole run. "
            + "Ratios: the other peer's median / this row's; above 1, this row is faster. Set-up (not timed): subscribing N, "
            + "starting the N reader tasks and waiting until each has made its iterator (OpenCombine: N `sink` calls). "
            + "Checked: every reader got 0..<M in order.")
    }

    if workloads.contains(.storm) || workloads.contains(.valueWake) {
        for w in [ScaleWorkload.storm, .valueWake] where workloads.contains(w) {
            var table: [(n: Int, runs: [PeerRuns])] = []
            for n in plan.ns {
                let runs = await ctx.interleave(w, n: n, work: Double(plan.rounds(n) * n), ctx.stormCells(n, value: w == .valueWake))
                table.append((n, runs))
            }
            p("")
            if w == .storm {
                p("#### \(w.rawValue): N readers parked in `next()`, one `send`, until every reader has the element")
            } else {
                p("#### \(w.rawValue): `BroadcastValue`, N readers parked after reading the current value, one `send`, until every reader has read it")
            }
            p("")
            p("| N | peer | storms | p50 µs | p99 µs | max µs | p50 ÷ N (ns per reader) | median reader µs | send call p50 µs | lock ÷ this (p50) | this ÷ floor (p50) | parked late |")
            p("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
            let ours = w == .storm ? scaleOurs : scaleValueOurs
            let lockName = w == .storm ? scaleLock : LockValuePeer.name
            for (n, runs) in table {
                var p50s: [String: Double] = [:]
                for r in runs where !r.skipped { p50s[r.peer] = spread(r.runs.flatMap(\.storms)).0 }
                for r in runs {
                    if r.skipped {
                        p("| \(grouped(n)) | \(r.peer) | 0 | not run | | | | | | | | |")
                        continue
                    }
                    let (p50, p99, mx) = spread(r.runs.flatMap(\.storms))
                    let readerMed = median(r.runs.flatMap(\.readerMedians).map { Double($0) })
                    let call = spread(r.runs.flatMap(\.sendCalls)).0
                    let lock = p50s[lockName].map { fmt($0 / p50, 2) + "×" } ?? "–"
                    let floor = p50s[scaleFloorName].map { fmt(p50 / $0, 2) + "×" } ?? "–"
                    let late = r.peer == ours ? "\(r.runs.map(\.lateParks).reduce(0, +))" : "–"
                    let peer = r.error.map { "\(r.peer) **WRONG: \($0)**" } ?? r.peer
                    p("| \(grouped(n)) | \(peer) | \(r.runs.map(\.storms.count).reduce(0, +)) | \(micros(p50)) | \(micros(p99)) | \(micros(mx)) "
                        + "| \(fmtNs(p50 / Double(n))) | \(micros(readerMed)) | \(micros(call)) | \(lock) | \(floor) | \(late) |")
                }
            }
            p("")
            p("Storm: from just before the `send` until the last reader's clock reading after its `next()` returned; p50/p99/max over "
                + "all storms of all runs (\(plan.ns.map { "\(plan.rounds($0)) per run at N = \(grouped($0))" }.joined(separator: ", "))). "
                + "Median reader: the median reader's wake time in a storm, median over storms. Send call: time inside the `send` call. "
                + "Parked: every reader counts itself just before it calls `next()`; once all N have, the driver sleeps 1 ms + 10 ns·N; "
                + "for \(ours) it then also waits until every subscription reports its consumer suspended (`isConsumerWaiting`); "
                + "'parked late' counts the storms where that settle was not enough (0: every reader was parked at every send). "
                + "OpenCombine: synchronous sinks on the sender's thread, so its storm is its send call. "
                + "Floor: N tasks suspended in `withUnsafeContinuation`, resumed in a loop: the runtime's enqueue and task switch alone. "
                + "Checked: every reader got exactly 1, 2, … in order (after the initial value 0 for value wake).")
        }
    }

    if workloads.contains(.registration) {
        var table: [(n: Int, runs: [PeerRuns])] = []
        for n in plan.ns {
            let samples = plan.registrationSamples(n)
            let seconds = plan.registrationSeconds
            let runs = await ctx.interleave(.registration, n: n, [
                ScaleCell(peer: scaleOurs) { await runRegistrationBroadcast(subscribers: n, samples: samples, seconds: seconds) },
                ScaleCell(peer: scaleLock) { await runRegistrationLock(subscribers: n, samples: samples, seconds: seconds) },
                ScaleCell(peer: scaleCombine) { await runRegistrationCombine(subscribers: n, samples: samples, seconds: seconds) },
            ])
            table.append((n, runs))
        }
        p("")
        p("#### \(ScaleWorkload.registration.rawValue): one `subscribe()` and one `cancel()` while a producer sends as fast as it can to N subscribers")
        p("")
        p("| N | peer | samples | subscribe p50 µs | p99 µs | max µs | cancel p50 µs | p99 µs | max µs | µs per send, alone | µs per send, meanwhile |")
        p("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for (n, runs) in table {
            for r in runs {
                if r.skipped {
                    p("| \(grouped(n)) | \(r.peer) | 0 | not run | | | | | | | |")
                    continue
                }
                let quiet = median(r.runs.map(\.quietSendNanos))
                let (s50, s99, smax) = spread(r.runs.flatMap(\.subscribeNanos))
                let (c50, c99, cmax) = spread(r.runs.flatMap(\.cancelNanos))
                let window = Double(r.runs.map(\.windowNanos).reduce(0, +))
                let sends = Double(r.runs.map(\.sends).reduce(0, +))
                let peer = r.error.map { "\(r.peer) **WRONG: \($0)**" } ?? r.peer
                p("| \(grouped(n)) | \(peer) | \(grouped(r.runs.map(\.subscribeNanos.count).reduce(0, +))) | \(micros(s50)) | \(micros(s99)) | \(micros(smax)) "
                    + "| \(micros(c50)) | \(micros(c99)) | \(micros(cmax)) | \(micros(quiet)) | \(micros(sends > 0 ? window / sends : .nan)) |")
            }
        }
        p("")
        p("The N steady subscribers do not read and are `.bufferingNewest(1)` (lock+AsyncStream: its streams with "
            + "`.bufferingNewest(1)`; OpenCombine: sinks that keep a tally), so the producer never waits and nothing grows. "
            + "The producer task sends without yielding on one of the 2 pool threads; the measuring task, on the other, does up to "
            + plan.ns.map { "\(grouped(plan.registrationSamples($0)))" }.joined(separator: "/")
            + " subscribe+cancel pairs per run (at most \(fmt(plan.registrationSeconds, 1)) s of them), each call timed alone "
            + "(clock reads included) and preceded by a busy-wait drawn uniformly from [0, 2 × the producer's time per send alone] "
            + "(at most 20 ms), so that calls arrive at random points of the sends rather than right after the previous call "
            + "got the lock (and the measuring task does not starve the producer). lock+AsyncStream's cancel is releasing the "
            + "stream (its `onTermination` removes it under the lock). µs per send: alone = the producer's 20 ms before the "
            + "measuring starts / its sends; meanwhile = the measuring window / the sends made in it. Checked (every 16th pair, "
            + "outside the timed calls): `subscriberCount` is N + 1 right after `subscribe()` "
            + "and N right after `cancel()` (AsyncBroadcast; lock+AsyncStream: its dictionary); afterwards every steady "
            + "subscriber holds exactly the last element sent (AsyncBroadcast: and dropped all the others; OpenCombine: every sink got every element in order).")
    }

    if workloads.contains(.memory) {
        let k = plan.idleCount
        p("")
        p("#### \(ScaleWorkload.memory.rawValue): allocator bytes per subscription that holds nothing (\(grouped(k)) subscriptions)")
        p("")
        if let meter = o.byteMeter {
            log("· \(ScaleWorkload.memory.rawValue), \(grouped(k)) subscriptions")
            watchdog.beat(ScaleWorkload.memory.rawValue)
            let runs = plan.smoke ? 1 : 3
            p("| element | policy | peer | bytes per subscription | allocations per subscription |")
            p("|---|---|---|---:|---:|")
            func row(_ element: String, _ policy: String, _ peer: String, _ measure: () -> IdleBytes) {
                guard plan.wants(peer) else { return }
                var results: [IdleBytes] = []
                for _ in 0..<runs { results.append(measure()) }
                let bytes = median(results.map(\.bytes))
                let mallocs = median(results.map(\.mallocs))
                var name = peer
                if let e = results.compactMap(\.error).first {
                    name += " **WRONG: \(e)**"
                    ctx.failures.append("\(ScaleWorkload.memory.rawValue), \(element), \(policy), \(peer): \(e)")
                }
                p("| \(element) | \(policy) | \(name) | \(fmt(bytes, 0)) | \(fmt(mallocs, 2)) |")
            }
            func rows<E: Payload>(_ t: E.Type, _ element: String) {
                let policies: [(String, BroadcastBufferingPolicy)] = [
                    ("unbounded", .unbounded), ("bufferingNewest(8)", .bufferingNewest(8)),
                    ("bufferingOldest(8)", .bufferingOldest(8)), ("bounded(8)", .bounded(8)),
                ]
                for (name, policy) in policies {
                    row(element, name, scaleOurs) { idleBroadcast(E.self, policy: policy, count: k, meter: meter) }
                }
                row(element, "unbounded", scaleLock) { idleLock(E.self, policy: .unbounded, count: k, meter: meter) }
                row(element, "bufferingNewest(8)", scaleLock) { idleLock(E.self, policy: .newest(8), count: k, meter: meter) }
                row(element, "(none: synchronous)", scaleCombine) { idleCombine(E.self, count: k, meter: meter) }
            }
            rows(Int.self, "Int")
            rows(Payload64.self, "64-byte struct")
            p("")
            p("Bytes: \(meter.source), allocated minus freed while \(grouped(k)) subscriptions are made on a fresh sequence and kept "
                + "(a buffer or table that grew and moved counts once, at its final size; the sequence's own subscriber table "
                + "and dictionary growth are included, spread over the \(grouped(k))); requested sizes, so the allocator's own "
                + "rounding and headers (about 8-16 bytes per allocation) come on top. Allocations: net live allocations per "
                + "subscription. Median of \(runs) run(s). lock+AsyncStream: `AsyncStream.makeStream` + its dictionary entry; "
                + "bufferingOldest and bounded are not in its policy set here. OpenCombine: a `sink` (no buffer). "
                + "Checked: `subscriberCount` is \(grouped(k)) and every subscription holds nothing (`bufferedCount` 0), then 0 after cancelling all.")
        } else {
            p("Not measured: the malloc interposer is not active (or `--no-allocs`), and it is the only byte counter here.")
        }
    }

    if workloads.contains(.producers) {
        var table: [(n: Int, p: Int, m: Int, runs: [PeerRuns])] = []
        for n in plan.producerNs {
            let m = plan.producerElements(n)
            for pc in plan.producerCounts {
                let runs = await ctx.interleave(.producers, n: n, work: Double(m * n), tag: " P=\(pc)", runs: plan.smoke ? 1 : Swift.min(plan.reps, 3), [
                    ScaleCell(peer: scaleOurs) {
                        let setupStart = nowNanos()
                        let s = BroadcastSequence<Int, Never>(bufferingPolicy: .unbounded)
                        let subs = (0..<n).map { _ in s.subscribe() }
                        return await runProducers(subs, setupStart: setupStart, producers: pc, elements: m,
                                                  send: { _ = s.send($0) }, finish: { s.finish() })
                    },
                    ScaleCell(peer: scaleLock) {
                        let setupStart = nowNanos()
                        let peer = LockStreamPeer<Int>(policy: .unbounded)
                        let streams = (0..<n).map { _ in peer.makeStream() }
                        return await runProducers(streams, setupStart: setupStart, producers: pc, elements: m,
                                                  send: { peer.yield($0) }, finish: { await peer.finish() })
                    },
                ])
                table.append((n, pc, m, runs))
            }
        }
        p("")
        p("#### \(ScaleWorkload.producers.rawValue): P threads sending concurrently to N reader tasks (unbounded Int)")
        p("")
        p("| N | P | M | peer | runs | median M deliveries/s | min | max | ÷ its P = 1 | this ÷ lock+AsyncStream |")
        p("|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|")
        var one: [String: Double] = [:]
        for (n, pc, m, runs) in table {
            var meds: [String: Double] = [:]
            for r in runs where !r.skipped { meds[r.peer] = median(r.runs.map(\.deliveriesPerSecond)) }
            for r in runs {
                if r.skipped {
                    p("| \(grouped(n)) | \(pc) | \(grouped(m)) | \(r.peer) | 0 | not run | | | | |")
                    continue
                }
                let v = meds[r.peer]!
                if pc == 1 { one["\(n)|\(r.peer)"] = v }
                let vs1 = one["\(n)|\(r.peer)"].map { fmt(v / $0, 2) + "×" } ?? "–"
                let lock = meds[scaleLock].map { fmt(v / $0, 2) + "×" } ?? "–"
                let xs = r.runs.map(\.deliveriesPerSecond)
                let peer = r.error.map { "\(r.peer) **WRONG: \($0)**" } ?? r.peer
                p("| \(grouped(n)) | \(pc) | \(grouped(m)) | \(peer) | \(r.runs.count) | \(fmt(v / 1e6, 1)) | \(fmt(xs.min()! / 1e6, 1)) "
                    + "| \(fmt(xs.max()! / 1e6, 1)) | \(vs1) | \(lock) |")
            }
        }
        p("")
        p("P producer pthreads (the readers are tasks on the cooperative pool, 2 threads on this machine; P > 2 oversubscribes the cores) "
            + "each send M/P elements, keys i·P + p, all starting together; deliveries/s = M·N / (start until the last reader has seen "
            + "the end). ÷ its P = 1: this peer at P / itself at P = 1 (below 1: total throughput falls as producers are added). "
            + "this ÷ lock+AsyncStream: above 1, more deliveries per second. Checked: every reader got all M keys, each producer's in "
            + "the order sent, and every reader the same order as reader 0 (an order-sensitive hash).")
    }

    if workloads.contains(.registrationStorm) {
        for line in await ctx.stormTable(o) { p(line) }
        for line in ctx.gateTable(o) { p(line) }
    }

    if workloads.contains(.lifecycle) {
        for line in await ctx.lifecycleTable(o) { p(line) }
    }

    if workloads.contains(.topicsMemory) {
        for line in await ctx.topicsMemoryTable(o) { p(line) }
    }
    if workloads.contains(.topicsFanout) {
        for line in await ctx.topicsFanoutTable(o) { p(line) }
    }
    if workloads.contains(.topicsChurn) {
        for line in await ctx.topicsChurnTable(o) { p(line) }
    }
    if workloads.contains(.sparseFanout) {
        for line in await ctx.sparseFanoutTable(o) { p(line) }
    }

    if !ctx.notes.isEmpty {
        p("")
        p("Peers not run (too slow for the budget), or stopped early:")
        for note in ctx.notes { p("- \(note)") }
    }
    p("")
    p("Scale cells: \(fmt(Double(nowNanos() &- t0) / 1e9, 1)) s.")
    return ScaleReport(lines: out, failures: ctx.failures)
}
