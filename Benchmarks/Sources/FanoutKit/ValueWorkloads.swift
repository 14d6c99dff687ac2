// The current-value workloads: `value-read` (uncontended reads of the current
// value) and `value-update` (one producer changing it while N subscribers
// follow, conflated). Generic over the peer, specialised in this module.
@preconcurrency import OpenCombine
import Synchronization

// MARK: value-read

/// One task reads the current value `reads` times; ns per read.
func runValueRead<P: ValueReader>(_: P.Type, reads: Int, meter: AllocMeter?) async -> RunResult {
    let peer = P(7)
    return await Task.detached { () -> RunResult in
        meter?.start()
        let t0 = nowNanos()
        let sum = readLoop(peer, reads)
        let t1 = nowNanos()
        let mallocs = meter?.stop()
        return RunResult(nanos: t1 &- t0, units: reads, mallocs: mallocs,
                         error: sum == 7 &* reads ? nil : "sum \(sum), expected \(7 &* reads)")
    }.value
}

@inline(never)
func readLoop<P: ValueReader>(_ peer: P, _ reads: Int) -> Int {
    var sum = 0
    for _ in 0..<reads { sum &+= peer.read() }
    return sum
}

/// The actor's getter: `await actor.read()` from a task that is not on it.
func runActorValueRead(reads: Int, meter: AllocMeter?) async -> RunResult {
    let peer = ActorValuePeer(7)
    return await Task.detached { () -> RunResult in
        meter?.start()
        let t0 = nowNanos()
        var sum = 0
        for _ in 0..<reads { sum &+= await peer.read() }
        let t1 = nowNanos()
        let mallocs = meter?.stop()
        return RunResult(nanos: t1 &- t0, units: reads, mallocs: mallocs,
                         error: sum == 7 &* reads ? nil : "sum \(sum), expected \(7 &* reads)")
    }.value
}

// MARK: value-update

/// The end of a value-update run, written by the last subscriber to see the final value.
final class FinalBox: Sendable {
    struct State {
        var end: UInt64 = 0
        var mallocs: Int? = nil
    }
    let state = Mutex(State())
}

/// What a value-update subscriber saw: strictly increasing values (never the
/// same change twice), the first one the initial value 0, the last one `k`.
func checkValueTallies(_ tallies: [Tally], updates k: Int) -> String? {
    for (i, t) in tallies.enumerated() {
        if !t.inOrder { return "subscriber \(i): a value not newer than the one before" }
        if t.last != k { return "subscriber \(i): last \(t.last), expected \(k)" }
        if t.count > k + 1 || t.count < 2 { return "subscriber \(i): \(t.count) values for \(k) updates" }
    }
    return nil
}

/// `n` subscriber tasks follow the value (each has read the initial value 0
/// and is iterating before the first update); one producer task sends
/// 1...k. Time and allocations run from the first update until the last
/// subscriber has seen `k`; ns per update.
func runValueUpdate<P: ValuePeer>(_: P.Type, subscribers n: Int, updates k: Int, meter: AllocMeter?) async -> RunResult {
    let peer = P(0)
    let ready = Latch(n)
    let done = Latch(1)
    let sawFinal = Counter()
    let final = FinalBox()
    var streams: [P.Stream] = []
    streams.reserveCapacity(n)
    for _ in 0..<n { streams.append(await peer.subscribe()) }
    let consumers = streams.map { stream in
        Task.detached { () -> Tally in
            var iterator = stream.makeAsyncIterator()
            var tally = Tally()
            if let first = await iterator.next(isolation: nil) { tally.add(first) }  // the initial value
            ready.arrive()
            while let value = await iterator.next(isolation: nil) {
                tally.add(value)
                if value == k {
                    tally.end = nowNanos()
                    if sawFinal.next() == n {
                        let mallocs = meter?.stop()
                        final.state.withLock { $0 = .init(end: tally.end, mallocs: mallocs) }
                        done.arrive()
                    }
                    break
                }
            }
            return tally
        }
    }
    await ready.wait()
    let producer = Task.detached { () -> UInt64 in
        meter?.start()
        let start = nowNanos()
        for i in 1...k { await peer.send(i) }
        return start
    }
    let start = await producer.value
    await done.wait()
    var tallies: [Tally] = []
    for task in consumers { tallies.append(await task.value) }
    let (end, mallocs) = final.state.withLock { ($0.end, $0.mallocs) }
    let seen = tallies.reduce(0) { $0 + $1.count - 1 }  // changes seen, the initial value not counted
    var result = RunResult(nanos: end &- start, units: k, mallocs: mallocs,
                           error: checkValueTallies(tallies, updates: k))
    result.receivedFraction = Double(seen) / Double(max(n * k, 1))
    return result
}

/// OpenCombine `CurrentValueSubject` + `n` sinks: each update calls every
/// sink synchronously on the producer's thread. Time: the producer's loop.
func runCombineValueUpdate(subscribers n: Int, updates k: Int, meter: AllocMeter?) async -> RunResult {
    let subject = CurrentValueSubject<Int, Never>(0)
    let boxes = (0..<n).map { _ in SinkBox() }
    let cancellables = boxes.map { box in
        subject.sink { value in box.tally.add(value) }  // gets the initial value 0 now
    }
    let shared = UncheckedBox(value: subject)
    let (start, end, mallocs) = await Task.detached { () -> (UInt64, UInt64, Int?) in
        let subject = shared.value
        meter?.start()
        let start = nowNanos()
        for i in 1...k { subject.send(i) }
        let end = nowNanos()
        return (start, end, meter?.stop())
    }.value
    withExtendedLifetime(cancellables) {}
    let tallies = boxes.map(\.tally)
    let seen = tallies.reduce(0) { $0 + $1.count - 1 }
    var result = RunResult(nanos: end &- start, units: k, mallocs: mallocs,
                           error: checkValueTallies(tallies, updates: k))
    result.receivedFraction = Double(seen) / Double(max(n * k, 1))
    return result
}

// MARK: value-send (diagnostic)

/// `n` subscribers are registered (each has read the initial value) but none
/// reads on, so nobody is parked and no update wakes anyone: the cost of the
/// send itself, and its own allocations, without the executor's wake-up work.
func runValueSend<P: ValuePeer>(_: P.Type, subscribers n: Int, updates k: Int, meter: AllocMeter?) async -> RunResult {
    let peer = P(0)
    var iterators: [P.Stream.AsyncIterator] = []
    for _ in 0..<n {
        var iterator = await peer.subscribe().makeAsyncIterator()
        _ = await iterator.next(isolation: nil)  // the initial value
        iterators.append(iterator)
    }
    let held = UncheckedBox(value: iterators)
    return await Task.detached { () -> RunResult in
        meter?.start()
        let start = nowNanos()
        for i in 1...k { await peer.send(i) }
        let end = nowNanos()
        let mallocs = meter?.stop()
        withExtendedLifetime(held) {}
        return RunResult(nanos: end &- start, units: k, mallocs: mallocs, error: nil)
    }.value
}

// MARK: Cells

let valueReadInfo = V2Info(unit: "ns/read", allocUnit: "read",
    how: "one task reads the current value R times in a loop (no subscribers, no writer); ns per read")
let valueUpdateInfo = V2Info(unit: "ns/update", allocUnit: "update",
    how: "one producer task sends 1...K (Int) while N subscriber tasks iterate (each has read the initial value "
        + "and is iterating first; conflation allowed); time from the first send until every subscriber has seen K, / K; "
        + "allocations counted over the same window")

let valueSendInfo = V2Info(unit: "ns/update", allocUnit: "update",
    how: "diagnostic: as value-update, but the N subscribers, registered and past their initial value, do not read on, "
        + "so no update wakes anyone: the send path alone (OpenCombine has no such state: its sinks always run)")

func valueGroups(_ o: CompareOptions) -> [Group] {
    var groups: [Group] = []
    let reads = o.valueReads
    func read<P: ValueReader>(_ p: P.Type) -> PeerCell {
        PeerCell(peer: P.name) { meter in await runValueRead(P.self, reads: reads, meter: meter) }
    }
    groups.append(Group(workload: "value-read", n: 1, peers: [
        read(BroadcastValuePeer.self),
        read(CombineValueReader.self),
        read(LockValuePeer.self),
        read(PthreadValuePeer.self),
        PeerCell(peer: "actor (await read())") { meter in await runActorValueRead(reads: reads, meter: meter) },
    ], v2: valueReadInfo))

    let k = o.valueUpdates
    for n in [1, 4, 16, 64] {
        func update<P: ValuePeer>(_ p: P.Type) -> PeerCell {
            PeerCell(peer: P.name) { meter in await runValueUpdate(P.self, subscribers: n, updates: k, meter: meter) }
        }
        groups.append(Group(workload: "value-update", n: n, peers: [
            update(BroadcastValuePeer.self),
            PeerCell(peer: CombineValueName.name + " + sink") { meter in
                await runCombineValueUpdate(subscribers: n, updates: k, meter: meter)
            },
            update(LockValuePeer.self),
            update(ActorValuePeer.self),
        ], v2: valueUpdateInfo))
    }
    for n in [1, 64] {
        func send<P: ValuePeer>(_ p: P.Type) -> PeerCell {
            PeerCell(peer: P.name) { meter in await runValueSend(P.self, subscribers: n, updates: k, meter: meter) }
        }
        groups.append(Group(workload: "value-send, no reader waiting", n: n, peers: [
            send(BroadcastValuePeer.self), send(LockValuePeer.self), send(ActorValuePeer.self),
        ], v2: valueSendInfo))
    }
    return groups
}
