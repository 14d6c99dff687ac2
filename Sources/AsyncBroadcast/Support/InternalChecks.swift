/// `_checkInvariants()` methods run only when the package is built with
/// `ASYNCBROADCAST_INTERNAL_CHECKS` defined (set the environment variable of
/// the same name to `1` when running `swift build`/`swift test`; see
/// `Package.swift`). CI turns it on for the debug tests, the ThreadSanitizer
/// tests and the fuzz builds. Release builds of users never pay for them.
@inlinable @inline(__always)
var internalChecksEnabled: Bool {
    #if ASYNCBROADCAST_INTERNAL_CHECKS
    return true
    #else
    return false
    #endif
}

/// An invariant of the library's storage. Checked only under
/// `ASYNCBROADCAST_INTERNAL_CHECKS`; a violation traps with `message`.
@inlinable @inline(__always)
func internalInvariant(
    _ condition: @autoclosure () -> Bool, _ message: @autoclosure () -> String,
    file: StaticString = #fileID, line: UInt = #line
) {
    if internalChecksEnabled && !condition() {
        internalInconsistency(message(), file: file, line: line)
    }
}

/// The positions of an `count`-entry table that one invariant check visits:
/// all of them while the table is small, otherwise `window` consecutive
/// ones (wrapping) from `cursor`, which then moves on. A check made on every
/// transition so stays O(1) at thousands of subscribers, which made checked
/// stress runs quadratic, while successive transitions still visit every
/// entry.
@inlinable
func invariantCheckPositions(count: Int, cursor: inout Int, window: Int = 64) -> [Int] {
    guard count > window else { return Array(0..<count) }
    let start = cursor % count
    cursor = start + window
    return (0..<window).map { (start + $0) % count }
}
