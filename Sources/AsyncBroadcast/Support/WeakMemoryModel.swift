internal import _CAtomics

/// Controls for the weak-memory model that the deterministic checkers run
/// the library under (the fuzz targets and the litmus runner; not API).
///
/// Only a build with `ASYNCBROADCAST_WEAK_MEMORY=1` routes the library's
/// atomics and locks through the model (`isCompiledIn`); elsewhere these calls
/// change nothing. The model (TSO with release-only unlocks, described in
/// `_CAtomics/WeakMemory.c`) gives each *logical thread* a FIFO store buffer:
/// a store stays invisible to other logical threads until a fence, a
/// read-modify-write, a lock or the harness drains it. A harness running
/// several logical threads on one OS thread (tasks on a manual executor)
/// names the thread before running each one, and decides when buffers drain.
@_spi(Testing)
public enum WeakMemoryModel {
    /// Whether the library's atomics go through the model in this build.
    public static var isCompiledIn: Bool {
        #if ASYNCBROADCAST_WEAK_MEMORY
        return true
        #else
        return false
        #endif
    }

    /// How many logical threads the model has.
    public static var threadCount: Int { Int(CAB_WM_THREADS) }

    /// Turns buffering on or off (off drains every buffer first).
    public static func setEnabled(_ on: Bool) { cab_wm_enable(on) }

    /// The calling OS thread's logical thread from now on (`0 ..< threadCount`),
    /// or `nil`: unmodelled, its operations go straight to memory.
    public static var currentThread: Int? {
        get { let t = cab_wm_thread(); return t < 0 ? nil : t }
        set { cab_wm_set_thread(newValue ?? -1) }
    }

    /// Runs `body` as the checker's own observer: loads see the newest store
    /// any thread made, and nothing drains.
    public static func observing<R>(_ body: () throws -> R) rethrows -> R {
        cab_wm_set_observer(true)
        defer { cab_wm_set_observer(false) }
        return try body()
    }

    /// Makes the oldest `count` buffered stores of `thread` visible (all of
    /// them if `count` is `nil`).
    public static func drain(thread: Int, count: Int? = nil) { cab_wm_drain(thread, count ?? -1) }

    public static func drainAll() { cab_wm_drain_all() }

    /// Stores `thread` has made that others cannot see yet.
    public static func pendingStores(thread: Int) -> Int { cab_wm_pending(thread) }

    /// Stores buffered so far, and loads that read memory while another
    /// logical thread had a newer store to the same word buffered (how much
    /// weak behaviour a run exercised).
    public static var statistics: (buffered: UInt64, staleLoads: UInt64) {
        var buffered: UInt64 = 0, stale: UInt64 = 0
        cab_wm_statistics(&buffered, &stale)
        return (buffered, stale)
    }

    /// One ordering of a cross-thread handshake (a row of Handshakes.md)
    /// that a checker can take away, to show that it finds the bug.
    public enum Ordering: Int, CaseIterable, Sendable {
        /// The reader's fence in `Parking.park` (row 1).
        case parkSkipsFence = 1
        /// The producer's fence before it looks for parked readers (row 1).
        case wakeSkipsFence = 2
        /// `finish`'s fence after recording the terminal event (rows 2, 3).
        case finishSkipsFence = 4
        /// The consumer's fence after taking its last element (row 2).
        case popSkipsFence = 8
        /// `cancel()`'s fence before it looks for a parked reader (row 4).
        case cancelSkipsFence = 16
        /// A `.bounded` consumer's sequentially consistent head store (row 5).
        case boundedHeadRelease = 32
        /// An emitter's sequentially consistent announcement (row 5).
        case emitterFlagRelease = 64
        /// Not an ordering: the sequence lock's unlock ignoring the requests
        /// pushed while it was held (`SequenceGate`, Handshakes.md row 13).
        case gateUnlockIgnoresRequests = 128

        /// The `-DASYNCBROADCAST_FAULT_…` name of the same fault.
        public var faultName: String {
            switch self {
            case .parkSkipsFence: return "PARK_SKIPS_FENCE"
            case .wakeSkipsFence: return "WAKE_SKIPS_FENCE"
            case .finishSkipsFence: return "FINISH_SKIPS_FENCE"
            case .popSkipsFence: return "POP_SKIPS_FENCE"
            case .cancelSkipsFence: return "CANCEL_SKIPS_FENCE"
            case .boundedHeadRelease: return "BOUNDED_HEAD_RELEASE"
            case .emitterFlagRelease: return "EMITTER_FLAG_RELEASE"
            case .gateUnlockIgnoresRequests: return "GATE_UNLOCK_IGNORES_REQUESTS"
            }
        }
    }

    /// The orderings taken away now (weak-memory builds only; a normal
    /// build ignores this and keeps every ordering).
    /// Every case that is a memory ordering: what a lock-ordered row must
    /// survive the removal of. (`gateUnlockIgnoresRequests` breaks the
    /// lock itself: a row whose sides take a sequence lock would hang.)
    public static var memoryOrderings: Set<Ordering> {
        Set(Ordering.allCases).subtracting([.gateUnlockIgnoresRequests])
    }

    public static var removedOrderings: Set<Ordering> {
        get { Set(Ordering.allCases.filter { Int(cab_wm_faults()) & $0.rawValue != 0 }) }
        set { cab_wm_set_faults(newValue.reduce(0) { $0 | $1.rawValue }) }
    }

    /// Called before each operation (load, store, RMW, fence, lock) of a
    /// modelled thread that holds none of the library's locks; never nested.
    /// The hook may switch `currentThread`, run another logical thread's
    /// code to completion right there, and switch back: a preemption.
    public static func setPreemptionHook(_ hook: (@convention(c) () -> Void)?) {
        cab_wm_set_preempt_hook(hook)
    }
}
