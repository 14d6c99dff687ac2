import Foundation

/// A value behind a lock: the one shared-state box of the tests, the fuzz
/// targets and the stress tool. Not part of AsyncBroadcast's API.
///
/// ```swift
/// let seen = Locked<[Int]>([])
/// seen.withLock { $0.append(1) }
/// ```
public final class Locked<Value>: @unchecked Sendable {
    private let lock = NSLock()
    private var stored: Value

    public init(_ value: Value) { stored = value }

    public func withLock<R>(_ body: (inout Value) throws -> R) rethrows -> R {
        lock.lock()
        defer { lock.unlock() }
        return try body(&stored)
    }

    public var value: Value {
        get { withLock { $0 } }
        set { withLock { $0 = newValue } }
    }
}
