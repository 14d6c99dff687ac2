/// What one `send(_:)` or `emit(_:)` did.
///
/// ```swift
/// let result = sequence.send(event)
/// if result.dropped > 0 { metrics.increment("events.dropped", by: result.dropped) }
/// ```
public struct BroadcastSendResult: Sendable, Hashable {
    /// Subscribers that now hold the element in their buffer, or were handed
    /// it while waiting in `next()`. A `.bufferingNewest` subscriber that had
    /// to evict its oldest element counts here and in `dropped`.
    /// <!-- restates: SEQ-COUNT-DELIVERED -->
    public var delivered: Int
    /// Subscribers whose buffering policy dropped an element for this send:
    /// the new element (`.bufferingOldest`, or capacity 0 with no reader
    /// waiting) or their oldest unread one (`.bufferingNewest`).
    /// <!-- restates: SEQ-COUNT-DROPPED -->
    public var dropped: Int
    /// The sequence had already finished: nothing was delivered.
    /// <!-- restates: SEQ-COUNT-FINISHED -->
    public var isFinished: Bool
    /// Subscribers that this send ended by their eviction limit
    /// (``BroadcastEviction``): they did not receive the element.
    /// <!-- restates: EVICT-ISEVICTED -->
    ///
    /// ```swift
    /// let result = sequence.send(event)
    /// if result.evicted > 0 { log.notice("\(result.evicted) slow clients dropped") }
    /// ```
    public var evicted: Int

    public init(delivered: Int = 0, dropped: Int = 0, isFinished: Bool = false) {
        self.delivered = delivered
        self.dropped = dropped
        self.isFinished = isFinished
        self.evicted = 0
    }

    /// A result with an eviction count.
    ///
    /// ```swift
    /// #expect(sequence.send(1) == BroadcastSendResult(delivered: 1, evicted: 1))
    /// ```
    public init(delivered: Int = 0, dropped: Int = 0, isFinished: Bool = false, evicted: Int) {
        self.delivered = delivered
        self.dropped = dropped
        self.isFinished = isFinished
        self.evicted = evicted
    }

    @usableFromInline
    static var finished: BroadcastSendResult { BroadcastSendResult(isFinished: true) }
}
