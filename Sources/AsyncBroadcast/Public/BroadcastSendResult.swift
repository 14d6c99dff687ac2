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
    public var delivered: Int
    /// Subscribers whose buffering policy dropped an element for this send:
    /// the new element (`.bufferingOldest`, or capacity 0 with no reader
    /// waiting) or their oldest unread one (`.bufferingNewest`).
    public var dropped: Int
    /// The sequence had already finished: nothing was delivered.
    public var isFinished: Bool

    public init(delivered: Int = 0, dropped: Int = 0, isFinished: Bool = false) {
        self.delivered = delivered
        self.dropped = dropped
        self.isFinished = isFinished
    }

    @usableFromInline
    static var finished: BroadcastSendResult { BroadcastSendResult(isFinished: true) }
}
