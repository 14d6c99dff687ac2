@_spi(Testing) import AsyncBroadcast
import FuzzKit

// The reference model of a shared sequence: when runs start and stop, what
// each run's listener or upstream task sees, and `subscriberCounts`. The
// elements themselves go through `BroadcastModel` (FuzzKit), which the
// other targets already check against the plain sequence; this file adds
// only what sharing decides. It follows the sharing contract (the doc
// comments of `BroadcastStart`, `BroadcastSink` and the sharing
// initializers) and knows nothing of the library's state machine.

/// How the sequence starts its upstream.
enum StartModel: CustomStringConvertible {
    case eagerly
    case lazily
    /// `whileSubscribed(stopAfter:)`; 0 is `.zero` (stop inside the call
    /// that removed the last subscriber), else that many manual-clock seconds.
    case whileSubscribed(seconds: Int)

    var description: String {
        switch self {
        case .eagerly: return ".eagerly"
        case .lazily: return ".lazily"
        case .whileSubscribed(let s): return ".whileSubscribed(stopAfter: \(s == 0 ? ".zero" : ".seconds(\(s))"))"
        }
    }
}

/// How a finish is requested (by a sink, an upstream or the sequence).
enum EndModel: Equatable, CustomStringConvertible {
    case finish
    case fail(Int)

    var code: Int {
        if case .fail(let code) = self { return code }
        return 0
    }

    var terminal: ModelTerminal {
        switch self {
        case .finish: return .finished
        case .fail(let code): return .failed(code)
        }
    }

    var description: String {
        switch self {
        case .finish: return "finish()"
        case .fail(let code): return "finish(throwing: \(code))"
        }
    }
}

/// What one `register` call does, chosen by the input (run k uses plan
/// k mod count).
struct ListenerPlan: CustomStringConvertible {
    /// Elements sent through the new sink inside `register` itself.
    var syncSends: Int
    /// A finish through the new sink inside `register` itself.
    var syncEnd: EndModel?
    /// What the unregister closure does with its own (now stopped) sink.
    var onUnregister: OnUnregister

    enum OnUnregister: CustomStringConvertible {
        case nothing, send, finish, fail
        var description: String {
            switch self {
            case .nothing: return "nothing"
            case .send: return "sink.send"
            case .finish: return "sink.finish()"
            case .fail: return "sink.finish(throwing:)"
            }
        }
    }

    init(byte: Int) {
        syncSends = [0, 0, 1, 2][byte & 3]
        switch byte >> 2 & 7 {
        case 6: syncEnd = .finish
        case 7: syncEnd = .fail(byte >> 5)
        default: syncEnd = nil
        }
        onUnregister = [.nothing, .send, .finish, .fail][byte >> 5 & 3]
    }

    var description: String {
        "register sends \(syncSends)" + (syncEnd.map { ", then \($0)" } ?? "") + "; unregister: \(onUnregister)"
    }
}

/// What an upstream does when its task is cancelled while it waits for
/// its next element.
enum CancelMode: CustomStringConvertible {
    /// Ends (returns nil).
    case end
    /// Throws.
    case fail
    /// Keeps waiting: let go only at its next element or end.
    case ignore

    init(byte: Int) { self = [.end, .fail, .ignore][byte % 3] }

    var description: String {
        switch self {
        case .end: return "ends on cancellation"
        case .fail: return "throws on cancellation"
        case .ignore: return "ignores cancellation"
        }
    }
}

/// One element sent through a sink inside `register` or unregister, and
/// what `send` returned.
struct SentElement: Equatable, CustomStringConvertible {
    var id: Int
    var result: BroadcastSendResult
    var description: String { "#\(id) -> \(describe(result))" }
}

/// The listener log: what `register` and the unregister closures did, in
/// the order they ran.
enum ListenerEvent: Equatable, CustomStringConvertible {
    case register(run: Int, sent: [SentElement], end: EndModel?)
    case unregister(run: Int, sent: SentElement?)

    var description: String {
        switch self {
        case .register(let run, let sent, let end):
            return "register #\(run)" + (sent.isEmpty ? "" : " sent \(sent)") + (end.map { " then \($0)" } ?? "")
        case .unregister(let run, let sent):
            return "unregister #\(run)" + (sent.map { " (own sink: \($0))" } ?? "")
        }
    }
}

/// Ids of the elements the listener closures make: they cannot take ids
/// from the driver (they may run on another thread), so the id says which
/// run made it.
func registerElementID(run: Int, index: Int) -> Int { run * 1000 + index }
func unregisterElementID(run: Int) -> Int { run * 1000 + 999 }

/// Where an upstream task is, once it has settled.
enum TaskPC: CustomStringConvertible {
    /// Suspended in its upstream's `next()`, waiting for the driver.
    case atGate
    /// Suspended in the sequence, its element waiting for room.
    case queuedEmit(ModelEmit)
    /// The task body has returned.
    case returned

    var description: String {
        switch self {
        case .atGate: return "waiting for its next element"
        case .queuedEmit(let e): return "emit #\(e.payload) waiting for room" + (e.outcome.map { " (decided: \($0))" } ?? "")
        case .returned: return "returned"
        }
    }
}

final class RunModel: CustomStringConvertible {
    /// 1-based: the k-th `register` / `upstream()` call.
    let index: Int
    /// The stop was decided (unregister called, or task cancelled).
    var stopped = false
    // Upstream runs only:
    var pc = TaskPC.atGate
    let cancelMode: CancelMode
    /// `next()` calls the task made on its upstream.
    var nextCalls = 1
    /// The upstream's `next()` saw the task's cancellation.
    var gateSawCancel = false
    /// Its sink said `ready()` while it was the current run of an
    /// unfinished sequence (listener runs only).
    var ready = false

    init(index: Int, cancelMode: CancelMode) {
        self.index = index
        self.cancelMode = cancelMode
    }

    var description: String {
        "run #\(index)" + (stopped ? " stopped" : " current")
            + " [task: \(pc), next() calls \(nextCalls)\(gateSawCancel ? ", saw cancellation" : "")]"
    }
}

/// `subscriberCounts` as a model `BroadcastValue<Int, Never>`.
final class CountsSubscriberModel {
    let name: String
    var lastSeen: Int
    var ended = false
    init(name: String, lastSeen: Int) {
        self.name = name
        self.lastSeen = lastSeen
    }
}

final class ShareModel {
    let start: StartModel
    let isListener: Bool
    let plans: [ListenerPlan]
    let cancelModes: [CancelMode]
    let elements: BroadcastModel

    var runs: [RunModel] = []
    var current: RunModel?
    var ended = false
    var everSubscribed = false
    /// `whileSubscribed` with a delay: the stop is pending until `deadline`.
    var stopDeadline: Int?
    var now = 0
    var starts = 0
    var stops = 0
    var listenerLog: [ListenerEvent] = []
    private var reconciling = false

    // `subscriberCounts`
    var countsCreated = false
    var countsValue = 0
    /// The value's version: 1 for its initial value, +1 per change.
    var countsVersion = 1
    var countsFinished = false

    init(start: StartModel, isListener: Bool, plans: [ListenerPlan], cancelModes: [CancelMode],
         defaultPolicy: BroadcastBufferingPolicy, replay: Int) {
        self.start = start
        self.isListener = isListener
        self.plans = plans
        self.cancelModes = cancelModes
        elements = BroadcastModel(defaultPolicy: defaultPolicy, replay: replay)
    }

    var terminal: ModelTerminal? { elements.terminal }
    var isStopPending: Bool { stopDeadline != nil }

    /// Whether a run should be going now, per the start strategy.
    var wantsRun: Bool {
        if ended { return false }
        switch start {
        case .eagerly: return true
        case .lazily: return everSubscribed
        case .whileSubscribed: return elements.subscriberCount > 0 || stopDeadline != nil
        }
    }

    // MARK: Sections

    /// The sequence was created: `.eagerly` starts now.
    func created() {
        reconcile()
    }

    /// Call after each library call that is one transition of the sequence
    /// (one lock section), with the registered count it found: membership
    /// changes arm or disarm the stop timer, refresh `subscriberCounts`, and
    /// may start or stop a run.
    func afterSection(countBefore: Int) {
        let count = elements.subscriberCount
        if count != countBefore {
            if count > 0 {
                everSubscribed = true
                stopDeadline = nil
            } else if countBefore > 0, !ended, case .whileSubscribed(let seconds) = start, seconds > 0 {
                stopDeadline = now + seconds
            }
        }
        refreshCounts()
        reconcile()
    }

    func refreshCounts() {
        guard countsCreated else { return }
        let count = elements.subscriberCount
        if count != countsValue {
            countsValue = count
            countsVersion += 1
        }
        if terminal != nil && count == 0 { countsFinished = true }
    }

    /// Starts or stops runs until the state wants no change. A finish
    /// inside `register` comes back here while the outer call is still
    /// working: the outer loop picks it up, as the library's single
    /// reconciler does.
    func reconcile() {
        guard !reconciling else { return }
        reconciling = true
        defer { reconciling = false }
        while true {
            if let run = current, !wantsRun {
                stop(run)
            } else if current == nil, wantsRun {
                startRun()
            } else {
                return
            }
        }
    }

    private func startRun() {
        let index = runs.count + 1
        let run = RunModel(index: index, cancelMode: isListener ? .end : cancelModes[(index - 1) % cancelModes.count])
        if isListener { run.pc = .returned }  // no task
        runs.append(run)
        current = run
        starts += 1
        guard isListener else { return }  // the task reaches its upstream's first `next()`
        let plan = plans[(index - 1) % plans.count]
        var sent: [SentElement] = []
        for i in 0..<plan.syncSends {
            let id = registerElementID(run: index, index: i)
            sent.append(SentElement(id: id, result: elements.send(id)))
        }
        // The closure logs itself when it returns, so before any unregister.
        listenerLog.append(.register(run: index, sent: sent, end: plan.syncEnd))
        if let end = plan.syncEnd { runEnded(run, end) }
    }

    private func stop(_ run: RunModel) {
        current = nil
        run.stopped = true
        stops += 1
        if isListener {
            let plan = plans[(run.index - 1) % plans.count]
            var sent: SentElement? = nil
            if case .send = plan.onUnregister {
                sent = SentElement(id: unregisterElementID(run: run.index), result: BroadcastSendResult(isFinished: true))
            }
            listenerLog.append(.unregister(run: run.index, sent: sent))
            return
        }
        switch run.pc {
        case .atGate:
            run.gateSawCancel = true
            if run.cancelMode != .ignore { run.pc = .returned }  // its end counts for nothing
        case .queuedEmit(let e):
            // The stop cancels the run's waiting emit if it is still waiting.
            // Implementation choice: when the stop comes from the last
            // (full `.bounded`) subscriber leaving, that removal made room
            // and served the emit first, in the same section, so the element
            // was delivered (to the replay window, at least) before the stop.
            elements.cancelEmit(e)
        case .returned:
            break
        }
    }

    /// The run ended on its own (a sink's finish, its upstream's end or
    /// error): finishes the sequence if the run is current.
    func runEnded(_ run: RunModel, _ end: EndModel) {
        guard run === current, terminal == nil else { return }
        finishSequence(end)
    }

    func finishSequence(_ end: EndModel) {
        let before = elements.subscriberCount
        if terminal == nil {
            elements.finish(end.terminal)
            ended = true
            stopDeadline = nil
        }
        afterSection(countBefore: before)
    }

    // MARK: Sources

    /// `sink.send` (or `sink.send(_:replayable:)`) on run `run`'s sink.
    func sinkSend(_ run: RunModel, id: Int, replayable: Bool = true) -> BroadcastSendResult {
        guard run === current else { return BroadcastSendResult(isFinished: true) }
        return elements.send(id, replayable: replayable)
    }

    /// `sink.ready()` on run `run`'s sink: ignored once the run was stopped
    /// or the sequence finished.
    func sinkReady(_ run: RunModel) {
        if run === current && terminal == nil { run.ready = true }
    }

    /// The driver hands run `run`'s upstream task an element.
    func upstreamElement(_ run: RunModel, id: Int) {
        precondition(run.pc.isAtGate)
        guard run === current, terminal == nil else {
            run.pc = .returned  // a stopped run's element is dropped; its task stops iterating
            return
        }
        let e = ModelEmit(payload: id)
        if elements.emitBegins(e, taskCancelled: false) {
            run.pc = .queuedEmit(e)
        } else {
            run.nextCalls += 1
        }
    }

    /// The driver ends run `run`'s upstream (its `next()` returns nil or throws).
    func upstreamEnd(_ run: RunModel, _ end: EndModel) {
        precondition(run.pc.isAtGate)
        run.pc = .returned
        runEnded(run, end)
    }

    /// Upstream tasks whose waiting emit was decided move on.
    func advanceTasks() {
        for run in runs {
            guard case .queuedEmit(let e) = run.pc, let outcome = e.outcome else { continue }
            if case .delivered(let result) = outcome, !result.isFinished {
                run.nextCalls += 1
                if run.stopped {
                    run.gateSawCancel = true
                    run.pc = run.cancelMode == .ignore ? .atGate : .returned
                } else {
                    run.pc = .atGate
                }
            } else {
                run.pc = .returned
            }
        }
    }

    // MARK: Clock

    func advance(by seconds: Int) {
        now += seconds
        if let deadline = stopDeadline, now >= deadline {
            stopDeadline = nil
            reconcile()
        }
    }

    // MARK: subscriberCounts

    func subscribeCounts(name: String) -> CountsSubscriberModel {
        if !countsCreated {
            countsCreated = true
            countsValue = elements.subscriberCount
            countsVersion = 1
            countsFinished = terminal != nil && countsValue == 0
        }
        return CountsSubscriberModel(name: name, lastSeen: countsVersion - 1)
    }

    /// Implementation choice: conflation is by version, as for any
    /// `BroadcastValue`, so a reader that missed 0 → 1 → 0 reads 0 again.
    func pollCounts(_ s: CountsSubscriberModel) -> ReadResult {
        if s.ended { return .end }
        if s.lastSeen < countsVersion {
            s.lastSeen = countsVersion
            return .element(countsValue)
        }
        if countsFinished {
            s.ended = true
            return .end
        }
        return .empty
    }

    // MARK: Observing

    var liveUpstreamTasks: Int { isListener ? 0 : runs.filter { !$0.pc.isReturned }.count }

    var counters: SharingCounters {
        var c = SharingCounters()
        c.starts = starts
        c.stops = stops
        c.liveUpstreamTasks = liveUpstreamTasks
        c.liveTimerTasks = isStopPending ? 1 : 0
        c.isRunning = current != nil
        c.isStopPending = isStopPending
        return c
    }

    func dump() -> String {
        var lines = ["sharing: start=\(start) now=\(now)s ended=\(ended) everSubscribed=\(everSubscribed)"
            + " stopDeadline=\(stopDeadline.map { "\($0)s" } ?? "none") starts=\(starts) stops=\(stops)"
            + " current=\(current.map { "#\($0.index)" } ?? "none")"]
        if countsCreated {
            lines.append("subscriberCounts: value=\(countsValue) version=\(countsVersion) finished=\(countsFinished)")
        }
        if !isListener { for run in runs { lines.append("  \(run)") } }
        if isListener { lines.append("listener log: \(listenerLog)") }
        lines.append(elements.dump())
        return lines.joined(separator: "\n")
    }
}

extension TaskPC {
    var isAtGate: Bool { if case .atGate = self { return true } else { return false } }
    var isReturned: Bool { if case .returned = self { return true } else { return false } }
}
