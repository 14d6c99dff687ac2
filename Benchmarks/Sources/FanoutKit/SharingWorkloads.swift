// The sharing workloads: one upstream `AsyncSequence` iterated once and
// delivered to N subscribers (`broadcast(bufferingPolicy:started:)`, against
// swift-async-algorithms `share(bufferingPolicy:)` and a lock+AsyncStream hub
// fed by a task), and the cost of a subscribe+cancel pair while a
// `subscriberCounts` subscription is being read. Generic code, specialised in
// this module; printed in their own table (`printSharingTable`).
import AsyncAlgorithms
import AsyncBroadcast

// MARK: The upstream

/// `0..<count` as an `AsyncSequence` that never suspends, except once: the
/// first `next()` waits for `gate`, so that every subscriber can be in place
/// (and the clock started) before the first element exists.
public struct GatedCountingUpstream: AsyncSequence, Sendable {
    public typealias Element = Int
    public typealias Failure = Never

    let count: Int
    let gate: Latch

    public struct AsyncIterator: AsyncIteratorProtocol {
        public typealias Element = Int
        public typealias Failure = Never

        var index = 0
        let count: Int
        var gate: Latch?

        @inline(__always)
        public mutating func next() async -> Int? {
            if let gate = self.gate {
                self.gate = nil
                await gate.wait()
            }
            guard index < count else { return nil }
            defer { index &+= 1 }
            return index
        }

        @inline(__always)
        public mutating func next(isolation actor: isolated (any Actor)?) async -> Int? {
            if let gate = self.gate {
                self.gate = nil
                await gate.wait()
            }
            guard index < count else { return nil }
            defer { index &+= 1 }
            return index
        }
    }

    public func makeAsyncIterator() -> AsyncIterator { AsyncIterator(count: count, gate: gate) }
}

// MARK: sharing

/// Which design shares the upstream.
enum SharingPeer: Sendable, CaseIterable {
    case broadcastBounded, broadcastUnbounded, shareBounded, shareUnbounded, hub

    static let bound = 64

    var name: String {
        switch self {
        case .broadcastBounded: "AsyncBroadcast bounded(\(Self.bound))"
        case .broadcastUnbounded: "AsyncBroadcast unbounded"
        case .shareBounded: "share() bounded(\(Self.bound))"
        case .shareUnbounded: "share() unbounded"
        case .hub: "lock+AsyncStream hub (unbounded)"
        }
    }

    /// The AsyncBroadcast cell this peer is compared with (same buffering).
    var reference: SharingPeer? {
        switch self {
        case .broadcastBounded, .broadcastUnbounded: nil
        case .shareBounded: .broadcastBounded
        case .shareUnbounded, .hub: .broadcastUnbounded
        }
    }
}

/// Iterates `sequence` to its end (making its iterator first, then saying so).
@inline(never)
func consumeShared<S: AsyncSequence>(_ sequence: S, ready: Latch) async -> Tally
where S.Element == Int, S.Failure == Never {
    var iterator = sequence.makeAsyncIterator()
    ready.arrive()
    var tally = Tally()
    while let element = await iterator.next(isolation: nil) {
        tally.add(element)
    }
    tally.end = nowNanos()
    return tally
}

/// Starts `n` consumer tasks over `sequences` (one each, or the same
/// sequence `n` times for `share()`), waits until every one has made its
/// iterator, opens the upstream's gate, and times from there until the last
/// consumer has seen the end. Allocations are counted over the same window.
func timeShared<S: AsyncSequence & Sendable>(
    _ sequences: [S], upstreamCount m: Int, gate: Latch, meter: AllocMeter?,
    feeder: (@Sendable () async -> Void)? = nil
) async -> RunResult where S.Element == Int, S.Failure == Never {
    let n = sequences.count
    let ready = Latch(n)
    let consumers = sequences.map { sequence in
        Task.detached { await consumeShared(sequence, ready: ready) }
    }
    await ready.wait()
    let feederTask = feeder.map { f in Task.detached { await f() } }
    meter?.start()
    let start = nowNanos()
    gate.arrive()
    var tallies: [Tally] = []
    tallies.reserveCapacity(n)
    for task in consumers { tallies.append(await task.value) }
    let mallocs = meter?.stop()
    await feederTask?.value
    let end = tallies.map(\.end).max() ?? nowNanos()
    return RunResult(nanos: end &- start, units: m, mallocs: mallocs,
                     error: checkAll(tallies, .all(count: m, ordered: true)))
}

/// One upstream of `m` Ints shared to `n` subscribers; ns (and allocations)
/// per upstream element, delivered to all `n`.
func runSharing(_ peer: SharingPeer, subscribers n: Int, elements m: Int, meter: AllocMeter?) async -> RunResult {
    let gate = Latch(1)
    let upstream = GatedCountingUpstream(count: m, gate: gate)
    switch peer {
    case .broadcastBounded, .broadcastUnbounded:
        let policy: BroadcastBufferingPolicy = peer == .broadcastBounded ? .bounded(SharingPeer.bound) : .unbounded
        let sequence = upstream.broadcast(bufferingPolicy: policy, started: .lazily)
        // The first subscribe starts the upstream task, which waits at the gate.
        let subscriptions = (0..<n).map { _ in sequence.subscribe() }
        let result = await timeShared(subscriptions, upstreamCount: m, gate: gate, meter: meter)
        withExtendedLifetime(sequence) {}  // releasing it would finish it and stop the upstream
        return result
    case .shareBounded, .shareUnbounded:
        let policy: AsyncBufferSequencePolicy = peer == .shareBounded ? .bounded(SharingPeer.bound) : .unbounded
        let shared = upstream.share(bufferingPolicy: policy)
        // Each consumer registers (a side) when it makes its iterator; the
        // first next() starts the upstream task, which waits at the gate.
        return await timeShared(Array(repeating: shared, count: n), upstreamCount: m, gate: gate, meter: meter)
    case .hub:
        let hub = LockStreamPeer<Int>(policy: .unbounded)
        let streams = (0..<n).map { _ in hub.makeStream() }
        return await timeShared(streams, upstreamCount: m, gate: gate, meter: meter) {
            // The usual home-made wrapper: one task iterates the upstream and yields to all.
            var iterator = upstream.makeAsyncIterator()
            while let element = await iterator.next(isolation: nil) { hub.yield(element) }
            await hub.finish()
        }
    }
}

// MARK: sharing subscriberCounts

/// What a `subscriberCounts` reader saw.
struct CountsTally: Sendable {
    var first = -1
    var last = -1
    var seen = 0
    /// Reads that returned the count the reader had already: allowed, since
    /// the counts are conflated by change, not by value (a reader that missed
    /// 0 → 1 → 0 gets 0 again); shown in the table to say how often.
    var repeats = 0
}

/// `existing` subscribers are registered (not read); with `watched`, a task
/// iterates `subscriberCounts` the whole time (conflated: it wakes for the
/// changes it has not seen yet). One task does `cycles` subscribe-then-cancel
/// pairs; ns (and allocations) per pair. Afterwards a new counts
/// subscription must start at `existing`; then the sequence finishes and
/// every subscriber is cancelled: the reader must have started at
/// `existing`, never seen the same count twice in a row, and ended (nil) at 0.
func runCountsChurn(existing k: Int, watched: Bool, cycles: Int, meter: AllocMeter?) async -> RunResult {
    let sequence = BroadcastSequence<Int, Never>(bufferingPolicy: .unbounded)
    let held = (0..<k).map { _ in sequence.subscribe() }
    var reader: Task<CountsTally, Never>?
    if watched {
        let counts = sequence.subscriberCounts
        let ready = Latch(1)
        reader = Task.detached { () -> CountsTally in
            var iterator = counts.makeAsyncIterator()
            var t = CountsTally()
            if let first = await iterator.next(isolation: nil) {
                t.first = first
                t.last = first
                t.seen = 1
            }
            ready.arrive()
            while let c = await iterator.next(isolation: nil) {
                if c == t.last { t.repeats += 1 }
                t.last = c
                t.seen += 1
            }
            return t
        }
        await ready.wait()
    }
    let (nanos, mallocs) = await Task.detached { () -> (UInt64, Int?) in
        meter?.start()
        let t0 = nowNanos()
        for _ in 0..<cycles {
            let s = sequence.subscribe()
            s.cancel()
        }
        let t1 = nowNanos()
        return (t1 &- t0, meter?.stop())
    }.value
    var error: String? = sequence.subscriberCount == k ? nil : "subscriberCount \(sequence.subscriberCount), expected \(k)"
    // Each change refreshes the counts before subscribe()/cancel() returns,
    // so a new counts subscription starts at the count now.
    var fresh = sequence.subscriberCounts.makeAsyncIterator()
    if let now = await fresh.next(isolation: nil), now != k, error == nil {
        error = "a new subscriberCounts subscription starts at \(now), expected \(k)"
    }
    sequence.finish()
    for s in held { s.cancel() }
    if error != nil { reader?.cancel() }  // it may never see its end
    var readerRepeatShare = 0.0
    if let reader {
        let t = await reader.value
        readerRepeatShare = Double(t.repeats) / Double(max(t.seen - 1, 1))
        if t.first != k { error = error ?? "counts reader: first \(t.first), expected \(k)" }
        if t.last != 0 { error = error ?? "counts reader: ended at \(t.last), expected 0" }
    }
    var result = RunResult(nanos: nanos, units: cycles, mallocs: mallocs, error: error)
    // Shown as "reader repeats" in the table: the share of the reader's reads
    // (after its first) that repeated the count before.
    result.receivedFraction = readerRepeatShare
    return result
}

// MARK: Cells

/// What a sharing cell measures, for its table.
struct SharingInfo: Sendable {
    var unit: String
    var allocUnit: String
    var how: String
}

let sharingInfo = SharingInfo(
    unit: "ns/element", allocUnit: "element",
    how: "one upstream AsyncSequence of M Ints (no suspension; its first next() waits at a gate) shared to N "
        + "subscriber tasks, all subscribed and iterating before the gate opens; time from opening the gate until "
        + "the last subscriber has seen the end, / M (per upstream element, delivered to all N); allocations over "
        + "the same window, / M. Checked: every subscriber got 0..<M in order")
let countsInfo = SharingInfo(
    unit: "ns/cycle", allocUnit: "cycle",
    how: "one task does C subscribe()+cancel() pairs on a BroadcastSequence with N other subscribers registered; "
        + "'counts reader': a task iterates subscriberCounts throughout. Checked: a new subscriberCounts subscription "
        + "afterwards starts at N; the reader starts at N and ends at 0 after finish + cancelling all; "
        + "repeated counts: see 'reader repeats'")

let countsNoReader = "subscribe+cancel, no counts reader"
let countsReader = "subscribe+cancel, counts reader"

func sharingGroups(_ o: CompareOptions) -> [Group] {
    var groups: [Group] = []
    for n in [1, 4, 16, 64] {
        let m = max(o.deliveries / n, 256)
        let peers = SharingPeer.allCases.map { peer in
            PeerCell(peer: peer.name) { meter in await runSharing(peer, subscribers: n, elements: m, meter: meter) }
        }
        groups.append(Group(workload: "sharing", n: n, peers: peers, sharing: sharingInfo))
    }
    let cycles = o.churnCycles
    for k in [0, 1000] {
        groups.append(Group(workload: "sharing: subscriberCounts", n: k, peers: [
            PeerCell(peer: countsNoReader) { meter in
                await runCountsChurn(existing: k, watched: false, cycles: cycles, meter: meter)
            },
            PeerCell(peer: countsReader) { meter in
                await runCountsChurn(existing: k, watched: true, cycles: cycles, meter: meter)
            },
        ], sharing: countsInfo))
    }
    return groups
}

/// The cell a row is compared with: AsyncBroadcast with the same buffering
/// (sharing), or the no-reader pair at the same N (subscriberCounts).
func sharingReference(_ peer: String) -> String? {
    if peer == countsReader { return countsNoReader }
    return SharingPeer.allCases.first { $0.name == peer }?.reference?.name
}

func printSharingTable(_ rows: [Row], _ o: CompareOptions) {
    func key(_ r: Row, _ peer: String) -> String { "\(r.workload)|\(r.n)|\(peer)" }
    var medians = [String: Double]()
    for r in rows { medians[key(r, r.peer)] = r.median }

    print("| workload | N | peer | unit | median | min | allocs | vs | reader repeats |")
    print("|---|---:|---|---|---:|---:|---:|---:|---:|")
    var notes: [String: String] = [:]
    var order: [String] = []
    for r in rows {
        guard let info = r.sharing else { continue }
        if notes[r.workload] == nil {
            notes[r.workload] = info.how
            order.append(r.workload)
        }
        var allocs = r.median == nil ? "" : "–"
        if let total = r.mallocs {
            let per = r.allocs ?? 0
            allocs = per >= 0.1 || total == 0 ? fmtAllocs(per, total) + "/" + info.allocUnit
                : "\(fmt(per, 4))/\(info.allocUnit) (\(total) total)"
        }
        var ratio = "–"
        if let med = r.median, let refName = sharingReference(r.peer), let ref = medians[key(r, refName)] ?? nil {
            ratio = fmt(med / ref, 2) + "×"
        }
        let med = r.median.map(fmtNs) ?? "n/a"
        let mn = r.min.map(fmtNs) ?? "n/a"
        let peer = r.error == nil ? r.peer : "\(r.peer) **WRONG: \(r.error!)**"
        let repeats = r.peer == countsReader && r.median != nil ? fmt(r.receivedFraction * 100, 1) + " %" : "–"
        print("| \(r.workload) | \(r.n) | \(peer) | \(info.unit) | \(med) | \(mn) | \(allocs) | \(ratio) | \(repeats) |")
    }
    print("")
    print("vs = this peer's median / the median of AsyncBroadcast with the same buffering (share() bounded(\(SharingPeer.bound)) "
        + "vs AsyncBroadcast bounded(\(SharingPeer.bound)); share() unbounded and the hub vs AsyncBroadcast unbounded), "
        + "or, for subscriberCounts, / the no-reader pair at the same N: above 1, AsyncBroadcast (or no reader) is faster.")
    print("N: subscribers (sharing); other subscribers already registered (subscriberCounts).")
    print("Reader repeats: median share of the counts reader's reads that returned the count it had already "
        + "(a change that came back between two reads)"
        + ": allowed, the counts are conflated by change, not by value.")
    for w in order {
        let size = w == "sharing" ? " (M = max(\(o.deliveries) / N, 256))" : " (C = \(o.churnCycles))"
        print("- \(w): \(notes[w]!)" + size)
    }
}
