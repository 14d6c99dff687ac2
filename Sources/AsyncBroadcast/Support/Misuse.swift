/// Traps on a programmer error, printing `AsyncBroadcast misuse: <message>`.
///
/// `precondition` prints nothing in `-O` builds, so a user who hits one in a
/// release build sees only "Illegal instruction". `fatalError` prints its
/// message in every configuration but `-Ounchecked`, which is why every
/// misuse check in the library goes through here.
@usableFromInline @inline(never)
func misuse(_ message: String, file: StaticString = #fileID, line: UInt = #line) -> Never {
    fatalError("AsyncBroadcast misuse: \(message)", file: file, line: line)
}

/// Traps when the library's own bookkeeping is broken: a bug in
/// AsyncBroadcast, never in the caller's code. Printed in every configuration.
@usableFromInline @inline(never)
func internalInconsistency(_ message: String, file: StaticString = #fileID, line: UInt = #line) -> Never {
    fatalError("AsyncBroadcast internal inconsistency (please report): \(message)", file: file, line: line)
}
