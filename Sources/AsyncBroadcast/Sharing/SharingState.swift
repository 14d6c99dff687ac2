/// When a shared sequence's upstream runs, as a state machine.
///
/// Guarded by the sequence lock (it lives in `BroadcastState`). Its
/// transitions only decide; the actions they return (start a run, stop one,
/// start or cancel a stop timer) run user code or touch tasks, so
/// `BroadcastStorage.reconcileSharing()` performs them with no lock held.
///
/// One thread at a time performs actions: the *reconciler*. A transition
/// that makes an action necessary claims the role if it is free
/// (`claimReconciler()`); if another thread holds it, that thread finds the
/// new work when it next looks. So `register` and its unregister closure
/// strictly alternate and never overlap, without holding a lock across user
/// code.
///
/// A class, not a struct, though only the sequence lock's holder touches
/// it: every `BroadcastState` has room for one, and a plain sequence's
/// (or topic's) `nil` costs a word instead of the 160-odd bytes of the
/// state inline.
///
/// Invariants (checked by `_checkInvariants()`):
/// - outside the reconciler, no action is needed: `reconciling || !needsAction`;
/// - `.starting` and a timer slot without a task exist only while reconciling;
/// - `starts - stops` is 1 while a run is starting or running, else 0;
/// - `pendingEmit` belongs to the current run.
@usableFromInline
final class SharingState {
    /// A run: one `upstream()` iteration task or one `register` call.
    @usableFromInline
    enum Run {
        case stopped
        /// The reconciler is launching it (outside the lock); its elements count already.
        case starting(generation: UInt64)
        case running(generation: UInt64, handle: RunHandle)
    }

    /// The pending stop of `whileSubscribed(stopAfter:)` with a non-zero delay.
    @usableFromInline
    struct TimerSlot {
        let token: UInt64
        /// `nil` while the reconciler creates the task.
        var task: Task<Void, Never>?
    }

    let mode: BroadcastStart.Mode
    /// Runs are tasks (an upstream's iteration, or an asynchronous
    /// listener's `listen` and take-down), counted in `liveUpstreamTasks`.
    let runsAreTasks: Bool
    /// Runs are listener registrations, whose sink says when they are
    /// ready (`BroadcastSink.ready()`); an upstream's runs are ready at once.
    let hasListener: Bool
    /// Runs are asynchronous listeners: a run is over only once its task
    /// has returned (its take-down awaited), and nothing restarts before.
    let awaitsTakeDown: Bool

    var run: Run = .stopped
    /// Of the latest run; a run's elements and its end count only while it
    /// is current.
    var generation: UInt64 = 0
    var subscriberCount = 0
    var everSubscribed = false
    /// The sequence has finished: nothing starts again.
    var ended = false
    /// `whileSubscribed` with a delay: the last subscriber left, the stop waits.
    var lingering = false
    var lingerToken: UInt64 = 0
    var timer: TimerSlot?
    var reconciling = false
    /// The current run's `emit` that waits for room, cancelled when the run stops.
    @usableFromInline var pendingEmit: Int?
    var counters = SharingCounters()
    /// The run whose sink called `ready()`, while it runs (or, once the
    /// sequence has ended, the last run's); 0 for none. Cleared when a run
    /// stops and the sequence goes on: the next run must say it again.
    @usableFromInline var readyGeneration: UInt64 = 0
    /// `Subscription.upstreamReady()` callers: woken at `ready()`, at the
    /// end, and when a subscriber leaves; each rechecks its own case.
    @usableFromInline var readinessWaiters = SharingWaiters()
    /// `upstreamStopped()` callers: woken when nothing of the upstream runs.
    @usableFromInline var stoppedWaiters = SharingWaiters()

    /// A topic's new generation whose previous one is still stopping its
    /// run (`BroadcastTopics`): nothing starts until the registry clears
    /// this, so a topic's `register` never overlaps its last unregister.
    @usableFromInline var startBlocked: Bool
    /// See `Sharing.startDecided`.
    let startDecided: (@Sendable () -> Void)?

    @usableFromInline
    init<Element, Failure>(
        mode: BroadcastStart.Mode, source: SharedSource<Element, Failure>, startBlocked: Bool = false,
        startDecided: (@Sendable () -> Void)? = nil
    ) {
        self.startDecided = startDecided
        self.mode = mode
        self.runsAreTasks = source.runsAreTasks
        self.hasListener = source.hasListener
        self.awaitsTakeDown = source.awaitsTakeDown
        self.startBlocked = startBlocked
    }

    /// No subscriber, and nothing runs, starts, stops or waits to stop.
    @usableFromInline var isIdle: Bool {
        guard case .stopped = run else { return false }
        return subscriberCount == 0 && !reconciling && !lingering && timer == nil && !takeDownPending
    }

    /// The last run has stopped and its unregister (or cancellation, or
    /// asynchronous take-down) has been performed.
    @usableFromInline var hasStopped: Bool {
        guard case .stopped = run else { return false }
        return !reconciling && !takeDownPending
    }

    /// A stopped asynchronous listener's task has not returned yet: its
    /// `listen` or its take-down still runs. No run starts meanwhile.
    var takeDownPending: Bool {
        awaitsTakeDown && counters.liveUpstreamTasks > 0 && !Fault.sharingRestartBeforeTakeDown
    }

    /// Nothing of the upstream runs: no run, no start or stop being
    /// performed, no upstream or listener task alive (`upstreamStopped()`).
    @usableFromInline var upstreamIsStopped: Bool {
        guard case .stopped = run else { return false }
        return !reconciling && counters.liveUpstreamTasks == 0
    }

    // MARK: Queries

    /// Whether elements and the end of run `generation` still count.
    @usableFromInline
    func isCurrent(_ generation: UInt64) -> Bool {
        switch run {
        case .stopped: return false
        case .starting(let current), .running(let current, _): return current == generation
        }
    }

    var wantsRun: Bool {
        if ended || startBlocked { return false }
        switch mode {
        case .eagerly: return true
        case .lazily: return everSubscribed
        case .whileSubscribed: return subscriberCount > 0 || lingering
        }
    }

    var timerIsStale: Bool {
        guard let timer, timer.task != nil else { return false }
        return !(lingering && timer.token == lingerToken)
    }

    var needsAction: Bool {
        if timerIsStale || (lingering && timer == nil) { return true }
        switch run {
        case .stopped: return wantsRun && !takeDownPending
        case .running: return !wantsRun
        case .starting: return false
        }
    }

    // MARK: Transitions

    /// Call when the registered subscriber count changed.
    func subscribersChanged(from old: Int, to new: Int) {
        subscriberCount = new
        if new > 0 {
            everSubscribed = true
            lingering = false
        } else if old > 0, !ended, case .whileSubscribed(let delay) = mode, !delay.isZero {
            lingerToken &+= 1
            lingering = true
        }
    }

    /// The sequence finished (any way): stop for good.
    @usableFromInline
    func sequenceEnded() {
        ended = true
        lingering = false
    }

    /// The stop timer `token` returned (it slept its delay, or was cancelled).
    func timerReturned(token: UInt64) {
        counters.liveTimerTasks -= 1
        if timer?.token == token { timer = nil }
        if lingering && token == lingerToken { lingering = false }
    }

    /// `true` if the caller must now run `reconcileSharing()`.
    @usableFromInline
    func claimReconciler() -> Bool {
        guard !reconciling || Fault.sharingParallelReconcilers, needsAction else { return false }
        reconciling = true
        return true
    }

    /// The reconciler's next action, or `nil` (and the role is released).
    /// The caller cancels `pendingEmit` when this returns `.stop`.
    func nextAction() -> SharingAction? {
        if timerIsStale, let task = timer?.task {
            timer = nil
            return .cancelTimer(task)
        }
        if lingering && timer == nil {
            timer = TimerSlot(token: lingerToken, task: nil)
            counters.liveTimerTasks += 1
            return .startTimer(token: lingerToken)
        }
        switch run {
        case .stopped where wantsRun && !takeDownPending:
            generation &+= 1
            run = .starting(generation: generation)
            counters.starts += 1
            if runsAreTasks { counters.liveUpstreamTasks += 1 }
            startDecided?()
            return .start(generation: generation)
        case .running(_, let handle) where !wantsRun:
            run = .stopped
            counters.stops += 1
            // A later run serves later subscribers; at the end, the last
            // run's readiness stays for the subscribers that drain.
            if !ended { readyGeneration = 0 }
            return .stop(handle)
        default:
            reconciling = false
            return nil
        }
    }

    /// What the reconciler's last action produced, recorded under the lock.
    func record(_ outcome: SharingActionOutcome) {
        switch outcome {
        case .started(let generation, let handle):
            guard case .starting(generation) = run else {
                internalInconsistency("run \(generation) finished starting but is not the starting run")
            }
            run = .running(generation: generation, handle: handle)
        case .timerStarted(let token, let task):
            // A timer that already returned was cleared from the slot.
            if timer?.token == token { timer?.task = task }
        }
    }

    // MARK: Invariants

    func _checkInvariants() {
        internalInvariant(reconciling || !needsAction, "a sharing action is needed but nobody reconciles")
        let active: Int
        switch run {
        case .stopped: active = 0
        case .starting: active = 1; internalInvariant(reconciling, "a run is starting outside the reconciler")
        case .running: active = 1
        }
        internalInvariant(
            counters.starts - counters.stops == active,
            "starts \(counters.starts) - stops \(counters.stops) != \(active) active run(s)")
        if let timer, timer.task == nil { internalInvariant(reconciling, "a timer is being created outside the reconciler") }
        if pendingEmit != nil { internalInvariant(active == 1, "a pending upstream emit outlives its run") }
        internalInvariant(counters.liveUpstreamTasks >= 0 && counters.liveTimerTasks >= 0, "negative live task count")
    }
}

/// What the reconciler does outside the lock.
@usableFromInline
enum SharingAction {
    /// Launch the upstream task, or call `register`, for run `generation`.
    case start(generation: UInt64)
    /// Cancel the run's task, or call its unregister closure.
    case stop(RunHandle)
    /// Launch the stop timer of `whileSubscribed(stopAfter:)`.
    case startTimer(token: UInt64)
    case cancelTimer(Task<Void, Never>)
}

/// What an action produced, recorded by the reconciler's next look.
@usableFromInline
enum SharingActionOutcome {
    case started(generation: UInt64, handle: RunHandle)
    case timerStarted(token: UInt64, task: Task<Void, Never>)
}

/// How a running run is stopped.
@usableFromInline
enum RunHandle: Sendable {
    /// An upstream's iteration, or an asynchronous listener's task (whose
    /// take-down runs once `listen` has returned): cancelled.
    case task(Task<Void, Never>)
    case listener(unregister: @Sendable () -> Void)
}
