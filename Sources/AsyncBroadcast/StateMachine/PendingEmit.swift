/// An `emit` queued because a `.bounded` subscriber was full.
///
/// Stored by value in the sequence's queue, so waiting allocates nothing.
/// The entry is queued *before* the emitter creates its continuation (the
/// lock cannot be held across `withUnsafeContinuation`), so it may be served
/// or cancelled while `continuation` is still `nil`; the outcome then waits
/// in `BroadcastState.decidedEmits` until the emitter comes for it.
struct PendingEmit<Element: Sendable> {
    let id: Int
    var element: Element?
    var continuation: UnsafeContinuation<EmitOutcome, Never>?
}
