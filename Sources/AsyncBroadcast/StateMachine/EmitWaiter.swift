/// An `emit` waiting for every `.bounded` subscriber to have room.
///
/// Allocated only on `emit`'s slow path. All mutable fields are guarded by
/// the sequence lock. The emitting task keeps the waiter alive until it
/// resumes, so the element's last release happens there, unlocked.
final class EmitWaiter<Element: Sendable>: @unchecked Sendable {
    let element: Element
    var continuation: UnsafeContinuation<EmitOutcome, Never>?
    /// Tombstone: the emitter was cancelled before its continuation was queued.
    var isCancelled = false

    init(element: Element) { self.element = element }
}
