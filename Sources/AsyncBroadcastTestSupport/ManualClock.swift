/// A clock whose time moves only when the test says so: `sleep` suspends
/// until `advance(by:)` reaches the deadline, so timer-driven code runs
/// deterministically and without real waiting. Not part of AsyncBroadcast's
/// API.
///
/// ```swift
/// let clock = ManualClock()
/// let timer = Task { try await clock.sleep(for: .seconds(5)) }
/// await clock.waitForSleepers(1)   // the timer is asleep (wrap in a deadline)
/// clock.advance(by: .seconds(5))   // resumes it
/// ```
///
/// Every sleep's continuation is resumed exactly once, by whichever comes
/// first: the `advance` that reaches its deadline or the task's
/// cancellation. Both decide under the one lock and resume outside it.
@available(macOS 13, iOS 16, tvOS 16, watchOS 9, *)
public final class ManualClock: Clock, Sendable {
    /// A point on the manual clock's time line: the time advanced since the
    /// clock was created.
    public struct Instant: InstantProtocol, Sendable, Hashable, CustomStringConvertible {
        public var offset: Duration

        public init(offset: Duration = .zero) { self.offset = offset }

        public func advanced(by duration: Duration) -> Instant { Instant(offset: offset + duration) }
        public func duration(to other: Instant) -> Duration { other.offset - offset }
        public static func < (lhs: Instant, rhs: Instant) -> Bool { lhs.offset < rhs.offset }

        // The operators `ContinuousClock.Instant` has, so tests read alike.
        public static func + (lhs: Instant, rhs: Duration) -> Instant { lhs.advanced(by: rhs) }
        public static func - (lhs: Instant, rhs: Duration) -> Instant { lhs.advanced(by: .zero - rhs) }
        public static func - (lhs: Instant, rhs: Instant) -> Duration { rhs.duration(to: lhs) }

        public var description: String { "ManualClock.Instant(\(offset))" }
    }

    /// One `sleep` call's progress. An entry exists from the call's start
    /// until its continuation is resumed, so a cancellation that arrives
    /// before the continuation is registered finds `.registering` and leaves
    /// a tombstone (`.cancelled`) instead of being lost; one that arrives
    /// after the resumption finds nothing and leaves nothing behind.
    private enum Entry {
        case registering
        case cancelled
        case sleeping(deadline: Instant, continuation: CheckedContinuation<Void, any Error>)
    }

    private struct State {
        var now = Instant()
        var nextID: UInt64 = 0
        var entries: [UInt64: Entry] = [:]
        var sleeperCount = 0
    }

    private let state = Locked(State())

    public init() {}

    public var now: Instant { state.withLock { $0.now } }

    /// Zero: a deadline is reached exactly when `advance` passes it.
    public var minimumResolution: Duration { .zero }

    /// Sleepers currently suspended: a test waits until the code under test
    /// is asleep before it advances, so that the advance is not missed (an
    /// advance before the sleep starts would leave the sleeper waiting for
    /// the next one).
    public var sleeperCount: Int { state.withLock { $0.sleeperCount } }

    /// Suspends until `advance` moves `now` to `deadline` or past it.
    /// Throws `CancellationError` at once if the task is (or becomes)
    /// cancelled, also if the deadline has already passed. `tolerance` is
    /// ignored: deadlines are exact.
    public func sleep(until deadline: Instant, tolerance: Duration? = nil) async throws {
        try Task.checkCancellation()
        let id: UInt64? = state.withLock { state in
            if deadline <= state.now { return nil }
            let id = state.nextID
            state.nextID += 1
            state.entries[id] = .registering
            return id
        }
        guard let id else { return }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                // `advance` may have passed the deadline since the check
                // above; it skipped this entry, so it is decided here.
                let outcome: Result<Void, any Error>? = state.withLock { state in
                    switch state.entries[id] {
                    case .cancelled:
                        state.entries[id] = nil
                        return .failure(CancellationError())
                    case .registering where deadline <= state.now:
                        state.entries[id] = nil
                        return .success(())
                    case .registering:
                        state.entries[id] = .sleeping(deadline: deadline, continuation: continuation)
                        state.sleeperCount += 1
                        return nil
                    case .sleeping, nil:
                        preconditionFailure("ManualClock: sleep \(id) registered twice")
                    }
                }
                if let outcome { continuation.resume(with: outcome) }
            }
        } onCancel: {
            let continuation: CheckedContinuation<Void, any Error>? = state.withLock { state in
                switch state.entries[id] {
                case .registering:
                    state.entries[id] = .cancelled  // the tombstone
                    return nil
                case .sleeping(_, let continuation):
                    state.entries[id] = nil
                    state.sleeperCount -= 1
                    return continuation
                case .cancelled, nil:
                    return nil  // already resumed by `advance`
                }
            }
            continuation?.resume(throwing: CancellationError())
        }
    }

    /// Moves `now` forward by `duration` (not negative) and resumes every
    /// sleeper whose deadline it reaches, earliest deadline first. The
    /// sleepers are resumed before this returns (so `sleeperCount` already
    /// excludes them), but run later, on their executors.
    public func advance(by duration: Duration) {
        precondition(duration >= .zero, "ManualClock.advance(by:) with a negative duration")
        let due: [CheckedContinuation<Void, any Error>] = state.withLock { state in
            state.now = state.now.advanced(by: duration)
            var due: [(deadline: Instant, id: UInt64, continuation: CheckedContinuation<Void, any Error>)] = []
            for (id, entry) in state.entries {
                if case .sleeping(let deadline, let continuation) = entry, deadline <= state.now {
                    due.append((deadline, id, continuation))
                }
            }
            for sleeper in due { state.entries[sleeper.id] = nil }
            state.sleeperCount -= due.count
            // Earliest deadline first; equal deadlines in call order.
            return due.sorted { ($0.deadline, $0.id) < ($1.deadline, $1.id) }.map(\.continuation)
        }
        for continuation in due { continuation.resume() }
    }

    /// Waits (yielding, never sleeping) until at least `count` sleepers are
    /// suspended. Returns early if the task is cancelled; it has no deadline
    /// of its own, so callers wrap it in theirs.
    public func waitForSleepers(_ count: Int) async {
        while sleeperCount < count, !Task.isCancelled {
            await Task.yield()
        }
    }
}
