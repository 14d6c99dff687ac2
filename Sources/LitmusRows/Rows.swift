// The litmus runner: every row of the handshake table
// (Sources/AsyncBroadcast/Subscriber/Handshakes.md), checked exhaustively
// under the weak-memory model.
//
// A row is two sides, A and B, each a few calls into the real library (a
// reader's `next()` run as a task job on a `ManualExecutor`, a `send`, a
// `finish()`, ...), run as logical threads 1 and 2 of the model on this one
// OS thread. The runner tries every schedule: each order of the two sides'
// steps, and between two steps nothing, or one side's store buffer drained.
// Stores a side does not drain stay invisible to the other side, exactly as
// in a store buffer, so a missing fence shows up as a lost wake-up or a stuck
// subscriber in some schedule. After each schedule it checks the row's
// property with the checker's own view (`WeakMemoryModel.observing`).
//
// For each row it checks:
// - every schedule passes with every ordering in place;
// - with each ordering the row relies on taken away
//   (`WeakMemoryModel.removedOrderings`), some schedule fails: the test can
//   fail, and the ordering is necessary;
// - a row ordered by a lock passes with every ordering taken away: the lock
//   alone orders it.
// Prints a line per check and `N passed, N failed` last; exits non-zero on a
// failure. Build and run: `bash scripts/litmus.sh`; the same rows are Swift
// Testing tests in Tests/LitmusTests.

@_spi(Testing) import AsyncBroadcast
import AsyncBroadcastTestSupport

@_spi(Testing) public typealias Ordering = WeakMemoryModel.Ordering

/// What a task side reports (written by its job, read by the checker on the
/// same OS thread).
final class Mailbox: @unchecked Sendable {
    var value: Int?
    var done = false
    var emitted: BroadcastSendResult?
}

/// One schedule's world: the two sides and the property to check.
struct Scenario {
    var sideA: () -> Void
    var sideB: () -> Void
    /// `nil` if the property holds, else what went wrong.
    var check: () -> String?
    /// Releases everything (runs with every buffer drained).
    var cleanup: () -> Void
}

@_spi(Testing) public struct Row {
    @_spi(Testing) public let number: Int
    @_spi(Testing) public let name: String
    /// The orderings the row relies on whose removal the model can show.
    @_spi(Testing) public let shown: [Ordering]
    /// Orderings the row relies on that this model cannot show (why).
    @_spi(Testing) public let notShown: [(Ordering, String)]
    /// Ordered by a lock: must pass with every ordering removed.
    @_spi(Testing) public let lockOrdered: Bool
    /// Side A / side B runs a task's job (a job is never run inside another
    /// job's preemption, so such a side is never the inner one when the
    /// other is a job too).
    let jobA: Bool
    let jobB: Bool
    let make: (ManualExecutor) -> Scenario
}

/// One schedule: `outer` runs; before its operation number `preemptAt`
/// (counting the model's preemption points; past its last one: after it)
/// the other side runs whole. Around that, one side's buffer may drain.
@_spi(Testing) public struct Schedule: CustomStringConvertible {
    var outerIsA: Bool
    var preemptAt: Int
    var drainOuterFirst: Bool
    var drainInnerAfter: Bool
    @_spi(Testing) public var description: String {
        let (outer, inner) = outerIsA ? ("A", "B") : ("B", "A")
        return "\(inner) runs before \(outer)'s operation #\(preemptAt)"
            + (drainOuterFirst ? ", \(outer)'s stores drained first" : "")
            + (drainInnerAfter ? ", \(inner)'s stores drained after it" : "")
    }
}

let threadA = 1, threadB = 2, driver = 0

/// The preemption hook's state (one OS thread: plain globals).
nonisolated(unsafe) var pendingInner: (() -> Void)?
nonisolated(unsafe) var preemptCountdown = 0
nonisolated(unsafe) var schedule = Schedule(outerIsA: true, preemptAt: 0, drainOuterFirst: false, drainInnerAfter: false)

func runInner() {
    guard let inner = pendingInner else { return }
    pendingInner = nil
    let outerThread = WeakMemoryModel.currentThread ?? driver
    let innerThread = schedule.outerIsA ? threadB : threadA
    if schedule.drainOuterFirst { WeakMemoryModel.drain(thread: outerThread) }
    WeakMemoryModel.currentThread = innerThread
    inner()
    if schedule.drainInnerAfter { WeakMemoryModel.drain(thread: innerThread) }
    WeakMemoryModel.currentThread = outerThread
}

@_spi(Testing) public let preemptionHook: @convention(c) () -> Void = {
    guard pendingInner != nil else { return }
    let outerThread = schedule.outerIsA ? threadA : threadB
    guard WeakMemoryModel.currentThread == outerThread else { return }
    if preemptCountdown == 0 { runInner() } else { preemptCountdown -= 1 }
}

/// Runs one schedule of `row`. Returns the failure, if any, and whether the
/// inner side ran as a preemption (`false`: the outer side had fewer points).
func run(_ row: Row, _ schedule: Schedule) -> (failure: String?, preempted: Bool) {
    let executor = ManualExecutor()
    let result = runScenario(row.make, executor, schedule)
    // The scenario is gone: whatever its tasks still hold is released as
    // they finish.
    executor.runUntilIdle()
    WeakMemoryModel.drainAll()
    return result
}

func runScenario(_ make: (ManualExecutor) -> Scenario, _ executor: ManualExecutor,
                 _ chosen: Schedule) -> (failure: String?, preempted: Bool) {
    WeakMemoryModel.currentThread = driver
    let scenario = make(executor)
    WeakMemoryModel.drainAll()  // the setup happens before both sides
    schedule = chosen
    preemptCountdown = chosen.preemptAt
    pendingInner = chosen.outerIsA ? scenario.sideB : scenario.sideA
    WeakMemoryModel.currentThread = chosen.outerIsA ? threadA : threadB
    (chosen.outerIsA ? scenario.sideA : scenario.sideB)()
    let preempted = pendingInner == nil
    runInner()  // after the outer side, if it had no point left
    WeakMemoryModel.currentThread = driver
    let failure = WeakMemoryModel.observing { scenario.check() }
    WeakMemoryModel.drainAll()
    scenario.cleanup()
    executor.runUntilIdle()
    return (failure, preempted)
}

/// The first failing schedule of `row` with `removed` taken away, if any,
/// and how many schedules were tried.
@_spi(Testing) public func firstFailure(_ row: Row, removed: Set<Ordering>) -> (found: (schedule: Schedule, failure: String)?, tried: Int) {
    WeakMemoryModel.removedOrderings = removed
    defer { WeakMemoryModel.removedOrderings = [] }
    var tried = 0
    for outerIsA in [true, false] {
        // A job never runs inside another job.
        if row.jobA && row.jobB { if !outerIsA { continue } }
        var preemptAt = 0
        while true {
            var reachedPoint = false
            for drainOuterFirst in [false, true] {
                for drainInnerAfter in [false, true] {
                    let chosen = Schedule(outerIsA: outerIsA, preemptAt: preemptAt,
                                          drainOuterFirst: drainOuterFirst, drainInnerAfter: drainInnerAfter)
                    let (failure, preempted) = run(row, chosen)
                    tried += 1
                    reachedPoint = reachedPoint || preempted
                    if let failure { return ((chosen, failure), tried) }
                }
            }
            if !reachedPoint { break }  // the inner side ran after the outer one: every point is done
            preemptAt += 1
        }
    }
    return (nil, tried)
}

// MARK: Helpers for the rows

/// A reader task that takes one element (or the end) with `next()`.
func reader(_ subscription: BroadcastSequence<Int, Never>.Subscription, on executor: ManualExecutor,
            _ mailbox: Mailbox) -> Task<Void, Never> {
    Task(executorPreference: executor) {
        var iterator = subscription.makeAsyncIterator()
        mailbox.value = await iterator.next()
        mailbox.done = true
    }
}

/// Runs `task`'s job if it is queued (a side's step).
func step(_ task: Task<Void, Never>?, _ executor: ManualExecutor) {
    guard let task else { return }
    let address = ManualExecutor.address(of: task)
    if let index = executor.queuedAddresses.firstIndex(of: address) { executor.run(at: index) }
}

/// The reader must be able to go on: done, or queued to run.
func readerCanGoOn(_ task: Task<Void, Never>?, _ mailbox: Mailbox, _ executor: ManualExecutor, _ what: String) -> String? {
    guard let task, !mailbox.done else { return nil }
    if executor.queuedAddresses.contains(ManualExecutor.address(of: task)) { return nil }
    return "lost wake-up: the reader is suspended, not queued, after \(what)"
}

func policyName(_ policy: BroadcastBufferingPolicy) -> String {
    switch policy {
    case .unbounded: return "unbounded"
    case .bounded(let n): return "bounded(\(n))"
    case .bufferingOldest(let n): return "bufferingOldest(\(n))"
    case .bufferingNewest(let n): return "bufferingNewest(\(n))"
    }
}

// MARK: The rows (numbered as in Handshakes.md)

let lockFree: [BroadcastBufferingPolicy] = [.unbounded, .bounded(4), .bufferingOldest(4)]
let locked: [BroadcastBufferingPolicy] = [.bufferingNewest(4), .bufferingOldest(0)]
/// Every row of the table, numbered as in Handshakes.md.
@_spi(Testing) public let rows: [Row] = makeRows()

func makeRows() -> [Row] {
var rows: [Row] = []

// row-1 claims: DRF-RESUME-ONCE
// Row 1: park / wake. A reader parks (counts itself, CAS to parked, fence,
// looks at its buffer); a send publishes (tail store, fence) and looks at the
// parked count and the park word.
for policy in lockFree + locked {
    rows.append(Row(
        number: 1, name: "park / send, \(policyName(policy))",
        shown: lockFree.contains(where: { policyName($0) == policyName(policy) }) ? [.wakeSkipsFence] : [],
        notShown: [(.parkSkipsFence, "the reader's CAS to parked drains its buffer in a TSO model (C11 needs the fence: an acq_rel CAS does not order a later load of another word)")]
            + (lockFree.contains(where: { policyName($0) == policyName(policy) }) ? []
               : [(.wakeSkipsFence, "a locked buffer: the reader's look takes the subscriber lock the send released, which orders it")]),
        lockOrdered: !lockFree.contains(where: { policyName($0) == policyName(policy) }),
        jobA: true, jobB: false,
        make: { executor in
            let sequence = BroadcastSequence<Int, Never>(bufferingPolicy: policy)
            let subscription = sequence.subscribe()
            let mailbox = Mailbox()
            var task: Task<Void, Never>? = reader(subscription, on: executor, mailbox)
            var delivered = 0
            return Scenario(
                sideA: { step(task, executor) },
                sideB: { delivered = sequence.send(1).delivered },
                // Capacity 0 drops the element unless the reader waits then.
                check: { delivered == 0 ? nil : readerCanGoOn(task, mailbox, executor, "a send that delivered") },
                cleanup: { sequence.finish(); executor.runUntilIdle(); task = nil; _ = subscription })
        }))
}

// row-2 claims: SEQ-FINISH-IDLE-LEAVES
// Row 2: pop / finish (the drained subscriber that stayed counted). The
// consumer takes its last element (head store, fence when drained, loads
// terminalHint); `finish` stores terminalHint, fences, loads the head.
for policy in lockFree + [.bufferingNewest(4)] {
    let isLockFree = lockFree.contains(where: { policyName($0) == policyName(policy) })
    let isBounded = policyName(policy).hasPrefix("bounded")
    rows.append(Row(
        number: 2, name: "last pop / finish, \(policyName(policy))",
        shown: !isLockFree ? [] : isBounded ? [.finishSkipsFence] : [.popSkipsFence, .finishSkipsFence],
        notShown: !isLockFree ? [(.popSkipsFence, "a locked buffer: pop and finish's count take the subscriber lock"),
                                 (.finishSkipsFence, "a locked buffer: pop and finish's count take the subscriber lock")]
            : isBounded ? [(.popSkipsFence, "a .bounded pop stores its head seq_cst and then loads the emitter flag seq_cst, which drains in a TSO model (C11 orders only the seq_cst load, not the acquire load of terminalHint after it)")]
            : [],
        lockOrdered: !isLockFree,
        jobA: false, jobB: false,
        make: { executor in
            let sequence = BroadcastSequence<Int, Never>(bufferingPolicy: policy)
            let subscription = sequence.subscribe()
            _ = sequence.send(1)
            var took: Int?
            return Scenario(
                sideA: { if case .element(let x) = subscription.poll() { took = x } },
                sideB: { sequence.finish() },
                check: {
                    guard took == 1 else { return "the consumer did not take its element" }
                    let count = sequence.subscriberCount
                    return count == 0 ? nil : "a finished, drained subscriber is still counted (subscriberCount \(count))"
                },
                cleanup: { _ = subscription })
        }))
}

// row-3-4 claims: SEQ-FINISH-IDLE-LEAVES, SEQ-END-EFFECTS
// Rows 3 and 4: a reader parks while `finish()` / `cancel()` runs. The
// ending side stores terminalHint (and, for `cancel()`, `ended`), fences and
// looks at the park word. (`cancel()`'s CAS on the consumer slot fails while
// the reader holds it: a failed CAS is only a load.)
for (number, event, ordering) in [(3, "finish()", Ordering.finishSkipsFence), (4, "cancel()", .cancelSkipsFence)] {
    for policy in lockFree + locked {
        let isLockFree = lockFree.contains(where: { policyName($0) == policyName(policy) })
        rows.append(Row(
            number: number, name: "park / \(event), \(policyName(policy))",
            shown: isLockFree ? [ordering] : [],
            notShown: [(.parkSkipsFence, "the reader's CAS to parked drains its buffer in a TSO model")]
                + (isLockFree ? [] : [(ordering, "a locked buffer: the reader's look takes the subscriber lock \(event) released")]),
            lockOrdered: !isLockFree,
            jobA: true, jobB: false,
            make: { executor in
                let sequence = BroadcastSequence<Int, Never>(bufferingPolicy: policy)
                let subscription = sequence.subscribe()
                let mailbox = Mailbox()
                var task: Task<Void, Never>? = reader(subscription, on: executor, mailbox)
                return Scenario(
                    sideA: { step(task, executor) },
                    sideB: { if number == 3 { sequence.finish() } else { subscription.cancel() } },
                    check: { readerCanGoOn(task, mailbox, executor, event) },
                    cleanup: { executor.runUntilIdle(); task = nil; _ = (subscription, sequence) })
            }))
    }
}

// row-5 claims: SEQ-EMIT-WAITS-WHILE-FULL
// Row 5: a full `.bounded` subscriber's consumer / an emitter looking for
// room. The consumer publishes its head (seq_cst) and loads the emitter flag
// (seq_cst); the emitter stores the flag (seq_cst) and loads the head (seq_cst).
rows.append(Row(
    number: 5, name: "bounded pop / emit, bounded(1)",
    shown: [.boundedHeadRelease, .emitterFlagRelease], notShown: [], lockOrdered: false,
    jobA: false, jobB: true,
        make: { executor in
        let sequence = BroadcastSequence<Int, Never>(bufferingPolicy: .bounded(1))
        let subscription = sequence.subscribe()
        _ = sequence.send(1)
        let mailbox = Mailbox()
        var emitter: Task<Void, Never>? = Task(executorPreference: executor) {
            mailbox.emitted = try? await sequence.emit(2)
            mailbox.done = true
        }
        var took: Int?
        return Scenario(
            sideA: { if case .element(let x) = subscription.poll() { took = x } },
            sideB: { step(emitter, executor) },
            check: {
                guard took == 1 else { return "the consumer did not take its element" }
                if mailbox.done { return nil }
                if let emitter, executor.queuedAddresses.contains(ManualExecutor.address(of: emitter)) { return nil }
                return "lost wake-up: the emitter waits for room although the subscriber has it"
            },
            cleanup: { sequence.finish(); executor.runUntilIdle(); emitter = nil; _ = subscription })
    }))

// row-6 claims: DRF-RESUME-ONCE
// Row 6: BroadcastValue park / change. The reader joins the parked list under
// the value's lock, parks, and looks again under the lock; a change updates
// the version and wakes the list under the lock.
rows.append(Row(
    number: 6, name: "value park / send", shown: [], notShown: [], lockOrdered: true,
    jobA: true, jobB: false,
        make: { executor in
        let value = BroadcastValue<Int, Never>(0)
        let subscription = value.subscribe()
        let mailbox = Mailbox()
        var task: Task<Void, Never>? = Task(executorPreference: executor) {
            var iterator = subscription.makeAsyncIterator()
            mailbox.value = await iterator.next()  // the current value, at once
            mailbox.value = await iterator.next()
            mailbox.done = true
        }
        return Scenario(
            sideA: { step(task, executor) },
            sideB: { value.send(1) },
            check: {
                if mailbox.done || mailbox.value == 1 { return nil }  // it has the new value
                if let task, executor.queuedAddresses.contains(ManualExecutor.address(of: task)) { return nil }
                return "lost wake-up: the value reader sleeps through a change"
            },
            cleanup: { value.finish(); executor.runUntilIdle(); task = nil; _ = subscription })
    }))

// row-7 claims: DRF-RESUME-ONCE
// Row 7: BroadcastPromise waiter / completion, both under the promise's lock.
rows.append(Row(
    number: 7, name: "promise wait / succeed", shown: [], notShown: [], lockOrdered: true,
    jobA: true, jobB: false,
        make: { executor in
        let promise = BroadcastPromise<Int, Never>()
        let mailbox = Mailbox()
        var task: Task<Void, Never>? = Task(executorPreference: executor) {
            mailbox.value = try? await promise.value
            mailbox.done = true
        }
        return Scenario(
            sideA: { step(task, executor) },
            sideB: { promise.succeed(7) },
            check: {
                guard !mailbox.done else { return mailbox.value == 7 ? nil : "the waiter got the wrong value" }
                if let task, executor.queuedAddresses.contains(ManualExecutor.address(of: task)) { return nil }
                return "lost wake-up: the promise waiter sleeps through its completion"
            },
            cleanup: { executor.runUntilIdle(); task = nil })
    }))
return rows
}
