/// What a parked consumer is resumed with.
enum Wake<Element: Sendable>: Sendable {
    /// A producer handed the element straight to the waiting consumer.
    case element(Element)
    /// Something changed (a terminal event, or the buffer refilled while
    /// parking): look at the subscriber again.
    case retry
    /// The consumer's task was cancelled while it waited.
    case cancelled
}

/// How a waiting `emit` ends.
enum EmitOutcome: Sendable {
    case delivered(BroadcastSendResult)
    case cancelled
}

/// Work decided inside a critical section and carried out after it.
///
/// Resuming a continuation or running an element's `deinit` while a lock is
/// held can deadlock (against the runtime's task-status lock taken during
/// cancellation, swift-async-algorithms PR 303) or re-enter the sequence from
/// user code. So state transitions only *record* these effects; the caller
/// runs them once every lock is released. The arrays allocate only when
/// something is recorded, so a send with no wake-ups and no evictions
/// allocates nothing.
struct Effects<Element: Sendable>: ~Copyable {
    private var consumerWakes: [(UnsafeContinuation<Wake<Element>, Never>, Wake<Element>)] = []
    private var emitterWakes: [(UnsafeContinuation<EmitOutcome, Never>, EmitOutcome)] = []
    private var released: [Element] = []

    init() {}

    mutating func resume(_ continuation: UnsafeContinuation<Wake<Element>, Never>, with wake: Wake<Element>) {
        consumerWakes.append((continuation, wake))
    }

    mutating func resume(_ continuation: UnsafeContinuation<EmitOutcome, Never>, with outcome: EmitOutcome) {
        emitterWakes.append((continuation, outcome))
    }

    /// Keeps `element` alive until `run()`, so its deinitializer runs unlocked.
    mutating func release(_ element: consuming Element) {
        released.append(element)
    }

    /// Runs the recorded effects. Call with no lock held.
    consuming func run() {
        for (continuation, wake) in consumerWakes { continuation.resume(returning: wake) }
        for (continuation, outcome) in emitterWakes { continuation.resume(returning: outcome) }
        released = []
    }
}
