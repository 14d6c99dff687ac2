// The sequence lock's other callers while a producer sends (run with
// `--filter storm`, after the registration storm):
// - `isFinished` read in a loop, and `finish()`, while one thread sends to
//   N = 1,024 idle subscribers: how long a call takes;
// - a `BroadcastTopics` subscribe + cancel loop on a topic a producer sends
//   to (1,024 subscribers), and a third thread sending to another topic of
//   the SAME shard (and, as the control, of another shard): how many of its
//   sends take over 1 ms, and its worst.
// Only public API (and the testing SPI the other cells use), so that the
// same file builds against an older library for an interleaved comparison.
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif
@_spi(Testing) import AsyncBroadcast

/// `isFinished` calls (R = 1 "registrant" of the storm loop) while one
/// thread sends to `subscribers` idle subscribers.
func isFinishedWhileSending(subscribers n: Int, seconds: Double) -> CallTimes {
    let sequence = BroadcastSequence<Int, Never>()
    let idle = (0..<n).map { _ in sequence.subscribe(bufferingPolicy: .bufferingNewest(1)) }
    let storm = stormLoop(
        registrants: 1, seconds: seconds,
        send: { _ = sequence.send($0) },
        registerOnce: {
            if sequence.isFinished { print("finished?") }
            return 0
        })
    withExtendedLifetime(idle) {}
    return storm.registrations[0]
}

/// One `finish()` per round, on a sequence one thread is sending to
/// (`subscribers` idle subscribers), after that thread's 50th send.
func finishWhileSending(subscribers n: Int, rounds: Int) -> [UInt64] {
    var times: [UInt64] = []
    for _ in 0..<rounds {
        let sequence = BroadcastSequence<Int, Never>()
        let idle = (0..<n).map { _ in sequence.subscribe(bufferingPolicy: .bufferingNewest(1)) }
        let sent = Counter()
        let done = Flag()
        spawnThread {
            var i = 0
            while !sequence.send(i).isFinished {
                i &+= 1
                sent.increment()
            }
            done.set()
        }
        while sent.current < 50 { sched_yield() }
        let t0 = nowNanos()
        sequence.finish()
        times.append(nowNanos() &- t0)
        while !done.isSet { sched_yield() }
        withExtendedLifetime(idle) {}
    }
    return times
}

/// Sends to `measured` (one subscriber) timed, while one thread sends to
/// `busy` (N idle subscribers) and one loops `subscribe(to: busy)` +
/// `cancel()`.
func topicSendsBesideASubscribeLoop(subscribers n: Int, sameShard: Bool, seconds: Double) -> (times: CallTimes, pairs: Int) {
    let topics = BroadcastTopics<Int, Int, Never>()
    let busy = 0
    // 64 or more shards, a power of two; topics in the same shard share
    // their hash's low bits for every shard count up to 64 when they share
    // the low 6 bits (and, for the control, differ in them).
    let mask = 63
    let measured = (1...).first { k in ((k.hashValue ^ busy.hashValue) & mask == 0) == sameShard }!
    let idle = (0..<n).map { _ in topics.subscribe(to: busy, bufferingPolicy: .bufferingNewest(1)) }
    let reader = topics.subscribe(to: measured, bufferingPolicy: .bufferingNewest(1))
    let go = Flag()
    let stop = Flag()
    let finished = Counter()
    let pairs = Counter()
    let times = CallTimes(capacity: 1 << 20)
    spawnThread {
        while !go.isSet { sched_yield() }
        var i = 0
        while !stop.isSet { _ = topics.send(i, to: busy); i &+= 1 }
        finished.increment()
    }
    spawnThread {
        while !go.isSet { sched_yield() }
        while !stop.isSet {
            topics.subscribe(to: busy, bufferingPolicy: .bufferingNewest(1)).cancel()
            pairs.increment()
        }
        finished.increment()
    }
    spawnThread {
        while !go.isSet { sched_yield() }
        var i = 0
        while !stop.isSet {
            let t0 = nowNanos()
            _ = topics.send(i, to: measured)
            times.record(nowNanos() &- t0)
            i &+= 1
        }
        finished.increment()
    }
    go.set()
    usleep(UInt32(seconds * 1e6))
    stop.set()
    while finished.current < 3 { usleep(1_000) }
    withExtendedLifetime((idle, reader)) {}
    return (times, pairs.current)
}

extension ScaleContext {
    func gateTable(_ o: CompareOptions) -> [String] {
        let n = 1_024
        let seconds = plan.smoke ? 0.2 : 2.0
        var out: [String] = []
        func p(_ s: String = "") { out.append(s) }
        p("")
        p("#### the sequence lock's other callers while one thread sends to N = \(grouped(n)) idle subscribers")
        p("")
        p("| call | calls | p50 µs | p99 µs | max ms |")
        p("|---|---:|---:|---:|---:|")
        let reads = isFinishedWhileSending(subscribers: n, seconds: seconds)
        let (r50, r99, rmax) = spread(reads.samples)
        p("| `isFinished` (a loop on one thread, \(fmt(seconds, 1)) s) | \(grouped(reads.count)) | \(micros(r50)) | \(micros(r99)) | \(fmt(max(rmax, Double(reads.worst)) / 1e6, 3)) |")
        let finishes = finishWhileSending(subscribers: n, rounds: plan.smoke ? 3 : 30)
        let (f50, f99, fmax) = spread(finishes)
        p("| `finish()` (one per sequence, after the sender's 50th send) | \(finishes.count) | \(micros(f50)) | \(micros(f99)) | \(fmt(fmax / 1e6, 3)) |")
        p("")
        p("#### sends to a topic while one thread sends to another topic (N = \(grouped(n))) and one loops `subscribe(to:)` + `cancel()` on it")
        p("")
        p("| measured topic | sends | p50 µs | p99 µs | sends over 1 ms | max ms | subscribe+cancel pairs |")
        p("|---|---:|---:|---:|---:|---:|---:|")
        for same in [true, false] {
            let (times, pairs) = topicSendsBesideASubscribeLoop(subscribers: n, sameShard: same, seconds: seconds)
            let (s50, s99, _) = spread(times.samples)
            let slow = times.samples.filter { $0 > 1_000_000 }.count
            p("| \(same ? "same shard" : "another shard (control)") | \(grouped(times.count)) | \(micros(s50)) | \(micros(s99)) | \(slow) | \(fmt(Double(times.worst) / 1e6, 2)) | \(grouped(pairs)) |")
        }
        return out
    }
}
