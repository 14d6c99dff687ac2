#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Seconds on the monotonic clock.
func monotonicSeconds() -> Double {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1_000_000_000
}

/// Prints a line and flushes at once (output is often piped to a log).
func say(_ line: String) {
    print(line)
    fflush(nil)
}

/// Flushes and ends the process now, without running exit handlers: used
/// when tasks are hung and can never be awaited.
func terminate(status: Int32) -> Never {
    fflush(nil)
    _exit(status)
}

/// The process's resident set size in bytes (VmRSS from /proc/self/status),
/// or nil where that file does not exist.
func residentMemoryBytes() -> Int? {
    guard let file = fopen("/proc/self/status", "r") else { return nil }
    defer { fclose(file) }
    var buffer = [CChar](repeating: 0, count: 512)
    while fgets(&buffer, Int32(buffer.count), file) != nil {
        let line = String(decoding: buffer.prefix(while: { $0 != 0 }).map { UInt8(bitPattern: $0) }, as: UTF8.self)
        guard line.hasPrefix("VmRSS:") else { continue }
        let digits = line.dropFirst("VmRSS:".count).filter { $0.isNumber }
        guard let kilobytes = Int(String(digits)) else { return nil }
        return kilobytes * 1024
    }
    return nil
}

func formatMB(_ bytes: Int) -> String {
    let tenths = (bytes * 10 + 512 * 1024) / (1024 * 1024)
    return "\(tenths / 10).\(tenths % 10) MB"
}

func formatSeconds(_ seconds: Double) -> String {
    let hundredths = Int((seconds * 100).rounded())
    let fraction = hundredths % 100
    return "\(hundredths / 100).\(fraction < 10 ? "0" : "")\(fraction)s"
}

func hex(_ value: UInt64) -> String { "0x" + String(value, radix: 16) }

/// The body of a raw pthread.
private final class ThreadBody: Sendable {
    let run: @Sendable () -> Void
    init(_ run: @escaping @Sendable () -> Void) { self.run = run }
}

/// Runs `body` on a new detached OS thread (not the cooperative pool).
func spawnThread(_ body: @escaping @Sendable () -> Void) {
    let context = Unmanaged.passRetained(ThreadBody(body)).toOpaque()
    var thread = pthread_t()
    let status = pthread_create(
        &thread, nil,
        { raw in
            let body = Unmanaged<ThreadBody>.fromOpaque(raw!).takeRetainedValue()
            body.run()
            return nil
        }, context)
    guard status == 0 else { fatalError("pthread_create failed: \(status)") }
    pthread_detach(thread)
}

/// Lets another thread run (for bounded spins on producer threads).
func yieldThread() { sched_yield() }
