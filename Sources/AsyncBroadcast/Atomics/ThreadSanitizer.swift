public import _CAtomics  // public for the inlinable wrappers: see AtomicInt.swift

/// ThreadSanitizer hooks from the C shim: real in a `--sanitize=thread`
/// build, empty calls otherwise.
///
/// Inlinable like the other wrappers, but the C functions stay out of line in
/// `_CAtomics.c`: that file is compiled with the package's sanitizer flags,
/// which is how it knows whether the TSan runtime is there to call.
@usableFromInline
enum ThreadSanitizer {
    @inlinable static func ignoreAccessesBegin() { cab_tsan_ignore_accesses_begin() }
    @inlinable static func ignoreAccessesEnd() { cab_tsan_ignore_accesses_end() }
    @inlinable static var isActive: Bool { cab_tsan_is_active() }
}
