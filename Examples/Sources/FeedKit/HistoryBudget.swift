import NIOConcurrencyHelpers
import Synchronization

/// The bytes every topic's recovery window holds together, and their cap
/// (`--history-bytes`): the process's whole history, however many topics
/// there are.
///
/// Each window counts what it holds here as it appends and evicts. When the
/// total passes the cap, the oldest messages of the process go first,
/// whichever windows they are in (the window whose first message is oldest
/// is trimmed up to the next window's first, and so on), down to
/// ``lowWater``, so that a busy process trims once per many messages rather
/// than at every one. A client whose `since` was trimmed gets `resync`
/// (``History/read(since:through:limit:maximumBytes:)``).
///
/// ```swift
/// let budget = HistoryBudget(limit: 64 << 20)
/// let history = History(limits: HistoryLimits(), budget: budget)
/// history.append(message)      // trims the oldest windows if the process is over 64 MiB
/// budget.held                  // bytes held by every window now
/// ```
///
/// Locks: a window calls in here after releasing its own lock; a trim takes
/// `trimming`, then the registry's lock (released before any window's), then
/// one window's lock at a time. No path takes them in another order.
public final class HistoryBudget: Sendable {
    /// The most bytes (``FeedMessage/bytes``) all windows hold together.
    public let limit: Int
    /// A trim stops once the total is at or below this: the cap less 1/16.
    public var lowWater: Int { limit - limit / 16 }

    private let total = Atomic<Int>(0)
    private let trimmedBytes = Atomic<Int>(0)
    private let windows = NIOLockedValueBox<[ObjectIdentifier: WeakHistory]>([:])
    private let trimming = NIOLock()

    public init(limit: Int) {
        self.limit = max(0, limit)
    }

    /// Bytes held by every window now.
    public var held: Int { total.load(ordering: .relaxed) }
    /// Bytes the cap has trimmed so far.
    public var trimmed: Int { trimmedBytes.load(ordering: .relaxed) }

    /// The default cap: 1/128 of the machine's memory, between 32 MiB and
    /// 1 GiB (192 MiB on a machine of 24 GiB).
    public static func defaultLimit(physicalMemory: UInt64) -> Int {
        Int(clamping: min(max(physicalMemory / 128, 32 << 20), 1 << 30))
    }

    func register(_ history: History) {
        windows.withLockedValue { $0[ObjectIdentifier(history)] = WeakHistory(history) }
    }

    func unregister(_ id: ObjectIdentifier, holding bytes: Int) {
        windows.withLockedValue { _ = $0.removeValue(forKey: id) }
        total.subtract(bytes, ordering: .relaxed)
    }

    func added(_ bytes: Int) { total.add(bytes, ordering: .relaxed) }
    func removed(_ bytes: Int) { total.subtract(bytes, ordering: .relaxed) }

    /// Trims the oldest messages while the total is over the cap.
    func trimIfOver() {
        guard held > limit else { return }
        trimming.withLock {
            while held > lowWater {
                // Strong references for the scan; released before any window's lock is taken again.
                let live = windows.withLockedValue { $0.values.compactMap(\.history) }
                let firsts = live.compactMap { history in history.oldestArrival.map { (history: history, at: $0) } }
                guard let oldest = firsts.min(by: { $0.at < $1.at }) else { return }
                // Up to the next window's first message: beyond it, that window's is older.
                let next = firsts.lazy.filter { $0.history !== oldest.history }.map(\.at).min()
                let freed = oldest.history.trim(arrivedUpTo: next, whileOver: lowWater)
                trimmedBytes.add(freed, ordering: .relaxed)
            }
        }
    }
}

private final class WeakHistory: @unchecked Sendable {
    // Written once, in init; `weak` loads are atomic in the Swift runtime.
    weak var history: History?
    init(_ history: History) { self.history = history }
}
