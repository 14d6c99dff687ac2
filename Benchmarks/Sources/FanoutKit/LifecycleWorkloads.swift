// lifecycle — what a sequence costs to make, use briefly and end (where a
// fence pair that favours consumers, Handshakes.md row 2, would show its
// price: it was measured with these cells and dropped).
//
// - finish() with one subscriber whose reader is parked in `next()`: the
//   time of the `finish()` call, and with one that has read a long stream
//   first (a consumer that has caught up thousands of times).
// - short-lived sequences: create, subscribe, send 4, finish, drain in one
//   task, over and over, from P = 1, 2, 4 tasks: sequences per second.
// - create + release: P = 1, 2, 4 threads each making a sequence nobody
//   subscribes to and releasing it (which finishes it): per second.
// - create, send 1, release: one task making a sequence, sending it one
//   element (nobody subscribed) and releasing it, against the hand-built
//   peer (lock+AsyncStream's lock and empty dictionary of continuations,
//   one `yield` to nobody): ns per sequence, and allocations per sequence
//   (a separate, untimed run). Each is kept until the next one replaces it,
//   so it escapes (the compiler put a purely local one on the stack). What
//   a topic of a `BroadcastTopics` that lives for one send costs.
//
// `fanout-compare --filter lifecycle` runs them alone. Checked: every
// drained subscriber got 0, 1, 2, 3 and then the end.
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif
@_spi(Testing) import AsyncBroadcast
import Synchronization

/// `finish()` timed alone, `samples` times, each on a fresh sequence with one
/// subscriber parked in `next()` (after reading `warm` elements first).
func runFinishLatency(samples: Int, warm: Int) async -> ScaleRun {
    var run = ScaleRun()
    run.sendCallNanos.reserveCapacity(samples)
    for _ in 0..<samples {
        let sequence = BroadcastSequence<Int, Never>()
        let subscription = sequence.subscribe()
        let reader = Task.detached { () -> Int in
            var count = 0
            for await _ in subscription { count += 1 }
            return count
        }
        for i in 0..<warm { sequence.send(i) }
        // Parked: the reader has taken everything and waits in `next()`.
        while !subscription.isConsumerWaiting || subscription.bufferedCount != 0 { sched_yield() }
        let t0 = nowNanos()
        sequence.finish()
        run.sendCallNanos.append(nowNanos() &- t0)
        let count = await reader.value
        if count != warm && run.error == nil { run.error = "the reader got \(count) elements, expected \(warm)" }
    }
    return run
}

/// One short-lived sequence: create, subscribe, send 0...3, finish, drain.
@inline(__always)
func shortLivedBroadcast() async -> Bool {
    let sequence = BroadcastSequence<Int, Never>()
    let subscription = sequence.subscribe()
    for i in 0..<4 { sequence.send(i) }
    sequence.finish()
    var expected = 0
    for await element in subscription {
        if element != expected { return false }
        expected += 1
    }
    return expected == 4
}

@inline(__always)
func shortLivedLock() async -> Bool {
    let peer = LockStreamPeer<Int>(policy: .unbounded)
    let stream = peer.makeStream()
    for i in 0..<4 { peer.yield(i) }
    await peer.finish()
    var expected = 0
    for await element in stream {
        if element != expected { return false }
        expected += 1
    }
    return expected == 4
}

/// `p` tasks each doing `per` short-lived sequences; sequences per second.
func runShortLived(tasks p: Int, per: Int, _ once: @escaping @Sendable () async -> Bool) async -> ScaleRun {
    var run = ScaleRun()
    let t0 = nowNanos()
    let ok = await withTaskGroup(of: Bool.self) { group in
        for _ in 0..<p {
            group.addTask {
                var ok = true
                for _ in 0..<per { ok = await once() && ok }
                return ok
            }
        }
        var all = true
        for await ok in group { all = all && ok }
        return all
    }
    let elapsed = nowNanos() &- t0
    if !ok { run.error = "a subscriber did not get 0, 1, 2, 3 and then the end" }
    run.deliveriesPerSecond = Double(p * per) / (Double(elapsed) / 1e9)
    return run
}

/// `p` threads each making and releasing `per` sequences; per second.
func runCreateRelease(threads p: Int, per: Int) async -> ScaleRun {
    var run = ScaleRun()
    let go = Flag()
    let ready = Counter()
    let done = Counter()
    for _ in 0..<p {
        spawnThread {
            ready.increment()
            while !go.isSet { sched_yield() }
            for i in 0..<per {
                let sequence = BroadcastSequence<Int, Never>()
                if sequence.subscriberCount != 0 { print("impossible \(i)") }
            }
            done.increment()
        }
    }
    while ready.current < p { sched_yield() }
    let t0 = nowNanos()
    go.set()
    while done.current < p { try? await Task.sleep(for: .microseconds(100)) }
    run.deliveriesPerSecond = Double(p * per) / (Double(nowNanos() &- t0) / 1e9)
    return run
}

/// Where a create-send-release cycle keeps its sequence until the next
/// cycle replaces (and so releases) it, as a registry keeps a topic: the
/// object escapes, so the compiler cannot put it on the stack.
final class LastObject {
    var object: AnyObject?
}

/// One sequence nobody subscribes to: created, sent `i`, released (when
/// the next cycle replaces it in `slot`).
@inline(never)
func createSendDropBroadcast(_ i: Int, _ slot: LastObject) -> Bool {
    let sequence = BroadcastSequence<Int, Never>()
    slot.object = sequence
    return sequence.send(i).delivered == 0
}

/// The hand-built peer: a lock and an empty dictionary of continuations.
@inline(never)
func createSendDropLock(_ i: Int, _ slot: LastObject) -> Bool {
    let peer = LockStreamPeer<Int>(policy: .unbounded)
    slot.object = peer
    peer.yield(i)
    return peer.state.withLock { $0.continuations.isEmpty }
}

/// `per` create-send-release cycles in the calling task: ns per cycle in
/// `nsPerDelivery`; with `meter`, an untimed run of `per` more first, whose
/// allocations per cycle go to `extra["allocs"]`.
func runCreateSendDrop(per: Int, meter: AllocMeter?, _ once: (Int, LastObject) -> Bool) -> ScaleRun {
    var run = ScaleRun()
    var ok = true
    let slot = LastObject()
    if let meter {
        meter.start()
        for i in 0..<per { ok = once(i, slot) && ok }
        run.extra["allocs"] = Double(meter.stop()) / Double(per)
    }
    slot.object = nil
    let t0 = nowNanos()
    for i in 0..<per { ok = once(i, slot) && ok }
    slot.object = nil
    run.nsPerDelivery = Double(nowNanos() &- t0) / Double(per)
    if !ok { run.error = "a send to a sequence nobody subscribed to delivered something" }
    return run
}

extension ScaleContext {
    func lifecycleTable(_ o: CompareOptions) async -> [String] {
        let runs = plan.smoke ? 1 : plan.reps
        let samples = plan.smoke ? 50 : 1_000
        let shortPer = plan.smoke ? 500 : 50_000
        let createPer = plan.smoke ? 2_000 : 200_000
        var out: [String] = []
        func p(_ s: String = "") { out.append(s) }
        p("")
        p("#### \(ScaleWorkload.lifecycle.rawValue)")
        p("")
        p("| cell | P | peer | runs | median | min | max |")
        p("|---|---:|---|---:|---:|---:|---:|")
        for warm in [0, 1_000] {
            let warmed = plan.smoke ? Swift.min(warm, 100) : warm
            let label = warm == 0 ? "finish(), 1 parked subscriber: p50 µs (p99)" : "finish(), 1 parked subscriber that read \(grouped(warm)) first: p50 µs (p99)"
            let r = await interleave(.lifecycle, n: 1, tag: " finish warm=\(warm)", runs: runs, [
                ScaleCell(peer: scaleOurs) { await runFinishLatency(samples: samples, warm: warmed) },
            ])
            for pr in r where !pr.skipped {
                let p50s = pr.runs.map { spread($0.sendCallNanos).0 }
                let p99s = pr.runs.map { spread($0.sendCallNanos).1 }
                let peer = pr.error.map { "\(pr.peer) **WRONG: \($0)**" } ?? pr.peer
                p("| \(label) | 1 | \(peer) | \(pr.runs.count) | \(micros(median(p50s))) (\(micros(median(p99s)))) "
                    + "| \(micros(p50s.min()!)) | \(micros(p50s.max()!)) |")
            }
        }
        for tasks in [1, 2, 4] {
            let r = await interleave(.lifecycle, n: 1, tag: " short-lived P=\(tasks)", runs: runs, [
                ScaleCell(peer: scaleOurs) { await runShortLived(tasks: tasks, per: shortPer / tasks, { await shortLivedBroadcast() }) },
                ScaleCell(peer: scaleLock) { await runShortLived(tasks: tasks, per: shortPer / tasks, { await shortLivedLock() }) },
            ])
            for pr in r where !pr.skipped {
                let xs = pr.runs.map(\.deliveriesPerSecond)
                let peer = pr.error.map { "\(pr.peer) **WRONG: \($0)**" } ?? pr.peer
                p("| short-lived sequences (create, subscribe, send 4, finish, drain), k/s | \(tasks) | \(peer) | \(xs.count) "
                    + "| \(fmt(median(xs) / 1e3, 0)) | \(fmt(xs.min()! / 1e3, 0)) | \(fmt(xs.max()! / 1e3, 0)) |")
            }
        }
        for threads in [1, 2, 4] {
            let r = await interleave(.lifecycle, n: 1, tag: " create+release P=\(threads)", runs: runs, [
                ScaleCell(peer: scaleOurs) { await runCreateRelease(threads: threads, per: createPer / threads) },
            ])
            for pr in r where !pr.skipped {
                let xs = pr.runs.map(\.deliveriesPerSecond)
                p("| create + release (nobody subscribed), k/s | \(threads) | \(pr.peer) | \(xs.count) "
                    + "| \(fmt(median(xs) / 1e3, 0)) | \(fmt(xs.min()! / 1e3, 0)) | \(fmt(xs.max()! / 1e3, 0)) |")
            }
        }
        for counting in [false, true] {
            let meter = counting ? o.meter : nil
            if counting && meter == nil { continue }
            let r = await interleave(.lifecycle, n: 1, tag: " create+send+release\(counting ? " allocs" : "")", runs: counting ? 1 : runs, [
                ScaleCell(peer: scaleOurs) { runCreateSendDrop(per: createPer, meter: meter, createSendDropBroadcast) },
                ScaleCell(peer: scaleLock) { runCreateSendDrop(per: createPer, meter: meter, createSendDropLock) },
            ])
            let medians = Dictionary(r.filter { !$0.skipped }.map { ($0.peer, median($0.runs.map(\.nsPerDelivery))) }, uniquingKeysWith: { a, _ in a })
            for pr in r where !pr.skipped {
                let peer = pr.error.map { "\(pr.peer) **WRONG: \($0)**" } ?? pr.peer
                if counting {
                    let a = pr.runs.compactMap { $0.extra["allocs"] }
                    p("| create, send 1, release (nobody subscribed): allocations per sequence | 1 | \(peer) | \(a.count) "
                        + "| \(fmt(median(a), 2)) | \(fmt(a.min()!, 2)) | \(fmt(a.max()!, 2)) |")
                } else {
                    let xs = pr.runs.map(\.nsPerDelivery)
                    let times = pr.peer == scaleOurs
                        ? medians[scaleLock].map { " (\(fmt(median(xs) / $0, 2))× the peer's)" } ?? "" : ""
                    p("| create, send 1, release (nobody subscribed): ns per sequence\(times) | 1 | \(peer) | \(xs.count) "
                        + "| \(fmt(median(xs), 1)) | \(fmt(xs.min()!, 1)) | \(fmt(xs.max()!, 1)) |")
                }
            }
        }
        p("")
        p("finish(): the time of the `finish()` call on a fresh sequence whose one subscriber's reader task has taken "
            + "everything and is suspended in `next()` (\(grouped(samples)) samples per run; median over runs of each run's p50, "
            + "its p99 in brackets). Short-lived: P tasks each create a sequence, subscribe, send 0...3, finish and read the "
            + "four elements and the end, \(grouped(shortPer)) sequences in all per run (lock+AsyncStream: `makeStream`, "
            + "four yields under its lock, finish, the same drain). Create + release: P pthreads each create a "
            + "`BroadcastSequence` and release it (its deinit finishes it), \(grouped(createPer)) in all per run. "
            + "Create, send 1, release: one task creates a `BroadcastSequence`, stores it (the next one replaces it: it escapes), "
            + "sends it one element and releases it (lock+AsyncStream: the peer's lock and empty dictionary, one `yield` to nobody), \(grouped(createPer)) per run; "
            + "allocations per sequence from one more, untimed run per peer. "
            + "Median, minimum and maximum over the runs.")
        return out
    }
}
