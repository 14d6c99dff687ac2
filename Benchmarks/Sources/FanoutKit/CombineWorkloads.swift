// OpenCombine's PassthroughSubject with `sink` subscribers: delivery is a
// synchronous call on the producer's thread, the bar for "as fast as a
// callback". Producers are tasks, as for the other peers.
@preconcurrency import OpenCombine

public enum CombinePeer {
    public static let name = "OpenCombine sink"
}

final class SinkBox: @unchecked Sendable {
    var tally = Tally()
}

struct UncheckedBox<T>: @unchecked Sendable { let value: T }

public func runCombineFanout<E: Payload>(
    items: [E], subscribers n: Int, producers: Int = 1, meter: AllocMeter?
) async -> RunResult {
    let subject = PassthroughSubject<E, Never>()
    let boxes = (0..<n).map { _ in SinkBox() }
    let cancellables = boxes.map { box in
        subject.sink { element in box.tally.add(element.key) }
    }
    let shared = UncheckedBox(value: subject)
    meter?.start()
    let m = items.count
    let share = m / producers
    // OpenCombine serialises calls into each subscriber (a lock per conduit),
    // so concurrent producers may call `send` directly.
    let producerTasks = (0..<producers).map { p in
        Task.detached { () -> (UInt64, UInt64) in
            let subject = shared.value
            let start = nowNanos()
            let lo = p * share
            let hi = p == producers - 1 ? m : lo + share
            for i in lo..<hi { subject.send(items[i]) }
            return (start, nowNanos())
        }
    }
    var start = UInt64.max
    var end: UInt64 = 0
    for task in producerTasks {
        let (s, e) = await task.value
        start = min(start, s)
        end = max(end, e)
    }
    let mallocs = meter?.stop()
    subject.send(completion: .finished)
    withExtendedLifetime(cancellables) {}
    let tallies = boxes.map(\.tally)
    return RunResult(
        nanos: end &- start, units: m * n, mallocs: mallocs,
        error: checkAll(tallies, .all(count: m, ordered: producers == 1)))
}

public func runCombineChurn(subscribers n: Int, cycles: Int, meter: AllocMeter?) async -> RunResult {
    let subject = PassthroughSubject<Int, Never>()
    let boxes = (0..<n).map { _ in SinkBox() }
    let cancellables = boxes.map { box in
        subject.sink { element in box.tally.add(element) }
    }
    let shared = UncheckedBox(value: subject)
    let done = Flag()
    let started = Latch(1)
    let producer = Task.detached { () -> Int in
        let subject = shared.value
        var i = 0
        started.arrive()
        while !done.isSet {
            for _ in 0..<16 {
                subject.send(i)
                i += 1
            }
            await Task.yield()
        }
        return i
    }
    await started.wait()
    let churner = Task.detached { () -> (UInt64, Int?) in
        let subject = shared.value
        meter?.start()
        let t0 = nowNanos()
        for _ in 0..<cycles {
            let c = subject.sink { _ in }
            c.cancel()
        }
        let t1 = nowNanos()
        let mallocs = meter?.stop()
        done.set()
        return (t1 &- t0, mallocs)
    }
    let (nanos, mallocs) = await churner.value
    let sent = await producer.value
    subject.send(completion: .finished)
    withExtendedLifetime(cancellables) {}
    return RunResult(
        nanos: nanos, units: cycles, mallocs: mallocs,
        error: checkAll(boxes.map(\.tally), .all(count: sent, ordered: true)))
}

/// Latency of a synchronous callback: from just before `send` to inside the sink.
public func runCombineLatency(subscribers n: Int, samples: Int) async -> RunResult {
    let subject = PassthroughSubject<Int, Never>()
    final class LatBox: @unchecked Sendable { var lat: [UInt64] = [] }
    let boxes = (0..<n).map { _ in LatBox() }
    let cancellables = boxes.map { box in
        box.lat.reserveCapacity(samples)
        return subject.sink { sent in box.lat.append(nowNanos() &- UInt64(sent)) }
    }
    let shared = UncheckedBox(value: subject)
    await Task.detached {
        let subject = shared.value
        for _ in 0..<samples {
            try? await Task.sleep(for: .microseconds(30))
            subject.send(Int(nowNanos()))
        }
    }.value
    subject.send(completion: .finished)
    withExtendedLifetime(cancellables) {}
    var all = boxes.flatMap(\.lat)
    all.sort()
    var result = RunResult(
        nanos: all.isEmpty ? 0 : all[all.count / 2], units: 1, mallocs: nil,
        error: all.count == n * samples ? nil : "\(all.count)/\(n * samples) samples")
    result.latencies = all
    return result
}
