/// An `emit` queued because a `.bounded` subscriber was full.
///
/// Stored by value in the sequence's queue, so waiting allocates nothing.
/// The entry is queued *before* the emitter creates its continuation (the
/// lock cannot be held across `withUnsafeContinuation`), so it may be served
/// or cancelled while `continuation` is still `nil`; the outcome then waits
/// in `BroadcastState.decidedEmits` until the emitter comes for it.
@usableFromInline
struct PendingEmit<Element: Sendable> {
    @usableFromInline let id: Int
    @usableFromInline var element: Element?
    @usableFromInline var continuation: UnsafeContinuation<Void, Never>?

    @inlinable
    init(id: Int, element: Element?, continuation: UnsafeContinuation<Void, Never>?) {
        self.id = id
        self.element = element
        self.continuation = continuation
    }
}
