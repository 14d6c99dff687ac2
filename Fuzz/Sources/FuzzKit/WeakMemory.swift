// The fuzz targets' side of the weak-memory model (`WeakMemoryModel`, the
// library's `_CAtomics/WeakMemory.c`): only a library built with
// `ASYNCBROADCAST_WEAK_MEMORY=1` (the default of `run.sh`) has it; elsewhere
// every call here does nothing and the targets run sequentially consistent.
//
// The model gives each *logical thread* a TSO store buffer. The targets that
// run tasks on `ManualExecutor` name the logical thread of each job before
// running it (`runAs`), so a task's stores can stay invisible to the driver
// (thread 0) and to the other tasks until something drains them: the
// library's own fences, read-modify-writes and locks, the runtime's
// synchronisation at a continuation resume, or the harness, where a real
// program synchronises with a task through means the model does not see
// (awaiting it, reference counts, handing a subscription to another
// consumer) and where the input says so.

@_spi(Testing) import AsyncBroadcast
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

public enum FuzzWeakMemory {
    /// The library routes its atomics through the model.
    public static let isOn = WeakMemoryModel.isCompiledIn

    /// The driver's logical thread (the fuzzer's own code between jobs).
    public static let driver = 0

    /// Logical thread of task number `index` (0-based): 1 + index, wrapped
    /// into the model's threads (the last one is kept for runtime jobs).
    public static func thread(ofTask index: Int) -> Int {
        guard isOn else { return 0 }
        return 1 + index % (WeakMemoryModel.threadCount - 2)
    }

    /// Runtime jobs that belong to no task of the program.
    public static var runtimeThread: Int { isOn ? WeakMemoryModel.threadCount - 1 : 0 }

    /// `FUZZ_REMOVE_ORDERING=name[,name...]` (a `WeakMemoryModel.Ordering`
    /// case name): the handshake orderings taken away for this whole run.
    static let removedOrderings: Set<WeakMemoryModel.Ordering> = {
        guard let raw = getenv("FUZZ_REMOVE_ORDERING") else { return [] }
        var result = Set<WeakMemoryModel.Ordering>()
        for name in String(cString: raw).split(separator: ",") {
            let name = name.trimmingCharacters(in: " ")
            guard !name.isEmpty else { continue }
            guard let ordering = WeakMemoryModel.Ordering.allCases.first(where: { "\($0)" == name }) else {
                printErr("FUZZ_REMOVE_ORDERING: unknown ordering \(name) (known: \(WeakMemoryModel.Ordering.allCases.map { "\($0)" }.joined(separator: ", ")))")
                exit(2)
            }
            result.insert(ordering)
        }
        if !result.isEmpty && !isOn {
            printErr("FUZZ_REMOVE_ORDERING needs the weak-memory build (ASYNCBROADCAST_WEAK_MEMORY=1; run.sh without --sc)")
            exit(2)
        }
        return result
    }()

    nonisolated(unsafe) static var reportInstalled = false
    nonisolated(unsafe) static var inputs = 0

    /// At the start of every input (and of its traced re-run): every buffer
    /// drained, buffering on, the calling thread is the driver, the removed
    /// orderings in place. The first call prints the mode and arranges the
    /// statistics line at exit.
    public static func beginInput(_ input: ByteReader) {
        guard isOn else { return }
        WeakMemoryModel.setEnabled(false)  // drains every buffer
        WeakMemoryModel.drainAll()
        WeakMemoryModel.removedOrderings = removedOrderings
        WeakMemoryModel.setEnabled(true)
        WeakMemoryModel.currentThread = driver
        inputs += 1
        if !reportInstalled {
            reportInstalled = true
            printErr("weak memory: on (TSO store buffers per task; removed orderings: \(removedOrderings.isEmpty ? "none" : removedOrderings.map { "\($0)" }.sorted().joined(separator: ", ")))")
            atexit { FuzzWeakMemory.report(final: true) }
        }
        if inputs & (inputs - 1) == 0 && inputs >= 4096 { report(final: false) }
    }

    /// One line on stderr: how much weak behaviour the run exercised.
    public static func report(final: Bool) {
        guard isOn, reportInstalled else { return }
        let stats = WeakMemoryModel.statistics
        printErr("weak memory\(final ? " (at exit)" : ""): \(inputs) inputs, \(stats.buffered) stores buffered, \(stats.staleLoads) stale loads (read memory while another thread had a newer store buffered)")
    }

    /// Runs `body` (one job) as logical thread `thread`, then the driver again.
    /// Nothing drains: the job's stores stay where the model put them.
    @inline(__always)
    public static func runAs<R>(_ thread: Int, _ body: () throws -> R) rethrows -> R {
        guard isOn else { return try body() }
        let previous = WeakMemoryModel.currentThread
        WeakMemoryModel.currentThread = thread
        defer { WeakMemoryModel.currentThread = previous }
        return try body()
    }

    /// The checker's own look at the library: loads see the newest store of
    /// any thread, nothing drains.
    @inline(__always)
    public static func observing<R>(_ body: () throws -> R) rethrows -> R {
        guard isOn else { return try body() }
        return try WeakMemoryModel.observing(body)
    }

    /// The checker's look at state that the library reads under a lock
    /// (`isFinished`, `waitingEmitterCount`, a `BroadcastValue`'s value...).
    ///
    /// Not through `observing`: in the model as it is, an observer's unlock
    /// resets the mutex's release mark (`cab_wm_unlock` sees no buffer of its
    /// own and records "nothing pending"), so the next real acquirer would no
    /// longer drain the last releaser's stores and would read a stale
    /// lock-protected word (seen: "published count 1 != 0 subscribers" in the
    /// library's invariant check). Instead the look runs as an unmodelled
    /// thread: its lock() drains the last releaser's buffer up to its unlock,
    /// as any acquirer's would (a drain is always a legal TSO behaviour), and
    /// what it reads under the lock is then current.
    @inline(__always)
    public static func observingLocked<R>(_ body: () throws -> R) rethrows -> R {
        guard isOn else { return try body() }
        let previous = WeakMemoryModel.currentThread
        WeakMemoryModel.currentThread = nil
        defer { WeakMemoryModel.currentThread = previous }
        return try body()
    }

    /// Makes the oldest `count` stores of `thread` visible (all if nil).
    public static func drain(_ thread: Int, count: Int? = nil) {
        guard isOn else { return }
        WeakMemoryModel.drain(thread: thread, count: count)
    }

    public static func drainAll() {
        guard isOn else { return }
        WeakMemoryModel.drainAll()
    }

    public static func pending(_ thread: Int) -> Int {
        guard isOn else { return 0 }
        return WeakMemoryModel.pendingStores(thread: thread)
    }
}

extension Substring {
    fileprivate func trimmingCharacters(in set: Character) -> String {
        var s = self
        while s.first == set { s.removeFirst() }
        while s.last == set { s.removeLast() }
        return String(s)
    }
}
