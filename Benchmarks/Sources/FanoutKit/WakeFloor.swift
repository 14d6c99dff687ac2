// The wake floor of a sparse fan-out: what delivering one element to a
// parked reader task costs with nothing but the runtime's own parts.
//
// Each subscriber is a slot: a `Mutex` around the pending elements and the
// parked reader's continuation. The reader is a task that takes what is
// pending under the lock, or parks on a bare `UnsafeContinuation<Void, Never>`
// inside `withTaskCancellationHandler` (one cancellation record per park, as
// any cancellable reader needs); a producer appends under the slot's lock,
// takes the continuation, and resumes it after unlocking. Nothing else: no
// registry, no replay, no policies, no buffer beyond two arrays the reader
// swaps (so steady state allocates nothing). A broadcaster's sparse path is
// measured against this (`topics: fan-out`, `sparse: fan-out`).
import AsyncBroadcast
import Synchronization

/// One subscriber of the floor.
final class FloorSlot: Sendable {
    struct State {
        var pending: [Int] = []
        var continuation: UnsafeContinuation<Void, Never>? = nil
        var finished = false
        var cancelled = false
    }
    let state = Mutex(State())

    init() {
        state.withLock { $0.pending.reserveCapacity(16) }
    }

    /// The producer's side: one element, and the parked reader woken outside the lock.
    @inline(__always)
    func deliver(_ element: Int) {
        let waiter = state.withLock { s -> UnsafeContinuation<Void, Never>? in
            s.pending.append(element)
            defer { s.continuation = nil }
            return s.continuation
        }
        waiter?.resume()
    }

    func finish() {
        let waiter = state.withLock { s -> UnsafeContinuation<Void, Never>? in
            s.finished = true
            defer { s.continuation = nil }
            return s.continuation
        }
        waiter?.resume()
    }
}

/// A slot read as an `AsyncSequence`, so the floor runs through the same
/// driver, checks and clock as the broadcasters (`runTopicsFanout`).
struct FloorStream: AsyncSequence, Sendable {
    typealias Element = Int
    typealias Failure = Never
    let slot: FloorSlot

    struct Iterator: AsyncIteratorProtocol {
        typealias Element = Int
        typealias Failure = Never
        let slot: FloorSlot
        /// Taken from the slot in one swap; `index` is the next to return.
        var taken: [Int] = []
        var index = 0

        init(slot: FloorSlot) {
            self.slot = slot
            taken.reserveCapacity(16)
        }

        mutating func next() async -> Int? { await next(isolation: nil) }

        mutating func next(isolation actor: isolated (any Actor)?) async -> Int? {
            while true {
                if index < taken.count {
                    index += 1
                    return taken[index - 1]
                }
                taken.removeAll(keepingCapacity: true)
                index = 0
                let (finished, cancelled) = slot.state.withLock { s in
                    swap(&s.pending, &taken)
                    return (s.finished, s.cancelled)
                }
                if !taken.isEmpty { continue }
                if finished || cancelled { return nil }
                let slot = self.slot
                await withTaskCancellationHandler {
                    await withUnsafeContinuation(isolation: actor) { (c: UnsafeContinuation<Void, Never>) in
                        let now = slot.state.withLock { s -> Bool in
                            if !s.pending.isEmpty || s.finished || s.cancelled { return true }
                            s.continuation = c
                            return false
                        }
                        if now { c.resume() }
                    }
                } onCancel: {
                    let waiter = slot.state.withLock { s -> UnsafeContinuation<Void, Never>? in
                        s.cancelled = true
                        defer { s.continuation = nil }
                        return s.continuation
                    }
                    waiter?.resume()
                }
            }
        }
    }

    func makeAsyncIterator() -> Iterator { Iterator(slot: slot) }
}

/// The floor for one `FanoutSends` configuration: a slot per subscription.
final class WakeFloor: Sendable {
    let sends: FanoutSends
    let slots: [FloorSlot]

    init(_ sends: FanoutSends) {
        self.sends = sends
        slots = (0..<sends.subscriptionCount).map { _ in FloorSlot() }
    }

    /// Delivers `key` to every member of `topic`, each woken after its own unlock.
    @inline(__always)
    func send(_ key: Int, to topic: Int) {
        let first = Int(sends.firstSubscription[topic])
        let end = Int(sends.firstSubscription[topic + 1])
        for j in first..<end { slots[j].deliver(key) }
    }

    func finishAll() {
        for slot in slots { slot.finish() }
    }
}

let wakeFloorName = "floor: parked tasks, a mutex per slot"

func fanoutFloor(_ sends: FanoutSends, meter: ByteMeter? = nil, beat: @escaping @Sendable () -> Void) async -> ScaleRun {
    let setupStart = nowNanos()
    let floor = WakeFloor(sends)
    return await runTopicsFanout(sends, setupStart: setupStart, streams: floor.slots.map { FloorStream(slot: $0) },
                                 send: .thread { key, topic in floor.send(key, to: topic) },
                                 finish: { floor.finishAll() }, meter: meter, beat: beat)
}

/// The sparse cell's AsyncBroadcast peer: K plain `BroadcastSequence`s
/// (unbounded), each with its 1 or 2 subscriptions; a send goes to one sequence.
func sparseOurs(_ sends: FanoutSends, meter: ByteMeter? = nil, beat: @escaping @Sendable () -> Void) async -> ScaleRun {
    let setupStart = nowNanos()
    let sequences = (0..<sends.topicCount).map { _ in BroadcastSequence<Int, Never>() }
    let subs = (0..<sends.subscriptionCount).map { sequences[sends.topic(ofSubscription: $0)].subscribe() }
    var run = await runTopicsFanout(sends, setupStart: setupStart, streams: subs,
                                    send: .thread { key, topic in _ = sequences[topic].send(key) },
                                    finish: { for s in sequences { s.finish() } }, meter: meter, beat: beat)
    if let i = sequences.firstIndex(where: { $0.subscriberCount != 0 }), run.error == nil {
        run.error = "sequence \(i) has \(sequences[i].subscriberCount) subscribers after finish() and the readers' end"
    }
    return run
}

extension ScaleContext {
    /// `sparse: fan-out`: K plain sequences of 1–2 subscribers each, random
    /// sends, AsyncBroadcast beside the wake floor, at P = 1, 2, 4.
    func sparseFanoutTable(_ o: CompareOptions) async -> [String] {
        let k = plan.onlyN.map { Swift.max($0, 2) } ?? (plan.smoke ? 2_000 : 100_000)
        let m = plan.smoke ? 1 << 13 : 1 << 19
        let runs = plan.smoke ? 1 : plan.reps
        let watchdog = self.watchdog
        let meter = o.byteMeter
        var table: [(p: Int, sends: FanoutSends, runs: [PeerRuns], allocs: [String: Double])] = []
        for pc in [1, 2, 4] {
            let sends = FanoutSends(subscribers: k, producers: pc, sends: m, shape: .sequences)
            let label = "\(ScaleWorkload.sparseFanout.rawValue) P=\(pc)"
            let beat: @Sendable () -> Void = { watchdog.beat(label) }
            // One metered run per peer first (untimed): allocations per delivery.
            var allocs: [String: Double] = [:]
            if pc == 1 || plan.smoke {
                let metered: [(String, @Sendable () async -> ScaleRun)] = [
                    (scaleOurs, { await sparseOurs(sends, meter: meter, beat: beat) }),
                    (wakeFloorName, { await fanoutFloor(sends, meter: meter, beat: beat) }),
                ]
                for (peer, run) in metered where plan.wants(peer) {
                    beat()
                    let r = logFanoutRun(peer + " (metered)", await run())
                    if let e = r.error { failures.append("\(label), \(peer): \(e)") }
                    if let a = r.extra["allocs"] { allocs[peer] = a / Double(sends.deliveries) }
                }
            }
            let r = await interleave(.sparseFanout, n: k, work: Double(sends.deliveries), tag: " P=\(pc)", runs: runs, [
                ScaleCell(peer: scaleOurs) { logFanoutRun(scaleOurs, await sparseOurs(sends, beat: beat)) },
                ScaleCell(peer: wakeFloorName) { logFanoutRun(wakeFloorName, await fanoutFloor(sends, beat: beat)) },
            ])
            table.append((pc, sends, r, allocs))
        }
        var out: [String] = []
        func p(_ s: String = "") { out.append(s) }
        let first = table[0].sends
        p("")
        p("#### \(ScaleWorkload.sparseFanout.rawValue): \(grouped(k)) `BroadcastSequence`s of 1 or 2 subscribers "
            + "(\(grouped(first.subscriptionCount)) reader tasks); P producers send to random sequences")
        p("")
        for line in fanoutRows(table.map { ($0.p, $0.sends, $0.runs, $0.allocs) }, ours: scaleOurs) { p(line) }
        p("")
        p("K = \(grouped(k)) unbounded `BroadcastSequence<Int, Never>`s, sequence i with 1 subscriber if i is even, 2 if odd, "
            + "each subscription read by its own task. M = \(grouped(first.sends)) sends per run, split evenly over P producer "
            + "pthreads, each to a sequence drawn uniformly (the same draws for both peers; \(grouped(first.deliveries)) "
            + "deliveries at P = 1). Floor: the same subscriptions as slots (a `Mutex` around the pending elements and the "
            + "continuation), each read by a task parked on a bare `UnsafeContinuation<Void, Never>` inside "
            + "`withTaskCancellationHandler`; a send appends under the slot's lock and resumes after it. "
            + fanoutColumnsNote + " Checked: every subscription received exactly the count and sum of the elements sent "
            + "to its sequence, none of another, each producer's in order; every sequence has no subscriber after `finish()`.")
        return out
    }

    /// The rows of a fan-out table (topics and sparse cells): rate, CPU per
    /// delivery, each against the floor, allocations per delivery.
    func fanoutRows(_ table: [(p: Int, sends: FanoutSends, runs: [PeerRuns], allocs: [String: Double])], ours: String) -> [String] {
        var out: [String] = []
        func p(_ s: String = "") { out.append(s) }
        p("| P | peer | runs | median M deliveries/s | min | max | ÷ floor (rate) | CPU ns per delivery (median) | ÷ floor (CPU) | ours ÷ this (CPU) | allocations per delivery | send p50 µs | send p99 µs | worst send ms | set-up s |")
        p("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for (pc, sends, runs, allocs) in table {
            var meds: [String: Double] = [:]
            var cpus: [String: Double] = [:]
            for r in runs where !r.skipped {
                meds[r.peer] = median(r.runs.map(\.deliveriesPerSecond))
                cpus[r.peer] = median(r.runs.map { ($0.extra["cpu"] ?? .nan) / Double(sends.deliveries) })
            }
            for r in runs {
                if r.skipped {
                    p("| \(pc) | \(r.peer) | 0 | not run | | | | | | | | | | | |")
                    continue
                }
                let v = meds[r.peer]!
                let c = cpus[r.peer]!
                let xs = r.runs.map(\.deliveriesPerSecond)
                let rateFloor = meds[wakeFloorName].map { fmt(v / $0, 2) + "×" } ?? "–"
                let cpuFloor = cpus[wakeFloorName].map { fmt(c / $0, 2) + "×" } ?? "–"
                let oursCPU = cpus[ours].map { fmt($0 / c, 2) + "×" } ?? "–"
                let a = allocs[r.peer].map { fmt($0, 3) } ?? "–"
                let (s50, s99, smax) = spread(r.runs.flatMap(\.sendCallNanos))
                let peer = r.error.map { "\(r.peer) **WRONG: \($0)**" } ?? r.peer
                p("| \(pc) | \(peer) | \(r.runs.count) | \(fmt(v / 1e6, 2)) | \(fmt(xs.min()! / 1e6, 2)) | \(fmt(xs.max()! / 1e6, 2)) "
                    + "| \(rateFloor) | \(fmt(c, 0)) | \(cpuFloor) | \(oursCPU) | \(a) | \(micros(s50)) | \(micros(s99)) | \(fmt(smax / 1e6, 2)) "
                    + "| \(fmt(median(r.runs.map { Double($0.setupNanos) }) / 1e9, 2)) |")
            }
        }
        return out
    }
}

/// What the fan-out tables' columns mean.
let fanoutColumnsNote =
    "Deliveries/s = deliveries / (the producers' start until the last reader has received all it should; "
    + "OpenCombine: until the last send returned). CPU per delivery: the process's CPU time (every thread, "
    + "`CLOCK_PROCESS_CPUTIME_ID`) over the same window / deliveries, median over runs: what the deliveries cost "
    + "whatever share of the 2 CPUs other work left us. ÷ floor: this peer's median / the floor's (rate: above 1 "
    + "delivers more per second; CPU: above 1 spends more). Ours ÷ this (CPU): AsyncBroadcast's CPU / this peer's "
    + "(below 1: AsyncBroadcast spends less). Allocations per delivery: mallocs (MallocInterposer) from the producers' "
    + "start until every reader has its elements, / deliveries, in one separate untimed run per peer at P = 1 (every "
    + "P in smoke; – without the interposer). Send: the time of one send call (clock reads either side, about 20-40 "
    + "ns, included), p50/p99/worst over every send of every run. Set-up (not timed): subscribing all and starting "
    + "the readers."
