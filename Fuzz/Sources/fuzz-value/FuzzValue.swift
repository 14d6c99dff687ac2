// Target 3 (`value`): BroadcastValue, model-based, with interleavings.
//
// The input is a program on one `BroadcastValue<V, FuzzError>` and up to 8
// subscription slots, with V one of three value types (byte 0):
// `Keyed` (Equatable struct holding a class token), `Opaque` (not
// Equatable, holding a class token), `Numbers` (an Equatable array, so
// that `update` mutates a copy-on-write buffer in place). The generic
// program never tells the library whether V is Equatable: it finds out at
// run time. Every `next()` runs in a task on `ManualExecutor`
// (AsyncBroadcastTestSupport); the input picks which queued job runs next,
// on this one thread, so a run is deterministic. "Read now" runs one
// `next()` until it returns or parks (the sequential, poll-like use);
// `poll()` (SPI) is the non-suspending step.
//
// Steps: subscribe (also from a cancelled task), send (equal to the current
// value, a palette value, a fresh one), update (body: no-op, assign,
// mutate in place, assign or mutate then throw, throw, mutate and restore),
// finish, finish(throwing:), cancel(), release a subscription, spawn a
// reader (1 to 40 `next()` calls; `next()` or `next(isolation:)`), spawn a
// `for try await` reader on the BroadcastValue itself, cancel a task, read
// now, poll, run job i, run all, arm the current value (its token's
// `deinit` sends a palette value: the replaced value must be released after
// the lock), release the BroadcastValue.
//
// `ValueModel` (FuzzKit/ValueModel.swift) is stepped alongside. Checked
// after every step:
// - what each `next()` / `poll()` returned: the model's current value if
//   this subscriber has not seen the current version (never a version
//   twice, never a stale one), else the end / the error once / nil, else it
//   must wait; task cancellation (first call and every 32nd, at once for a
//   waiting reader) ends the subscriber with nil;
// - every reader the model says was woken (by a change, finish, cancel(),
//   its task's cancellation, releasing the BroadcastValue) is queued, every
//   parked reader is not queued (an equal send wakes nobody) and is really
//   parked (`isConsumerWaiting`), and a reader parks only when there is
//   nothing for it (a reader left waiting with work = a hang);
// - no task is enqueued twice or after completing (a continuation resumed
//   twice), nothing is enqueued from another thread;
// - `value`, `subscriberCount`, `isFinished`, and the SPI `changeCount`,
//   `wakeCount`, `parkedSubscriberCount`, `isConsumerWaiting`;
// - `update`: the body sees the current value, its result is returned, a
//   thrown error is rethrown and what the body changed before throwing is
//   kept; after finish the value does not change;
// - live tokens: exactly the palette, the current value and the snapshots
//   of unregistered subscriptions are alive (replaced values are released);
// - epilogue: finish (or release the BroadcastValue), run every job: every
//   reader completes (a hang fails with a message); release everything:
//   no token alive.

@_spi(Testing) import AsyncBroadcast
import AsyncBroadcastTestSupport
import FuzzKit
#if canImport(Glibc)
import Glibc
#endif

let slotCount = 8
let maxTasks = 64
let readCounts = [1, 1, 1, 2, 3, 5, 40]

// MARK: - Value types

protocol FuzzValue: Sendable {
    static var typeName: String { get }
    /// Whether the type is Equatable (the library finds out at run time).
    static var isEquatable: Bool { get }
    /// Four fixed values the program keeps (so they repeat: A, B, A).
    static func palette(_ index: Int) -> Self
    /// A value never seen before.
    static func fresh(_ serial: Int) -> Self
    /// What the model compares: equal keys exactly when `==` says equal.
    var key: [Int] { get }
    /// The class token inside, if any (its lifetime is checked).
    var classToken: Token? { get }
    /// An in-place mutation (inside `update`).
    mutating func mutate(_ serial: Int)
}

/// Equatable; == compares the key and the token's identity.
struct Keyed: FuzzValue, Equatable {
    var k: Int
    var token: Token
    static let typeName = "Keyed"
    static let isEquatable = true
    static func palette(_ index: Int) -> Keyed { Keyed(k: index, token: Token(-1 - index)) }
    static func fresh(_ serial: Int) -> Keyed { Keyed(k: serial % 3, token: Token(serial)) }
    var key: [Int] { [k, token.id] }
    var classToken: Token? { token }
    mutating func mutate(_ serial: Int) { k += 1 + serial % 2 }
    static func == (a: Keyed, b: Keyed) -> Bool { a.k == b.k && a.token.id == b.token.id }
}

/// Not Equatable: every send and update is a change.
struct Opaque: FuzzValue {
    var token: Token
    static let typeName = "Opaque (not Equatable)"
    static let isEquatable = false
    static func palette(_ index: Int) -> Opaque { Opaque(token: Token(-1 - index)) }
    static func fresh(_ serial: Int) -> Opaque { Opaque(token: Token(serial)) }
    var key: [Int] { [token.id] }
    var classToken: Token? { token }
    mutating func mutate(_ serial: Int) { token = Token(serial) }
}

/// An Equatable collection: `update` mutates its buffer in place.
struct Numbers: FuzzValue, Equatable {
    var items: [Int]
    static let typeName = "Numbers ([Int], Equatable)"
    static let isEquatable = true
    static func palette(_ index: Int) -> Numbers { Numbers(items: [[], [1], [1, 2], [2]][index]) }
    static func fresh(_ serial: Int) -> Numbers { Numbers(items: [serial % 4, serial]) }
    var key: [Int] { items }
    var classToken: Token? { nil }
    mutating func mutate(_ serial: Int) {
        if !items.isEmpty && (items.count > 4 || serial % 3 == 0) {
            items.removeLast()
        } else {
            items.append(serial % 3)
        }
    }
}

/// A value's class part: counted in `livePayloads` (single-threaded), so
/// the program knows which values the library still holds. An armed token
/// sends into the BroadcastValue from its `deinit` (SEMANTICS 6: the
/// replaced value is released after the lock, so this is a normal send).
final class Token: @unchecked Sendable {
    let id: Int
    var onDeinit: (() -> Void)?
    init(_ id: Int) {
        self.id = id
        livePayloads += 1
    }
    deinit {
        livePayloads -= 1
        onDeinit?()
    }
}

struct BodyError: Error, Equatable {
    let code: Int
}

// MARK: - Entry point

let driverThread = pthread_self()

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzValue(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let bytes = ByteReader(data, size)
    func run(traced: Bool) {
        var input = bytes
        switch input.below(3) {
        case 0: ValueProgram<Keyed>(input: input, trace: Trace(enabled: traced || Trace.alwaysTrace)).run()
        case 1: ValueProgram<Opaque>(input: input, trace: Trace(enabled: traced || Trace.alwaysTrace)).run()
        default: ValueProgram<Numbers>(input: input, trace: Trace(enabled: traced || Trace.alwaysTrace)).run()
        }
    }
    Trace.rerunTraced = {
        FuzzWeakMemory.beginInput(bytes)
        run(traced: true)
    }
    FuzzWeakMemory.beginInput(bytes)
    run(traced: false)
    Trace.rerunTraced = nil
    return 0
}

// MARK: - Tasks

/// What a reader task reports (written by the task, read by the driver
/// after each job; single-threaded).
final class Mailbox<V: FuzzValue>: @unchecked Sendable {
    var reads: [ValueRead] = []
    var done = false
    var iterator: BroadcastValue<V, FuzzError>.Subscription.AsyncIterator?
}

final class ReaderTask<V: FuzzValue> {
    enum PC { case notStarted, running, done }
    let name: String
    let sub: ValueModelSubscriber
    let maxReads: Int
    let mailbox = Mailbox<V>()
    /// For `isConsumerWaiting` (nil for a reader of `makeAsyncIterator()`
    /// on the BroadcastValue itself).
    weak var subscription: BroadcastValue<V, FuzzError>.Subscription?
    var handle: Task<Void, Never>?
    var pointer: UnsafeRawPointer?
    /// The task's logical thread in the weak-memory model.
    var thread = 0
    var pc = PC.notStarted
    /// `next()` calls that returned.
    var reads = 0
    var cancelled = false
    /// The call that was under way when the task was cancelled (it had
    /// already passed its cancellation check).
    var cancelledInCall: Int?
    /// Cancelled inside the wait (parked, or woken and not run yet): the
    /// cancellation handler left its tombstone, so the reader returns nil
    /// when it runs, whatever arrived meanwhile.
    var tombstone = false

    init(name: String, sub: ValueModelSubscriber, maxReads: Int) {
        self.name = name
        self.sub = sub
        self.maxReads = maxReads
    }

    func state() -> String {
        var s: String
        switch pc {
        case .notStarted: s = "not started"
        case .done: s = "done"
        case .running:
            s = "in next() #\(reads + 1)"
            if sub.parked { s += ", parked" } else if sub.woken { s += ", woken" } else { s += ", runnable" }
        }
        if cancelled { s += ", cancelled" }
        return s
    }
}

struct Slot<V: FuzzValue> {
    let subscription: BroadcastValue<V, FuzzError>.Subscription
    let model: ValueModelSubscriber
    var reader: ReaderTask<V>?
}

// MARK: - The program

final class ValueProgram<V: FuzzValue> {
    typealias BV = BroadcastValue<V, FuzzError>

    var input: ByteReader
    let trace: Trace
    /// Tokens alive before this program (a traced re-run starts while the
    /// failed run still holds its own).
    let baseline = livePayloads
    let executor = ManualExecutor()
    var palette: [V] = []
    let model: ValueModel
    var value: BV?
    var slots: [Slot<V>?] = Array(repeating: nil, count: slotCount)
    var tasks: [ReaderTask<V>] = []
    var taskByPointer: [UnsafeRawPointer: ReaderTask<V>] = [:]
    var serial = 0
    var subscriberSerial = 0
    /// A problem seen inside a job (reported once the job returns).
    var pendingFailure: String?
    /// Armed tokens: id -> the palette index its `deinit` sends.
    var armed: [Int: Int] = [:]
    /// The epilogue ends the value by releasing it instead of `finish()`.
    let releaseAtEnd: Bool

    init(input: ByteReader, trace: Trace) {
        self.input = input
        self.trace = trace
        palette = (0..<4).map(V.palette)
        let initialByte = self.input.byte()
        serial = 1
        let initial = initialByte < 128 ? palette[initialByte % 4] : V.fresh(serial)
        releaseAtEnd = initialByte & 64 != 0
        model = ValueModel(initial: initial.key, isEquatable: V.isEquatable)
        value = BV(initial, throwing: FuzzError.self)
        trace.add("BroadcastValue<\(V.typeName), FuzzError>(\(describeKey(initial.key)))")
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

    func nextSerial() -> Int {
        serial += 1
        return serial
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
            if value != nil && !releaseAtEnd {
                trace.add("(epilogue) finish()")
                value!.finish()
            } else {
                trace.add("(epilogue) release the BroadcastValue (finishes it)")
                value = nil
            }
            model.finish(.finished)
            drainRuntimeJobs()
            check()
        }
        trace.add("(epilogue) run every queued job")
        var budget = 100_000
        while executor.queuedCount > 0 && budget > 0 {
            runJob(at: 0)
            budget -= 1
        }
        if budget == 0 { trace.fail("jobs keep coming: a reader never stops", details: model.dump()) }
        for task in tasks where !task.mailbox.done {
            trace.fail("\(task.name) never completed: it waits forever (\(task.state())), a lost wake-up",
                       details: model.dump())
        }
        FuzzWeakMemory.drainAll()  // every reader completed and was awaited
        trace.add("(epilogue) release the BroadcastValue, every subscription and task")
        value = nil
        armed.removeAll()
        for index in slots.indices where slots[index] != nil {
            model.release(slots[index]!.model)
            slots[index] = nil
        }
        for task in tasks { task.handle = nil }
        executor.setOnEnqueue(nil)
        let alive = livePayloads - baseline
        let expected = Set(palette.compactMap(\.classToken?.id)).count
        if alive != expected {
            trace.fail("\(alive - expected) tokens still alive after releasing everything (besides the \(expected) of the palette)",
                       details: model.dump())
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
            // older corpus keeps its meaning; `raw % 22` is `below(22)`).
            if raw == 255 {
                trace.add("(memory) drain every store buffer")
                FuzzWeakMemory.drainAll()
            } else {
                let which = input.below(tasks.count + 1)
                let count = input.below(4)  // 0: all, else the oldest 1...3
                let task = which == 0 ? nil : tasks[which - 1]
                let thread = task?.thread ?? FuzzWeakMemory.driver
                trace.add("(memory) drain \(count == 0 ? "all" : "the oldest \(count)") of \(task?.name ?? "the driver")'s stores (\(FuzzWeakMemory.pending(thread)) pending)")
                FuzzWeakMemory.drain(thread, count: count == 0 ? nil : count)
            }
            return
        }
        let opcode = raw % 22
        if value == nil && (opcode <= 9 || opcode == 20) { return }  // released
        switch opcode {
        case 0, 1:
            guard let index = slots.firstIndex(where: { $0 == nil }) else { return }
            subscriberSerial += 1
            let name = "s\(subscriberSerial)"
            trace.add("\(name) = subscribe()  [slot \(index)]")
            let subscription = value!.subscribe()
            let m = model.subscribe(name: name)
            m.holders = 1
            slots[index] = Slot(subscription: subscription, model: m)
        case 2:
            guard let index = slots.firstIndex(where: { $0 == nil }) else { return }
            subscribeFromCancelledTask(slot: index)
        case 3, 4, 5:
            send(input.byte())
        case 6, 7:
            update(variant: input.byte(), choice: input.byte())
        case 8:
            trace.add("finish()")
            value!.finish()
            model.finish(.finished)
        case 9:
            let code = input.byte()
            trace.add("finish(throwing: FuzzError(\(code)))")
            value!.finish(throwing: FuzzError(code: code))
            model.finish(.failed(code))
        case 10:
            guard let index = occupiedSlot(from: input.byte()), let slot = slots[index] else { return }
            trace.add("\(slot.model.name).cancel()")
            slot.subscription.cancel()
            model.cancel(slot.model)
        case 11:
            guard let index = occupiedSlot(from: input.byte()), let slot = slots[index] else { return }
            let held = slot.reader.map { $0.pc != .done } ?? false
            trace.add("release \(slot.model.name)" + (held ? " (its reader still holds it)" : ""))
            // A reference count drop: the driver's release (an RMW) and a
            // completed reader's earlier one order their stores before the
            // deinit, wherever it runs.
            FuzzWeakMemory.drain(FuzzWeakMemory.driver)
            if let reader = slot.reader, reader.mailbox.done { FuzzWeakMemory.drain(reader.thread) }
            slots[index] = nil
            model.release(slot.model)
        case 12, 13:
            let count = readCounts[input.below(readCounts.count)]
            let flags = input.byte()
            guard let index = occupiedSlot(from: flags >> 1) else { return }
            spawnReader(slot: index, maxReads: count, isolated: flags & 1 != 0)
        case 14:
            let count = readCounts[input.below(readCounts.count)]
            spawnLoopReader(maxReads: count)
        case 15:
            let live = tasks.filter { $0.pc != .done && !$0.cancelled }
            let pick = input.byte()
            guard !live.isEmpty else { return }
            cancelTask(live[pick % live.count])
        case 16:
            let byte = input.byte()
            guard let index = occupiedSlot(from: byte >> 1) else { return }
            if byte & 1 == 0 {
                readNow(slot: index)
                return
            }
            poll(slot: index)
        case 17:
            trace.add("run every queued job (\(executor.queuedCount))")
            var budget = 256
            while executor.queuedCount > 0 && budget > 0 {
                runJob(at: 0)
                budget -= 1
            }
            return
        case 18, 19:
            let pick = input.byte()
            let queued = executor.queuedCount
            guard queued > 0 else { return }
            runJob(at: pick % queued)
            return
        case 20:
            arm(palette: input.byte() % 4)
        default:
            // Rare on purpose: ends the interesting part of the program.
            guard input.byte() < 40, value != nil else { return }
            trace.add("release the BroadcastValue (finishes it)")
            // Reference counts: the last release sees every earlier one's stores.
            FuzzWeakMemory.drain(FuzzWeakMemory.driver)
            for task in tasks where task.mailbox.done { FuzzWeakMemory.drain(task.thread) }
            value = nil
            model.finish(.finished)
        }
        drainRuntimeJobs()
        check()
    }

    // MARK: Changing the value

    /// A value chosen by `choice`: equal to the current one (a copy of
    /// `value`), one of the palette, or a fresh one.
    func choose(_ choice: Int) -> (V, String) {
        switch choice % 4 {
        case 0: return (value!.value, "the current value")
        case 1: return (palette[(choice >> 2) % 4], "palette[\((choice >> 2) % 4)]")
        default: return (V.fresh(nextSerial()), "fresh")
        }
    }

    func send(_ choice: Int) {
        let (newValue, what) = choose(choice)
        trace.add("send(\(describeKey(newValue.key)))  [\(what)]")
        let before = model.version
        value!.send(newValue)
        let changed = model.set(newValue.key)
        trace.annotate(changed ? " -> change v\(before + 1)" : " -> no change")
    }

    /// `update` with a body chosen by `variant`; after finish the body runs
    /// on a discarded copy.
    func update(variant: Int, choice: Int) {
        let (newValue, what) = variant % 7 == 1 || variant % 7 == 3 ? choose(choice) : (palette[0], "")
        let mutation = nextSerial()
        let result = variant >> 3
        let expectedStart = model.current
        var sawStart: [Int]?
        var left: [Int]?
        let description: String
        let body: (inout V) throws(BodyError) -> Int
        switch variant % 7 {
        case 0:
            description = "{ _ in \(result) }"
            body = { v throws(BodyError) in sawStart = v.key; left = v.key; return result }
        case 1:
            description = "{ $0 = \(describeKey(newValue.key)) [\(what)]; return \(result) }"
            body = { v throws(BodyError) in sawStart = v.key; v = newValue; left = v.key; return result }
        case 2:
            description = "{ $0.mutate(\(mutation)); return \(result) }"
            body = { v throws(BodyError) in sawStart = v.key; v.mutate(mutation); left = v.key; return result }
        case 3:
            description = "{ $0 = \(describeKey(newValue.key)) [\(what)]; throw BodyError(\(result)) }"
            body = { v throws(BodyError) in sawStart = v.key; v = newValue; left = v.key; throw BodyError(code: result) }
        case 4:
            description = "{ _ in throw BodyError(\(result)) }"
            body = { v throws(BodyError) in sawStart = v.key; left = v.key; throw BodyError(code: result) }
        case 5:
            description = "{ $0.mutate(\(mutation)); $0 = original; return \(result) }"
            body = { v throws(BodyError) in
                sawStart = v.key
                let original = v
                v.mutate(mutation)
                v = original
                left = v.key
                return result
            }
        default:
            description = "{ $0.mutate(\(mutation)); throw BodyError(\(result)) }"
            body = { v throws(BodyError) in sawStart = v.key; v.mutate(mutation); left = v.key; throw BodyError(code: result) }
        }
        trace.add("update \(description)")
        let outcome: Result<Int, BodyError>
        do throws(BodyError) {
            outcome = .success(try value!.update(body))
        } catch {
            outcome = .failure(error)
        }
        guard let sawStart, let left else { trace.fail("update did not run its body", details: model.dump()) }
        if sawStart != expectedStart {
            trace.fail("update's body started from \(describeKey(sawStart)), expected the current value \(describeKey(expectedStart))",
                       details: model.dump())
        }
        let throwsInBody = [3, 4, 6].contains(variant % 7)
        let expectedOutcome: Result<Int, BodyError> = throwsInBody ? .failure(BodyError(code: result)) : .success(result)
        if outcome != expectedOutcome {
            trace.fail("update returned \(outcome), expected \(expectedOutcome)", details: model.dump())
        }
        let before = model.version
        let changed = model.set(left)
        trace.annotate(" -> \(outcome), " + (changed ? "change v\(before + 1) \(describeKey(left))" : "no change"))
    }

    /// Makes the current value's token send `palette[p]` from its
    /// `deinit` (only a fresh token: the palette lives to the end). It
    /// fires when the library lets go of its last copy: the call that
    /// replaced it, or the release of a snapshot holding it.
    func arm(palette p: Int) {
        guard let bv = value, let token = bv.value.classToken, token.id > 0, armed[token.id] == nil else { return }
        let message = palette[p]
        trace.add("arm \(describeKey(model.current)): its deinit sends palette[\(p)] \(describeKey(message.key))")
        token.onDeinit = { [weak bv] in bv?.send(message) }
        armed[token.id] = p
    }

    /// Fires, in the model, the armed tokens the library no longer holds;
    /// once the BroadcastValue is gone, their weak reference is nil.
    func settleArmed() {
        guard !armed.isEmpty else { return }
        guard value != nil else {
            armed.removeAll()
            return
        }
        while let (id, p) = armed.sorted(by: { $0.key < $1.key }).first(where: { entry in
            !model.heldKeys(storageAlive: true).contains { $0.last == entry.key }
        }) {
            armed[id] = nil
            let before = model.version
            let changed = model.set(palette[p].key)
            trace.annotate("; token \(id) released: its deinit sent \(describeKey(palette[p].key))"
                           + (changed ? " (change v\(before + 1))" : " (no change)"))
        }
    }

    // MARK: Subscribing and reading

    func subscribeFromCancelledTask(slot index: Int) {
        guard tasks.count < maxTasks else { return }
        subscriberSerial += 1
        let name = "s\(subscriberSerial)"
        trace.add("\(name) = subscribe() from a cancelled task  [slot \(index)]")
        let box = Mailbox<V>()
        nonisolated(unsafe) var made: BV.Subscription?
        let bv = value!
        let handle = Task(executorPreference: executor) {
            made = bv.subscribe()
            box.done = true
        }
        handle.cancel()
        let pointer = ManualExecutor.address(of: handle)
        guard let jobIndex = executor.queuedAddresses.firstIndex(of: pointer) else {
            trace.fail("the subscribing task was not queued")
        }
        FuzzWeakMemory.runAs(FuzzWeakMemory.thread(ofTask: tasks.count)) { executor.run(at: jobIndex) }
        FuzzWeakMemory.drain(FuzzWeakMemory.thread(ofTask: tasks.count))  // the driver awaits the subscription
        guard box.done, let subscription = made else { trace.fail("the subscribing task did not complete in one job") }
        made = nil
        let m = model.subscribe(name: name, fromCancelledTask: true)
        m.holders = 1
        slots[index] = Slot(subscription: subscription, model: m)
    }

    func register(_ task: ReaderTask<V>, _ handle: Task<Void, Never>) {
        // Creating a task enqueues it (a locked RMW in the runtime): what the
        // driver stored before is visible to the task.
        FuzzWeakMemory.drain(FuzzWeakMemory.driver)
        task.thread = FuzzWeakMemory.thread(ofTask: tasks.count)
        task.handle = handle
        let p = ManualExecutor.address(of: handle)
        task.pointer = p
        taskByPointer[p] = task
        tasks.append(task)
    }

    func start(_ task: ReaderTask<V>, iterator: BV.Subscription.AsyncIterator, isolated: Bool) {
        let mailbox = task.mailbox
        mailbox.iterator = iterator
        let maxReads = task.maxReads
        let handle = Task(executorPreference: executor) {
            precondition(pthread_equal(pthread_self(), driverThread) != 0, "a reader runs off the driver thread")
            var iterator = mailbox.iterator!
            mailbox.iterator = nil
            for _ in 0..<maxReads {
                let result: ValueRead
                do throws(FuzzError) {
                    let element = isolated ? try await iterator.next(isolation: nil) : try await iterator.next()
                    result = element.map { .value($0.key) } ?? .end
                } catch {
                    result = .failure(error.code)
                }
                mailbox.reads.append(result)
            }
            mailbox.done = true
        }
        register(task, handle)
    }

    @discardableResult
    func spawnReader(slot index: Int, maxReads: Int, isolated: Bool) -> ReaderTask<V>? {
        guard tasks.count < maxTasks, var slot = slots[index] else { return nil }
        guard slot.reader == nil || slot.reader!.pc == .done else { return nil }  // one consumer per subscription
        // The one-consumer hand-over from the previous reader (awaited).
        if let previous = slot.reader { FuzzWeakMemory.drain(previous.thread) }
        let task = ReaderTask<V>(name: "r\(tasks.count + 1)", sub: slot.model, maxReads: maxReads)
        trace.add("\(task.name) = Task { \(maxReads == 1 ? "next()" : "next() ×\(maxReads)")\(isolated ? " (isolation: nil)" : "") on \(slot.model.name) }")
        task.subscription = slot.subscription
        slot.model.holders += 1
        start(task, iterator: slot.subscription.makeAsyncIterator(), isolated: isolated)
        slot.reader = task
        slots[index] = slot
        return task
    }

    /// `for try await v in value`: `makeAsyncIterator()` on the BroadcastValue
    /// (made here, so it registers now); only the task holds it.
    func spawnLoopReader(maxReads: Int) {
        guard tasks.count < maxTasks, let bv = value else { return }
        subscriberSerial += 1
        let m = model.subscribe(name: "s\(subscriberSerial)")
        m.holders = 1
        let task = ReaderTask<V>(name: "r\(tasks.count + 1)", sub: m, maxReads: maxReads)
        trace.add("\(task.name) = Task { for try await over the BroadcastValue (\(m.name)), \(maxReads) iteration\(maxReads == 1 ? "" : "s") }")
        start(task, iterator: bv.makeAsyncIterator(), isolated: false)
    }

    /// One `next()` now, run until it returns or parks: the sequential use.
    func readNow(slot index: Int) {
        guard let task = spawnReader(slot: index, maxReads: 1, isolated: false) else { return }
        trace.annotate("  [read now]")
        drainRuntimeJobs()
        check()
        var budget = 64
        while let jobIndex = executor.queuedAddresses.firstIndex(of: task.pointer!), budget > 0 {
            runJob(at: jobIndex)
            budget -= 1
        }
        if budget == 0 { trace.fail("\(task.name) keeps yielding", details: model.dump()) }
        // The sequential use: the driver awaited this `next()` when it returned.
        if task.mailbox.done { FuzzWeakMemory.drain(task.thread) }
    }

    /// The `poll()` SPI: one step that never parks (only with no reader
    /// inside `next()`: one consumer per subscription).
    func poll(slot index: Int) {
        guard let slot = slots[index], slot.reader == nil || slot.reader!.pc == .done else { return }
        // The one-consumer hand-over: the driver polls only after the last
        // reader is done (a real program awaits it).
        if let reader = slot.reader { FuzzWeakMemory.drain(reader.thread) }
        trace.add("\(slot.model.name).poll()")
        let actual: ValueRead?
        switch slot.subscription.poll() {
        case .element(let v): actual = .value(v.key)
        case .empty: actual = nil
        case .end: actual = .end
        case .failure(let error): actual = .failure(error.code)
        }
        let before = trace.enabled ? model.dump() : ""
        let expected = model.read(slot.model)
        trace.annotate(" -> \(actual.map { "\($0)" } ?? "empty")")
        if actual != expected {
            trace.fail("\(slot.model.name).poll() returned \(actual.map { "\($0)" } ?? "empty"), expected \(expected.map { "\($0)" } ?? "empty")",
                       details: before)
        }
    }

    func cancelTask(_ task: ReaderTask<V>) {
        trace.add("cancel task \(task.name) (\(task.state()))")
        task.cancelled = true
        if task.pc == .running { task.cancelledInCall = task.reads }
        if task.sub.parked || task.sub.woken {
            task.tombstone = true
            model.wakeForTaskCancellation(task.sub)
        }
        task.handle!.cancel()
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
        trace.add("run \(task.name) (\(task.state()))")
        let mailbox = task.mailbox
        mailbox.reads.removeAll()
        if task.pc == .done { trace.fail("\(task.name) ran after it completed", details: model.dump()) }
        if task.sub.parked { trace.fail("\(task.name) ran while the model says it is parked", details: model.dump()) }
        let before = trace.enabled ? model.dump() : ""
        FuzzWeakMemory.runAs(task.thread) { executor.run(at: index) }  // its stores stay buffered
        drainRuntimeJobs()
        simulate(task, details: before)
        check()
    }

    /// What the model expects from the reader's `next()` number `call`
    /// (0-based); `nil`: it waits.
    func expectedRead(_ task: ReaderTask<V>, call: Int) -> ValueRead? {
        let s = task.sub
        if s.ended { return .end }
        if task.tombstone {
            task.tombstone = false
            return model.endByTaskCancellation(s)
        }
        let ignoresCancellation = s.unregistered
        if task.cancelled && !ignoresCancellation && call % 32 == 0 && task.cancelledInCall != call {
            // The iterator looks at its task's cancellation on its first call
            // and then every 32.
            return model.endByTaskCancellation(s)
        }
        if let read = model.read(s) { return read }
        if task.cancelled && !ignoresCancellation {
            // It would wait: the cancellation handler fires at once.
            return model.endByTaskCancellation(s)
        }
        return nil
    }

    /// Steps the reader's model over what its job did.
    func simulate(_ task: ReaderTask<V>, details: @autoclosure () -> String) {
        let mailbox = task.mailbox
        let s = task.sub
        task.pc = .running
        s.woken = false
        for actual in mailbox.reads {
            let call = task.reads
            guard let expected = expectedRead(task, call: call) else {
                trace.annotate(" -> next() returned \(mailbox.reads)")
                trace.fail("\(task.name): next() #\(call + 1) returned \(actual), expected it to wait (\(s.name) has seen v\(s.lastSeen), the latest)",
                           details: details())
            }
            if actual != expected {
                trace.annotate(" -> next() returned \(mailbox.reads)")
                trace.fail("\(task.name): next() #\(call + 1) on \(s.name) returned \(actual), expected \(expected)", details: details())
            }
            task.reads += 1
        }
        trace.annotate(" -> next() returned \(mailbox.reads)" + (mailbox.done ? ", task completed" : ""))
        let expectDone = task.reads == task.maxReads
        if mailbox.done != expectDone {
            trace.fail("\(task.name): the task \(mailbox.done ? "completed" : "did not complete") after \(task.reads) of \(task.maxReads) next() calls",
                       details: details())
        }
        if expectDone {
            task.pc = .done
            model.release(s)  // the task lets go of its iterator
            return
        }
        // Still inside next() #reads+1: queued again (a yield) or parked.
        if executor.queuedAddresses.contains(task.pointer!) { return }
        if task.subscription.map({ !$0.isConsumerWaiting }) ?? false {
            trace.fail("\(task.name) is suspended, not queued, but isConsumerWaiting is false", details: details())
        }
        if model.hasWork(s) || task.cancelled && !s.unregistered {
            trace.fail("\(task.name) parked although next() #\(task.reads + 1) has something to return (\(s)): it would wait forever",
                       details: details())
        }
        model.park(s)
    }

    // MARK: Checks

    func check() {
        settleArmed()
        let queued = Set(executor.queuedAddresses)
        for task in tasks {
            let isQueued = queued.contains(task.pointer!)
            switch task.pc {
            case .done:
                if isQueued { trace.fail("\(task.name) is queued after it completed", details: model.dump()) }
                continue
            case .notStarted:
                if !isQueued { trace.fail("\(task.name) has not started but is not queued", details: model.dump()) }
            case .running:
                if task.sub.parked && isQueued {
                    trace.fail("\(task.name) was woken although nothing concerns it (\(task.state()))", details: model.dump())
                }
                if !task.sub.parked && !isQueued {
                    trace.fail("\(task.name) should have been woken (\(task.state())) but is left waiting: a lost wake-up",
                               details: model.dump())
                }
            }
            if task.mailbox.done { trace.fail("\(task.name) completed unexpectedly (\(task.state()))", details: model.dump()) }
        }
        if let value {
            // All of these take the value's lock: see `observingLocked`.
            let (current, subscriberCount, isFinished, changeCount, wakeCount, parked) = FuzzWeakMemory.observingLocked {
                (value.value.key, value.subscriberCount, value.isFinished, value.changeCount, value.wakeCount,
                 value.parkedSubscriberCount)
            }
            if current != model.current {
                trace.fail("value is \(describeKey(current)), expected \(describeKey(model.current))", details: model.dump())
            }
            expectEqual(subscriberCount, model.subscriberCount, "subscriberCount", trace, details: model.dump())
            expectEqual(isFinished, model.terminal != nil, "isFinished", trace, details: model.dump())
            expectEqual(changeCount, model.changeCount, "changeCount", trace, details: model.dump())
            expectEqual(wakeCount, model.wakeCount, "wakeCount", trace, details: model.dump())
            expectEqual(parked, model.parkedCount, "parkedSubscriberCount", trace, details: model.dump())
        }
        for slot in slots {
            guard let slot else { continue }
            let waiting = FuzzWeakMemory.observing { slot.subscription.isConsumerWaiting }
            expectEqual(waiting, slot.model.parked, "\(slot.model.name).isConsumerWaiting", trace,
                        details: model.dump())
        }
        checkTokens()
    }

    /// Only the palette, the current value (while the storage is alive) and
    /// untaken snapshots are alive: replaced values are released by the call
    /// that replaced them, values returned by `next()` by the reader.
    func checkTokens() {
        guard V.self != Numbers.self else { return }
        let alive = livePayloads - baseline
        var expected = Set(palette.compactMap(\.classToken?.id))
        let storageAlive = value != nil || model.registeredKindAlive
        for key in model.heldKeys(storageAlive: storageAlive) { expected.insert(key.last!) }
        if alive != expected.count {
            trace.fail("live tokens: expected \(expected.count) (\(expected.sorted()): palette, current value\(storageAlive ? "" : " (storage released)"), snapshots), got \(alive)",
                       details: model.dump())
        }
    }
}
