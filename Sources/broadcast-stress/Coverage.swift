import AsyncBroadcastTestSupport

/// Counts how often the interesting races actually happened, so a passing
/// run shows what it exercised (printed at the end).
enum Coverage {
    private static let counts = Locked<[String: Int]>([:])

    static func add(_ event: String, _ count: Int = 1) {
        guard count > 0 else { return }
        counts.withLock { $0[event, default: 0] += count }
    }

    static var summary: String {
        counts.value.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", ")
    }
}
