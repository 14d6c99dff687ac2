public import _CAtomics  // public for the inlinable wrappers: see AtomicInt.swift

/// A lock, up to `wordCount` atomic words (all starting at 0) and optional
/// extra bytes, in one C allocation.
///
/// Subscribing used to cost a malloc per atomic; a subscriber now gets its
/// lock, every word it needs and its first ring segment (the extra bytes)
/// from one block. Words `8k ..< 8k + 8` share cache line `k + 1` (the lock
/// has line 0), so owners group words by the thread that writes them; the
/// extra bytes start on a line of their own. The owner calls `destroy()`
/// once, in its `deinit`, after deinitializing whatever it put in the extra
/// bytes; the `Lock` and `AtomicInt` views must not be destroyed.
@usableFromInline
struct AtomicBlock: @unchecked Sendable {
    /// `cab_block` is opaque to Swift (an incomplete C type).
    @usableFromInline let raw: OpaquePointer

    @inlinable init(wordCount: Int) { raw = cab_block_create(wordCount) }

    /// - Parameter extraAlignment: a power of two; the extra bytes are also
    ///   aligned to a cache line.
    @inlinable
    init(wordCount: Int, extraBytes: Int, extraAlignment: Int) {
        raw = cab_block_create_extra(wordCount, extraBytes, Swift.max(extraAlignment, 64))
    }

    @inlinable func destroy() {
        #if ASYNCBROADCAST_WEAK_MEMORY
        cab_wm_forget(UnsafeMutableRawPointer(raw), cab_block_size(raw))
        #endif
        cab_block_destroy(raw)
    }

    @inlinable var lock: Lock { Lock(unowned: cab_block_lock(raw)) }

    @inlinable func word(_ index: Int) -> AtomicInt { AtomicInt(unowned: cab_block_word(raw, index)) }

    /// The extra bytes of a block made by `init(wordCount:extraBytes:extraAlignment:)`
    /// with the same `wordCount` and `extraAlignment`.
    @inlinable
    func extra(wordCount: Int, extraAlignment: Int) -> UnsafeMutableRawPointer {
        cab_block_extra(raw, wordCount, Swift.max(extraAlignment, 64))
    }
}
