// Target `share`: sharing an upstream, start/stop interleavings.
//
// The input builds ONE shared sequence, fed either by a fake listener
// (`init(register:)`: the closure records each call and keeps the sink; the
// program then calls that sink, and the stale sinks of earlier runs,
// itself) or by an upstream task (`init(upstream:)`, typed or untyped: each
// run's upstream is a `Gate` whose elements and end the program hands over
// one at a time), started `.eagerly`, `.lazily`,
// `.whileSubscribed(stopAfter: .zero)` or `.whileSubscribed(stopAfter:)`
// with a delay on a `ManualClock`. Then a program of operations: subscribe
// (also from a cancelled task, or from a high-priority task with a
// task-local value), cancel, release, poll, sink send / finish /
// finish(throwing:) on any run's sink (upstream: hand any waiting run an
// element, its end or an error), send, send(contentsOf:), finish, release
// the sequence, subscribe to and poll `subscriberCounts`, advance the clock.
//
// `ShareModel` predicts, after every operation: which runs started and
// stopped (the listener's register/unregister log, with what each sink
// call inside them returned; each upstream's `next()` calls and whether it
// saw its task's cancellation), `sharingCounters`, `waitingEmitterCount`,
// the stop timer asleep on the clock, and the number of live elements.
// Upstream tasks and stop timers run on the library's own tasks, so the
// program waits for that state with a deadline (a hang fails with both
// states printed; a count already past the model's fails at once), then
// compares: what each poll returns, send results, `droppedCount`,
// `subscriberCount`, `isFinished`, the `subscriberCounts` readings. Inside
// the closures it checks that `register` and unregister never overlap,
// each unregister runs once, and `upstream()` runs in a detached task (not
// on the subscriber's thread, without its task-local value or priority)
// that iterates with `next(isolation:)` (typed) or `next()` (untyped).
// Epilogue: finish, let every upstream go, release everything: the
// sequence's storage must be freed (no task, timer or listener keeps it),
// no element may stay alive, and `subscriberCounts` must end.
//
// Readiness (v5): `sink.ready()` on any run's sink, and
// `upstreamReady()` of a registered subscriber in a task on the manual
// executor: `true` at once without a listener, or once the current run (the
// one serving it) said `ready()`; until then it waits, and a waiter must
// return `true` in the step that makes its run ready (a lost wake-up
// fails), `false` only once the subscriber or the sequence has ended.
//
// Input layout: byte 0 the source (bit 0: listener or upstream; bit 1:
// `FuzzError` or `any Error`), byte 1 the start, byte 2 the default
// policy, byte 3 the replay, bytes 4-7 what each run's listener or
// upstream does (run k uses entry k mod 4), then one opcode byte per step
// followed by its operands.

@_spi(Testing) import AsyncBroadcast
import AsyncBroadcastTestSupport
import FuzzKit
#if canImport(Glibc)
import Glibc
#endif

typealias CountsSubscription = BroadcastValue<Int, Never>.Subscription

let slotCount = 8
let countsSlotCount = 4
/// How long an asynchronous effect (an upstream task moving on, a stop
/// timer firing or returning) may take before it counts as a hang.
/// Two of them (the run and its traced re-run) must fit in run.sh's
/// per-input timeout.
let settleDeadlineSeconds = 5.0

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzShare(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let bytes = ByteReader(data, size)
    var peek = bytes
    if peek.byte() & 2 == 0 {
        runProgram(bytes, errors: ErrorCoding<FuzzError>.typed) { policy, replay, started, upstream in
            BroadcastSequence<Item, FuzzError>(bufferingPolicy: policy, replay: replay, started: started, upstream: upstream)
        }
    } else {
        runProgram(bytes, errors: ErrorCoding<any Error>.untyped) { policy, replay, started, upstream in
            // The untyped overload: `GateUpstream.Failure` is not `any Error`.
            BroadcastSequence<Item, any Error>(bufferingPolicy: policy, replay: replay, started: started,
                                               upstream: upstream)
        }
    }
    Trace.rerunTraced = nil
    return 0
}

/// Makes the upstream-fed sequence with the typed or the untyped `init(upstream:)`.
typealias UpstreamInit<Failure: Error> = (BroadcastBufferingPolicy, Int, BroadcastStart,
                                          @escaping @Sendable () -> GateUpstream) -> BroadcastSequence<Item, Failure>

func runProgram<Failure: Error>(_ bytes: ByteReader, errors: ErrorCoding<Failure>,
                                upstreamInit: @escaping UpstreamInit<Failure>) {
    Trace.rerunTraced = {
        FuzzWeakMemory.beginInput(bytes)
        let program = ShareProgram(input: bytes, trace: Trace(enabled: true), errors: errors, upstreamInit: upstreamInit)
        program.run()
    }
    FuzzWeakMemory.beginInput(bytes)
    let program = ShareProgram(input: bytes, trace: Trace(), errors: errors, upstreamInit: upstreamInit)
    program.run()
}

struct CountsSlot {
    let subscription: CountsSubscription
    let model: CountsSubscriberModel
}

/// What the program waits for after each step: everything the library
/// may still be doing on its own threads shows here.
struct Observed: Equatable, CustomStringConvertible {
    var counters: SharingCounters?
    var waitingEmitters: Int?
    var listenerCalls = 0
    var gates: [Gate.Observed] = []
    var sleepers = 0
    var liveItems: Int?
    var violations: [String] = []

    var description: String {
        var parts: [String] = []
        if let c = counters {
            parts.append("counters(starts \(c.starts), stops \(c.stops), liveUpstreamTasks \(c.liveUpstreamTasks), liveTimerTasks \(c.liveTimerTasks), isRunning \(c.isRunning), isStopPending \(c.isStopPending))")
        }
        if let waitingEmitters { parts.append("waitingEmitterCount \(waitingEmitters)") }
        parts.append("register/unregister calls \(listenerCalls)")
        if !gates.isEmpty {
            parts.append("upstreams [" + gates.enumerated().map { "#\($0.offset + 1): \($0.element)" }.joined(separator: "; ") + "]")
        }
        parts.append("clock sleepers \(sleepers)")
        if let liveItems { parts.append("live elements \(liveItems)") }
        if !violations.isEmpty { parts.append("violations \(violations)") }
        return parts.joined(separator: ", ")
    }
}

final class ShareProgram<Failure: Error> {
    typealias Shared = BroadcastSequence<Item, Failure>
    typealias Subscription = Shared.Subscription

    struct Slot {
        let subscription: Subscription
        let model: ModelSubscriber
    }

    /// An `upstreamReady()` call in a task on the manual executor.
    final class ReadyBox: @unchecked Sendable {
        var result: Bool?
        var threw = false
        var done = false
    }

    struct ReadyWaiter {
        let box: ReadyBox
        let model: ModelSubscriber
        let run: RunModel
    }

    /// `upstreamReady()` calls still waiting.
    var readyWaiters: [ReadyWaiter] = []

    /// A subscribe made inside a cancelled task (on the manual executor).
    final class Mailbox: @unchecked Sendable {
        var sequence: Shared?
        var subscription: Subscription?
        var done = false
    }

    let errors: ErrorCoding<Failure>
    var input: ByteReader
    let trace: Trace
    let model: ShareModel
    let recorder: Recorder<Failure>
    let clock = ManualClock()
    let executor = ManualExecutor()
    var sequence: Shared?
    weak var probe: StorageProbe?
    var slots: [Slot?] = Array(repeating: nil, count: slotCount)
    var countsSlots: [CountsSlot?] = Array(repeating: nil, count: countsSlotCount)
    var subscriberSerial = 0
    var nextID = 1_000_000
    /// Elements alive before this program (a traced re-run starts while the
    /// failed run still holds its own).
    let baselineItems = liveItems.value

    init(input: ByteReader, trace: Trace, errors: ErrorCoding<Failure>, upstreamInit: UpstreamInit<Failure>) {
        self.errors = errors
        self.input = input
        self.trace = trace
        let sourceByte = self.input.byte()
        let isListener = sourceByte & 1 == 0
        let startByte = self.input.below(8)
        let start: StartModel
        switch startByte {
        case 0: start = .eagerly
        case 1: start = .lazily
        case 2, 3: start = .whileSubscribed(seconds: 0)
        default: start = .whileSubscribed(seconds: [1, 2, 3, 5][startByte - 4])
        }
        let policy = decodePolicy(self.input.byte())
        let replay = replayTable[self.input.below(replayTable.count)]
        var plans: [ListenerPlan] = []
        var modes: [CancelMode] = []
        for _ in 0..<4 {
            let byte = self.input.byte()
            plans.append(ListenerPlan(byte: byte))
            modes.append(CancelMode(byte: byte))
        }
        model = ShareModel(start: start, isListener: isListener, plans: plans, cancelModes: modes,
                           defaultPolicy: policy, replay: replay)
        recorder = Recorder(errors: errors, plans: plans, cancelModes: modes)

        let started: BroadcastStart
        switch start {
        case .eagerly: started = .eagerly
        case .lazily: started = .lazily
        case .whileSubscribed(let seconds): started = .whileSubscribed(stopAfter: .seconds(seconds), clock: clock)
        }
        let probe = StorageProbe()
        self.probe = probe
        let recorder = self.recorder
        let failure = sourceByte & 2 == 0 ? "FuzzError" : "any Error"
        if isListener {
            trace.add("create(bufferingPolicy: \(describe(policy)), replay: \(replay), started: \(start), register:) of <Item, \(failure)>"
                + " runs: " + plans.enumerated().map { "#\($0.offset + 1) mod 4: \($0.element)" }.joined(separator: "; "))
            sequence = Shared(bufferingPolicy: policy, replay: replay, started: started) { sink in
                withExtendedLifetime(probe) {}
                return recorder.register(sink)
            }
        } else {
            trace.add("create(bufferingPolicy: \(describe(policy)), replay: \(replay), started: \(start), upstream:) of <Item, \(failure)>"
                + " upstreams: " + modes.enumerated().map { "#\($0.offset + 1) mod 4: \($0.element)" }.joined(separator: "; "))
            sequence = upstreamInit(policy, replay, started) {
                withExtendedLifetime(probe) {}
                return recorder.makeUpstream()
            }
        }
        model.created()
        settle()
        check()
    }

    // MARK: Running

    func run() {
        var steps = 0
        while !input.isAtEnd && steps < 600 {
            step()
            steps += 1
        }
        epilogue()
    }

    func makeID() -> Int {
        defer { nextID += 1 }
        return nextID
    }

    var seq: Shared { sequence! }

    func occupiedSlot(from index: Int) -> Int? {
        for k in 0..<slotCount where slots[(index + k) % slotCount] != nil { return (index + k) % slotCount }
        return nil
    }

    func occupiedCountsSlot(from index: Int) -> Int? {
        for k in 0..<countsSlotCount where countsSlots[(index + k) % countsSlotCount] != nil {
            return (index + k) % countsSlotCount
        }
        return nil
    }

    /// A run for a sink or upstream operation: even bytes prefer the
    /// current one, odd ones pick any (stale runs included).
    func pickRun(_ byte: Int, among candidates: [RunModel]) -> RunModel? {
        guard !candidates.isEmpty else { return nil }
        if byte & 1 == 0, let current = model.current, candidates.contains(where: { $0 === current }) { return current }
        return candidates[(byte >> 1) % candidates.count]
    }

    func decodeEnd(_ byte: Int) -> EndModel {
        byte & 3 == 3 ? .fail(byte >> 2) : .finish
    }

    func step() {
        let raw = input.byte()
        if raw >= 254 {
            // Weak memory: the driver's buffered stores become visible to the
            // library's own tasks (rare byte values, so the older corpus
            // keeps its meaning; `raw % 20` is `below(20)`).
            trace.add("(memory) drain the driver's stores (\(FuzzWeakMemory.pending(FuzzWeakMemory.driver)) pending)")
            FuzzWeakMemory.drain(FuzzWeakMemory.driver)
            return
        }
        if raw >= 240 {
            readinessStep(raw)
            return
        }
        let opcode = raw % 20
        if sequence == nil && [0, 1, 2, 3, 12, 13, 14, 15, 16].contains(opcode) { return }  // released
        switch opcode {
        case 0, 1, 2:
            let byte = input.byte()
            let policy: BroadcastBufferingPolicy? = byte & 0x80 != 0 ? nil : decodePolicy(byte)
            guard let index = slots.firstIndex(where: { $0 == nil }) else { return }
            subscriberSerial += 1
            let name = "s\(subscriberSerial)"
            trace.add("\(name) = subscribe(bufferingPolicy: \(policy.map(describe) ?? "nil"))")
            let before = model.elements.subscriberCount
            let subscription = seq.subscribe(bufferingPolicy: policy)
            let m = model.elements.subscribe(name: name, policy: policy)
            m.holders = 1
            model.afterSection(countBefore: before)
            slots[index] = Slot(subscription: subscription, model: m)
        case 3:
            let byte = input.byte()
            let policy: BroadcastBufferingPolicy? = byte & 0x80 != 0 ? nil : decodePolicy(byte)
            guard let index = slots.firstIndex(where: { $0 == nil }) else { return }
            subscribeFromTask(policy, cancelled: byte & 0x40 == 0, slot: index)
        case 4:
            guard let index = occupiedSlot(from: input.byte()), let slot = slots[index] else { return }
            trace.add("\(slot.model.name).cancel()")
            let before = model.elements.subscriberCount
            slot.subscription.cancel()
            model.elements.cancel(slot.model)
            model.afterSection(countBefore: before)
        case 5:
            guard let index = occupiedSlot(from: input.byte()), let slot = slots[index] else { return }
            // A waiting `upstreamReady()` keeps the subscription (its task
            // holds it): not released meanwhile.
            guard !readyWaiters.contains(where: { $0.model === slot.model }) else { return }
            trace.add("release \(slot.model.name)")
            let before = model.elements.subscriberCount
            slots[index] = nil
            model.elements.release(slot.model)
            model.afterSection(countBefore: before)
        case 6, 7:
            guard let index = occupiedSlot(from: input.byte()), let slot = slots[index] else { return }
            trace.add("\(slot.model.name).poll()")
            poll(slot)
        case 8:
            guard let index = occupiedSlot(from: input.byte()), let slot = slots[index] else { return }
            trace.add("\(slot.model.name): poll() until empty")
            var results: [ReadResult] = []
            while results.count < 10_000 {
                let r = poll(slot, annotate: false)
                results.append(r)
                if r == .empty || r.endsRead { break }
            }
            trace.annotate(" -> \(results)")
        case 9, 10:
            sourceElement(input.byte())
        case 11:
            sourceEnd(input.byte(), end: decodeEnd(input.byte()))
        case 12:
            let id = makeID()
            trace.add("send(#\(id))")
            let actual = seq.send(Item(id))
            let expected = model.elements.send(id)
            trace.annotate(" -> \(describe(actual))")
            if actual != expected {
                trace.fail("send(#\(id)) returned \(describe(actual)), expected \(describe(expected))", details: model.dump())
            }
        case 13:
            sendBatch(input.byte())
        case 14:
            // Rare-ish: ends the interesting part of the program.
            guard input.byte() < 64 else { return }
            let end = decodeEnd(input.byte())
            trace.add("\(end) (the sequence's)")
            switch end {
            case .finish: seq.finish()
            case .fail(let code): seq.finish(throwing: errors.make(code))
            }
            model.finishSequence(end)
        case 15:
            guard input.byte() < 32 else { return }
            trace.add("release the sequence (finishes it)")
            sequence = nil
            model.finishSequence(.finish)
        case 16:
            guard let index = countsSlots.firstIndex(where: { $0 == nil }) else { return }
            subscriberSerial += 1
            let name = "c\(subscriberSerial)"
            trace.add("\(name) = subscriberCounts")
            let subscription = seq.subscriberCounts
            countsSlots[index] = CountsSlot(subscription: subscription, model: model.subscribeCounts(name: name))
        case 17:
            guard let index = occupiedCountsSlot(from: input.byte()), let slot = countsSlots[index] else { return }
            trace.add("\(slot.model.name).poll()")
            pollCounts(slot)
        case 18:
            guard let index = occupiedCountsSlot(from: input.byte()), let slot = countsSlots[index] else { return }
            trace.add("release \(slot.model.name)")
            countsSlots[index] = nil
        default:
            let seconds = [0, 1, 1, 2, 3, 5][input.below(6)]
            trace.add("clock.advance(by: .seconds(\(seconds)))  [now \(model.now + seconds)s]")
            clock.advance(by: .seconds(seconds))
            model.advance(by: seconds)
        }
        model.advanceTasks()
        settle()
        check()
    }

    // MARK: Readiness

    func readinessStep(_ raw: Int) {
        let byte = input.byte()
        if raw % 2 == 0 {
            guard model.isListener, let run = pickRun(byte, among: model.runs) else { return }
            let sink = recorder.sinks.withLock { $0[run.index - 1] }
            trace.add("sink #\(run.index)\(run === model.current ? "" : " (stale)").ready()")
            sink.ready()
            model.sinkReady(run)
        } else {
            guard sequence != nil, let index = occupiedSlot(from: byte), let slot = slots[index] else { return }
            let s = slot.model
            // Only where the serving run is known: a registered subscriber of
            // an unfinished sequence is served by the current run.
            guard s.registered, !s.cancelled, model.terminal == nil else { return }
            let run = model.current
            if model.isListener && run == nil { return }
            trace.add("\(s.name).upstreamReady() in a task")
            let box = ReadyBox()
            let subscription = slot.subscription
            Task(executorPreference: executor) {
                do {
                    box.result = try await subscription.upstreamReady()
                } catch {
                    box.threw = true
                }
                box.done = true
            }
            s.holders += 1  // the task's reference
            runReadyTasks()
            let expectedNow = !model.isListener || run!.ready
            if expectedNow {
                guard box.done, box.result == true else {
                    trace.fail("\(s.name).upstreamReady() " + (box.done ? "returned \(box.result.map { "\($0)" } ?? "CancellationError")" : "waits")
                        + ", expected true at once" + (model.isListener ? " (run #\(run!.index) said ready())" : " (no listener)"),
                        details: model.dump())
                }
                trace.annotate(" -> true")
                model.elements.release(s)
            } else {
                if box.done {
                    trace.fail("\(s.name).upstreamReady() returned \(box.result.map { "\($0)" } ?? "CancellationError") at once, expected it to wait for run #\(run!.index)'s ready()",
                               details: model.dump())
                }
                trace.annotate(" -> waits")
                readyWaiters.append(ReadyWaiter(box: box, model: s, run: run!))
            }
        }
        model.advanceTasks()
        settle()
        check()
    }

    /// Runs the `upstreamReady()` tasks' jobs (a task of its own, awaited
    /// by the driver: drained once it ran).
    func runReadyTasks() {
        FuzzWeakMemory.drain(FuzzWeakMemory.driver)
        FuzzWeakMemory.runAs(FuzzWeakMemory.thread(ofTask: 1)) { executor.runUntilIdle() }
        FuzzWeakMemory.drain(FuzzWeakMemory.thread(ofTask: 1))
    }

    /// The waiting `upstreamReady()` calls after a step: one whose run said
    /// `ready()` must have returned `true`; one whose subscriber or
    /// sequence ended, `false`; a `true` needs its run's `ready()`.
    func checkReadyWaiters() {
        guard !readyWaiters.isEmpty else { return }
        runReadyTasks()
        var still: [ReadyWaiter] = []
        for w in readyWaiters {
            let s = w.model
            let ended = s.cancelled || !s.registered || model.terminal != nil
            if !w.box.done {
                if w.run.ready {
                    trace.fail("\(s.name).upstreamReady() still waits after run #\(w.run.index)'s sink.ready()", details: model.dump())
                }
                if ended {
                    trace.fail("\(s.name).upstreamReady() still waits after its subscriber or the sequence ended (expected false)",
                               details: model.dump())
                }
                still.append(w)
                continue
            }
            let expected = w.run.ready
            if w.box.threw || w.box.result != expected || (!expected && !ended) {
                trace.fail("\(s.name).upstreamReady() returned \(w.box.threw ? "CancellationError" : String(w.box.result!)), expected \(expected)"
                    + (expected ? "" : " only once its subscriber or the sequence ended"), details: model.dump())
            }
            trace.annotate("  [\(s.name).upstreamReady() -> \(w.box.result!)]")
            let before = model.elements.subscriberCount
            model.elements.release(s)  // the task's reference
            model.afterSection(countBefore: before)
        }
        readyWaiters = still
    }

    // MARK: Operations

    @discardableResult
    func poll(_ slot: Slot, annotate: Bool = true) -> ReadResult {
        let before = model.elements.subscriberCount
        let actual: ReadResult
        switch slot.subscription.poll() {
        case .element(let item): actual = .element(item.id)
        case .empty: actual = .empty
        case .end: actual = .end
        case .failure(let error): actual = .failure(errors.code(error))
        }
        if case .element = actual, case .bufferingOldest(let n) = slot.model.policy, n > 0 {
            // Weak memory: the pop's head store, still buffered, would make
            // the buffer look full to an upstream task's send racing it: a
            // legal drop the model cannot follow (see `staleHeadIsAmbiguous`
            // in fuzz-sched). A drain is always legal.
            FuzzWeakMemory.drain(FuzzWeakMemory.driver)
        }
        let dump = trace.enabled ? model.dump() : ""
        let expected = model.elements.poll(slot.model)
        model.afterSection(countBefore: before)
        model.advanceTasks()
        if annotate { trace.annotate(" -> \(actual)") }
        if actual != expected {
            trace.fail("\(slot.model.name).poll() returned \(actual), expected \(expected)", details: dump)
        }
        return actual
    }

    func pollCounts(_ slot: CountsSlot) {
        let actual: ReadResult
        switch slot.subscription.poll() {
        case .element(let count): actual = .element(count)
        case .empty: actual = .empty
        case .end: actual = .end
        }
        let expected = model.pollCounts(slot.model)
        trace.annotate(" -> \(actual)")
        if actual != expected {
            trace.fail("\(slot.model.name).poll() (subscriberCounts) returned \(actual), expected \(expected)",
                       details: model.dump())
        }
    }

    func sendBatch(_ byte: Int) {
        let count = byte % 6
        let contiguous = byte & 8 == 0
        let first = nextID
        nextID += count
        trace.add("send(contentsOf: #\(first)..<#\(first + count)" + (contiguous ? ")" : " as a lazy map)"))
        let actual: BroadcastSendResult
        if contiguous {
            actual = seq.send(contentsOf: (first..<first + count).map { Item($0) })
        } else {
            actual = seq.send(contentsOf: (first..<first + count).lazy.map { Item($0) })
        }
        var expected = BroadcastSendResult(isFinished: model.terminal != nil)
        if model.terminal == nil {
            for id in first..<first + count {
                let result = model.elements.send(id)
                expected.delivered += result.delivered
                expected.dropped += result.dropped
            }
        }
        trace.annotate(" -> \(describe(actual))")
        if actual != expected {
            trace.fail("send(contentsOf:) returned \(describe(actual)), expected \(describe(expected))", details: model.dump())
        }
    }

    /// A sink's `send` (listener), or an element handed to a waiting upstream.
    func sourceElement(_ byte: Int) {
        if model.isListener {
            guard let run = pickRun(byte, among: model.runs) else { return }
            let sink = recorder.sinks.withLock { $0[run.index - 1] }
            let id = makeID()
            // The top bit: an out-of-band element, kept out of the replay window.
            let replayable = byte & 0x80 == 0
            trace.add("sink #\(run.index)\(run === model.current ? "" : " (stale)").send(#\(id)\(replayable ? "" : ", replayable: false"))")
            let actual = replayable ? sink.send(Item(id)) : sink.send(Item(id), replayable: false)
            let expected = model.sinkSend(run, id: id, replayable: replayable)
            trace.annotate(" -> \(describe(actual))")
            if actual != expected {
                trace.fail("sink #\(run.index).send(#\(id)) returned \(describe(actual)), expected \(describe(expected))",
                           details: model.dump())
            }
        } else {
            guard let run = pickRun(byte, among: model.runs.filter { $0.pc.isAtGate }) else { return }
            let id = makeID()
            trace.add("upstream #\(run.index)\(run === model.current ? "" : " (stopped)") yields #\(id)")
            hand(run, .element(Item(id)))
            model.upstreamElement(run, id: id)
            model.advanceTasks()
            trace.annotate(" -> its task is " + (run.pc.isAtGate ? "back in next()" : "\(run.pc)"))
        }
    }

    /// A sink's `finish` (listener), or a waiting upstream's end.
    func sourceEnd(_ byte: Int, end: EndModel) {
        if model.isListener {
            guard let run = pickRun(byte, among: model.runs) else { return }
            let sink = recorder.sinks.withLock { $0[run.index - 1] }
            trace.add("sink #\(run.index)\(run === model.current ? "" : " (stale)").\(end)")
            switch end {
            case .finish: sink.finish()
            case .fail(let code): sink.finish(throwing: errors.make(code))
            }
            model.runEnded(run, end)
        } else {
            guard let run = pickRun(byte, among: model.runs.filter { $0.pc.isAtGate }) else { return }
            trace.add("upstream #\(run.index)\(run === model.current ? "" : " (stopped)") "
                + (end == .finish ? "ends" : "throws FuzzError(\(end.code))"))
            switch end {
            case .finish: hand(run, .end)
            case .fail(let code): hand(run, .fail(code))
            }
            model.upstreamEnd(run, end)
        }
    }

    func hand(_ run: RunModel, _ handed: Gate.Handed) {
        let gate = recorder.gates.withLock { $0[run.index - 1] }
        if !gate.hand(handed) {
            trace.fail("upstream #\(run.index) is not waiting in next(), the model says it is (\(run))", details: model.dump())
        }
    }

    /// A subscribe made inside a task on the manual executor: a cancelled
    /// one (never registered, starts nothing), or one at high priority with
    /// a task-local value set, which the upstream task must not inherit.
    func subscribeFromTask(_ policy: BroadcastBufferingPolicy?, cancelled: Bool, slot index: Int) {
        subscriberSerial += 1
        let name = "s\(subscriberSerial)"
        trace.add("\(name) = subscribe(bufferingPolicy: \(policy.map(describe) ?? "nil")) from "
            + (cancelled ? "a cancelled task" : "a high-priority task with a task-local value"))
        let mailbox = Mailbox()
        mailbox.sequence = seq
        let handle = Task(executorPreference: executor, priority: cancelled ? nil : .high) {
            SubscriberContext.$marker.withValue(42) {
                mailbox.subscription = mailbox.sequence!.subscribe(bufferingPolicy: policy)
            }
            mailbox.sequence = nil
            mailbox.done = true
        }
        if cancelled { handle.cancel() }
        // A task of its own (logical thread 1), awaited by the driver: its
        // stores are visible once the driver has the subscription.
        FuzzWeakMemory.drain(FuzzWeakMemory.driver)  // creating the task
        FuzzWeakMemory.runAs(FuzzWeakMemory.thread(ofTask: 0)) { executor.runUntilIdle() }
        FuzzWeakMemory.drain(FuzzWeakMemory.thread(ofTask: 0))
        guard mailbox.done, let subscription = mailbox.subscription else {
            trace.fail("the subscribing task did not complete in one job")
        }
        mailbox.subscription = nil
        let before = model.elements.subscriberCount
        let m = model.elements.subscribe(name: name, policy: policy, fromCancelledTask: cancelled)
        m.holders = 1
        model.afterSection(countBefore: before)
        slots[index] = Slot(subscription: subscription, model: m)
    }

    // MARK: Waiting and checking

    /// The program holds a reference to the storage, so the replay window
    /// is alive and every element is accounted for.
    var storageHeld: Bool {
        sequence != nil || slots.contains { $0 != nil } || recorder.sinks.withLock { !$0.isEmpty }
    }

    func observe() -> Observed {
        var o = Observed()
        if let sequence {
            // Both take the sequence lock: see `observingLocked`.
            (o.counters, o.waitingEmitters) = FuzzWeakMemory.observingLocked {
                (sequence.sharingCounters, sequence.waitingEmitterCount)
            }
        }
        o.listenerCalls = recorder.log.withLock { $0.count }
        o.gates = recorder.gates.withLock { $0.map(\.observed) }
        o.sleepers = clock.sleeperCount
        if storageHeld { o.liveItems = liveItems.value - baselineItems }
        o.violations = recorder.violations.value
        return o
    }

    func expectedObservation() -> Observed {
        var o = Observed()
        if sequence != nil {
            o.counters = model.counters
            o.waitingEmitters = model.elements.emitQueue.count
        }
        o.listenerCalls = model.listenerLog.count
        if !model.isListener {
            o.gates = model.runs.map { Gate.Observed(waiting: $0.pc.isAtGate, nextCalls: $0.nextCalls, sawCancel: $0.gateSawCancel) }
        }
        o.sleepers = model.isStopPending ? 1 : 0
        if storageHeld { o.liveItems = model.elements.heldPayloads(storageAlive: true).count }
        return o
    }

    /// Waits until the library's own tasks have done what the model says
    /// the step set off; fails if they have not within the deadline.
    func settle() {
        let expected = expectedObservation()
        var observed = observe()
        if observed == expected { return }
        // The library's own tasks run on real threads, unmodelled: they read
        // memory, so the driver's buffered stores are invisible to them. A
        // real store buffer drains within nanoseconds; waiting stands for
        // that, so the driver's buffer drains before the wait.
        FuzzWeakMemory.drainAll()
        let start = ContinuousClock.now
        var spins = 0
        while observed != expected {
            if !observed.violations.isEmpty {
                trace.fail("inside a listener or upstream: \(observed.violations.joined(separator: "; "))", details: model.dump())
            }
            if let overshoot = overshoot(observed, expected) {
                trace.fail("the library went past the expected state: \(overshoot)",
                           details: "expected: \(expected)\nobserved: \(observed)\n" + model.dump())
            }
            if ContinuousClock.now - start > .seconds(settleDeadlineSeconds) {
                trace.fail("the library did not reach the expected state within \(settleDeadlineSeconds) s (a hang, or a start/stop the model does not expect)",
                           details: "expected: \(expected)\nobserved: \(observed)\n" + model.dump())
            }
            spins += 1
            if spins < 1000 { sched_yield() } else { usleep(100) }
            observed = observe()
        }
    }

    /// A count that only grows and is already past the model's: waiting
    /// cannot help, so report it now instead of at the deadline.
    func overshoot(_ observed: Observed, _ expected: Observed) -> String? {
        if let o = observed.counters, let e = expected.counters {
            if o.starts > e.starts { return "\(o.starts) starts, expected \(e.starts)" }
            if o.stops > e.stops { return "\(o.stops) stops, expected \(e.stops)" }
        }
        if observed.listenerCalls > expected.listenerCalls {
            return "\(observed.listenerCalls) register/unregister calls, expected \(expected.listenerCalls)"
        }
        if observed.gates.count > expected.gates.count {
            return "\(observed.gates.count) upstream() calls, expected \(expected.gates.count)"
        }
        for (index, (o, e)) in zip(observed.gates, expected.gates).enumerated() {
            if o.nextCalls > e.nextCalls { return "upstream #\(index + 1): \(o.nextCalls) next() calls, expected \(e.nextCalls)" }
            if o.sawCancel && !e.sawCancel { return "upstream #\(index + 1) saw its task's cancellation" }
        }
        return nil
    }

    func check() {
        checkReadyWaiters()
        let log = recorder.log.value
        if log != model.listenerLog {
            trace.fail("listener log: expected \(model.listenerLog), got \(log)", details: model.dump())
        }
        // Not through `FuzzWeakMemory.observing`: its flag is global, so
        // the library's real threads would run as observers meanwhile. The
        // driver's own view is exact here: the only other modelled thread
        // (a subscribing task) is drained at once, and the real threads
        // write memory directly.
        if let sequence {
            expectEqual(sequence.subscriberCount, model.elements.subscriberCount, "subscriberCount", trace, details: model.dump())
            let isFinished = FuzzWeakMemory.observingLocked { sequence.isFinished }
            expectEqual(isFinished, model.terminal != nil, "isFinished", trace, details: model.dump())
        }
        for slot in slots {
            guard let slot else { continue }
            expectEqual(slot.subscription.droppedCount, slot.model.dropped, "\(slot.model.name).droppedCount", trace,
                        details: model.dump())
        }
    }

    // MARK: Epilogue

    func epilogue() {
        if sequence != nil, model.terminal == nil {
            trace.add("(epilogue) finish()")
            seq.finish()
            model.finishSequence(.finish)
            model.advanceTasks()
            settle()
            check()
        }
        for run in model.runs where run.pc.isAtGate {
            // Upstreams that ignore cancellation wait for their end.
            trace.add("(epilogue) upstream #\(run.index) ends")
            hand(run, .end)
            model.upstreamEnd(run, .finish)
            settle()
            check()
        }
        // The model's own consistency: every start has its stop.
        precondition(model.starts == model.stops && model.current == nil && !model.isStopPending
            && model.liveUpstreamTasks == 0, "the model leaves a run going: \(model.dump())")
        FuzzWeakMemory.drainAll()  // releasing: reference counts order everything before
        trace.add("(epilogue) release every subscription, sink and the sequence (keep subscriberCounts)")
        for index in slots.indices where slots[index] != nil {
            let before = model.elements.subscriberCount
            model.elements.release(slots[index]!.model)
            slots[index] = nil
            model.afterSection(countBefore: before)
        }
        sequence = nil
        recorder.sinks.withLock { $0.removeAll() }
        recorder.gates.withLock { $0.removeAll() }
        let start = ContinuousClock.now
        while probe != nil || liveItems.value != baselineItems || clock.sleeperCount != 0 {
            if ContinuousClock.now - start > .seconds(settleDeadlineSeconds) {
                trace.fail(probe != nil
                    ? "the sequence's storage is still alive after releasing everything: a task, timer or listener keeps it"
                    : "\(liveItems.value - baselineItems) elements still alive after releasing everything (clock sleepers \(clock.sleeperCount))",
                    details: model.dump())
            }
            usleep(50)
        }
        // `subscriberCounts` does not keep the sequence; it ends once the
        // sequence has finished and nobody is left.
        for index in countsSlots.indices {
            guard let slot = countsSlots[index] else { continue }
            while true {
                trace.add("(epilogue) \(slot.model.name).poll()")
                pollCounts(slot)
                if slot.model.ended { break }
            }
            countsSlots[index] = nil
        }
    }
}
