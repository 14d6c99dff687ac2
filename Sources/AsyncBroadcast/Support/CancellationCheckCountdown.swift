/// When an iterator looks at its task's cancellation flag: on its first
/// `next()`, then every 32 calls.
///
/// Reading the flag is an expensive 16-byte atomic load, too costly for
/// every element; a reader waiting in `next()` notices cancellation at once
/// anyway, through its cancellation handler. So a cancelled consumer that is
/// never made to wait returns at most 31 more elements. Shared by the
/// iterators of `BroadcastSequence` and `BroadcastValue` subscriptions.
@usableFromInline
struct CancellationCheckCountdown {
    /// Calls left before the next look.
    @usableFromInline var callsLeft = 0

    @inlinable init() {}

    /// `true` on the calls that should read the task's cancellation flag.
    @inlinable
    mutating func isDue() -> Bool {
        if callsLeft > 0 {
            callsLeft -= 1
            return false
        }
        callsLeft = 31
        return true
    }
}
