import AsyncBroadcast
import AsyncBroadcastTestSupport
import Foundation
import Synchronization

// The test upstream and the fake listener of sharing rounds, and the
// tracker that records every run they start and end.

/// An element of a shared sequence: which run produced it, its position in
/// that run, and whether it was produced after its run had been stopped.
struct SharedItem: Sendable {
    let run: Int
    let index: Int
    /// Upstream: yielded after its task was cancelled. Listener: sent after
    /// its unregister closure was called. Either way the stop was decided
    /// before, so no subscriber may receive it.
    let stale: Bool
    let object: Payload?

    init(run: Int, index: Int, stale: Bool, withObject: Bool) {
        self.run = run
        self.index = index
        self.stale = stale
        object = withObject ? Payload(key: SharedItem.key(run: run, index: index)) : nil
    }

    static func key(run: Int, index: Int) -> Int { run << 32 | index }

    var integrityProblem: String? {
        guard let object, object.key != SharedItem.key(run: run, index: index) else { return nil }
        return "element r\(run)#\(index) carries the payload of r\(object.key >> 32)#\(object.key & 0xFFFF_FFFF)"
    }
}

typealias SharedStream = BroadcastSequence<SharedItem, StressError>

/// How the sequence may end by its own source (not the round's own end).
enum SelfEnd: Sendable, Hashable, CustomStringConvertible {
    case finished
    case failed(Int)

    var description: String {
        switch self {
        case .finished: return "nil"
        case .failed(let code): return SharingCode.describe(code)
        }
    }
}

/// Records what the upstream runs and listener registrations did, from
/// whatever thread they run on; collects the violations they notice.
final class SharingTracker: Sendable {
    enum UpstreamEnd: Sendable {
        case ended, failed, cancelled
    }

    struct UpstreamRecord {
        var end: UpstreamEnd?
        /// The iterator was freed: the library's task let go of the run.
        var released = false
    }

    struct ListenerRecord {
        var unregisterCalls = 0
    }

    private struct State {
        var upstreams: [Int: UpstreamRecord] = [:]
        var upstreamStarts = 0
        var parked = 0
        var registrations: [Int: ListenerRecord] = [:]
        var registerCalls = 0
        var unregisterCalls = 0
        var active: Int?
        var liveThreads = 0
        var selfEnds: Set<SelfEnd> = []
        var violations = ViolationList()
    }

    let plan: SharingRoundPlan
    let pace: SharingPace
    private let state = Locked(State())
    /// register/unregister closures running right now: never more than one.
    private let inFlight = Atomic<Int>(0)
    private let inFlightName = Locked<String>("")
    /// Elements made by every run (delivered or not), for the progress line.
    let produced = Atomic<Int>(0)

    init(plan: SharingRoundPlan) {
        self.plan = plan
        pace = SharingPace(burst: plan.burst, perTick: plan.perTick)
    }

    func add(_ invariant: String, _ detail: String) {
        state.withLock { $0.violations.add(invariant, detail) }
    }

    var violations: [Violation] { state.withLock { $0.violations.all } }

    // MARK: Upstream runs

    func startUpstreamRun() -> UpstreamRun {
        let id = state.withLock { state -> Int in
            state.upstreamStarts += 1
            state.upstreams[state.upstreamStarts] = UpstreamRecord()
            return state.upstreamStarts
        }
        return UpstreamRun(id: id, plan: plan.run(id), tracker: self, withObjects: plan.withObjects)
    }

    func upstreamEnded(_ id: Int, _ end: UpstreamEnd) {
        state.withLock { $0.upstreams[id]?.end = end }
    }

    func upstreamReleased(_ id: Int) {
        state.withLock { $0.upstreams[id]?.released = true }
    }

    func parking(_ delta: Int) { state.withLock { $0.parked += delta } }

    /// A run reached its own end: the sequence may finish with it.
    func selfEnd(_ end: SelfEnd) { _ = state.withLock { $0.selfEnds.insert(end) } }

    var selfEnds: Set<SelfEnd> { state.withLock { $0.selfEnds } }

    // MARK: Listener registrations

    /// Entering a register or unregister closure. Nothing may be in flight.
    func enterCallback(_ name: String) {
        let (previous, _) = inFlight.wrappingAdd(1, ordering: .sequentiallyConsistent)
        if previous != 0 {
            add("register/unregister never concurrent", "\(name) started while \(inFlightName.value) was still running (\(previous + 1) in flight)")
        }
        inFlightName.value = name
    }

    func leaveCallback() {
        inFlight.wrappingSubtract(1, ordering: .sequentiallyConsistent)
    }

    func registered() -> Int {
        state.withLock { state in
            state.registerCalls += 1
            let id = state.registerCalls
            if let active = state.active {
                state.violations.add("register/unregister alternate", "register (registration \(id)) called while registration \(active) was not unregistered")
            }
            state.active = id
            state.registrations[id] = ListenerRecord()
            return id
        }
    }

    func unregistered(_ id: Int) {
        state.withLock { state in
            state.unregisterCalls += 1
            state.registrations[id, default: ListenerRecord()].unregisterCalls += 1
            let calls = state.registrations[id]!.unregisterCalls
            if calls > 1 {
                state.violations.add("unregister exactly once", "the unregister closure of registration \(id) was called \(calls) times")
            }
            if state.active != id {
                state.violations.add("register/unregister alternate", "unregister of registration \(id) called while the active registration is \(state.active.map(String.init) ?? "none")")
            } else {
                state.active = nil
            }
        }
    }

    func threadStarted() { state.withLock { $0.liveThreads += 1 } }
    func threadExited() { state.withLock { $0.liveThreads -= 1 } }

    // MARK: Queries

    struct Snapshot {
        var upstreamStarts: Int
        var upstreamsNotReleased: [Int]
        var upstreamsNotEnded: [Int]
        var parked: Int
        var registerCalls: Int
        var unregisterCalls: Int
        var neverUnregistered: [Int]
        var active: Int?
        var liveThreads: Int

        /// Nothing of any run is left: every upstream iterator freed, every
        /// registration unregistered, every listener thread gone.
        var isQuiet: Bool {
            upstreamsNotReleased.isEmpty && neverUnregistered.isEmpty && active == nil && liveThreads == 0
        }

        var description: String {
            var parts: [String] = []
            if upstreamStarts > 0 {
                parts.append("upstream runs started \(upstreamStarts), not freed \(upstreamsNotReleased.prefix(8)), not ended \(upstreamsNotEnded.prefix(8)), parked \(parked)")
            }
            if registerCalls > 0 {
                parts.append("register calls \(registerCalls), unregister calls \(unregisterCalls), never unregistered \(neverUnregistered.prefix(8)), active \(active.map(String.init) ?? "none"), listener threads alive \(liveThreads)")
            }
            return parts.isEmpty ? "no run started" : parts.joined(separator: "; ")
        }
    }

    var snapshot: Snapshot {
        state.withLock { state in
            Snapshot(
                upstreamStarts: state.upstreamStarts,
                upstreamsNotReleased: state.upstreams.filter { !$0.value.released }.map(\.key).sorted(),
                upstreamsNotEnded: state.upstreams.filter { $0.value.end == nil }.map(\.key).sorted(),
                parked: state.parked,
                registerCalls: state.registerCalls, unregisterCalls: state.unregisterCalls,
                neverUnregistered: state.registrations.filter { $0.value.unregisterCalls == 0 }.map(\.key).sorted(),
                active: state.active, liveThreads: state.liveThreads)
        }
    }
}

// MARK: - Upstream

/// The test upstream: each iteration is a new run, recorded in the tracker.
@available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
struct TrackedUpstream: AsyncSequence, Sendable {
    typealias Element = SharedItem
    typealias Failure = StressError

    let tracker: SharingTracker

    func makeAsyncIterator() -> Iterator { Iterator(run: tracker.startUpstreamRun()) }

    struct Iterator: AsyncIteratorProtocol {
        typealias Element = SharedItem
        typealias Failure = StressError

        let run: UpstreamRun

        mutating func next() async throws(StressError) -> SharedItem? { try await run.next() }

        mutating func next(isolation actor: isolated (any Actor)?) async throws(StressError) -> SharedItem? {
            try await run.next()
        }
    }
}

/// One iteration of the test upstream: `length` elements, then its ending.
/// Honours cancellation (after `cancelLag` more elements, tagged stale).
///
/// `@unchecked Sendable`: only the library's upstream task calls `next()`,
/// one call at a time.
final class UpstreamRun: @unchecked Sendable {
    let id: Int
    let plan: SharingRunPlan
    let tracker: SharingTracker
    let withObjects: Bool
    private var index = 0
    private var lagLeft: Int
    private var done = false
    private let paceBase: Int

    init(id: Int, plan: SharingRunPlan, tracker: SharingTracker, withObjects: Bool) {
        self.id = id
        self.plan = plan
        self.tracker = tracker
        self.withObjects = withObjects
        lagLeft = plan.cancelLag
        paceBase = tracker.pace.ticks
    }

    deinit { tracker.upstreamReleased(id) }

    func next() async throws(StressError) -> SharedItem? {
        if done { return nil }
        if Task.isCancelled {
            if lagLeft > 0 {
                lagLeft -= 1
                return make(stale: true)
            }
            return try endCancelled()
        }
        if index >= plan.length {
            switch plan.ending {
            case .end:
                done = true
                tracker.selfEnd(.finished)
                tracker.upstreamEnded(id, .ended)
                return nil
            case .fail:
                done = true
                let code = SharingCode.upstreamFailed(id)
                tracker.selfEnd(.failed(code))
                tracker.upstreamEnded(id, .failed)
                throw StressError(code: code)
            case .park:
                await parkUntilCancelled()
                return try endCancelled()
            }
        }
        await tracker.pace.wait(for: index, since: paceBase)
        if Task.isCancelled { return try await next() }
        if plan.yieldEvery > 0 && index % plan.yieldEvery == 0 { await Task.yield() }
        // Read after the yield: a cancellation seen here means the stop was
        // decided before this element exists.
        return make(stale: Task.isCancelled)
    }

    private func make(stale: Bool) -> SharedItem {
        defer { index += 1 }
        tracker.produced.wrappingAdd(1, ordering: .relaxed)
        return SharedItem(run: id, index: index, stale: stale, withObject: withObjects)
    }

    private func endCancelled() throws(StressError) -> SharedItem? {
        done = true
        tracker.upstreamEnded(id, .cancelled)
        if plan.throwWhenCancelled { throw StressError(code: SharingCode.afterCancel(id)) }
        return nil
    }

    /// An idle upstream: only the task's cancellation (the stop) ends it.
    private func parkUntilCancelled() async {
        tracker.parking(1)
        defer { tracker.parking(-1) }
        await awaitCancellation()
    }
}

/// Suspends until the current task is cancelled (at once if it already is).
func awaitCancellation() async {
    enum Park {
        case idle
        case waiting(CheckedContinuation<Void, Never>)
        case cancelled
    }
    let park = Locked(Park.idle)
    await withTaskCancellationHandler {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let resumeNow = park.withLock { state -> Bool in
                if case .cancelled = state { return true }
                state = .waiting(continuation)
                return false
            }
            if resumeNow { continuation.resume() }
        }
    } onCancel: {
        let waiting = park.withLock { state -> CheckedContinuation<Void, Never>? in
            defer { state = .cancelled }
            if case .waiting(let continuation) = state { return continuation }
            return nil
        }
        waiting?.resume()
    }
}

// MARK: - Listener

/// One `register` call of the fake listener: sends from its own threads
/// (and sometimes inside `register`, sometimes after its unregister).
///
/// `@unchecked Sendable`: every mutable field is guarded by `condition`.
final class FakeListener: @unchecked Sendable {
    let id: Int
    let plan: SharingRunPlan
    let sink: BroadcastSink<SharedItem, StressError>
    let tracker: SharingTracker
    let withObjects: Bool
    private let condition = NSCondition()
    private var stopped = false
    private var nextIndex = 0
    private var endIssued = false
    private var lateDone = false
    /// A send returned `isFinished`: every later one must too (a stopped
    /// registration, or a finished sequence, stays so).
    private var sawFinished = false
    private let paceBase: Int

    /// The `register` closure of a sharing round.
    static func register(_ sink: BroadcastSink<SharedItem, StressError>, tracker: SharingTracker) -> @Sendable () -> Void {
        tracker.enterCallback("register")
        let id = tracker.registered()
        let listener = FakeListener(id: id, plan: tracker.plan.run(id), sink: sink, tracker: tracker)
        for _ in 0..<listener.plan.syncSends { _ = listener.sendNext() }
        for _ in 0..<listener.plan.callbackSpins { yieldThread() }
        for _ in 0..<tracker.plan.listenerThreads {
            tracker.threadStarted()
            spawnThread { listener.threadBody() }
        }
        if listener.plan.finishInRegister && listener.claimEnd() { listener.selfEnd() }
        tracker.leaveCallback()
        return { listener.unregister() }
    }

    private init(id: Int, plan: SharingRunPlan, sink: BroadcastSink<SharedItem, StressError>, tracker: SharingTracker) {
        self.id = id
        self.plan = plan
        self.sink = sink
        self.tracker = tracker
        withObjects = tracker.plan.withObjects
        paceBase = tracker.pace.ticks
    }

    private var isStopped: Bool {
        condition.lock()
        defer { condition.unlock() }
        return stopped
    }

    private var upcoming: Int {
        condition.lock()
        defer { condition.unlock() }
        return nextIndex
    }

    private func unregister() {
        tracker.enterCallback("unregister of registration \(id)")
        tracker.unregistered(id)
        condition.lock()
        stopped = true
        condition.broadcast()
        let late = plan.lateInUnregister && takeLateAction()
        condition.unlock()
        tracker.pace.wakeThreads()
        if late { performLateAction() }
        for _ in 0..<plan.callbackSpins { yieldThread() }
        tracker.leaveCallback()
    }

    /// Sends the next element, unless the registration is stopped or has
    /// sent everything. `false`: nothing sent.
    private func sendNext() -> Bool {
        condition.lock()
        defer { condition.unlock() }
        guard !stopped, nextIndex < plan.length else { return false }
        let index = nextIndex
        nextIndex += 1
        tracker.produced.wrappingAdd(1, ordering: .relaxed)
        let result = sink.send(SharedItem(run: id, index: index, stale: false, withObject: withObjects))
        if result.isFinished {
            sawFinished = true
        } else if sawFinished {
            tracker.add("stopped sink delivers nothing", "registration \(id): send of #\(index) delivered (\(result)) after an earlier send of this registration returned isFinished")
        }
        return true
    }

    private func threadBody() {
        defer { tracker.threadExited() }
        var sent = 0
        while true {
            tracker.pace.waitOnThread(for: upcoming, since: paceBase, stopped: { isStopped })
            guard sendNext() else { break }
            sent += 1
            if plan.yieldEvery > 0 && sent % plan.yieldEvery == 0 { yieldThread() }
        }
        if claimEnd() { selfEnd() }
        condition.lock()
        while !stopped { condition.wait() }
        let late = !plan.lateInUnregister && takeLateAction()
        condition.unlock()
        if late { performLateAction() }
    }

    /// Claims the one self-end of this registration (if its plan has one).
    private func claimEnd() -> Bool {
        condition.lock()
        defer { condition.unlock() }
        guard !stopped, !endIssued, plan.ending != .park else { return false }
        endIssued = true
        return true
    }

    /// Finishes the sequence by itself (it counts if the run is still current).
    private func selfEnd() {
        switch plan.ending {
        case .park:
            break
        case .end:
            tracker.selfEnd(.finished)
            sink.finish()
        case .fail:
            let code = SharingCode.listenerFailed(id)
            tracker.selfEnd(.failed(code))
            sink.finish(throwing: StressError(code: code))
        }
    }

    /// Claims the one late action; call with `condition` held.
    private func takeLateAction() -> Bool {
        guard plan.lateAction != .none, !lateDone else { return false }
        lateDone = true
        return true
    }

    /// After the unregister closure was called: the sink must ignore it.
    private func performLateAction() {
        switch plan.lateAction {
        case .none:
            break
        case .send:
            let result = sink.send(SharedItem(run: id, index: Int(UInt32.max), stale: true, withObject: withObjects))
            if !result.isFinished || result.delivered != 0 {
                tracker.add("stopped sink delivers nothing", "registration \(id): a send after its unregister closure was called returned \(result) (expected isFinished, nothing delivered)")
            }
        case .finish:
            sink.finish()
        case .finishThrowing:
            sink.finish(throwing: StressError(code: SharingCode.afterUnregister(id)))
        }
    }
}

// MARK: - Pace

/// Spreads each run's elements over the round: a run may produce its first
/// `burst` elements at once, then `perTick` more per tick the round grants
/// (it grants while a wave runs), so elements keep flowing while
/// subscribers come and go. Opened for good when the round ends the
/// sequence. Waiting honours cancellation (tasks) and the stop (threads).
final class SharingPace: Sendable {
    private struct State {
        var ticks = 0
        var open = false
        var epoch: UInt64 = 0
        var waiters: [UInt64: CheckedContinuation<Void, Never>] = [:]
        var nextWaiter: UInt64 = 0
    }

    let burst: Int
    let perTick: Int
    private let state = Locked(State())
    /// Listener threads wait on it; `wakeThreads()` after a stop.
    private let condition = NSCondition()

    init(burst: Int, perTick: Int) {
        self.burst = burst
        self.perTick = perTick
    }

    var ticks: Int { state.withLock { $0.ticks } }

    func allows(_ index: Int, since base: Int) -> Bool {
        state.withLock { $0.open || index < burst + ($0.ticks - base) * perTick }
    }

    func grant(_ ticks: Int = 1) { release { $0.ticks += ticks } }

    func openForGood() { release { $0.open = true } }

    private func release(_ change: (inout State) -> Void) {
        let waiters = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            change(&state)
            state.epoch &+= 1
            defer { state.waiters.removeAll() }
            return Array(state.waiters.values)
        }
        for waiter in waiters { waiter.resume() }
        wakeThreads()
    }

    func wakeThreads() {
        condition.lock()
        condition.broadcast()
        condition.unlock()
    }

    /// Until element `index` is allowed or the task is cancelled.
    func wait(for index: Int, since base: Int) async {
        while !allows(index, since: base) && !Task.isCancelled {
            let epoch = state.withLock { $0.epoch }
            let id = state.withLock { state -> UInt64 in
                state.nextWaiter &+= 1
                return state.nextWaiter
            }
            await withTaskCancellationHandler {
                await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                    let resumeNow = state.withLock { state -> Bool in
                        if state.epoch != epoch || state.open { return true }
                        state.waiters[id] = continuation
                        return false
                    }
                    if resumeNow { continuation.resume() }
                }
            } onCancel: {
                state.withLock { $0.waiters.removeValue(forKey: id) }?.resume()
            }
        }
    }

    /// On a listener thread: until element `index` is allowed or `stopped()`.
    func waitOnThread(for index: Int, since base: Int, stopped: () -> Bool) {
        condition.lock()
        while !allows(index, since: base) && !stopped() { condition.wait() }
        condition.unlock()
    }
}
