import NIOConcurrencyHelpers
import NIOCore

/// How much of each topic's past this process keeps for clients that come
/// back with `GET /feed?topic=T&since=SEQ&epoch=E` (`--history-messages`,
/// `--history-seconds`; either at 0 turns history off).
public struct HistoryLimits: Sendable, Equatable {
    /// The most messages kept per topic: with the largest message
    /// (``FeedMessage/largestBytes``, 16,544 bytes) this bounds a topic's
    /// window at `messages × 16,544` bytes.
    public var messages: Int
    /// How long a message stays recoverable after this process received it.
    public var maximumAge: Duration

    public static let defaultMessages = 1000
    public static let defaultSeconds = 60
    /// Nothing kept: every `since` is answered with `resync`.
    public static let off = HistoryLimits(messages: 0, maximumAge: .zero)

    public init(messages: Int = Self.defaultMessages, maximumAge: Duration = .seconds(Self.defaultSeconds)) {
        self.messages = max(0, messages)
        self.maximumAge = maximumAge
    }

    public var isEnabled: Bool { messages > 0 && maximumAge > .zero }
    /// The most a topic's window can hold, in ``FeedMessage/bytes``.
    public var largestBytes: Int { isEnabled ? messages * FeedMessage.largestBytes : 0 }
}

/// One topic's recent messages, for recovery: the last ``HistoryLimits/messages``
/// received within ``HistoryLimits/maximumAge``, in `seq` order.
///
/// The topic's LISTEN loop appends each message *before* handing it to the
/// hub, so a connection that subscribed first and reads the window second
/// finds every message either in the window or in its subscription (see
/// ``RecoveryPhase``). The frames are the hub's own `ByteBuffer`s: a message
/// still queued for some connection is not stored twice.
///
/// Lives as long as the topic's ``Sequencer``: when the topic goes (no
/// client, no LISTEN), its numbering and its window go together.
///
/// With a ``HistoryBudget``, the window also counts its bytes in the
/// process's total, and the budget trims the process's oldest messages
/// (this window's among them) when the total passes its cap.
public final class History: Sendable {
    public let limits: HistoryLimits
    public let budget: HistoryBudget?
    private let now: @Sendable () -> Duration

    struct Entry {
        let message: FeedMessage
        let at: Duration
    }

    struct State {
        var entries = CircularBuffer<Entry>()
        /// The last `seq` appended (kept with history off too: `ready` carries it).
        var last = 0
        /// The smallest `since` the window can still serve: a client that had
        /// seen less missed a message that is gone (evicted, or lost in an outage).
        var floor = 0
        /// The last `seq` the process-wide cap trimmed (for the reason a client gets).
        var trimmedByCap = 0
        /// ``FeedMessage/bytes`` of `entries`.
        var bytes = 0
    }

    private let state = NIOLockedValueBox(State())

    /// `now` is a monotonic time since any fixed origin (a test's clock; by
    /// default the process's `ContinuousClock`).
    public init(limits: HistoryLimits, budget: HistoryBudget? = nil,
                now: @escaping @Sendable () -> Duration = History.monotonicNow) {
        self.limits = limits
        self.budget = limits.isEnabled ? budget : nil
        self.now = now
        self.budget?.register(self)
    }

    deinit {
        budget?.unregister(ObjectIdentifier(self), holding: state.withLockedValue { $0.bytes })
    }

    private static let origin = ContinuousClock.now
    public static let monotonicNow: @Sendable () -> Duration = { ContinuousClock.now - origin }

    /// Records a message; called by the topic's LISTEN loop, in `seq` order,
    /// before the message is delivered to the hub.
    public func append(_ message: FeedMessage) {
        let now = self.now()
        let limits = self.limits
        let freed = state.withLockedValue { state -> Int in
            state.last = message.seq
            guard limits.isEnabled else {
                state.floor = message.seq
                return 0
            }
            state.entries.append(Entry(message: message, at: now))
            state.bytes += message.bytes
            return Self.evict(&state, now: now, limits: limits)
        }
        // Outside the window's lock: a trim takes other windows' locks.
        if let budget {
            budget.added(message.bytes - freed)
            budget.trimIfOver()
        }
    }

    /// Notifications were lost (the LISTEN connection broke): nothing up to
    /// the last `seq` so far can be recovered across the hole, and the window
    /// empties.
    public func markLost() {
        let freed = state.withLockedValue { state -> Int in
            state.entries.removeAll()
            // `since == last` missed what was lost as well.
            state.floor = state.last + 1
            defer { state.bytes = 0 }
            return state.bytes
        }
        budget?.removed(freed)
    }

    /// What a client that has seen every message up to `since` missed, as the
    /// window stands now.
    public enum Read: Sendable {
        /// Messages after `since`, in order, up to `last` (none if `since ==
        /// last`), or the first of them only, up to the read's `limit` or
        /// `maximumBytes`: read again after the last one to get the rest.
        case covered(messages: [FeedMessage], last: Int)
        /// The window cannot say: the client must fetch its state again.
        case notCovered(last: Int, reason: String)
    }

    /// Reads what a client that has seen every message up to `since` missed:
    /// the messages after `since` up to `through` (default: the last so
    /// far), at most `limit` of them and `maximumBytes` of
    /// ``FeedMessage/bytes`` (at least one), so that a connection reading a
    /// long window holds one page at a time.
    public func read(since: Int, through: Int? = nil, limit: Int = .max, maximumBytes: Int = .max) -> Read {
        let now = self.now()
        let limits = self.limits
        return state.withLockedValue { state in
            let freed = Self.evict(&state, now: now, limits: limits)
            if freed > 0 { budget?.removed(freed) }
            let last = through.map { Swift.min($0, state.last) } ?? state.last
            if since > last {
                return .notCovered(last: state.last, reason: "since \(since) is ahead of this topic's last seq \(state.last)")
            }
            if since < state.floor {
                let reason: String
                if !limits.isEnabled {
                    reason = "this server keeps no history (--history-messages or --history-seconds is 0)"
                } else if since < state.trimmedByCap {
                    reason = "seq \(since + 1) is no longer held: this server's history cap (--history-bytes) trimmed it"
                        + (state.entries.first.map { "; the window starts at \($0.message.seq)" } ?? "")
                } else if let first = state.entries.first {
                    reason = "seq \(since + 1) is no longer held: the window starts at \(first.message.seq)"
                } else {
                    reason = "seq \(since + 1) is no longer held: the window is empty"
                }
                return .notCovered(last: state.last, reason: reason)
            }
            var messages: [FeedMessage] = []
            messages.reserveCapacity(Swift.min(last - since, limit))
            var bytes = 0
            // The window holds consecutive seqs (one per message, appended in
            // order): the page starts at an index, not after a scan, so a
            // window read page by page costs each page's length.
            guard let first = state.entries.first?.message.seq else { return .covered(messages: [], last: last) }
            var index = state.entries.index(state.entries.startIndex, offsetBy: Swift.min(state.entries.count, Swift.max(0, since + 1 - first)))
            while index < state.entries.endIndex {
                let message = state.entries[index].message
                guard message.seq <= last, messages.count < limit,
                      messages.isEmpty || bytes + message.bytes <= maximumBytes else { break }
                messages.append(message)
                bytes += message.bytes
                index = state.entries.index(after: index)
            }
            return .covered(messages: messages, last: last)
        }
    }

    /// The last `seq` appended so far.
    public var last: Int { state.withLockedValue { $0.last } }
    /// Messages held now (evicted by age only when the next message arrives or a client reads).
    public var count: Int { state.withLockedValue { $0.entries.count } }
    /// ``FeedMessage/bytes`` of the messages held now.
    public var bytes: Int { state.withLockedValue { $0.bytes } }

    /// When the window's first message arrived (nil: empty).
    var oldestArrival: Duration? { state.withLockedValue { $0.entries.first?.at } }

    /// The budget's trim: drops this window's messages that arrived up to
    /// `arrival` (all of them if nil), oldest first, while the process
    /// holds more than `total`; returns the bytes freed.
    func trim(arrivedUpTo arrival: Duration?, whileOver total: Int) -> Int {
        guard let budget else { return 0 }
        return state.withLockedValue { state in
            var freed = 0
            while let first = state.entries.first, arrival.map({ first.at <= $0 }) ?? true, budget.held > total {
                state.entries.removeFirst()
                state.floor = max(state.floor, first.message.seq)
                state.trimmedByCap = max(state.trimmedByCap, first.message.seq)
                state.bytes -= first.message.bytes
                freed += first.message.bytes
                budget.removed(first.message.bytes)
            }
            return freed
        }
    }

    /// Drops what is over the window's own limits; returns the bytes freed.
    private static func evict(_ state: inout State, now: Duration, limits: HistoryLimits) -> Int {
        var freed = 0
        while let first = state.entries.first,
              state.entries.count > limits.messages || now - first.at > limits.maximumAge {
            state.entries.removeFirst()
            state.floor = max(state.floor, first.message.seq)
            state.bytes -= first.message.bytes
            freed += first.message.bytes
        }
        return freed
    }
}
