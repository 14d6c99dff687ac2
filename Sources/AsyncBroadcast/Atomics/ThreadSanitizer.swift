internal import CAtomics

/// ThreadSanitizer hooks from the C shim: real in a `--sanitize=thread`
/// build, empty calls otherwise.
@usableFromInline
enum ThreadSanitizer {
    @usableFromInline static func ignoreAccessesBegin() { cab_tsan_ignore_accesses_begin() }
    @usableFromInline static func ignoreAccessesEnd() { cab_tsan_ignore_accesses_end() }
    @usableFromInline static var isActive: Bool { cab_tsan_is_active() }
}
