/// A `withLock` body waiting in the sequence lock's queue, and the slot its
/// result goes to, on the requester's stack (`SequenceGate.withLockQueued`).
///
/// The lock's holder runs it as `run(address)`: `run` captures nothing, so
/// neither side allocates to hand a body over, and the result is written
/// straight into the requester's frame, which outlives the call (the
/// requester returns only after its node is marked `done`).
@usableFromInline
struct QueuedRequest<R> {
    @usableFromInline let body: () -> R
    /// Set by whoever runs `body`: the holder (served) or the requester (granted).
    @usableFromInline var result: R?

    @inlinable
    init(body: @escaping () -> R) {
        self.body = body
        result = nil
    }

    /// Runs the request at `address` (a `QueuedRequest<R>`) and stores its result.
    @inlinable
    static func run(_ address: UnsafeMutableRawPointer) {
        let request = address.assumingMemoryBound(to: Self.self)
        request.pointee.result = request.pointee.body()
    }
}
