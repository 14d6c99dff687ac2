// The workloads, generic over an `AsyncPeer`. Every consumer and every
// producer is a task on the default (cooperative) executor. Subscribers are
// all registered, and every consumer has made its iterator, before the first
// send. Time runs from the first send to the last consumer seeing the end.

@inline(never)
func consume<S: AsyncSequence>(_ sequence: S, ready: Latch) async -> Tally
where S.Element: Payload, S.Failure == Never {
    var iterator = sequence.makeAsyncIterator()
    ready.arrive()
    var tally = Tally()
    while let element = await iterator.next(isolation: nil) {
        tally.add(element.key)
    }
    tally.end = nowNanos()
    return tally
}

/// How the producer hands elements over.
public enum SendMode: Sendable, Equatable {
    case send
    case emit  // AsyncBroadcast's `emit` (waits while a `.bounded` subscriber is full)
    /// AsyncBroadcast's `send(contentsOf:)`, this many elements per call
    /// (slices of `items`: contiguous, so nothing is copied before the call).
    case batch(Int)
}

/// One or more producers send `items` (split evenly) to `n` subscribers.
public func runFanout<P: AsyncPeer>(
    _ type: P.Type, policy: Policy, subscribers n: Int, items: [P.Element],
    producers: Int = 1, mode: SendMode = .send, meter: AllocMeter?
) async -> RunResult {
    let peer = P(policy: policy)
    let ready = Latch(n)
    var streams: [P.Stream] = []
    streams.reserveCapacity(n)
    for _ in 0..<n { streams.append(await peer.subscribe()) }
    let consumers = streams.map { stream in
        Task.detached { () -> Tally in
            var t = await consume(stream, ready: ready)
            t.dropped = peer.dropped(stream)
            return t
        }
    }
    await ready.wait()
    meter?.start()

    let m = items.count
    let share = m / producers
    let finishedProducers = Counter()
    let producerTasks = (0..<producers).map { p in
        Task.detached { () -> (start: UInt64, sent: UInt64) in
            let start = nowNanos()
            let lo = p * share
            let hi = p == producers - 1 ? m : lo + share
            switch mode {
            case .send:
                for i in lo..<hi { await peer.send(items[i]) }
            case .emit:
                if let ours = peer as? BroadcastPeer<P.Element> {
                    for i in lo..<hi { await ours.emit(items[i]) }
                } else {
                    fatalError("emit is AsyncBroadcast only")
                }
            case .batch(let size):
                if let ours = peer as? BroadcastPeer<P.Element> {
                    var i = lo
                    while i < hi {
                        let j = Swift.min(i + size, hi)
                        ours.send(contentsOf: items[i..<j])
                        i = j
                    }
                } else {
                    fatalError("send(contentsOf:) is AsyncBroadcast only")
                }
            }
            let sent = nowNanos()
            if finishedProducers.next() == producers { await peer.finish() }
            return (start, sent)
        }
    }
    var start = UInt64.max
    var sent: UInt64 = 0
    for task in producerTasks {
        let times = await task.value
        start = min(start, times.start)
        sent = max(sent, times.sent)
    }
    var tallies: [Tally] = []
    for task in consumers { tallies.append(await task.value) }
    let mallocs = meter?.stop()
    let end = tallies.map(\.end).max() ?? nowNanos()

    let expectation: Expectation
    if case .newest = policy {
        expectation = .newest(count: m)
    } else {
        expectation = .all(count: m, ordered: producers == 1)
    }
    let received = tallies.reduce(0) { $0 + $1.count }
    var result = RunResult(
        nanos: end &- start, units: m * n, mallocs: mallocs,
        error: checkAll(tallies, expectation))
    result.receivedFraction = Double(received) / Double(max(m * n, 1))
    result.producerNanos = sent &- start
    return result
}

/// `n` steady subscribers consume while a producer keeps sending (in bursts
/// of 16, yielding between bursts); meanwhile one task does `cycles`
/// subscribe-then-cancel cycles. Measures the churn loop (ns per cycle) and
/// checks the steady subscribers got everything.
public func runChurn<P: AsyncPeer>(
    _ type: P.Type, subscribers n: Int, cycles: Int, meter: AllocMeter?
) async -> RunResult where P.Element == Int {
    let peer = P(policy: .unbounded)
    let ready = Latch(n)
    var streams: [P.Stream] = []
    for _ in 0..<n { streams.append(await peer.subscribe()) }
    let consumers = streams.map { stream in
        Task.detached { await consume(stream, ready: ready) }
    }
    await ready.wait()
    let done = Flag()
    let started = Latch(1)
    let producer = Task.detached { () -> Int in
        var i = 0
        started.arrive()
        while !done.isSet {
            for _ in 0..<16 {
                await peer.send(i)
                i += 1
            }
            await Task.yield()
        }
        return i
    }
    await started.wait()
    let churner = Task.detached { () -> (UInt64, Int?) in
        meter?.start()
        let t0 = nowNanos()
        for _ in 0..<cycles { await peer.churnOnce() }
        // Removal may be asynchronous (the actor peer removes in a task).
        while let c = await peer.subscriberCount(), c > n { await Task.yield() }
        let t1 = nowNanos()
        let mallocs = meter?.stop()
        done.set()
        return (t1 &- t0, mallocs)
    }
    let (nanos, mallocs) = await churner.value
    let sent = await producer.value
    await peer.finish()
    var tallies: [Tally] = []
    for task in consumers { tallies.append(await task.value) }
    return RunResult(
        nanos: nanos, units: cycles, mallocs: mallocs,
        error: checkAll(tallies, .all(count: sent, ordered: true)))
}

/// Wake-up latency: `n` consumers are parked in `next()`; the producer sends
/// its clock reading; each consumer records `now - sent` as soon as it runs.
/// The producer waits for all acknowledgements and sleeps a little before the
/// next send so every consumer is parked again.
public func runLatency<P: AsyncPeer>(
    _ type: P.Type, subscribers n: Int, samples: Int
) async -> RunResult where P.Element == Int {
    let peer = P(policy: .unbounded)
    let ready = Latch(n)
    let acks = Counter()
    var streams: [P.Stream] = []
    for _ in 0..<n { streams.append(await peer.subscribe()) }
    let consumers = streams.map { stream in
        Task.detached { () -> [UInt64] in
            var iterator = stream.makeAsyncIterator()
            ready.arrive()
            var lat: [UInt64] = []
            lat.reserveCapacity(samples)
            while let sent = await iterator.next(isolation: nil) {
                lat.append(nowNanos() &- UInt64(sent))
                acks.increment()
            }
            return lat
        }
    }
    await ready.wait()
    let producer = Task.detached {
        for i in 0..<samples {
            while acks.current < n * i { try? await Task.sleep(for: .microseconds(20)) }
            try? await Task.sleep(for: .microseconds(30))
            await peer.send(Int(nowNanos()))
        }
        while acks.current < n * samples { try? await Task.sleep(for: .microseconds(20)) }
    }
    await producer.value
    await peer.finish()
    var all: [UInt64] = []
    var error: String?
    for (i, task) in consumers.enumerated() {
        let lat = await task.value
        if lat.count != samples, error == nil { error = "subscriber \(i): \(lat.count)/\(samples) samples" }
        all += lat
    }
    all.sort()
    let p50 = all.isEmpty ? 0 : all[all.count / 2]
    var result = RunResult(nanos: p50, units: 1, mallocs: nil, error: error)
    result.latencies = all
    return result
}

// MARK: Non-generic entry points for other modules

/// The async peers, for callers outside this module: calling the generic
/// workloads from another module would run them unspecialised.
public enum PeerKind: Sendable, CaseIterable {
    case broadcast, lockStream, actorStream, share, plainStream

    public var name: String {
        switch self {
        case .broadcast: BroadcastPeer<Int>.name
        case .lockStream: LockStreamPeer<Int>.name
        case .actorStream: ActorStreamPeer<Int>.name
        case .share: SharePeer<Int>.name
        case .plainStream: PlainStreamPeer<Int>.name
        }
    }
}

public func runFanout(
    _ kind: PeerKind, policy: Policy, subscribers n: Int, items: [Int],
    producers: Int = 1, mode: SendMode = .send, meter: AllocMeter?
) async -> RunResult {
    switch kind {
    case .broadcast:
        await runFanout(BroadcastPeer<Int>.self, policy: policy, subscribers: n, items: items,
                        producers: producers, mode: mode, meter: meter)
    case .lockStream:
        await runFanout(LockStreamPeer<Int>.self, policy: policy, subscribers: n, items: items,
                        producers: producers, mode: mode, meter: meter)
    case .actorStream:
        await runFanout(ActorStreamPeer<Int>.self, policy: policy, subscribers: n, items: items,
                        producers: producers, mode: mode, meter: meter)
    case .share:
        await runFanout(SharePeer<Int>.self, policy: policy, subscribers: n, items: items,
                        producers: producers, mode: mode, meter: meter)
    case .plainStream:
        await runFanout(PlainStreamPeer<Int>.self, policy: policy, subscribers: n, items: items,
                        producers: producers, mode: mode, meter: meter)
    }
}

public func runChurn(_ kind: PeerKind, subscribers n: Int, cycles: Int, meter: AllocMeter?) async -> RunResult {
    switch kind {
    case .broadcast: await runChurn(BroadcastPeer<Int>.self, subscribers: n, cycles: cycles, meter: meter)
    case .lockStream: await runChurn(LockStreamPeer<Int>.self, subscribers: n, cycles: cycles, meter: meter)
    case .actorStream: await runChurn(ActorStreamPeer<Int>.self, subscribers: n, cycles: cycles, meter: meter)
    case .share: await runChurn(SharePeer<Int>.self, subscribers: n, cycles: cycles, meter: meter)
    case .plainStream: await runChurn(PlainStreamPeer<Int>.self, subscribers: n, cycles: cycles, meter: meter)
    }
}

/// OpenCombine with Int elements, for callers outside this module.
public func runCombineFanoutInt(items: [Int], subscribers n: Int, producers: Int = 1, meter: AllocMeter?) async -> RunResult {
    await runCombineFanout(items: items, subscribers: n, producers: producers, meter: meter)
}
