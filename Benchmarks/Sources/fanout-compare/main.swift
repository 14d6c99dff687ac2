// fanout-compare: AsyncBroadcast against its peers, interleaved in one process.
//
//   swift run -c release --package-path Benchmarks fanout-compare            # full table
//   swift run -c release --package-path Benchmarks fanout-compare --smoke    # CI: every cell once, small
//
// Options: --reps K, --deliveries D (M·N per throughput run), --churn C,
// --samples S (wake-ups per latency run), --reads R (per value-read run),
// --updates K (per value-update run), --filter TEXT (workload name),
// --peer TEXT (peer name), --n N (one subscriber count), --no-allocs.
// `--filter value`, `--filter promise` and `--filter sharing` run those
// workloads alone (each has its own table); `--filter batch` the
// send(_:) vs send(contentsOf:) cells; `--filter scale` the scale cells
// (N up to 100,000; their own tables; `--filter "scale: wake"` one of them;
// `--budget S`: seconds one run of one peer may take there, default 30);
// `--filter topics` the BroadcastTopics cells (memory at 1,000,000 topics,
// a Centrifugo-shaped fan-out, churn with the race counted; `--n N` sets the
// memory cell's topic count and the fan-out cell's subscriber count);
// `--filter sparse` the sparse cell (100,000 plain sequences of 1-2
// subscribers beside the wake floor, which the topics fan-out cell has too).
// FANOUT_SCALE_FAULT=1: a deliberate fault in the scale throughput cell and
// the topics and sparse fan-out cells (every peer of them, floor included).
//
// Exits non-zero only if a run delivered a wrong result (count, sum, order):
// status 1, or status 3 if a run never finished (watchdog, 120 s per run).
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import FanoutKit
import MallocInterposerSwift

var options = CompareOptions()
var countAllocs = true
let arguments = Array(CommandLine.arguments.dropFirst())

@MainActor func value(after flag: String, minimum: Int = 1) -> Int {
    guard let i = arguments.firstIndex(of: flag), i + 1 < arguments.count, let v = Int(arguments[i + 1]), v >= minimum else {
        log("fanout-compare: \(flag) needs a \(minimum > 0 ? "positive" : "non-negative") number")
        exit(2)
    }
    return v
}

if arguments.contains("--help") || arguments.contains("-h") {
    print("""
    usage: fanout-compare [--smoke] [--reps K] [--deliveries D] [--churn C] [--samples S]
                          [--reads R] [--updates K]
                          [--filter TEXT] [--peer TEXT] [--n N] [--no-allocs] [--budget S]
      --filter scale       the scale cells alone (N = 64, 1,024, 16,384, 100,000; --n N for one N)
      --budget S           seconds one run of one peer may take in the scale cells (default 30)
      --filter topics      the BroadcastTopics cells ("topics: memory", "topics: fan-out", "topics: churn";
                           --n N: the memory cell's topics and the fan-out cell's subscribers)
      --filter sparse      "sparse: fan-out": 100,000 BroadcastSequences of 1-2 subscribers and the wake
                           floor (--n K: the sequences); "--filter fan-out" runs it with the topics one
      FANOUT_SCALE_FAULT=1 deliberate fault: a reader of the scale throughput cell ignores an element,
                           a topics or sparse fan-out subscription counts an element twice
    """)
    exit(0)
}
if arguments.contains("--smoke") { options = .smoke() }
if arguments.contains("--reps") { options.reps = value(after: "--reps") }
if arguments.contains("--deliveries") { options.deliveries = value(after: "--deliveries") }
if arguments.contains("--churn") { options.churnCycles = value(after: "--churn") }
if arguments.contains("--samples") { options.latencySamples = value(after: "--samples") }
if arguments.contains("--reads") { options.valueReads = value(after: "--reads") }
if arguments.contains("--updates") { options.valueUpdates = value(after: "--updates") }
if let i = arguments.firstIndex(of: "--filter"), i + 1 < arguments.count { options.filter = arguments[i + 1] }
if let i = arguments.firstIndex(of: "--peer"), i + 1 < arguments.count { options.peerFilter = arguments[i + 1] }
// 0: the subscriberCounts cell with no other subscribers.
if arguments.contains("--n") { options.onlyN = value(after: "--n", minimum: 0) }
if arguments.contains("--no-allocs") { countAllocs = false }
if arguments.contains("--budget") { options.scaleBudget = Double(value(after: "--budget")) }

// MARK: Allocation counting

/// Whether the interposer sees this process's mallocs (it must come before
/// libc in symbol lookup: linked first, or LD_PRELOADed).
nonisolated(unsafe) var escapedProbe: UnsafeMutableRawPointer?

@inline(never)
func interposerCounts() -> Bool {
    MallocInterposerSwift.initialize()
    MallocInterposerSwift.hook()
    escapedProbe = malloc(48)  // escapes, so the optimiser cannot drop it
    MallocInterposerSwift.unhook()
    free(escapedProbe)
    escapedProbe = nil
    return MallocInterposerSwift.getStatistics().mallocCount > 0
}

#if os(Linux)
/// Re-executes this program with the interposer preloaded.
func reexecWithPreload() -> Never? {
    guard getenv("FANOUT_COMPARE_PRELOADED") == nil else { return nil }
    var buffer = [CChar](repeating: 0, count: 4096)
    let n = readlink("/proc/self/exe", &buffer, buffer.count - 1)
    guard n > 0 else { return nil }
    let exe = String(decoding: buffer[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    let dir = exe.split(separator: "/", omittingEmptySubsequences: false).dropLast().joined(separator: "/")
    let lib = dir + "/libMallocInterposerSwift.so"
    guard access(lib, R_OK) == 0 else { return nil }
    let existing = getenv("LD_PRELOAD").map { String(cString: $0) }
    setenv("LD_PRELOAD", existing.map { "\(lib):\($0)" } ?? lib, 1)
    setenv("FANOUT_COMPARE_PRELOADED", "1", 1)
    var argv: [UnsafeMutablePointer<CChar>?] = CommandLine.arguments.map { strdup($0) }
    argv.append(nil)
    execv(exe, argv)
    return nil  // exec failed: run without counting
}
#endif

if countAllocs {
    var counting = interposerCounts()
    #if os(Linux)
    if !counting {
        reexecWithPreload()
        counting = interposerCounts()
    }
    #endif
    if counting {
        options.meter = AllocMeter(
            start: {
                MallocInterposerSwift.initialize()
                MallocInterposerSwift.hook()
            },
            stop: {
                MallocInterposerSwift.unhook()
                return MallocInterposerSwift.getStatistics().mallocCount
            })
        options.byteMeter = ByteMeter(
            source: "MallocInterposer (requested bytes)",
            start: {
                MallocInterposerSwift.initialize()
                MallocInterposerSwift.hook()
            },
            stop: {
                MallocInterposerSwift.unhook()
                let s = MallocInterposerSwift.getStatistics()
                return ByteCounts(mallocs: s.mallocCount, bytes: s.mallocBytesCount,
                                  frees: s.freeCount, freedBytes: s.freeBytesCount)
            })
    } else {
        log("fanout-compare: malloc interposer not active; allocations not counted")
    }
}

var name = utsname()
uname(&name)
func field<T>(_ t: T) -> String {
    withUnsafeBytes(of: t) { raw in String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self) }
}
print("fanout-compare \(options.smoke ? "--smoke " : "")on \(field(name.sysname)) \(field(name.release)) \(field(name.machine)), "
    + "\(sysconf(Int32(_SC_NPROCESSORS_ONLN))) CPUs; allocations \(options.meter == nil ? "not counted" : "counted with MallocInterposer")")
print("")

let ok = await runComparison(options)
exit(ok ? 0 : 1)
