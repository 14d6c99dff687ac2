/// How a subscriber's buffer behaves when its consumer falls behind.
///
/// Every subscriber has its own buffer; a slow subscriber never slows down or
/// drops elements for another one. <!-- restates: SEQ-SLOW-NEVER-AFFECTS-OTHERS -->
///
/// ```swift
/// let events = BroadcastSequence(of: Event.self, bufferingPolicy: .bufferingNewest(10))
/// let ui = events.subscribe()                                  // newest 10
/// let audit = events.subscribe(bufferingPolicy: .unbounded)    // everything
/// ```
public enum BroadcastBufferingPolicy: Sendable, Hashable {
    /// Keep every element until it is read (the default, as for `AsyncStream`).
    /// <!-- restates: SEQ-UNBOUNDED-KEEPS-ALL -->
    case unbounded
    /// Keep the first `n` unread elements; newer elements are dropped while
    /// the buffer is full. With `n == 0` an element reaches this subscriber
    /// only if it is already waiting in `next()`.
    /// <!-- restates: SEQ-OLDEST-KEEPS-FIRST -->
    case bufferingOldest(Int)
    /// Keep the last `n` unread elements; a new element evicts the oldest
    /// unread one while the buffer is full. With `n == 0` an element reaches
    /// this subscriber only if it is already waiting in `next()`.
    /// <!-- restates: SEQ-NEWEST-KEEPS-LAST -->
    case bufferingNewest(Int)
    /// Never drop: `BroadcastSequence.emit(_:)` waits while this subscriber
    /// holds `n` or more unread elements. `send(_:)` still delivers (it never
    /// waits), so `send` can over-fill the buffer. `n` must be at least 1.
    /// <!-- restates: SEQ-BOUNDED-NEVER-DROPS -->
    case bounded(Int)
}

extension BroadcastBufferingPolicy {
    /// Traps with a message naming `argument` if the policy is invalid, in
    /// every build configuration.
    /// <!-- restates: MISUSE-NEGATIVE-CAPACITY -->
    @usableFromInline
    func validate(argument: StaticString) {
        switch self {
        case .unbounded:
            break
        case .bufferingOldest(let n):
            if n < 0 { misuse("\(argument): .bufferingOldest capacity must not be negative (got \(n))") }
        case .bufferingNewest(let n):
            if n < 0 { misuse("\(argument): .bufferingNewest capacity must not be negative (got \(n))") }
        case .bounded(let n):
            if n < 1 { misuse("\(argument): .bounded capacity must be at least 1 (got \(n))") }
        }
    }

    /// Slots to allocate up front: small, since a policy's limit is a maximum
    /// and most subscribers never reach it.
    @usableFromInline
    var initialStorageCapacity: Int {
        switch self {
        case .unbounded: return 16
        case .bufferingOldest(let n), .bufferingNewest(let n), .bounded(let n): return Swift.min(n, 16)
        }
    }
}
