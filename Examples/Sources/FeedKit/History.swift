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
public final class History: Sendable {
    public let limits: HistoryLimits
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
    }

    private let state = NIOLockedValueBox(State())

    /// `now` is a monotonic time since any fixed origin (a test's clock; by
    /// default the process's `ContinuousClock`).
    public init(limits: HistoryLimits, now: @escaping @Sendable () -> Duration = History.monotonicNow) {
        self.limits = limits
        self.now = now
    }

    private static let origin = ContinuousClock.now
    public static let monotonicNow: @Sendable () -> Duration = { ContinuousClock.now - origin }

    /// Records a message; called by the topic's LISTEN loop, in `seq` order,
    /// before the message is delivered to the hub.
    public func append(_ message: FeedMessage) {
        let now = self.now()
        let limits = self.limits
        state.withLockedValue { state in
            state.last = message.seq
            guard limits.isEnabled else {
                state.floor = message.seq
                return
            }
            state.entries.append(Entry(message: message, at: now))
            Self.evict(&state, now: now, limits: limits)
        }
    }

    /// Notifications were lost (the LISTEN connection broke): nothing up to
    /// the last `seq` so far can be recovered across the hole, and the window
    /// empties.
    public func markLost() {
        state.withLockedValue { state in
            state.entries.removeAll()
            // `since == last` missed what was lost as well.
            state.floor = state.last + 1
        }
    }

    /// What a client that has seen every message up to `since` missed, as the
    /// window stands now.
    public enum Read: Sendable {
        /// Every message after `since`, up to `last` (none if `since == last`).
        case covered(messages: [FeedMessage], last: Int)
        /// The window cannot say: the client must fetch its state again.
        case notCovered(last: Int, reason: String)
    }

    public func read(since: Int) -> Read {
        let now = self.now()
        let limits = self.limits
        return state.withLockedValue { state in
            Self.evict(&state, now: now, limits: limits)
            if since > state.last {
                return .notCovered(last: state.last, reason: "since \(since) is ahead of this topic's last seq \(state.last)")
            }
            if since < state.floor {
                let reason: String
                if !limits.isEnabled {
                    reason = "this server keeps no history (--history-messages or --history-seconds is 0)"
                } else if let first = state.entries.first {
                    reason = "seq \(since + 1) is no longer held: the window starts at \(first.message.seq)"
                } else {
                    reason = "seq \(since + 1) is no longer held: the window is empty"
                }
                return .notCovered(last: state.last, reason: reason)
            }
            var messages: [FeedMessage] = []
            messages.reserveCapacity(state.last - since)
            for entry in state.entries where entry.message.seq > since { messages.append(entry.message) }
            return .covered(messages: messages, last: state.last)
        }
    }

    /// The last `seq` appended so far.
    public var last: Int { state.withLockedValue { $0.last } }
    /// Messages held now (evicted by age only when the next message arrives or a client reads).
    public var count: Int { state.withLockedValue { $0.entries.count } }
    /// ``FeedMessage/bytes`` of the messages held now.
    public var bytes: Int { state.withLockedValue { $0.entries.reduce(0) { $0 + $1.message.bytes } } }

    private static func evict(_ state: inout State, now: Duration, limits: HistoryLimits) {
        while let first = state.entries.first,
              state.entries.count > limits.messages || now - first.at > limits.maximumAge {
            state.entries.removeFirst()
            state.floor = max(state.floor, first.message.seq)
        }
    }
}
