@_spi(Testing) import AsyncBroadcast
import AsyncBroadcastTestSupport

// Sharing rounds: a shared `BroadcastSequence` fed by a test upstream
// (`init(upstream:)` or `broadcast()`) or by a fake callback listener
// (`init(register:)`, sending from its own threads, sometimes inside
// `register`, sometimes after its unregister), started eagerly, lazily or
// while subscribed (stop at once, after 1 ms of real time, or on a
// ManualClock a driver thread advances).
//
// Waves of subscribers (every policy, `.bounded` of 1-3 included) join
// (subscribe, for-await, handed a subscription, from a cancelled task),
// read a few elements and leave (cancel(), dropped, task cancelled while
// reading or while holding unread elements), concurrently with the
// upstream delivering, so whileSubscribed runs stop and restart; a few
// subscribers read until the end. The round finishes the sequence, fails
// it or releases it (mid-round or after the churn) unless a run ended or
// failed by itself first. Between waves, when no subscriber is left, probes
// check that whileSubscribed starts and stops inside subscribe()/cancel().
//
// Checked (SharingChecker for the records): per subscriber, elements in
// (run, index) order with no duplicate, none produced after its run was
// stopped, no gap for policies that never drop; every subscriber that saw
// the end saw the same one, one a current source produced (never a stopped
// run's end); every started run is stopped (every upstream iteration
// freed, every register matched by exactly one unregister, never two
// callbacks at once, every listener thread gone); the sharing counters end
// with starts == stops and no live upstream or timer task; subscriberCounts
// is conflated, converges to subscriberCount, ends at 0 after the finish;
// nothing (sequence, payloads) outlives the round. A hang fails through
// the watchdog.

/// A reference that does not keep the sequence alive: subscribers reach
/// the sequence through it, so the round can release it under them.
final class WeakStream: Sendable {
    weak let stream: SharedStream?
    init(_ stream: SharedStream) { self.stream = stream }
}

/// Subscriber tasks alive now, and subscriptions ever made.
final class SharingCensus: Sendable {
    private let state = Locked((live: 0, created: 0, joined: 0))
    func created() { state.withLock { $0.created += 1 } }
    /// A subscriber task got past its join (subscribed, or found nothing to join).
    func joined() { state.withLock { $0.joined += 1 } }
    var joinedCount: Int { state.withLock { $0.joined } }
    func enter() { state.withLock { $0.live += 1 } }
    func leave() { state.withLock { $0.live -= 1 } }
    var live: Int { state.withLock { $0.live } }
    var createdCount: Int { state.withLock { $0.created } }
}

/// Reads `subscriberCounts` in its own task.
final class CountsObserver: Sendable {
    private let state: Locked<(values: [Int], ended: Bool)>
    let task: Task<Void, Never>

    init(_ subscription: BroadcastValue<Int, Never>.Subscription) {
        let state = Locked<(values: [Int], ended: Bool)>(([], false))
        let box = TakeOnce(subscription)
        self.state = state
        task = Task {
            guard let subscription = box.take() else { return }
            for await count in subscription { state.withLock { $0.values.append(count) } }
            state.withLock { $0.ended = true }
        }
    }

    var values: [Int] { state.withLock { $0.values } }
    var last: Int? { state.withLock { $0.values.last } }
    var ended: Bool { state.withLock { $0.ended } }
}

/// Advances a ManualClock from its own thread, at random moments, while
/// the round runs; paused during probes that need time to stand still.
@available(macOS 13, iOS 16, tvOS 16, watchOS 9, *)
final class ClockDriver: Sendable {
    let clock: ManualClock
    let step: Duration
    private let state = Locked((paused: false, stop: false, running: false, advances: 0))

    init(clock: ManualClock, step: Duration) {
        self.clock = clock
        self.step = step
    }

    func start(seed: UInt64) {
        state.withLock { $0.running = true }
        spawnThread { [self] in
            var rng = SplitMix64(seed: seed)
            while true {
                let stop = state.withLock { state -> Bool in
                    if state.stop { return true }
                    // Under the lock: once pause() returns, no advance is in progress.
                    if !state.paused, clock.sleeperCount > 0, rng.chance(0.5) {
                        clock.advance(by: rng.chance(0.25) ? step / 2 : step)
                        state.advances += 1
                    }
                    return false
                }
                if stop { break }
                // Pacing only (how often time moves); nothing waits on it.
                usleepSeconds(Double(rng.int(in: 5...200)) / 1_000_000)
            }
            state.withLock { $0.running = false }
        }
    }

    func pause() { state.withLock { $0.paused = true } }
    func resume() { state.withLock { $0.paused = false } }
    func stop() { state.withLock { $0.stop = true } }
    var running: Bool { state.withLock { $0.running } }
    var advances: Int { state.withLock { $0.advances } }
}

enum SharingJoin: Sendable {
    case subscribe(BroadcastBufferingPolicy?)
    /// `makeAsyncIterator()` on the sequence (its default policy).
    case forAwait
    /// Subscribed by the round before the task started.
    case handOff(TakeOnce<SharedStream.Subscription>)
    /// The task cancels itself, then subscribes: not counted, starts nothing.
    case cancelledTask(BroadcastBufferingPolicy?)

    var name: String {
        switch self {
        case .subscribe: return "subscribe"
        case .forAwait: return "for-await"
        case .handOff: return "handed off"
        case .cancelledTask: return "cancelled task"
        }
    }
}

enum SharingLeave: Sendable, CaseIterable {
    /// `cancel()` after its reads.
    case cancel
    /// Drops subscription and iterator after its reads.
    case drop
    /// Reads until its task is cancelled.
    case taskCancel
    /// Stops reading after its reads, stays subscribed until its task is cancelled.
    case hold
}

@available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
final class SharingRoundRunner {
    private struct Handle {
        let id: Int
        let role: SharingRole
        let task: Task<SharingSubscriberRecord, Never>
    }

    let plan: SharingRoundPlan
    let options: Options
    let tracker: SharingTracker
    let census = SharingCensus()
    let clock: ManualClock?
    let driver: ClockDriver?
    let phase = Locked("setup")
    private var sequence: SharedStream?
    private let reference: WeakStream
    private var rng: SplitMix64
    private var out = ViolationList()
    private var nextID = 0
    private var records: [SharingSubscriberRecord] = []
    private var livesThrough: [Handle] = []
    private var observer: CountsObserver? {
        get { observerBox.value }
        set { observerBox.value = newValue }
    }
    /// Shared with the watchdog's description.
    private let observerBox = Locked<CountsObserver?>(nil)
    private var explicitEnd: SelfEnd?
    private var released = false
    private var probes = 0

    static func run(_ plan: SharingRoundPlan, header: [String], options: Options) async -> RoundReport {
        await SharingRoundRunner(plan: plan, options: options).run(header: header)
    }

    private init(plan: SharingRoundPlan, options: Options) {
        self.plan = plan
        self.options = options
        tracker = SharingTracker(plan: plan)
        rng = SplitMix64(seed: plan.seed ^ 0x5A4E_D00D)
        if plan.start == .whileSubscribedManual {
            let clock = ManualClock()
            self.clock = clock
            driver = ClockDriver(clock: clock, step: .seconds(1))
        } else {
            clock = nil
            driver = nil
        }
        let stream = Self.makeSequence(plan: plan, tracker: tracker, start: Self.start(plan.start, clock: clock))
        sequence = stream
        reference = WeakStream(stream)
    }

    private static func start(_ kind: SharingStartKind, clock: ManualClock?) -> BroadcastStart {
        switch kind {
        case .eagerly: return .eagerly
        case .lazily: return .lazily
        case .whileSubscribedZero: return .whileSubscribed(stopAfter: .zero)
        case .whileSubscribedDelay(let ms): return .whileSubscribed(stopAfter: .milliseconds(ms))
        case .whileSubscribedManual: return .whileSubscribed(stopAfter: .seconds(1), clock: clock!)
        }
    }

    private static func makeSequence(plan: SharingRoundPlan, tracker: SharingTracker, start: BroadcastStart) -> SharedStream {
        switch plan.source {
        case .upstream:
            return SharedStream(
                bufferingPolicy: plan.defaultPolicy, replay: plan.replay, started: start,
                upstream: { TrackedUpstream(tracker: tracker) })
        case .broadcast:
            return TrackedUpstream(tracker: tracker).broadcast(bufferingPolicy: plan.defaultPolicy, replay: plan.replay, started: start)
        case .listener:
            return SharedStream(
                bufferingPolicy: plan.defaultPolicy, replay: plan.replay, started: start,
                register: { sink in FakeListener.register(sink, tracker: tracker) })
        }
    }

    private func describeState() -> String {
        Self.describe(weak: reference, tracker: tracker, census: census, observer: observer, clock: clock, driver: driver)
    }

    private static func describe(
        weak: WeakStream, tracker: SharingTracker, census: SharingCensus, observer: CountsObserver?,
        clock: ManualClock?, driver: ClockDriver?
    ) -> String {
        var parts: [String] = []
        if let stream = weak.stream {
            let c = stream.sharingCounters
            parts.append(
                "subscriberCount \(stream.subscriberCount), isFinished \(stream.isFinished), waitingEmitterCount \(stream.waitingEmitterCount), "
                    + "sharingCounters starts \(c.starts) stops \(c.stops) liveUpstreamTasks \(c.liveUpstreamTasks) liveTimerTasks \(c.liveTimerTasks) isRunning \(c.isRunning) isStopPending \(c.isStopPending)")
        } else {
            parts.append("sequence released")
        }
        parts.append(tracker.snapshot.description)
        parts.append("subscriber tasks alive \(census.live)")
        if let observer { parts.append("subscriberCounts observer: ended \(observer.ended), last values \(observer.values.suffix(6))") }
        if let clock, let driver { parts.append("ManualClock sleepers \(clock.sleeperCount), advances \(driver.advances)") }
        return parts.joined(separator: "; ")
    }

    // MARK: The round

    private func run(header: [String]) async -> RoundReport {
        let roundStart = monotonicSeconds()
        watchdog.beginRound(
            .init(
                number: 0, header: header, deadlineAt: roundStart + options.deadline,
                deadline: options.deadline,
                sequenceState: {
                    [phase, reference, tracker, census, observerBox, clock, driver] in
                    "phase \(phase.value); "
                        + Self.describe(
                            weak: reference, tracker: tracker, census: census, observer: observerBox.value,
                            clock: clock, driver: driver)
                }))
        defer { watchdog.endRound() }
        let phaseToken = watchdog.register { [phase] in "sharing round, phase: \(phase.value)" }
        defer { watchdog.unregister(phaseToken) }

        weak let weakSequence = sequence
        await checkStartup()
        if plan.observer { observer = CountsObserver(sequence!.subscriberCounts) }
        driver?.start(seed: plan.seed ^ 0xC10C)

        // Churn.
        var previous: [Handle] = []
        for wave in 0..<plan.waves {
            phase.value = "wave \(wave) of \(plan.waves)"
            if wave == plan.livesThroughWave { startLivesThrough() }
            if wave == plan.endWave {
                await endSequence(during: "wave \(wave)")
                if released { break }
            }
            let overlap = rng.chance(plan.overlapChance)
            if !overlap {
                await endWave(previous)
                previous = []
                await probe()
                await awaitTimedStop()
            }
            let joinedBefore = census.joinedCount
            let current = spawnWave()
            // Every subscriber of the wave joins before the wave may end,
            // then it runs for a random while with the upstream delivering.
            let census = self.census
            let expected = joinedBefore + current.count
            _ = await waitUntil("the wave's subscribers join", seconds: options.deadline * 0.1) { census.joinedCount >= expected }
            for _ in 0..<rng.int(in: 0...rng.pick([8, 64, 512])) {
                tracker.pace.grant()
                await Task.yield()
            }
            if overlap { await endWave(previous) }
            previous = current
        }
        await endWave(previous)
        if plan.livesThroughWave == plan.waves { startLivesThrough() }

        // The end.
        if explicitEnd == nil {
            phase.value = "before the round's end"
            await checkBeforeEnd()
            await endSequence(during: "after the churn")
        }
        await drain()
        await teardown()

        // Release: nothing may outlive the round.
        phase.value = "release"
        let observerValues = observer?.values
        observer = nil
        sequence = nil
        if !(await waitUntil("the sequence is freed after the round released it", seconds: 1, { weakSequence == nil })) {
            out.add("leak", "the sequence is still alive after the round released it")
        }
        if !(await waitUntil("every payload is freed", seconds: 1, { LiveObjects.count.value == 0 })) {
            out.add("leak", "\(LiveObjects.count.value) payload objects still alive after the round released everything")
            LiveObjects.count.withLock { $0 = 0 }  // report each leak once
        }

        let violations =
            out.all + tracker.violations
            + SharingChecker.check(
                .init(
                    plan: plan, records: records, selfEnds: tracker.selfEnds, explicitEnd: explicitEnd,
                    observerValues: observerValues, subscribersCreated: census.createdCount))
        recordCoverage()
        return RoundReport(
            violations: violations, duration: monotonicSeconds() - roundStart,
            ops: census.createdCount, delivered: tracker.produced.load(ordering: .relaxed),
            received: records.reduce(0) { $0 + $1.received.count })
    }

    /// Right after init: `.eagerly` has started; the others start nothing
    /// before a counted subscriber (not one from a cancelled task).
    private func checkStartup() async {
        let stream = sequence!
        let counters = stream.sharingCounters
        let snapshot = tracker.snapshot
        if plan.start == .eagerly {
            if counters.starts != 1 { out.add("eagerly", "\(counters.starts) starts right after init (expected 1)") }
            if plan.source == .listener, snapshot.registerCalls != 1 {
                out.add("eagerly", "register called \(snapshot.registerCalls) times during init (expected once)")
            }
            return
        }
        if counters.starts != 0 || snapshot.registerCalls != 0 {
            out.add("start", "\(plan.start): \(counters.starts) starts (register calls \(snapshot.registerCalls)) right after init, with no subscriber")
        }
        let weak = self.reference
        let task = Task { () -> Int in
            withUnsafeCurrentTask { $0?.cancel() }
            guard let subscription = SharingRoundRunner.subscribeNow(weak, nil) else { return -1 }
            var received = 0
            do throws(StressError) {
                for try await _ in subscription { received += 1 }
            } catch {}
            return received
        }
        let received = await task.value
        let after = stream.sharingCounters
        if after.starts != 0 || after.isRunning {
            out.add("start", "\(plan.start): a subscribe() from a cancelled task started the upstream (starts \(after.starts), isRunning \(after.isRunning)): it is not a counted subscriber")
        }
        if received != 0 { out.add("start", "a subscriber from a cancelled task received \(received) elements before any run started") }
        if stream.subscriberCount != 0 {
            out.add("subscriberCount", "\(stream.subscriberCount) after a cancelled task's subscription ended")
        }
    }

    // MARK: Subscribers

    private func spawnWave() -> [Handle] {
        guard let stream = sequence else { return [] }
        var handles: [Handle] = []
        for _ in 0..<plan.waveSize {
            let policy: BroadcastBufferingPolicy? = rng.chance(0.25) ? nil : rng.pick(sharingPolicies(&rng))
            let join: SharingJoin
            switch rng.weighted([35, 20, 35, 10]) {
            case 0: join = .subscribe(policy)
            case 1: join = .forAwait
            case 2: join = .handOff(TakeOnce(stream.subscribe(bufferingPolicy: policy)))
            default: join = .cancelledTask(policy)
            }
            handles.append(
                spawn(
                    .churn, join, policy: policy, leave: rng.pick(SharingLeave.allCases),
                    reads: rng.int(in: 0...plan.readMax)))
        }
        return handles
    }

    private func startLivesThrough() {
        guard let stream = sequence, !stream.isFinished else { return }
        for _ in 0..<plan.livesThrough {
            let policy: BroadcastBufferingPolicy? = rng.chance(0.25) ? nil : rng.pick(sharingPolicies(&rng))
            let join: SharingJoin
            switch rng.int(in: 0...2) {
            case 0: join = .subscribe(policy)
            case 1: join = .forAwait
            default: join = .handOff(TakeOnce(stream.subscribe(bufferingPolicy: policy)))
            }
            livesThrough.append(spawn(.livesThrough, join, policy: policy, leave: .taskCancel, reads: .max))
        }
    }

    private func spawn(
        _ role: SharingRole, _ join: SharingJoin, policy: BroadcastBufferingPolicy?,
        leave: SharingLeave, reads: Int
    ) -> Handle {
        let id = nextID
        nextID += 1
        census.created()
        census.enter()  // here, not in the task: a task that has not started yet is alive too
        let resolved: BroadcastBufferingPolicy
        if case .forAwait = join { resolved = plan.defaultPolicy } else { resolved = policy ?? plan.defaultPolicy }
        let record = SharingSubscriberRecord(id: id, role: role, join: join.name, policy: resolved)
        let (weak, census) = (self.reference, self.census)
        let task = Task { await SharingRoundRunner.subscriber(record, join, leave: leave, reads: reads, weak: weak, census: census) }
        return Handle(id: id, role: role, task: task)
    }

    private static func subscribeNow(_ weak: WeakStream, _ policy: BroadcastBufferingPolicy?) -> SharedStream.Subscription? {
        weak.stream?.subscribe(bufferingPolicy: policy)
    }

    private static func iteratorNow(_ weak: WeakStream) -> SharedStream.Subscription.AsyncIterator? {
        weak.stream?.makeAsyncIterator()
    }

    private static func subscriber(
        _ initial: SharingSubscriberRecord, _ join: SharingJoin, leave: SharingLeave, reads: Int,
        weak: WeakStream, census: SharingCensus
    ) async -> SharingSubscriberRecord {
        defer { census.leave() }
        var record = initial
        var subscription: SharedStream.Subscription?
        var iterator: SharedStream.Subscription.AsyncIterator?
        switch join {
        case .subscribe(let policy):
            subscription = subscribeNow(weak, policy)
        case .forAwait:
            iterator = iteratorNow(weak)
        case .handOff(let box):
            subscription = box.take()
        case .cancelledTask(let policy):
            withUnsafeCurrentTask { $0?.cancel() }
            subscription = subscribeNow(weak, policy)
        }
        if let subscription { iterator = subscription.makeAsyncIterator() }
        census.joined()
        guard iterator != nil else { return record }

        var count = 0
        reading: while true {
            if count >= reads {
                switch leave {
                case .cancel where subscription != nil:
                    subscription!.cancel()
                    // cancel() ends the subscriber at once: its buffer is gone.
                    let after = await nextAfterEnd(&iterator!)
                    if let after { record.notes.append("next() returned \(after) after cancel()") }
                    record.end = .left
                    break reading
                case .cancel, .drop:
                    record.end = .left
                    break reading
                case .hold:
                    await awaitCancellation()
                    record.end = .left
                    break reading
                case .taskCancel:
                    break
                }
            }
            do throws(StressError) {
                guard let item = try await iterator!.next() else {
                    record.end = .finished
                    if let after = await nextAfterEnd(&iterator!) { record.notes.append("next() returned \(after) after nil") }
                    break reading
                }
                if let problem = item.integrityProblem { record.notes.append(problem) }
                record.received.append(SharedTag(run: item.run, index: item.index, stale: item.stale))
                count += 1
            } catch {
                record.end = .failed(error.code)
                if let after = await nextAfterEnd(&iterator!) { record.notes.append("next() returned \(after) after the error") }
                break reading
            }
        }
        record.taskCancelled = Task.isCancelled
        if !record.taskCancelled, record.end.terminal != nil, let stream = weak.stream, !stream.isFinished {
            record.endedUnfinished = true
        }
        return record
    }

    /// What `next()` returns once the subscriber has ended: nil, or a description.
    private static func nextAfterEnd(_ iterator: inout SharedStream.Subscription.AsyncIterator) async -> String? {
        do throws(StressError) {
            guard let item = try await iterator.next() else { return nil }
            return "r\(item.run)#\(item.index)"
        } catch {
            return SharingCode.describe(error.code)
        }
    }

    /// Cancels a wave's tasks and collects their records.
    private func endWave(_ handles: [Handle]) async {
        guard !handles.isEmpty else { return }
        for handle in handles { handle.task.cancel() }
        let census = self.census
        let token = watchdog.register { "sharing round: \(handles.count) cancelled subscriber tasks of a wave have not returned (\(census.live) subscriber tasks alive)" }
        defer { watchdog.unregister(token) }
        for handle in handles { records.append(await handle.task.value) }
    }

    // MARK: Probes

    /// With no subscriber left: whileSubscribed starts inside subscribe()
    /// and stops inside cancel() (`.zero`), or keeps the run through a
    /// pending stop (ManualClock, time standing still).
    private func probe() async {
        guard livesThrough.isEmpty, let stream = sequence, !stream.isFinished else { return }
        guard plan.start == .whileSubscribedZero || plan.start == .whileSubscribedManual else { return }
        let count = stream.subscriberCount
        if count != 0 {
            out.add("subscriberCount", "\(count) after every subscriber task returned (none left; expected 0 at once)")
            return
        }
        probes += 1
        phase.value += " (probe)"
        let listener = plan.source == .listener
        func finished() -> Bool { stream.isFinished }
        if plan.start == .whileSubscribedZero {
            let before = stream.sharingCounters
            let idle = tracker.snapshot
            if finished() { return }
            if before.isRunning || (listener && idle.active != nil) {
                out.add("whileSubscribed(.zero) stop", "no subscriber, yet a run is still up (isRunning \(before.isRunning), active registration \(idle.active.map(String.init) ?? "none"))")
            }
            let subscription = stream.subscribe(bufferingPolicy: .bufferingNewest(1))
            let started = stream.sharingCounters
            let running = tracker.snapshot
            if finished() { return }
            if !started.isRunning || started.starts != before.starts + 1 {
                out.add("whileSubscribed start", "after the first subscribe() returned: isRunning \(started.isRunning), starts \(before.starts) -> \(started.starts) (expected a new run, started inside subscribe())")
            }
            if listener, running.active == nil || running.registerCalls != idle.registerCalls + 1 {
                out.add("whileSubscribed start", "after the first subscribe() returned: register calls \(idle.registerCalls) -> \(running.registerCalls), active registration \(running.active.map(String.init) ?? "none") (register runs inside subscribe())")
            }
            subscription.cancel()
            let stopped = stream.sharingCounters
            let after = tracker.snapshot
            if finished() { return }
            if stopped.isRunning || stopped.stops != stopped.starts {
                out.add("whileSubscribed(.zero) stop", "after the last subscriber's cancel() returned: isRunning \(stopped.isRunning), starts \(stopped.starts), stops \(stopped.stops) (the stop happens inside cancel())")
            }
            if listener, after.active != nil || after.unregisterCalls != after.registerCalls {
                out.add("whileSubscribed(.zero) stop", "after the last subscriber's cancel() returned: registration \(after.active.map(String.init) ?? "none") still active, register calls \(after.registerCalls), unregister calls \(after.unregisterCalls) (unregister runs inside cancel())")
            }
        } else if let driver {
            // A stop timer that fired before the pause may still be
            // reconciling on its own thread (one reconciler at a time), so
            // each step waits for its settled state; with time standing
            // still nothing else can change it.
            driver.pause()
            defer { driver.resume() }
            let limit = options.deadline * 0.1
            // A starting run counts as running before its register call.
            let tracker = self.tracker
            func registered() -> Bool { !listener || tracker.snapshot.active != nil }
            let first = stream.subscribe(bufferingPolicy: .bufferingNewest(1))
            let isUp = await waitUntil("the probe's subscriber starts or keeps a run", seconds: limit) {
                let c = stream.sharingCounters
                return stream.isFinished || (c.isRunning && !c.isStopPending && registered())
            }
            let running = stream.sharingCounters
            if finished() { return }
            if !isUp {
                out.add("whileSubscribed start", "a subscriber arrived (none before), yet no run: isRunning \(running.isRunning), isStopPending \(running.isStopPending)")
            }
            first.cancel()
            let isPending = await waitUntil("the last subscriber's leaving makes a pending stop", seconds: limit) {
                let c = stream.sharingCounters
                return stream.isFinished || (c.isRunning && c.isStopPending && registered())
            }
            let pending = stream.sharingCounters
            if finished() { return }
            if !isPending {
                out.add("whileSubscribed delay", "after the last subscriber left, with time standing still: isRunning \(pending.isRunning), isStopPending \(pending.isStopPending) (expected a pending stop, the run going on)")
            }
            let again = stream.subscribe(bufferingPolicy: .bufferingNewest(1))
            let isKept = await waitUntil("a subscriber cancels the pending stop", seconds: limit) {
                let c = stream.sharingCounters
                return stream.isFinished || (c.isRunning && !c.isStopPending && registered())
            }
            let resumed = stream.sharingCounters
            let snapshot = tracker.snapshot
            if finished() { return }
            if !isKept || resumed.starts != pending.starts || resumed.stops != pending.stops {
                out.add("whileSubscribed delay", "a subscriber arriving during the pending stop must keep the run: isRunning \(resumed.isRunning), isStopPending \(resumed.isStopPending), starts \(pending.starts) -> \(resumed.starts), stops \(pending.stops) -> \(resumed.stops)")
            }
            if listener, snapshot.active == nil {
                out.add("whileSubscribed delay", "a subscriber arriving during the pending stop: no registration active")
            }
            again.cancel()
        }
    }

    /// Sometimes, with no subscriber left: the delayed stop must come
    /// (real time passes, or the driver advances the clock), so the next
    /// wave starts a fresh run.
    private func awaitTimedStop() async {
        guard livesThrough.isEmpty, let stream = sequence, !stream.isFinished, stream.subscriberCount == 0 else { return }
        switch plan.start {
        case .whileSubscribedDelay, .whileSubscribedManual: break
        default: return
        }
        guard rng.chance(0.5) else { return }
        let stopped = await waitUntil("the delayed stop happens", seconds: options.deadline * 0.1) {
            let c = stream.sharingCounters
            return stream.isFinished || (!c.isRunning && !c.isStopPending)
        }
        if !stopped {
            let c = stream.sharingCounters
            out.add("whileSubscribed delay", "no subscriber for \(formatSeconds(options.deadline * 0.1)), yet the run was not stopped: isRunning \(c.isRunning), isStopPending \(c.isStopPending), liveTimerTasks \(c.liveTimerTasks)\(driver.map { ", ManualClock advanced \($0.advances) times, sleepers \(clock!.sleeperCount)" } ?? "")")
        } else {
            Coverage.add("sharing:timed-stops")
        }
    }

    // MARK: The end

    private func checkBeforeEnd() async {
        guard let stream = sequence else { return }
        // Only stopped runs ended (their end counts for nothing), or none did.
        if tracker.selfEnds.isEmpty, stream.isFinished {
            out.add("stopped run's end ignored", "the sequence finished before the round's end, though no run ended while it could count (only stopped runs ended, or none); \(tracker.snapshot.description)")
        }
        if let observer {
            let converged = await waitUntil("subscriberCounts converges to subscriberCount", seconds: options.deadline * 0.2) {
                observer.last == stream.subscriberCount || observer.ended
            }
            if !converged {
                out.add("subscriberCounts", "its latest value \(observer.last.map(String.init) ?? "none") never reached subscriberCount \(stream.subscriberCount) (last values \(observer.values.suffix(6)))")
            }
        }
    }

    private func endSequence(during moment: String) async {
        phase.value = "ending the sequence (\(plan.end), \(moment))"
        defer { tracker.pace.openForGood() }
        switch plan.end {
        case .finish:
            explicitEnd = .finished
            sequence?.finish()
        case .finishThrowing:
            explicitEnd = .failed(SharingCode.explicit)
            sequence?.finish(throwing: StressError(code: SharingCode.explicit))
        case .release:
            explicitEnd = .finished
            released = true
            sequence = nil
            // A subscriber task may hold it for an instant (subscribing).
            let weak = self.reference
            if !(await waitUntil("the released sequence is freed", seconds: options.deadline * 0.2, { weak.stream == nil })) {
                out.add("leak", "the sequence outlived its last reference (released \(moment))")
            }
        }
    }

    /// After the end: subscribers that live through get the end; late
    /// subscribers get the replay and the same end at once; the observer ends.
    private func drain() async {
        phase.value = "draining"
        let census = self.census
        if !(await waitUntil("every subscriber task returns after the end", seconds: options.deadline * 0.3, { census.live == 0 })) {
            out.add("liveness", "\(census.live) subscriber tasks still running \(formatSeconds(options.deadline * 0.3)) after the sequence ended; \(describeState())")
            for handle in livesThrough { handle.task.cancel() }
        }
        await endWave(livesThrough)
        livesThrough = []
        if let stream = sequence {
            for _ in 0..<plan.lateSubscribers {
                let policy: BroadcastBufferingPolicy? = rng.chance(0.5) ? nil : rng.pick(sharingPolicies(&rng))
                let join: SharingJoin = rng.chance(0.5) ? .subscribe(policy) : .handOff(TakeOnce(stream.subscribe(bufferingPolicy: policy)))
                let handle = spawn(.late, join, policy: policy, leave: .taskCancel, reads: .max)
                let record = await handle.task.value
                records.append(record)
                if record.received.count > plan.replay {
                    out.add("late subscriber", "\(record.label) subscribed after the end and received \(record.received.count) elements; only the \(plan.replay) replayed may come")
                }
            }
            let count = stream.subscriberCount
            if count != 0 { out.add("subscriberCount", "\(count) after every subscriber task returned (expected 0 at once)") }
        }
        if let observer {
            if !(await waitUntil("subscriberCounts ends", seconds: options.deadline * 0.2, { observer.ended })) {
                out.add("subscriberCounts", "did not end after the sequence finished and every subscriber left (last values \(observer.values.suffix(6)), subscriberCount \(sequence.map { String($0.subscriberCount) } ?? "released"))")
                observer.task.cancel()
            }
            await observer.task.value
        }
        if let stream = sequence {
            // A fresh observer of a finished, empty sequence: 0, then the end.
            let late = stream.subscriberCounts
            let task = Task { () -> [Int] in
                var values: [Int] = []
                for await count in late { values.append(count) }
                return values
            }
            let values = await withTaskCancellationTimeout(task, seconds: options.deadline * 0.1)
            if values != [0] {
                out.add("subscriberCounts", "observed after the end with no subscriber left: \(values.map { "\($0)" } ?? "did not end") (expected [0], then the end)")
            }
        }
    }

    /// Every run stopped and gone, every counter settled.
    private func teardown() async {
        phase.value = "teardown"
        driver?.stop()
        let tracker = self.tracker
        let weak = self.reference
        let clock = self.clock
        let driver = self.driver
        func countersSettled() -> Bool {
            guard let stream = weak.stream else { return true }
            let c = stream.sharingCounters
            return c.starts == c.stops && c.liveUpstreamTasks == 0 && c.liveTimerTasks == 0 && !c.isRunning && !c.isStopPending
        }
        let settled = await waitUntil("every run stops and every upstream, listener and timer is gone", seconds: options.deadline * 0.3) {
            tracker.snapshot.isQuiet && countersSettled() && (clock?.sleeperCount ?? 0) == 0 && !(driver?.running ?? false)
        }
        let snapshot = tracker.snapshot
        if !settled {
            if !snapshot.upstreamsNotReleased.isEmpty {
                out.add("every run stopped", "upstream runs \(snapshot.upstreamsNotReleased.prefix(8)) still iterated after the sequence ended (not ended: \(snapshot.upstreamsNotEnded.prefix(8)), parked until cancelled: \(snapshot.parked)): their tasks were never cancelled")
            }
            if !snapshot.neverUnregistered.isEmpty || snapshot.active != nil {
                out.add("every run stopped", "registrations \(snapshot.neverUnregistered.prefix(8)) never unregistered (register calls \(snapshot.registerCalls), unregister calls \(snapshot.unregisterCalls)) after the sequence ended")
            }
            if snapshot.liveThreads != 0 {
                out.add("every run stopped", "\(snapshot.liveThreads) listener threads still waiting for their unregister")
            }
            if let clock, clock.sleeperCount != 0 {
                out.add("no timer outlives the sequence", "\(clock.sleeperCount) ManualClock sleepers left after the sequence ended (a stop timer not cancelled)")
            }
            if let stream = weak.stream {
                let c = stream.sharingCounters
                if !countersSettled() {
                    out.add("sharingCounters", "after the end: starts \(c.starts), stops \(c.stops), liveUpstreamTasks \(c.liveUpstreamTasks), liveTimerTasks \(c.liveTimerTasks), isRunning \(c.isRunning), isStopPending \(c.isStopPending) (expected starts == stops, nothing live)")
                }
            }
            if driver?.running ?? false { out.add("harness", "the clock driver thread did not stop") }
        }
        if let stream = weak.stream {
            let c = stream.sharingCounters
            switch plan.source {
            case .upstream, .broadcast:
                if c.starts != snapshot.upstreamStarts {
                    out.add("one iteration per start", "sharingCounters.starts \(c.starts), but the upstream was iterated \(snapshot.upstreamStarts) times")
                }
            case .listener:
                if c.starts != snapshot.registerCalls || c.stops != snapshot.unregisterCalls {
                    out.add("one register per start", "sharingCounters starts \(c.starts) / stops \(c.stops), but register was called \(snapshot.registerCalls) times, unregister \(snapshot.unregisterCalls)")
                }
            }
        }
    }

    // MARK: Helpers

    /// Polls `condition` (yielding, never sleeping) until it holds or
    /// `seconds` pass; the watchdog names what is awaited.
    private func waitUntil(_ what: String, seconds: Double, _ condition: () -> Bool) async -> Bool {
        let token = watchdog.register { "sharing round: waiting until \(what)" }
        defer { watchdog.unregister(token) }
        let deadline = monotonicSeconds() + seconds
        while !condition() {
            if monotonicSeconds() > deadline { return condition() }
            await Task.yield()
        }
        return true
    }

    /// The task's value if it returns within `seconds`; else cancels it and returns nil.
    private func withTaskCancellationTimeout<T: Sendable>(_ task: Task<T, Never>, seconds: Double) async -> T? {
        let done = Locked(false)
        let watcher = Task { () -> T in
            let value = await task.value
            done.value = true
            return value
        }
        if await waitUntil("a task returns", seconds: seconds, { done.value }) { return await watcher.value }
        task.cancel()
        _ = await watcher.value
        return nil
    }

    private func recordCoverage() {
        Coverage.add("sharing:rounds:\(plan.source.rawValue):\(plan.start)")
        let snapshot = tracker.snapshot
        Coverage.add("sharing:upstream-runs", snapshot.upstreamStarts)
        Coverage.add("sharing:registrations", snapshot.registerCalls)
        Coverage.add("sharing:probes", probes)
        if let driver { Coverage.add("sharing:clock-advances", driver.advances) }
        Coverage.add("sharing:end:nil", records.filter { $0.sawTerminal == .finished }.count)
        Coverage.add(
            "sharing:end:error",
            records.filter {
                if case .failed = $0.sawTerminal { return true }; return false
            }.count)
        Coverage.add("sharing:left", records.filter { $0.end == .left }.count)
        if !tracker.selfEnds.isEmpty { Coverage.add("sharing:self-ended") }
    }
}
