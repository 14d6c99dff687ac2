/// When a subscriber that falls too far behind is ended instead of holding
/// more (Redis' client-output-buffer-limit: hard and soft limits).
///
/// Producers check it inside the sends they already do (no timer, no task),
/// and only for subscribers that have a limit. An evicted subscriber ends as
/// with ``BroadcastSequence/Subscription/cancel()``: it leaves
/// `subscriberCount`, what it held is discarded, emitters waiting on it are
/// released, and its reader gets `nil` (the end of its events, after a last
/// `.lagged(n)` if a gap is pending); but
/// ``BroadcastSequence/Subscription/isEvicted`` is `true`. The element whose
/// send evicts it is not delivered to it. <!-- restates: EVICT-ENDS-LIKE-CANCEL -->
///
/// ```swift
/// // A WebSocket client that holds more than 1,000 unread messages is dropped.
/// let client = feed.subscribe(bufferingPolicy: .unbounded, eviction: .hardLimit(1_000))
/// for await message in client { try await socket.write(message) }
/// if client.isEvicted { try await socket.close(code: .policyViolation) }
/// ```
public struct BroadcastEviction: Sendable, Hashable {
    /// `Int.max` when there is no hard limit.
    @usableFromInline let hard: Int
    /// `Int.max` when there is no soft limit.
    @usableFromInline let soft: Int
    /// The soft limit's duration, in nanoseconds.
    @usableFromInline let softNanoseconds: Int

    @usableFromInline
    init(hard: Int, soft: Int, softNanoseconds: Int) {
        self.hard = hard
        self.soft = soft
        self.softNanoseconds = softNanoseconds
    }

    /// No limit: the subscriber holds what its policy lets it hold.
    ///
    /// ```swift
    /// let subscription = sequence.subscribe(eviction: .never)  // as subscribe()
    /// ```
    public static var never: BroadcastEviction { BroadcastEviction(hard: .max, soft: .max, softNanoseconds: 0) }

    /// Ends the subscriber at the send that would make it hold more than
    /// `unread` elements (`unread ≥ 1`; a smaller value traps with a message).
    /// <!-- restates: EVICT-HARD -->
    ///
    /// A send that its policy drops or that evicts its oldest element does not
    /// make it hold more, so a `.bufferingOldest(n)` or `.bufferingNewest(n)`
    /// subscriber with `n ≤ unread` is never evicted by this limit. <!-- restates: EVICT-LOSSY-NEVER-HARD -->
    ///
    /// ```swift
    /// let subscription = sequence.subscribe(bufferingPolicy: .bounded(64), eviction: .hardLimit(256))
    /// ```
    public static func hardLimit(_ unread: Int) -> BroadcastEviction {
        if unread < 1 { misuse("hardLimit(_:) needs at least 1 unread element (got \(unread))") }
        return BroadcastEviction(hard: unread, soft: .max, softNanoseconds: 0)
    }

    /// Ends it at a send that finds it has held more than `unread` elements
    /// at every send for at least `duration` (`unread ≥ 1`, `duration ≥ 0`).
    ///
    /// The time starts at the first send that finds it holding more than
    /// `unread`; a send that finds it at `unread` or below resets it.
    /// `ContinuousClock` is read only for such over-limit subscribers. <!-- restates: EVICT-SOFT -->
    ///
    /// ```swift
    /// let subscription = sequence.subscribe(eviction: .softLimit(100, for: .seconds(10)))
    /// ```
    @available(macOS 13, iOS 16, tvOS 16, watchOS 9, *)
    public static func softLimit(_ unread: Int, for duration: Duration) -> BroadcastEviction {
        if unread < 1 { misuse("softLimit(_:for:) needs at least 1 unread element (got \(unread))") }
        return BroadcastEviction(hard: .max, soft: unread, softNanoseconds: nanoseconds(duration, argument: "softLimit(_:for:)"))
    }

    /// Both limits; whichever is reached first ends it.
    /// <!-- restates: EVICT-BOTH -->
    ///
    /// ```swift
    /// let subscription = sequence.subscribe(eviction: .limits(hard: 1_000, soft: 100, for: .seconds(10)))
    /// ```
    @available(macOS 13, iOS 16, tvOS 16, watchOS 9, *)
    public static func limits(hard: Int, soft: Int, for duration: Duration) -> BroadcastEviction {
        if hard < 1 { misuse("limits(hard:soft:for:) needs a hard limit of at least 1 (got \(hard))") }
        if soft < 1 { misuse("limits(hard:soft:for:) needs a soft limit of at least 1 (got \(soft))") }
        return BroadcastEviction(hard: hard, soft: soft, softNanoseconds: nanoseconds(duration, argument: "limits(hard:soft:for:)"))
    }

    @available(macOS 13, iOS 16, tvOS 16, watchOS 9, *)
    @usableFromInline
    static func nanoseconds(_ duration: Duration, argument: String) -> Int {
        if duration < .zero { misuse("\(argument) needs a duration of at least zero (got \(duration))") }
        let (seconds, attoseconds) = duration.components
        if seconds >= Int64(Int.max / 1_000_000_000) { return .max }
        return Int(seconds) * 1_000_000_000 + Int(attoseconds / 1_000_000_000)
    }

    @inlinable var isNever: Bool { hard == .max && soft == .max }
}
