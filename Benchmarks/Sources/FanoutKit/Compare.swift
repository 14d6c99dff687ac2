// The comparison driver behind `fanout-compare`: every cell, every peer,
// interleaved, repeated; prints a markdown table of medians.
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

public struct CompareOptions: Sendable {
    public var smoke = false
    public var reps = 5
    /// Deliveries (M·N) per throughput run.
    public var deliveries = 1 << 17
    public var churnCycles = 10_000
    public var latencySamples = 300
    /// Reads per value-read run.
    public var valueReads = 1_000_000
    /// Updates (K) per value-update run.
    public var valueUpdates = 1 << 15
    /// Only workloads whose name contains this (case-insensitive).
    public var filter: String? = nil
    /// Only peers whose name contains one of these comma-separated words (case-insensitive).
    public var peerFilter: String? = nil
    /// Only this subscriber count.
    public var onlyN: Int? = nil
    public var meter: AllocMeter? = nil
    /// Allocated and freed bytes, for the scale cells' idle-memory cell.
    public var byteMeter: ByteMeter? = nil
    /// Seconds one run of one peer may take in the scale cells (ScaleWorkloads.swift).
    public var scaleBudget: Double? = nil
    /// Seconds one run may take before the process exits with status 3.
    public var hangLimit = 120

    public init() {}

    public static func smoke() -> CompareOptions {
        var o = CompareOptions()
        o.smoke = true
        o.reps = 1
        o.deliveries = 1 << 12
        o.churnCycles = 200
        o.latencySamples = 20
        o.valueReads = 10_000
        o.valueUpdates = 256
        return o
    }
}

typealias Runner = @Sendable (AllocMeter?) async -> RunResult

struct PeerCell {
    var peer: String
    var run: Runner?  // nil: n/a
}

struct Group {
    var workload: String
    var n: Int
    var peers: [PeerCell]
    var isLatency = false
    /// The lock+AsyncStream reference if it is not in this group (bounded).
    var referenceFrom: String? = nil
    /// Value and promise workloads: their own table (ValuePromiseTable.swift).
    var v2: V2Info? = nil
    /// Sharing workloads: their own table (SharingWorkloads.swift).
    var sharing: SharingInfo? = nil
}

struct Row {
    var workload: String
    var n: Int
    var peer: String
    var median: Double?
    var min: Double?
    var allocs: Double?
    var mallocs: Int?
    var error: String?
    var receivedFraction: Double = 1
    var v2: V2Info? = nil
    /// BroadcastValue or BroadcastPromise: the peer the others in its cell are compared with.
    var isOurs = false
    var allocDivisor = 1
    var sharing: SharingInfo? = nil
    /// Median producer-side ns per delivery (throughput runs).
    var producerMedian: Double? = nil
}

let lockName = LockStreamPeer<Int>.name
let oursName = BroadcastPeer<Int>.name

// MARK: Cell catalogue

let batchSize = 64
let batchWorkload = "batch: send vs send(contentsOf:) ×\(batchSize)"
let batchSingleName = "AsyncBroadcast send(_:)"
let batchName = "AsyncBroadcast send(contentsOf:) ×\(batchSize)"
let churnWorkload = "churn: ns per subscribe+cancel"

func floorCell(n: Int, m: Int) -> PeerCell {
    let items = Array(0..<m)
    return PeerCell(peer: FloorPeer.name) { meter in runFloor(items: items, subscribers: n, meter: meter) }
}

func throughputPeers<E: Payload>(
    _: E.Type, policy: Policy, n: Int, items: [E], producers: Int = 1
) -> [PeerCell] {
    func cell<P: AsyncPeer>(_ p: P.Type) -> PeerCell where P.Element == E {
        guard P.supports(policy) else { return PeerCell(peer: P.name, run: nil) }
        return PeerCell(peer: P.name) { meter in
            await runFanout(P.self, policy: policy, subscribers: n, items: items, producers: producers, meter: meter)
        }
    }
    var peers: [PeerCell] = []
    if case .bounded = policy {
        peers.append(PeerCell(peer: BroadcastPeer<E>.name + " (emit)") { meter in
            await runFanout(BroadcastPeer<E>.self, policy: policy, subscribers: n, items: items,
                            producers: producers, mode: .emit, meter: meter)
        })
    } else {
        peers.append(cell(BroadcastPeer<E>.self))
    }
    if n == 256 { return peers }
    peers.append(cell(LockStreamPeer<E>.self))
    peers.append(cell(ActorStreamPeer<E>.self))
    peers.append(cell(SharePeer<E>.self))
    // Synchronous delivery needs no buffer, so it runs in every policy's cell.
    peers.append(PeerCell(peer: CombinePeer.name) { meter in
        await runCombineFanout(items: items, subscribers: n, producers: producers, meter: meter)
    })
    if n == 1 { peers.append(cell(PlainStreamPeer<E>.self)) }
    return peers
}

func buildGroups(_ o: CompareOptions) -> [Group] {
    let ns = [1, 4, 16, 64, 256]
    var groups: [Group] = []
    func m(_ n: Int) -> Int { max(o.deliveries / n, 256) }

    func throughput<E: Payload>(_ name: String, _ t: E.Type, policy: Policy, producers: Int = 1) {
        for n in ns {
            let items = (0..<m(n)).map { E.make($0) }
            var g = Group(workload: name, n: n,
                          peers: throughputPeers(E.self, policy: policy, n: n, items: items, producers: producers))
            if case .bounded = policy { g.referenceFrom = "unbounded" }
            groups.append(g)
        }
    }
    throughput("unbounded", Int.self, policy: .unbounded)
    // The single-threaded floor (Floor.swift) beside the unbounded Int cells.
    for i in groups.indices where groups[i].workload == "unbounded" {
        groups[i].peers.append(floorCell(n: groups[i].n, m: m(groups[i].n)))
    }
    throughput("newest(1024)", Int.self, policy: .newest(1024))
    throughput("bounded(1024) emit", Int.self, policy: .bounded(1024))
    throughput("4 producers", Int.self, policy: .unbounded, producers: 4)
    throughput("class payload", RefPayload.self, policy: .unbounded)
    throughput("64-byte struct", Payload64.self, policy: .unbounded)

    // send(_:) against send(contentsOf:) in batches of `batchSize`, same
    // subscribers, same elements; the ratio column compares with send(_:).
    for n in [1, 4, 16, 64] {
        let items = Array(0..<m(n))
        groups.append(Group(workload: batchWorkload, n: n, peers: [
            PeerCell(peer: batchSingleName) { meter in
                await runFanout(BroadcastPeer<Int>.self, policy: .unbounded, subscribers: n, items: items, meter: meter)
            },
            PeerCell(peer: batchName) { meter in
                await runFanout(BroadcastPeer<Int>.self, policy: .unbounded, subscribers: n, items: items,
                                mode: .batch(batchSize), meter: meter)
            },
            floorCell(n: n, m: m(n)),
        ]))
    }

    let cycles = o.churnCycles
    for n in ns {
        func churn<P: AsyncPeer>(_ p: P.Type) -> PeerCell where P.Element == Int {
            PeerCell(peer: P.name) { meter in await runChurn(P.self, subscribers: n, cycles: cycles, meter: meter) }
        }
        var peers = [churn(BroadcastPeer<Int>.self)]
        if n != 256 {
            peers += [churn(LockStreamPeer<Int>.self), churn(ActorStreamPeer<Int>.self), churn(SharePeer<Int>.self)]
            peers.append(PeerCell(peer: CombinePeer.name) { meter in
                await runCombineChurn(subscribers: n, cycles: cycles, meter: meter)
            })
        }
        groups.append(Group(workload: churnWorkload, n: n, peers: peers))
    }

    let samples = o.latencySamples
    for n in ns {
        func lat<P: AsyncPeer>(_ p: P.Type) -> PeerCell where P.Element == Int {
            PeerCell(peer: P.name) { _ in await runLatency(P.self, subscribers: n, samples: samples) }
        }
        var peers = [lat(BroadcastPeer<Int>.self)]
        if n != 256 {
            peers += [lat(LockStreamPeer<Int>.self), lat(ActorStreamPeer<Int>.self), lat(SharePeer<Int>.self)]
            peers.append(PeerCell(peer: CombinePeer.name) { _ in
                await runCombineLatency(subscribers: n, samples: samples)
            })
            if n == 1 { peers.append(lat(PlainStreamPeer<Int>.self)) }
        }
        groups.append(Group(workload: "wake-up", n: n, peers: peers, isLatency: true))
    }
    groups += valueGroups(o)
    groups += promiseGroups(o)
    groups += sharingGroups(o)
    if let f = o.filter?.lowercased() {
        groups = groups.filter { $0.workload.lowercased().contains(f) }
    }
    if let n = o.onlyN { groups = groups.filter { $0.n == n } }
    if let f = o.peerFilter?.lowercased() {
        let wanted = f.split(separator: ",").map(String.init)
        for i in groups.indices {
            groups[i].peers = groups[i].peers.filter { p in wanted.contains { p.peer.lowercased().contains($0) } }
        }
    }
    return groups
}

// MARK: Running

func median(_ xs: [Double]) -> Double {
    let s = xs.sorted()
    if s.isEmpty { return .nan }
    return s.count % 2 == 1 ? s[s.count / 2] : (s[s.count / 2 - 1] + s[s.count / 2]) / 2
}

func percentile(_ sorted: [UInt64], _ p: Double) -> Double {
    if sorted.isEmpty { return .nan }
    let i = Swift.min(sorted.count - 1, Int((Double(sorted.count) * p).rounded(.down)))
    return Double(sorted[i])
}

public func log(_ s: String) {
    let line = s + "\n"
    _ = line.utf8CString.withUnsafeBufferPointer { write(2, $0.baseAddress, $0.count - 1) }
}

/// Runs everything, prints the table to standard output. Returns false if any
/// run delivered a wrong result.
public func runComparison(_ o: CompareOptions) async -> Bool {
    let t0 = nowNanos()
    let watchdog = Watchdog(limitSeconds: o.hangLimit)
    watchdog.start()
    let groups = buildGroups(o)
    let scale = scaleWorkloads(o)
    var rows: [Row] = []
    var failures: [String] = []

    for g in groups {
        log("· \(g.workload), N = \(g.n)")
        let active = g.peers.indices.filter { g.peers[$0].run != nil }
        var samples = [Int: [Double]]()
        var p99s = [Int: [Double]]()
        var allocs = [Int: (Double, Int)]()
        var allocUnits = [Int: Int]()
        var errors = [Int: String]()
        var fractions = [Int: [Double]]()
        var producerSamples = [Int: [Double]]()

        func run(_ i: Int, _ meter: AllocMeter?) async -> RunResult {
            watchdog.beat("\(g.workload), N = \(g.n), \(g.peers[i].peer)")
            return await g.peers[i].run!(meter)
        }

        func record(_ i: Int, _ r: RunResult, timed: Bool) {
            if let e = r.error, errors[i] == nil {
                errors[i] = e
                failures.append("\(g.workload) N=\(g.n) \(g.peers[i].peer): \(e)")
            }
            guard timed else { return }
            if g.isLatency {
                samples[i, default: []].append(percentile(r.latencies, 0.50))
                p99s[i, default: []].append(percentile(r.latencies, 0.99))
            } else {
                samples[i, default: []].append(r.nanosPerUnit)
                if let p = r.producerNanos {
                    producerSamples[i, default: []].append(Double(p) / Double(max(r.units, 1)))
                }
            }
            fractions[i, default: []].append(r.receivedFraction)
        }

        if !o.smoke {
            // Warm-up, then one run with allocation counting (not timed).
            for i in active { record(i, await run(i, nil), timed: false) }
            if let meter = o.meter, !g.isLatency {
                for i in active {
                    let r = await run(i, meter)
                    record(i, r, timed: false)
                    if let c = r.mallocs {
                        allocs[i] = (Double(c) / Double(max(r.units, 1)), c)
                        allocUnits[i] = r.units
                    }
                }
            }
        }
        for rep in 0..<o.reps {
            // Interleave peers, rotating who goes first.
            for k in active.indices {
                let i = active[(k + rep) % active.count]
                let r = await run(i, o.smoke ? o.meter : nil)
                record(i, r, timed: true)
                if o.smoke, let c = r.mallocs {
                    allocs[i] = (Double(c) / Double(max(r.units, 1)), c)
                    allocUnits[i] = r.units
                }
            }
        }

        for (i, p) in g.peers.enumerated() {
            if g.isLatency {
                rows.append(Row(workload: "wake-up p50 (ns)", n: g.n, peer: p.peer,
                                median: samples[i].map(median), min: samples[i]?.min(), error: errors[i]))
            } else {
                var row = Row(workload: g.workload, n: g.n, peer: p.peer,
                              median: samples[i].map(median), min: samples[i]?.min(),
                              allocs: allocs[i]?.0, mallocs: allocs[i]?.1, error: errors[i],
                              receivedFraction: fractions[i].map(median) ?? 1)
                if let info = g.v2 {
                    row.v2 = info
                    row.isOurs = p.peer.hasPrefix("Broadcast")
                    row.allocDivisor = info.allocsPerN ? g.n : allocUnits[i] ?? 1
                }
                row.sharing = g.sharing
                row.producerMedian = producerSamples[i].map(median)
                rows.append(row)
            }
        }
        if g.isLatency {
            for (i, p) in g.peers.enumerated() {
                rows.append(Row(workload: "wake-up p99 (ns)", n: g.n, peer: p.peer,
                                median: p99s[i].map(median), min: p99s[i]?.min(), error: errors[i]))
            }
        }
    }

    // The scale cells (ScaleWorkloads.swift): their own driver and tables.
    var scaleReport: ScaleReport? = nil
    if !scale.isEmpty {
        let report = await runScale(o, scale, watchdog: watchdog)
        failures += report.failures
        scaleReport = report
    }

    let classic = rows.filter { $0.v2 == nil && $0.sharing == nil }
    let v2 = rows.filter { $0.v2 != nil }
    let sharing = rows.filter { $0.sharing != nil }
    if !classic.isEmpty || (v2.isEmpty && sharing.isEmpty && scaleReport == nil) { printTable(classic, o) }
    if !v2.isEmpty {
        if !classic.isEmpty { print("") }
        printV2Table(v2, o)
    }
    if !sharing.isEmpty {
        if !classic.isEmpty || !v2.isEmpty { print("") }
        printSharingTable(sharing, o)
    }
    if let scaleReport {
        if !rows.isEmpty { print("") }
        for line in scaleReport.lines { print(line) }
    }
    let seconds = Double(nowNanos() - t0) / 1e9
    print("")
    print("Total time: \(fmt(seconds, 1)) s (\(o.smoke ? "smoke" : "full"), \(o.reps) timed run(s) per cell, "
        + "\(o.deliveries) deliveries per throughput run, \(o.churnCycles) churn cycles, "
        + "\(o.latencySamples) wake-ups per latency run, \(o.valueReads) reads per value-read run, "
        + "\(o.valueUpdates) updates per value-update run).")
    if !failures.isEmpty {
        print("")
        print("WRONG RESULTS:")
        for f in failures { print("- \(f)") }
    }
    return failures.isEmpty
}

// MARK: Formatting

func fmt(_ x: Double, _ decimals: Int) -> String {
    if x.isNaN { return "–" }
    var scale = 1.0
    for _ in 0..<decimals { scale *= 10 }
    let r = (x * scale).rounded()
    let negative = r < 0
    let v = abs(r)
    let whole = Int(v / scale)
    var s = "\(whole)"
    if decimals > 0 {
        let frac = Int(v - Double(whole) * scale)
        var f = "\(frac)"
        while f.count < decimals { f = "0" + f }
        s += "." + f
    }
    return negative ? "-" + s : s
}

func fmtNs(_ x: Double) -> String {
    if x >= 1000 { return fmt(x, 0) }
    if x >= 10 { return fmt(x, 1) }
    return fmt(x, 2)
}

func fmtAllocs(_ per: Double, _ total: Int) -> String {
    if total == 0 { return "0" }
    if per >= 0.1 { return fmt(per, 2) }
    // Tiny: per-run constants (task creation, buffer growth) spread over the run.
    return "\(fmt(per, 4)) (\(total) total)"
}

func printTable(_ rows: [Row], _ o: CompareOptions) {
    func key(_ r: Row) -> String { "\(r.workload)|\(r.n)" }
    var reference = [String: Double]()
    var referenceAllocs = [String: Double]()
    var floor = [String: Double]()
    var single = [String: Double]()
    var singleProducer = [String: Double]()
    for r in rows {
        if r.workload == batchWorkload && r.peer == batchSingleName { singleProducer[key(r)] = r.producerMedian }
        if r.peer == lockName {
            reference[key(r)] = r.median
            if r.mallocs != nil { referenceAllocs[key(r)] = r.allocs }
        }
        if r.peer == FloorPeer.name { floor[key(r)] = r.median }
        if r.workload == batchWorkload && r.peer == batchSingleName { single[key(r)] = r.median }
    }

    print("| workload | N | peer | median ns/delivery | min ns/delivery | allocs/delivery | allocs ÷ lock+AsyncStream's | ratio vs lock+AsyncStream | ÷ floor |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
    var lossy: [Row] = []
    for r in rows {
        let allocs = r.mallocs.map { fmtAllocs(r.allocs ?? 0, $0) } ?? (r.median == nil ? "" : "–")
        var allocRatio = ""
        if r.workload == churnWorkload, r.mallocs != nil, let mine = r.allocs, let ref = referenceAllocs[key(r)] {
            allocRatio = ref > 0 ? fmt(mine / ref, 2) + "×" : "–"
        }
        var ratio = "–"
        var toFloor = ""
        if let med = r.median {
            if let ref = reference[key(r)] {
                ratio = fmt(ref / med, 2) + "×"
            } else if r.workload.hasPrefix("bounded"), let ref = reference["unbounded|\(r.n)"] {
                ratio = fmt(ref / med, 2) + "× †"
            } else if let ref = single[key(r)] {
                ratio = fmt(ref / med, 2) + "× ‡"
            }
            if let f = floor[key(r)], f > 0 { toFloor = fmt(med / f, 1) + "×" }
        }
        let med = r.median.map(fmtNs) ?? "n/a"
        let mn = r.min.map(fmtNs) ?? "n/a"
        let peer = r.error == nil ? r.peer : "\(r.peer) **WRONG: \(r.error!)**"
        print("| \(r.workload) | \(r.n) | \(peer) | \(med) | \(mn) | \(allocs) | \(allocRatio) | \(ratio) | \(toFloor) |")
        if r.median != nil, r.receivedFraction < 0.999 { lossy.append(r) }
    }
    print("")
    print("Ratio = lock+AsyncStream's median / this peer's median: above 1 is faster (or, for wake-up, sooner) than lock+AsyncStream.")
    print("† no backpressure in lock+AsyncStream: compared with its `unbounded` cell at the same N.")
    print("‡ batch cells: compared with `\(batchSingleName)` in the same cell (the same elements sent one call each).")
    print("÷ floor = this peer's median / the floor's median in the same cell (how many times the floor's time it takes). "
        + "Floor: one thread copies each element into N separate \(floorChunk)-slot rings and drains them into the "
        + "same checked tallies the consumers keep, per \(floorChunk)-element chunk; no tasks, locks, atomics or wake-ups.")
    print("Allocs ÷ lock+AsyncStream's (churn rows): this peer's allocations per cycle / lock+AsyncStream's; below 1 = fewer.")
    print("Throughput cells: ns per delivery = time from the first send until every subscriber has seen the end, / (M·N), M·N ≈ \(o.deliveries).")
    print("Churn: ns per subscribe+cancel cycle while one producer keeps sending to N steady subscribers. Wake-up: send → parked consumer running.")
    let batchRows = rows.filter { $0.workload == batchWorkload && $0.peer == batchName }
    if !batchRows.isEmpty {
        print("")
        print("Batching: send(_:) ns per delivery / send(contentsOf:) ×\(batchSize) ns per delivery, end to end "
            + "(as in the table) and producer only (first send until the last send returned, / M·N); target ≥ 3× at N = 16:")
        for r in batchRows {
            guard let b = r.median, let s = single[key(r)] else { continue }
            var line = "- N = \(r.n): end to end \(fmtNs(s)) / \(fmtNs(b)) = \(fmt(s / b, 2))×"
            if let bp = r.producerMedian, let sp = singleProducer[key(r)] {
                line += "; producer only \(fmtNs(sp)) / \(fmtNs(bp)) = \(fmt(sp / bp, 2))×"
            }
            print(line)
        }
    }
    if !lossy.isEmpty {
        print("")
        print("Lossy cells (the producer outran the subscribers; ns per delivery still divides by M·N) — median share of M·N received:")
        for r in lossy {
            print("- \(r.workload), N = \(r.n), \(r.peer): \(fmt(r.receivedFraction * 100, 1)) %")
        }
    }
}
