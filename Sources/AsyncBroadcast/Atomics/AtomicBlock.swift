public import _CAtomics  // public for the inlinable wrappers: see AtomicInt.swift

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
    /// `cab_block` is opaque to Swift (an incomplete C type).
    @usableFromInline let raw: OpaquePointer

    @inlinable init(wordCount: Int) { raw = cab_block_create(wordCount) }

    @inlinable func destroy() { cab_block_destroy(raw) }

    @inlinable var lock: Lock { Lock(unowned: cab_block_lock(raw)) }

    @inlinable func word(_ index: Int) -> AtomicInt { AtomicInt(unowned: cab_block_word(raw, index)) }
}
