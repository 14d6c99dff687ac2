// ordo-one/benchmark suite for the main cells:
//
//   swift package --package-path Benchmarks benchmark
//   swift package --package-path Benchmarks benchmark --filter "unbounded.*N=16"
//
// One iteration = one run of M·N = 65,536 deliveries (M = 65,536 / N), or of
// 4,096 subscribe+cancel cycles for churn. The measurement (wall clock,
// throughput, mallocCountTotal) covers the sending and consuming only:
// subscribing and starting the consumer tasks happens before
// `startMeasurement()`. Divide wall clock and mallocs by 65,536 (or 4,096)
// for per-delivery (per-cycle) numbers; `fanout-compare` prints those directly.
import Benchmark
import FanoutKit

let deliveries = 65_536
let churnCycles = 4_096

struct BenchmarkRef: @unchecked Sendable { let benchmark: Benchmark }

func meter(_ benchmark: Benchmark) -> AllocMeter {
    let ref = BenchmarkRef(benchmark: benchmark)
    return AllocMeter(
        start: { ref.benchmark.startMeasurement() },
        stop: {
            ref.benchmark.stopMeasurement()
            return 0
        })
}

/// The harness's own timing (first send → last consumer done), per delivery or cycle.
let perUnit = BenchmarkMetric.custom("ns per delivery (or churn cycle)", useScalingFactor: false)

func check(_ result: RunResult, _ benchmark: Benchmark) {
    if let error = result.error { benchmark.error("wrong result: \(error)") }
    benchmark.measurement(perUnit, Int(result.nanosPerUnit.rounded()))
}

var configuration: Benchmark.Configuration {
    Benchmark.Configuration(
        metrics: [.wallClock, .throughput, .mallocCountTotal, perUnit],
        warmupIterations: 2,
        maxDuration: .seconds(2),
        maxIterations: 200
    )
}

// The generic workloads are reached through FanoutKit's non-generic entry
// points (`PeerKind`), so they run specialised.
func fanout(_ peer: PeerKind, _ workload: String, policy: Policy, n: Int, producers: Int = 1,
            mode: SendMode = .send) {
    let items = Array(0..<(deliveries / n))
    let name = mode == .emit ? "\(peer.name) emit" : peer.name
    Benchmark("\(workload) N=\(n) \(name)", configuration: configuration) { benchmark in
        check(await runFanout(peer, policy: policy, subscribers: n, items: items, producers: producers,
                              mode: mode, meter: meter(benchmark)), benchmark)
    }
}

func combine(_ workload: String, n: Int, producers: Int = 1) {
    let items = Array(0..<(deliveries / n))
    Benchmark("\(workload) N=\(n) \(CombinePeer.name)", configuration: configuration) { benchmark in
        check(await runCombineFanoutInt(items: items, subscribers: n, producers: producers, meter: meter(benchmark)),
              benchmark)
    }
}

func churn(_ peer: PeerKind, n: Int) {
    Benchmark("churn N=\(n) \(peer.name)", configuration: configuration) { benchmark in
        check(await runChurn(peer, subscribers: n, cycles: churnCycles, meter: meter(benchmark)), benchmark)
    }
}

let benchmarks: @Sendable () -> Void = {
    for n in [1, 4, 16, 64] {
        fanout(.broadcast, "unbounded", policy: .unbounded, n: n)
        fanout(.lockStream, "unbounded", policy: .unbounded, n: n)
        combine("unbounded", n: n)
    }
    fanout(.broadcast, "unbounded", policy: .unbounded, n: 256)
    fanout(.plainStream, "unbounded", policy: .unbounded, n: 1)

    fanout(.broadcast, "newest(1024)", policy: .newest(1024), n: 16)
    fanout(.lockStream, "newest(1024)", policy: .newest(1024), n: 16)
    fanout(.broadcast, "bounded(1024)", policy: .bounded(1024), n: 16, mode: .emit)

    fanout(.broadcast, "4 producers", policy: .unbounded, n: 16, producers: 4)
    fanout(.lockStream, "4 producers", policy: .unbounded, n: 16, producers: 4)

    churn(.broadcast, n: 16)
    churn(.lockStream, n: 16)
}
