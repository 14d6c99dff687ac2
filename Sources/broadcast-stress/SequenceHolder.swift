import AsyncBroadcastTestSupport

/// The round's strong reference to the sequence, shared by producers and
/// in-consumer joiners without capturing the sequence in long-lived closures,
/// so that dropping the last reference is under the harness's control.
final class SequenceHolder: Sendable {
    private let reference: Locked<Stream?>

    init(_ sequence: Stream) { reference = Locked(sequence) }

    func get() -> Stream? { reference.withLock { $0 } }

    func clear() { reference.withLock { $0 = nil } }

    /// `sequence.makeAsyncIterator()`; the sequence itself is not retained
    /// after this returns.
    func makeIterator() -> Stream.Subscription.AsyncIterator? {
        get()?.makeAsyncIterator()
    }
}
