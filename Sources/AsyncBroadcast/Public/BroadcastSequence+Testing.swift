// Every `@_spi(Testing)` entry point, for the tests, the fuzz targets and
// the stress tool: hooks that let them wait for an exact state instead of
// sleeping, or read without suspending. Not part of the public contract.

extension BroadcastSequence {
    /// How many `emit` calls are suspended waiting for room.
    @_spi(Testing)
    public var waitingEmitterCount: Int { storage.waitingEmitterCount }
}

extension BroadcastSequence.Subscription {
    /// A non-suspending read: the next buffered element, `.empty`, or the
    /// end. Claims the consumer slot like `next()`, so it traps if a
    /// consumer is inside `next()` at the same time.
    @_spi(Testing)
    public func poll() -> PollResult {
        switch core.poll() {
        case .element(let element): return .element(element)
        case .empty: return .empty
        case .end: return .end
        case .failure(let error): return .failure(error)
        }
    }

    /// Whether this subscription's consumer is suspended in `next()` now.
    @_spi(Testing)
    public var isConsumerWaiting: Bool { core.isConsumerParked }

    @_spi(Testing)
    public enum PollResult {
        case element(Element)
        case empty
        case end
        case failure(Failure)
    }
}

/// A snapshot of a shared sequence's upstream bookkeeping (tests only).
@_spi(Testing)
public struct SharingCounters: Sendable, Equatable {
    /// Runs started: upstream tasks launched, or `register` calls.
    public var starts = 0
    /// Runs stopped: tasks cancelled, or unregister closures called. Every
    /// run is stopped once it is over, so this reaches `starts`.
    public var stops = 0
    /// Upstream tasks launched that have not returned yet.
    public var liveUpstreamTasks = 0
    /// `whileSubscribed(stopAfter:)` timer tasks launched that have not returned yet.
    public var liveTimerTasks = 0
    /// A run is starting or running.
    public var isRunning = false
    /// The last subscriber left and the stop waits for its delay.
    public var isStopPending = false

    public init() {}
}

extension BroadcastSequence {
    /// The upstream bookkeeping of a shared sequence (all zero for a plain one).
    @_spi(Testing)
    public var sharingCounters: SharingCounters { storage.sharingCounters }
}

extension BroadcastSequence {
    /// Tasks waiting now in `Subscription.upstreamReady()` and in
    /// `upstreamStopped()` (a test's proof that a waiter is parked).
    @_spi(Testing)
    public var upstreamWaiterCounts: (ready: Int, stopped: Int) {
        storage.lock.withLock {
            guard let sharing = storage.state.sharing else { return (0, 0) }
            return (sharing.readinessWaiters.table.occupied, sharing.stoppedWaiters.table.occupied)
        }
    }
}
