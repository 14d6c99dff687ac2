import AsyncBroadcastTestSupport

/// Hands a value to exactly one taker, then forgets it (so the taker holds
/// the only reference).
final class TakeOnce<Value>: @unchecked Sendable {
    private let slot: Locked<Value?>
    init(_ value: Value) { slot = Locked(value) }
    func take() -> Value? {
        slot.withLock { value in
            defer { value = nil }; return value
        }
    }
}
