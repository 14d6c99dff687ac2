public import _CAtomics  // public for the inlinable wrappers: see AtomicInt.swift

/// ThreadSanitizer hooks from the C shim: real when the TSan runtime is in
/// the process, empty calls otherwise.
///
/// Inlinable like the other wrappers, but the C functions stay out of line in
/// `_CAtomics.c`, which finds the runtime through weak references to its
/// functions (null without it). That works however TSan was turned on:
/// `swift build --sanitize=thread` compiles the shim with TSan, but
/// `-Xswiftc -sanitize=thread` instruments only the Swift code and links the
/// runtime, so how the shim was compiled cannot tell.
@usableFromInline
enum ThreadSanitizer {
    @inlinable static func ignoreAccessesBegin() { cab_tsan_ignore_accesses_begin() }
    @inlinable static func ignoreAccessesEnd() { cab_tsan_ignore_accesses_end() }
    @inlinable static var isActive: Bool { cab_tsan_is_active() }
}
