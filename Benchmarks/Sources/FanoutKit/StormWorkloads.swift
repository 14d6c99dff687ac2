// scale: registration storm — R threads doing subscribe() + cancel() without
// pause while one thread sends to N idle subscribers: how many sends still
// complete, and how long one send can be held up. A reconnect storm after a
// deploy, in a server: the clients already connected must keep their feed.
//
// `fanout-compare --filter storm` runs it alone (R = 0, 1, 2, 4, 8; N = 1,024
// by default, `--n N` for another). Every run checks what it can: the
// sequence's subscriber count afterwards, and that every steady subscriber
// holds exactly the last element sent.
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif
@_spi(Testing) import AsyncBroadcast
import Synchronization

/// Samples of one thread's calls: a preallocated array (no allocation while
/// timing), the worst call, and the count past the array's end.
final class CallTimes: @unchecked Sendable {
    var samples: [UInt64]
    /// The first step of each call, as the call reported it (a storm's
    /// `subscribe()` alone), beside `samples` (the whole call).
    var firstSteps: [UInt64]
    var count = 0
    var worst: UInt64 = 0
    /// The thread's CPU time over the run.
    var cpuNanos: UInt64 = 0
    init(capacity: Int) {
        samples = []
        samples.reserveCapacity(capacity)
        firstSteps = []
        firstSteps.reserveCapacity(capacity)
    }
    @inline(__always) func record(_ nanos: UInt64) {
        count += 1
        if nanos > worst { worst = nanos }
        if samples.count < samples.capacity { samples.append(nanos) }
    }
    @inline(__always) func recordFirstStep(_ nanos: UInt64) {
        if firstSteps.count < firstSteps.capacity { firstSteps.append(nanos) }
    }
}

/// One storm: `registrants` threads doing subscribe + cancel and one sender
/// thread, all released together, for `seconds`. `registerOnce` returns
/// the time its first step (the `subscribe()`) took.
func stormLoop(
    registrants r: Int, seconds: Double,
    send: @escaping @Sendable (Int) -> Void,
    registerOnce: @escaping @Sendable () -> UInt64
) -> (sends: CallTimes, registrations: [CallTimes], sent: Int, windowNanos: UInt64) {
    let go = Flag()
    let stop = Flag()
    let ready = Counter()
    let finished = Counter()
    let sendTimes = CallTimes(capacity: 1 << 20)
    let registrationTimes = (0..<r).map { _ in CallTimes(capacity: 1 << 18) }
    let sentBox = Holder<Int>()
    spawnThread {
        ready.increment()
        while !go.isSet { sched_yield() }
        let cpu0 = threadCPUNanos()
        var i = 0
        while !stop.isSet {
            let t0 = nowNanos()
            send(i)
            sendTimes.record(nowNanos() &- t0)
            i &+= 1
        }
        sendTimes.cpuNanos = threadCPUNanos() &- cpu0
        sentBox.value = i
        finished.increment()
    }
    for k in 0..<r {
        let times = registrationTimes[k]
        spawnThread {
            ready.increment()
            while !go.isSet { sched_yield() }
            while !stop.isSet {
                let t0 = nowNanos()
                let firstStep = registerOnce()
                times.record(nowNanos() &- t0)
                times.recordFirstStep(firstStep)
            }
            finished.increment()
        }
    }
    while ready.current < r + 1 { sched_yield() }
    let t0 = nowNanos()
    go.set()
    usleep(UInt32(seconds * 1e6))
    stop.set()
    let window = nowNanos() &- t0
    while finished.current < r + 1 { usleep(1_000) }
    return (sendTimes, registrationTimes, sentBox.value ?? 0, window)
}

/// This thread's CPU time.
func threadCPUNanos() -> UInt64 {
    var t = timespec()
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t)
    return UInt64(t.tv_sec) * 1_000_000_000 + UInt64(t.tv_nsec)
}

extension ScaleRun {
    mutating func recordStorm(_ storm: (sends: CallTimes, registrations: [CallTimes], sent: Int, windowNanos: UInt64)) {
        sends = storm.sends.count
        windowNanos = storm.windowNanos
        senderCPUNanos = storm.sends.cpuNanos
        sendCallNanos = storm.sends.samples
        worstSendNanos = storm.sends.worst
        subscribeNanos = storm.registrations.flatMap(\.samples)
        stormSubscribeNanos = storm.registrations.flatMap(\.firstSteps)
        registrations = storm.registrations.map(\.count).reduce(0, +)
        worstRegistrationNanos = storm.registrations.map(\.worst).max() ?? 0
    }
}

func runStormBroadcast(subscribers n: Int, registrants r: Int, seconds: Double) -> ScaleRun {
    var run = ScaleRun()
    let setupStart = nowNanos()
    let sequence = BroadcastSequence<Int, Never>(bufferingPolicy: .bufferingNewest(1))
    let steady = (0..<n).map { _ in sequence.subscribe() }
    run.setupNanos = nowNanos() &- setupStart
    let storm = stormLoop(
        registrants: r, seconds: seconds,
        send: { _ = sequence.send($0) },
        registerOnce: {
            let t0 = nowNanos()
            let subscription = sequence.subscribe()
            let t1 = nowNanos()
            subscription.cancel()
            return t1 &- t0
        })
    run.recordStorm(storm)
    if sequence.subscriberCount != n {
        run.error = "subscriberCount \(sequence.subscriberCount) after the storm, expected \(n)"
    }
    let expected = storm.sent > 0 ? storm.sent - 1 : nil
    for (i, s) in steady.enumerated() where run.error == nil {
        var got: Int? = nil
        switch s.poll() {
        case .element(let e): got = e
        default: break
        }
        if got != expected || s.droppedCount != Swift.max(storm.sent - 1, 0) {
            run.error = "steady subscriber \(i): holds \(got.map(String.init) ?? "nothing"), dropped \(s.droppedCount); "
                + "expected \(expected.map(String.init) ?? "nothing"), \(Swift.max(storm.sent - 1, 0)) of \(storm.sent)"
        }
    }
    sequence.finish()
    return run
}

func runStormLock(subscribers n: Int, registrants r: Int, seconds: Double) -> ScaleRun {
    var run = ScaleRun()
    let setupStart = nowNanos()
    let peer = LockStreamPeer<Int>(policy: .newest(1))
    let steady = (0..<n).map { _ in peer.makeStream() }
    run.setupNanos = nowNanos() &- setupStart
    let storm = stormLoop(
        registrants: r, seconds: seconds,
        send: { peer.yield($0) },
        registerOnce: {
            let t0 = nowNanos()
            let stream = peer.makeStream()
            let t1 = nowNanos()
            withExtendedLifetime(stream) {}  // released here: onTermination removes it
            return t1 &- t0
        })
    run.recordStorm(storm)
    let count = peer.state.withLock { $0.continuations.count }
    if count != n { run.error = "\(count) continuations after the storm, expected \(n)" }
    withExtendedLifetime(steady) {}
    return run
}

extension ScaleContext {
    func stormTable(_ o: CompareOptions) async -> [String] {
        let n = plan.onlyN ?? 1_024
        let counts = plan.smoke ? [0, 2] : [0, 1, 2, 4, 8]
        let seconds = plan.smoke ? 0.2 : 2.0
        let runs = plan.smoke ? 1 : Swift.min(plan.reps, 3)
        var table: [(r: Int, runs: [PeerRuns])] = []
        for r in counts {
            let cells = [
                ScaleCell(peer: scaleOurs) { runStormBroadcast(subscribers: n, registrants: r, seconds: seconds) },
                ScaleCell(peer: scaleLock) { runStormLock(subscribers: n, registrants: r, seconds: seconds) },
            ]
            table.append((r, await interleave(.registrationStorm, n: n, tag: " R=\(r)", runs: runs, cells)))
        }
        var out: [String] = []
        func p(_ s: String = "") { out.append(s) }
        p("")
        p("#### \(ScaleWorkload.registrationStorm.rawValue): R threads doing subscribe() + cancel() without pause, one thread sending to N = \(grouped(n)) idle subscribers")
        p("")
        p("| R | peer | runs | sends in \(fmt(seconds, 1)) s (median) | ÷ its R = 0 | sender CPU % | send p50 µs | p99 µs | worst send ms (max over runs) | subscribe+cancel pairs/s | pair p99 µs | subscribe p99 µs | worst pair ms |")
        p("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        var zero: [String: Double] = [:]
        for (r, runs) in table {
            for pr in runs {
                if pr.skipped {
                    p("| \(r) | \(pr.peer) | 0 | not run | | | | | | | | | |")
                    continue
                }
                let sends = median(pr.runs.map { Double($0.sends) })
                if r == 0 { zero[pr.peer] = sends }
                let ratio = zero[pr.peer].map { fmt(sends / $0, 2) } ?? "–"
                let (s50, s99, _) = spread(pr.runs.flatMap(\.sendCallNanos))
                let worst = Double(pr.runs.map(\.worstSendNanos).max() ?? 0)
                let window = Double(pr.runs.map(\.windowNanos).reduce(0, +)) / 1e9
                let pairs = Double(pr.runs.map(\.registrations).reduce(0, +))
                let (_, r99, _) = spread(pr.runs.flatMap(\.subscribeNanos))
                let (_, sub99, _) = spread(pr.runs.flatMap(\.stormSubscribeNanos))
                let rworst = Double(pr.runs.map(\.worstRegistrationNanos).max() ?? 0)
                let peer = pr.error.map { "\(pr.peer) **WRONG: \($0)**" } ?? pr.peer
                let cpu = median(pr.runs.map { Double($0.senderCPUNanos) / Double(Swift.max($0.windowNanos, 1)) * 100 })
                p("| \(r) | \(peer) | \(pr.runs.count) | \(grouped(Int(sends))) | \(ratio) | \(fmt(cpu, 0)) | \(micros(s50)) | \(micros(s99)) "
                    + "| \(fmt(worst / 1e6, 2)) | \(r == 0 ? "–" : grouped(Int(pairs / window))) | \(r == 0 ? "–" : micros(r99)) | \(r == 0 ? "–" : micros(sub99)) "
                    + "| \(r == 0 ? "–" : fmt(rworst / 1e6, 2)) |")
            }
        }
        p("")
        p("One sender pthread sends 0, 1, 2, … as fast as it can to N subscribers that never read (`.bufferingNewest(1)`; "
            + "lock+AsyncStream: its streams with `.bufferingNewest(1)`), while R pthreads each loop `subscribe()` + `cancel()` "
            + "(lock+AsyncStream: `makeStream()` and releasing the stream) without pause, all started together for "
            + "\(fmt(seconds, 1)) s. Send: the time of one `send` call (clock reads included); worst send: the longest single "
            + "call seen. Sender CPU: the sender thread's CPU time / the window (100: it ran all the time). Pairs: subscribe + cancel pairs completed by all R threads per second; pair p99: one pair's time; subscribe p99: the `subscribe()` (lock+AsyncStream: `makeStream()`) alone, inside the pair. "
            + "R + 1 threads on \(sysconf(Int32(_SC_NPROCESSORS_ONLN))) CPUs: from R = 2 on, the threads also compete for the CPU. "
            + "Checked: the subscriber count is N afterwards and every steady subscriber holds exactly the last element sent "
            + "(AsyncBroadcast: and counts every other one as dropped).")
        return out
    }
}
