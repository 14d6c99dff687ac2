// Target 2 (`sched`): interleavings under a deterministic executor.
//
// Every task of the program (readers parked in `next()`, emitters waiting
// for room, a subscriber made from a cancelled task) runs on
// `ManualExecutor` (from AsyncBroadcastTestSupport), a `TaskExecutor` that
// only queues jobs. The input decides,
// between operations, which queued job runs next; everything runs on this
// one thread, so a run is a deterministic function of the input.
//
// The model (`BroadcastModel`) is stepped alongside. Each task also has a
// model "program counter" (where it is in `next()` / `emit`), so after
// every step we know which tasks must be runnable and which must be
// suspended. Checked after every step:
// - every task the model says was resumed is queued (nobody left waiting
//   who should have woken), and no suspended task is queued;
// - a task is never queued twice (a continuation resumed twice) nor after
//   it finished;
// - what each `next()` returned, per subscriber and in order; what each
//   `emit` returned (delivered to all, or, cancelled, to nobody);
// - send results, droppedCount, subscriberCount, isFinished,
//   waitingEmitterCount, isConsumerWaiting;
// - live payloads equal what the model says is held (nothing leaked, freed
//   buffers freed); at the end, after `finish()` and running every job,
//   every task has completed and no payload is alive.
//
// Weak memory (the default build, `ASYNCBROADCAST_WEAK_MEMORY=1`; see
// FuzzKit/WeakMemory.swift and README.md): the driver is logical thread 0,
// each task its own logical thread, set before each of its jobs. A job's
// stores are NOT drained when it ends: they stay in its task's store buffer
// (as if the task were still running on another core) until the library
// drains them (fence, RMW, lock, resume), the input says so, or the driver
// synchronises with the task as a real program would (the one-consumer
// hand-over of a subscription, releasing what the task referenced, the
// epilogue). Every check looks through `FuzzWeakMemory.observing`.

@_spi(Testing) import AsyncBroadcast
import AsyncBroadcastTestSupport
import FuzzKit
#if canImport(Glibc)
import Glibc
#endif

typealias Broadcast = BroadcastSequence<Payload, FuzzError>
typealias Subscription = Broadcast.Subscription

let slotCount = 8
let maxTasks = 64
let readCounts = [1, 1, 1, 2, 3, 5, 40]

// MARK: - Tasks

/// What a task body reports (written by the task, read by the driver
/// after each job; single-threaded).
final class Mailbox: @unchecked Sendable {
    var reads: [ReadResult] = []
    var emitted: EmitOutcomeModel?
    var done = false
    var subscription: Subscription?
    var payload: Payload?
    var sequence: Broadcast?
}

final class ReaderModel {
    enum PC: CustomStringConvertible {
        case start, waiting, done
        var description: String {
            switch self {
            case .start: return "starting next()"
            case .waiting: return "waiting in next()"
            case .done: return "done"
            }
        }
    }
    let sub: ModelSubscriber
    let maxReads: Int
    var reads = 0
    /// The iterator asks for the task's cancellation on its 1st call, then every 32.
    var calls = 0
    var pc = PC.start
    init(sub: ModelSubscriber, maxReads: Int) {
        self.sub = sub
        self.maxReads = maxReads
    }
}

final class EmitterModel {
    enum State { case notStarted, waiting, done }
    let emit: ModelEmit
    var state = State.notStarted
    init(emit: ModelEmit) { self.emit = emit }
    /// Waiting, but served, finished or cancelled: resumed.
    var isDecided: Bool { state == .waiting && emit.outcome != nil }
}

final class TaskRecord {
    enum Kind {
        case reader(ReaderModel)
        case emitter(EmitterModel)
        case subscriber
    }
    let name: String
    let kind: Kind
    let mailbox = Mailbox()
    var handle: Task<Void, Never>?
    var pointer: UnsafeRawPointer?
    var cancelled = false
    /// The task's logical thread in the weak-memory model.
    var thread = 0

    init(name: String, kind: Kind) {
        self.name = name
        self.kind = kind
    }

    var modelDone: Bool {
        switch kind {
        case .reader(let r): return r.pc == .done
        case .emitter(let e): return e.state == .done
        case .subscriber: return true
        }
    }
}

struct Slot {
    let subscription: Subscription
    let model: ModelSubscriber
    var reader: TaskRecord?
}

// MARK: - Entry point

let driverThread = pthread_self()

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzSched(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let bytes = ByteReader(data, size)
    Trace.rerunTraced = {
        FuzzWeakMemory.beginInput(bytes)
        let program = SchedProgram(input: bytes, trace: Trace(enabled: true))
        program.run()
    }
    FuzzWeakMemory.beginInput(bytes)
    let program = SchedProgram(input: bytes, trace: Trace())
    program.run()
    Trace.rerunTraced = nil
    return 0
}

final class SchedProgram {
    var input: ByteReader
    let trace: Trace
    let baseline = livePayloads
    let executor = ManualExecutor()
    let model: BroadcastModel
    var sequence: Broadcast?
    var slots: [Slot?] = Array(repeating: nil, count: slotCount)
    var tasks: [TaskRecord] = []
    var taskByPointer: [UnsafeRawPointer: TaskRecord] = [:]
    var subscriberSerial = 0
    /// A problem seen inside a job (reported once the job returns).
    var pendingFailure: String?

    init(input: ByteReader, trace: Trace) {
        self.input = input
        self.trace = trace
        let policy = decodePolicy(self.input.byte())
        let replay = replayTable[self.input.below(replayTable.count)]
        model = BroadcastModel(defaultPolicy: policy, replay: replay)
        sequence = Broadcast(bufferingPolicy: policy, replay: replay)
        trace.add("create(bufferingPolicy: \(describe(policy)), replay: \(replay))")
        nonisolated(unsafe) unowned let program = self  // single-threaded: see `enqueued`
        executor.setOnEnqueue { pointer in program.enqueued(pointer) }
    }

    func enqueued(_ pointer: UnsafeRawPointer) {
        if pthread_equal(pthread_self(), driverThread) == 0 {
            pendingFailure = pendingFailure ?? "a job was enqueued from another thread"
        }
        guard let task = taskByPointer[pointer] else { return }  // a runtime job
        if executor.queuedAddresses.contains(pointer) {
            pendingFailure = pendingFailure ?? "\(task.name) enqueued while already queued: a continuation resumed twice"
        } else if task.mailbox.done {
            pendingFailure = pendingFailure ?? "\(task.name) enqueued after it completed: a continuation resumed twice"
        }
    }

    var seq: Broadcast { sequence! }

    var sequenceHeldByEmitters: Bool {
        tasks.contains { task in
            if case .emitter(let e) = task.kind { return e.state != .done }
            return false
        }
    }

    /// The last reference to a `BroadcastSequence` going away finishes it.
    func finishIfSequenceReleased() {
        if sequence == nil && !sequenceHeldByEmitters { model.finish(.finished) }
    }

    // MARK: Running

    func run() {
        var steps = 0
        while !input.isAtEnd && steps < 3000 {
            step()
            steps += 1
        }
        epilogue()
    }

    func epilogue() {
        if model.terminal == nil {
            if sequence != nil {
                trace.add("(epilogue) finish()")
                seq.finish()
                model.finish(.finished)
            } else {
                // Emitters still hold the released sequence: nothing can
                // finish it, so cancel every task instead.
                for task in tasks where !task.modelDone && !task.cancelled { cancelTask(task) }
            }
            drainRuntimeJobs()
            check()
        }
        trace.add("(epilogue) run every queued job")
        while executor.queuedCount > 0 { runJob(at: 0) }
        for task in tasks where !task.mailbox.done {
            trace.fail("\(task.name) never completed: it waits forever (\(state(of: task)))", details: model.dump())
        }
        // Every task has completed and the driver has (in a real program)
        // awaited them all: everything they stored is visible.
        drainAll()
        trace.add("(epilogue) release every subscription, task and the sequence")
        for index in slots.indices where slots[index] != nil {
            model.release(slots[index]!.model)
            slots[index] = nil
        }
        sequence = nil
        for task in tasks { task.handle = nil }
        executor.setOnEnqueue(nil)
        if livePayloads != baseline {
            trace.fail("\(livePayloads - baseline) payloads still alive after releasing everything", details: model.dump())
        }
    }

    func occupiedSlot(from index: Int) -> Int? {
        for k in 0..<slotCount where slots[(index + k) % slotCount] != nil { return (index + k) % slotCount }
        return nil
    }

    func step() {
        let raw = input.byte()
        if raw >= 252 {
            // Weak memory: make stores visible (rare byte values, so the
            // older corpus keeps its meaning; `raw % 21` is `below(21)`).
            if raw == 255 {
                trace.add("(memory) drain every store buffer")
                drainAll()
            } else {
                let which = input.below(tasks.count + 1)
                let count = input.below(4)  // 0: all, else the oldest 1...3
                let task = which == 0 ? nil : tasks[which - 1]
                let thread = task?.thread ?? FuzzWeakMemory.driver
                trace.add("(memory) drain \(count == 0 ? "all" : "the oldest \(count)") of \(task?.name ?? "the driver")'s stores (\(FuzzWeakMemory.pending(thread)) pending)")
                drain(thread, count: count == 0 ? nil : count)
            }
            return
        }
        let opcode = raw % 21
        if sequence == nil && [0, 1, 2, 3, 4, 5, 6, 9, 10].contains(opcode) { return }  // released
        switch opcode {
        case 0, 1, 2:
            let byte = input.byte()
            let policy: BroadcastBufferingPolicy? = byte & 0x80 != 0 ? nil : decodePolicy(byte)
            guard let index = slots.firstIndex(where: { $0 == nil }) else { return }
            if opcode == 2 {
                subscribeFromCancelledTask(policy, slot: index)
            } else {
                subscriberSerial += 1
                let name = "s\(subscriberSerial)"
                trace.add("\(name) = subscribe(bufferingPolicy: \(policy.map(describe) ?? "nil"))")
                let subscription = seq.subscribe(bufferingPolicy: policy)
                let m = model.subscribe(name: name, policy: policy)
                m.holders = 1
                slots[index] = Slot(subscription: subscription, model: m)
            }
        case 3:
            send(count: 1)
        case 4:
            send(count: input.below(8) + 1)
        case 5, 6:
            spawnEmitter()
        case 7, 8:
            let count = readCounts[input.below(readCounts.count)]
            guard let index = occupiedSlot(from: input.byte()) else { return }
            spawnReader(slot: index, maxReads: count)
        case 9:
            trace.add("finish()")
            seq.finish()
            model.finish(.finished)
        case 10:
            let code = input.byte()
            trace.add("finish(throwing: FuzzError(\(code)))")
            seq.finish(throwing: FuzzError(code: code))
            model.finish(.failed(code))
        case 11:
            guard let index = occupiedSlot(from: input.byte()), let slot = slots[index] else { return }
            trace.add("\(slot.model.name).cancel()")
            // Weak memory: a completed reader's last store, the consumer
            // slot's release (`releaseConsumer`, a release store), may still
            // be buffered. `cancel()` then finds the slot taken, as when it
            // races a reader that is just returning from `next()`, and leaves
            // the lock-free buffer to the consumer (the next `poll()` or the
            // subscription's release frees it). Legal, and what the model does
            // for a busy consumer; which one happened shows in the live
            // payloads. Only when that reader's stores are still pending.
            let s = slot.model
            let mayLookBusy = s.isLockFree && !s.consumerBusy && !s.cancelled
                && slot.reader.map { $0.mailbox.done && FuzzWeakMemory.pending($0.thread) > 0 } ?? false
            slot.subscription.cancel()
            if mayLookBusy { s.consumerBusy = true }
            model.cancel(s)
            if mayLookBusy {
                s.consumerBusy = false
                if !s.awaitingFree.isEmpty && livePayloads - baseline == expectedHeld().count - s.awaitingFree.count {
                    s.awaitingFree.removeAll()
                    trace.annotate(" (freed its buffer)")
                } else if !s.awaitingFree.isEmpty {
                    trace.annotate(" (saw the completed reader's slot still taken: left \(s.awaitingFree) to the consumer)")
                }
            }
        case 12:
            guard let index = occupiedSlot(from: input.byte()), let slot = slots[index] else { return }
            trace.add("release \(slot.model.name)" + (slot.reader != nil && !slot.reader!.modelDone ? " (its reader still holds it)" : ""))
            // A reference count drop: the driver's release (an RMW) and a
            // completed reader's earlier release order their stores before
            // the deinit, wherever it runs.
            drain(FuzzWeakMemory.driver)
            if let reader = slot.reader, reader.mailbox.done { drain(reader.thread) }
            slots[index] = nil
            model.release(slot.model)
        case 13:
            let live = tasks.filter { !$0.modelDone && !$0.cancelled }
            guard !live.isEmpty else { return }
            cancelTask(live[input.below(live.count)])
        case 14:
            guard let index = occupiedSlot(from: input.byte()), let slot = slots[index] else { return }
            guard slot.reader == nil || slot.reader!.modelDone else { return }  // one consumer per subscription
            // The one-consumer hand-over: the driver takes the consumer role
            // only after the last reader is done (a real program awaits it).
            if let reader = slot.reader { drain(reader.thread) }
            poll(slot)
        case 20:
            // Rare on purpose: ends the interesting part of the program.
            guard input.byte() < 40, sequence != nil else { return }
            trace.add("release the sequence (it finishes once no emitter holds it)")
            // Reference counts: the last release sees every earlier one's stores.
            drain(FuzzWeakMemory.driver)
            for task in tasks where task.mailbox.done { drain(task.thread) }
            sequence = nil
            finishIfSequenceReleased()
        case 19:
            trace.add("run every queued job (\(executor.queuedCount))")
            var budget = 256
            while executor.queuedCount > 0 && budget > 0 {
                runJob(at: 0)
                budget -= 1
            }
            return
        default:
            let queued = executor.queuedCount
            guard queued > 0 else { return }
            runJob(at: input.below(queued))
            return
        }
        drainRuntimeJobs()
        check()
    }

    // MARK: Operations

    func send(count: Int) {
        let first = model.nextPayload
        trace.add(count == 1 ? "send(#\(first))" : "send(#\(first)...#\(first + count - 1))")
        for _ in 0..<count {
            let id = model.makePayloadID()
            let actual = seq.send(Payload(id))
            let expected = model.send(id)
            trace.annotate(" -> \(describe(actual))")
            if actual != expected {
                trace.fail("send(#\(id)) returned \(describe(actual)), expected \(describe(expected))", details: model.dump())
            }
        }
    }

    func poll(_ slot: Slot) {
        trace.add("\(slot.model.name).poll()")
        let actual: ReadResult
        switch slot.subscription.poll() {
        case .element(let payload): actual = .element(payload.id)
        case .empty: actual = .empty
        case .end: actual = .end
        case .failure(let error): actual = .failure(error.code)
        }
        if case .element = actual, staleHeadIsAmbiguous(slot.model) {
            drain(FuzzWeakMemory.driver)  // see `staleHeadIsAmbiguous`
        }
        let before = trace.enabled ? model.dump() : ""
        let expected = model.poll(slot.model)
        trace.annotate(" -> \(actual)")
        if actual != expected {
            trace.fail("\(slot.model.name).poll() returned \(actual), expected \(expected)", details: before)
        }
    }

    func register(_ task: TaskRecord, _ handle: Task<Void, Never>) {
        // Creating a task enqueues it (a locked RMW in the runtime): what the
        // driver stored before is visible to the task.
        drain(FuzzWeakMemory.driver)
        task.thread = FuzzWeakMemory.thread(ofTask: tasks.count)
        task.handle = handle
        let p = ManualExecutor.address(of: handle)
        task.pointer = p
        taskByPointer[p] = task
        tasks.append(task)
    }

    func spawnReader(slot index: Int, maxReads: Int) {
        guard tasks.count < maxTasks, var slot = slots[index] else { return }
        guard slot.reader == nil || slot.reader!.modelDone else { return }  // one consumer per subscription
        // The one-consumer hand-over from the previous reader (awaited).
        if let previous = slot.reader { drain(previous.thread) }
        let reader = ReaderModel(sub: slot.model, maxReads: maxReads)
        let task = TaskRecord(name: "r\(tasks.count + 1)", kind: .reader(reader))
        trace.add("\(task.name) = Task { read \(maxReads == 1 ? "once" : "up to \(maxReads)×") from \(slot.model.name) }")
        let mailbox = task.mailbox
        mailbox.subscription = slot.subscription
        slot.model.holders += 1
        let handle = Task(executorPreference: executor) {
            precondition(pthread_equal(pthread_self(), driverThread) != 0, "a reader runs off the driver thread")
            var iterator = mailbox.subscription!.makeAsyncIterator()
            mailbox.subscription = nil
            for _ in 0..<maxReads {
                let result: ReadResult
                do {
                    if let payload = try await iterator.next() {
                        result = .element(payload.id)
                    } else {
                        result = .end
                    }
                } catch let error as FuzzError {
                    result = .failure(error.code)
                } catch {
                    fatalError("unexpected error \(error)")
                }
                mailbox.reads.append(result)
                if result.endsRead { break }
            }
            mailbox.done = true
        }
        register(task, handle)
        slot.reader = task
        slots[index] = slot
    }

    func spawnEmitter() {
        guard tasks.count < maxTasks else { return }
        let id = model.makePayloadID()
        let emitter = EmitterModel(emit: ModelEmit(payload: id))
        let task = TaskRecord(name: "e\(tasks.count + 1)", kind: .emitter(emitter))
        trace.add("\(task.name) = Task { emit(#\(id)) }")
        let mailbox = task.mailbox
        mailbox.payload = Payload(id)
        mailbox.sequence = seq
        let handle = Task(executorPreference: executor) {
            precondition(pthread_equal(pthread_self(), driverThread) != 0, "an emitter runs off the driver thread")
            let sequence = mailbox.sequence!
            let payload = mailbox.payload!
            mailbox.sequence = nil
            mailbox.payload = nil
            do {
                mailbox.emitted = .delivered(try await sequence.emit(payload))
            } catch {
                mailbox.emitted = .cancelled
            }
            mailbox.done = true
        }
        register(task, handle)
    }

    func subscribeFromCancelledTask(_ policy: BroadcastBufferingPolicy?, slot index: Int) {
        guard tasks.count < maxTasks else { return }
        subscriberSerial += 1
        let name = "s\(subscriberSerial)"
        let task = TaskRecord(name: "t\(tasks.count + 1)", kind: .subscriber)
        trace.add("\(name) = subscribe(bufferingPolicy: \(policy.map(describe) ?? "nil")) from a cancelled task")
        let mailbox = task.mailbox
        let sequence = seq
        let handle = Task(executorPreference: executor) {
            mailbox.subscription = sequence.subscribe(bufferingPolicy: policy)
            mailbox.done = true
        }
        handle.cancel()
        task.cancelled = true
        register(task, handle)
        // Run it now (its only job), so the slot is ready for the next step.
        guard let jobIndex = executor.queuedAddresses.firstIndex(of: task.pointer!) else {
            trace.fail("the subscribing task was not queued")
        }
        FuzzWeakMemory.runAs(task.thread) { executor.run(at: jobIndex) }
        drain(task.thread)  // the driver awaits the subscription it made
        guard mailbox.done, let subscription = mailbox.subscription else {
            trace.fail("the subscribing task did not complete in one job")
        }
        mailbox.subscription = nil
        let m = model.subscribe(name: name, policy: policy, fromCancelledTask: true)
        m.holders = 1
        slots[index] = Slot(subscription: subscription, model: m)
    }

    func cancelTask(_ task: TaskRecord) {
        trace.add("cancel task \(task.name) (\(state(of: task)))")
        task.cancelled = true
        task.handle!.cancel()
        switch task.kind {
        case .reader(let r):
            // Inside the wait (parked, or resumed and not yet run), the
            // cancellation handler is installed: it leaves a tombstone, and
            // resumes the reader if it is parked. Elsewhere, `next()` notices
            // on its next cancellation check or when it is about to wait.
            if r.pc == .waiting {
                r.sub.tombstone = true
                if r.sub.parked {
                    r.sub.parked = false
                    r.sub.woken = true
                }
            }
        case .emitter(let e):
            if e.state == .waiting { model.cancelEmit(e.emit) }
        case .subscriber:
            break
        }
    }

    // MARK: Jobs

    /// Runs the runtime's own jobs (not tasks) at once, in order.
    func drainRuntimeJobs() {
        var budget = 10_000
        while let index = executor.queuedAddresses.firstIndex(where: { taskByPointer[$0] == nil }) {
            FuzzWeakMemory.runAs(FuzzWeakMemory.runtimeThread) { executor.run(at: index) }
            budget -= 1
            if budget == 0 { trace.fail("runtime jobs keep coming") }
        }
        if let pendingFailure { trace.fail(pendingFailure, details: model.dump()) }
    }

    func runJob(at index: Int) {
        guard let task = taskByPointer[executor.queuedAddresses[index]] else {
            trace.fail("a runtime job was left in the queue")
        }
        trace.add("run \(task.name) (\(state(of: task)))")
        let mailbox = task.mailbox
        mailbox.reads.removeAll()
        FuzzWeakMemory.runAs(task.thread) { executor.run(at: index) }
        drainRuntimeJobs()
        // A completed reader's last pops may be unpublished (nothing after
        // them drained its buffer; a suspended reader parked with an RMW).
        if case .reader(let r) = task.kind, mailbox.done, staleHeadIsAmbiguous(r.sub) {
            drain(task.thread)  // see `staleHeadIsAmbiguous`
        }
        let before = trace.enabled ? model.dump() : ""
        switch task.kind {
        case .reader(let r):
            let expected = simulate(r, task)
            trace.annotate(" -> next() returned \(mailbox.reads)" + (mailbox.done ? ", task completed" : ""))
            if mailbox.reads != expected {
                trace.fail("\(task.name): next() returned \(mailbox.reads), expected \(expected)", details: before)
            }
            if mailbox.done != (r.pc == .done) {
                trace.fail("\(task.name): task \(mailbox.done ? "completed" : "did not complete"), expected it \(r.pc == .done ? "to complete" : "to go on (\(r.pc))")",
                           details: before)
            }
        case .emitter(let e):
            simulate(e, task)
            trace.annotate(mailbox.done ? " -> emit returned \(mailbox.emitted.map { "\($0)" } ?? "?")" : " -> still waiting")
            if mailbox.done != (e.state == .done) {
                trace.fail("\(task.name): task \(mailbox.done ? "completed" : "did not complete"), expected \(e.state == .done ? "completion with \(e.emit.outcome!)" : "it to wait")",
                           details: before)
            }
            if e.state == .done && mailbox.emitted != e.emit.outcome {
                trace.fail("\(task.name): emit returned \(mailbox.emitted.map { "\($0)" } ?? "nothing"), expected \(e.emit.outcome!)",
                           details: before)
            }
        case .subscriber:
            trace.fail("a subscribing task ran twice")
        }
        check()
    }

    func simulate(_ e: EmitterModel, _ task: TaskRecord) {
        switch e.state {
        case .notStarted:
            let waits = model.emitBegins(e.emit, taskCancelled: task.cancelled)
            e.state = waits ? .waiting : .done
            if e.state == .done { finishIfSequenceReleased() }
        case .waiting where e.isDecided:
            e.state = .done
            finishIfSequenceReleased()
        case .waiting, .done:
            trace.fail("\(task.name) ran while the model says it is \(e.state)")
        }
    }

    /// Steps the reader's model from where it is to its next suspension;
    /// returns what its `next()` calls return meanwhile. Follows
    /// `SubscriberCore.next`: claim the consumer slot for the whole call;
    /// on the iterator's 1st call and every 32nd, a cancelled task ends the
    /// subscriber (as `cancel()`, `nil`); try to read; then wait (park,
    /// with no suspension before it) until woken, and read again.
    func simulate(_ r: ReaderModel, _ task: TaskRecord) -> [ReadResult] {
        var results: [ReadResult] = []
        let sub = r.sub

        /// One `next()` returned. Returns true when the task stops (done).
        func finishRead(_ result: ReadResult) -> Bool {
            sub.consumerBusy = false
            results.append(result)
            r.reads += 1
            if result.endsRead || r.reads == r.maxReads {
                r.pc = .done
                model.release(sub)  // the task lets go of its iterator
                return true
            }
            r.pc = .start
            return false
        }

        /// `waitForNext`: returns true if the task suspends.
        func enterWait() -> Bool {
            r.pc = .waiting
            // A cancelled task's handler runs at once and leaves the
            // tombstone: the park fails and the reader goes on without
            // suspending.
            if task.cancelled { sub.tombstone = true }
            if sub.tombstone { return false }
            sub.parked = true
            return true
        }

        while true {
            switch r.pc {
            case .start:
                let checksCancellation = r.calls % 32 == 0
                r.calls += 1
                sub.consumerBusy = true
                if checksCancellation && task.cancelled && !sub.ignoresTaskCancellation {
                    if finishRead(model.endByConsumer(sub)) { return results }
                    continue
                }
                let result = model.poll(sub)
                if result == .empty {
                    if enterWait() { return results }
                } else if finishRead(result) {
                    return results
                }
            case .waiting:
                if sub.parked {
                    trace.fail("\(task.name) ran while the model says it is parked", details: model.dump())
                }
                sub.woken = false
                // Resumed (or never suspended): a cancellation handler that
                // fired during the wait ends the subscriber, even if the
                // reader had been woken for an element: it is discarded.
                if sub.tombstone {
                    if finishRead(model.endByConsumer(sub)) { return results }
                    continue
                }
                let result = model.poll(sub)
                if result == .empty {
                    if enterWait() { return results }
                } else if finishRead(result) {
                    return results
                }
            case .done:
                trace.fail("\(task.name) ran after it completed")
            }
        }
    }

    // MARK: Weak memory

    func drain(_ thread: Int, count: Int? = nil) {
        FuzzWeakMemory.drain(thread, count: count)
    }

    func drainAll() {
        FuzzWeakMemory.drainAll()
    }

    /// A `.bufferingOldest(n > 0)` buffer (lock-free) whose consumer's
    /// head stores are still buffered looks fuller to every other sender:
    /// a send racing those pops may legally drop an element the model would
    /// deliver. How many of the pops a sender missed is not observable from
    /// here (it would take the producer's view of the ring's count, read
    /// from memory: no SPI exposes it), and one step can offer several
    /// elements (a batch of served emitters: deliveries first, then drops),
    /// so the model cannot follow it exactly. The harness therefore drains
    /// the consumer's buffer at the two places where pops can stay
    /// unpublished (a reader task that completes after its pops; the
    /// driver's `poll()`), for this policy only. A drain is always a legal
    /// TSO behaviour, so this hides no bug; it gives up the weak head for
    /// `.bufferingOldest`. The other lock-free policies keep it: `.bounded`
    /// publishes its head sequentially consistent (and the stale head is a
    /// finding with `boundedHeadRelease`), `.unbounded` never reads it for
    /// capacity; Bug 2 (a stale head at `finish`) is a caught-up pop.
    func staleHeadIsAmbiguous(_ s: ModelSubscriber) -> Bool {
        guard FuzzWeakMemory.isOn, case .bufferingOldest(let n) = s.policy else { return false }
        return n > 0
    }

    // MARK: Checks

    func state(of task: TaskRecord) -> String {
        switch task.kind {
        case .reader(let r):
            var s = "\(r.pc)"
            if r.pc == .waiting {
                if r.sub.parked { s += ", parked" }
                if r.sub.woken { s += ", resumed" }
            }
            return s + (task.cancelled ? ", cancelled" : "")
        case .emitter(let e):
            return (e.isDecided ? "resumed with \(e.emit.outcome!)" : "\(e.state)") + (task.cancelled ? ", cancelled" : "")
        case .subscriber:
            return "done"
        }
    }

    func check() {
        // `waitingEmitterCount` takes the sequence lock: see `observingLocked`
        // (outside `observing`, whose flag is global). `isFinished` reads a
        // word without the lock: the checker looks at it as it looks at the
        // other lock-free words (the newest store of any thread), since an
        // unmodelled thread's plain load would not see a finish whose store
        // still sits in the finisher's buffer (a legal, later-visible state).
        let locked = sequence.map { sequence in
            let waiting = FuzzWeakMemory.observingLocked { sequence.waitingEmitterCount }
            return (FuzzWeakMemory.observing { sequence.isFinished }, waiting)
        }
        FuzzWeakMemory.observing { checkObserving(locked) }
    }

    func expectedHeld() -> Set<Int> {
        var held = model.heldPayloads(storageAlive: sequence != nil || sequenceHeldByEmitters
            || model.subscribers.contains { $0.holders > 0 })
        for task in tasks {
            if case .emitter(let e) = task.kind, e.state != .done { held.insert(e.emit.payload) }
        }
        return held
    }

    func checkObserving(_ locked: (isFinished: Bool, waitingEmitters: Int)?) {
        // Who must be queued, who must be suspended, who must be done.
        let queued = Set(executor.queuedAddresses)
        for task in tasks {
            let isQueued = queued.contains(task.pointer!)
            let runnable: Bool
            switch task.kind {
            case .reader(let r):
                runnable = r.pc == .start || (r.pc == .waiting && r.sub.woken)
            case .emitter(let e):
                runnable = e.state == .notStarted || e.isDecided
            case .subscriber:
                runnable = false
            }
            if runnable && !isQueued {
                trace.fail("\(task.name) should be runnable (\(state(of: task))) but is \(task.mailbox.done ? "completed" : "not queued: left waiting")",
                           details: model.dump())
            }
            if !runnable && isQueued {
                trace.fail("\(task.name) is queued but should be \(task.modelDone ? "completed" : "suspended") (\(state(of: task)))",
                           details: model.dump())
            }
            if task.modelDone != task.mailbox.done {
                trace.fail("\(task.name): completed=\(task.mailbox.done), expected \(task.modelDone)", details: model.dump())
            }
        }
        if !KnownBugs.staleTombstone {
            for s in model.subscribers where s.registered && s.tombstone && !s.parked && !s.woken {
                // A reader still running will notice and end the subscriber;
                // with none, the subscriber stays counted and deaf.
                let readerActive = tasks.contains { task in
                    if case .reader(let r) = task.kind { return r.sub === s && r.pc != .done }
                    return false
                }
                if !readerActive {
                    trace.fail("\(s.name) is registered (counted in subscriberCount) but every send skips it: its last reader's task was cancelled after being resumed",
                               details: model.dump())
                }
            }
        }
        if let sequence {
            expectEqual(sequence.subscriberCount, model.subscriberCount, "subscriberCount", trace, details: model.dump())
            let (isFinished, waitingEmitters) = locked!
            expectEqual(isFinished, model.terminal != nil, "isFinished", trace, details: model.dump())
            expectEqual(waitingEmitters, model.emitQueue.count, "waitingEmitterCount", trace,
                        details: model.dump())
        }
        for slot in slots {
            guard let slot else { continue }
            expectEqual(slot.subscription.droppedCount, slot.model.dropped, "\(slot.model.name).droppedCount", trace,
                        details: model.dump())
            expectEqual(slot.subscription.isConsumerWaiting, slot.model.parked, "\(slot.model.name).isConsumerWaiting", trace,
                        details: model.dump())
        }
        let held = expectedHeld()
        if livePayloads - baseline != held.count {
            trace.fail("live payloads: expected \(held.count) (\(held.sorted())), got \(livePayloads - baseline)",
                       details: model.dump())
        }
    }
}
