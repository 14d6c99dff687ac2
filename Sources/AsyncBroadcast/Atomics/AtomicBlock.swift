internal import CAtomics

/// A lock and up to `wordCount` atomic words (all starting at 0) in one C
/// allocation.
///
/// Subscribing used to cost a malloc per atomic; a subscriber now gets its
/// lock and every word it needs from one block. Words `8k ..< 8k + 8` share
/// cache line `k + 1` (the lock has line 0), so owners group words by the
/// thread that writes them. The owner calls `destroy()` once, in its
/// `deinit`; the `Lock` and `AtomicInt` views must not be destroyed.
@usableFromInline
struct AtomicBlock: @unchecked Sendable {
    @usableFromInline let raw: OpaquePointer

    @usableFromInline init(wordCount: Int) { raw = cab_block_create(wordCount) }

    @usableFromInline func destroy() { cab_block_destroy(raw) }

    @usableFromInline var lock: Lock { Lock(unowned: OpaquePointer(cab_block_lock(raw))) }

    @usableFromInline func word(_ index: Int) -> AtomicInt {
        AtomicInt(unowned: OpaquePointer(cab_block_word(raw, index)))
    }
}
