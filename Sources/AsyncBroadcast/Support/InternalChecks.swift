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
func internalInvariant(_ condition: @autoclosure () -> Bool, _ message: @autoclosure () -> String,
                       file: StaticString = #fileID, line: UInt = #line) {
    if internalChecksEnabled && !condition() {
        internalInconsistency(message(), file: file, line: line)
    }
}
