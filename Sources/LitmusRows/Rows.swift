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

func runScenario(
    _ make: (ManualExecutor) -> Scenario, _ executor: ManualExecutor,
    _ chosen: Schedule
) -> (failure: String?, preempted: Bool) {
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
                    let chosen = Schedule(
                        outerIsA: outerIsA, preemptAt: preemptAt,
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
func reader(
    _ subscription: BroadcastSequence<Int, Never>.Subscription, on executor: ManualExecutor,
    _ mailbox: Mailbox
) -> Task<Void, Never> {
    Task(executorPreference: executor) {
        var iterator = subscription.makeAsyncIterator()
        mailbox.value = await iterator.next()
        mailbox.done = true
    }
}

/// Runs `task`'s job if it is queued (a side's step).
/// Row 1's scenario: a reader parks (side A) while a send (side B) reaches
/// it; `otherSubscribers` more subscribers, never read, push the send past
/// the direct wake of a few park words to the parked count.
func parkSendScenario(_ policy: BroadcastBufferingPolicy, otherSubscribers: Int, _ executor: ManualExecutor) -> Scenario {
    let sequence = BroadcastSequence<Int, Never>(bufferingPolicy: policy)
    let subscription = sequence.subscribe()
    let others = (0..<otherSubscribers).map { _ in sequence.subscribe() }
    let mailbox = Mailbox()
    var task: Task<Void, Never>? = reader(subscription, on: executor, mailbox)
    var delivered = 0
    return Scenario(
        sideA: { step(task, executor) },
        sideB: { delivered = sequence.send(1).delivered },
        // Capacity 0 drops the element unless the reader waits then.
        check: { delivered == 0 ? nil : readerCanGoOn(task, mailbox, executor, "a send that delivered") },
        cleanup: {
            sequence.finish(); executor.runUntilIdle(); task = nil; _ = subscription; _ = others
        })
}

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
        rows.append(
            Row(
                number: 1, name: "park / send, \(policyName(policy))",
                shown: lockFree.contains(where: { policyName($0) == policyName(policy) }) ? [.wakeSkipsFence] : [],
                notShown: [(.parkSkipsFence, "the reader's CAS to parked drains its buffer in a TSO model (C11 needs the fence: an acq_rel CAS does not order a later load of another word)")]
                    + (lockFree.contains(where: { policyName($0) == policyName(policy) })
                        ? []
                        : [(.wakeSkipsFence, "a locked buffer: the reader's look takes the subscriber lock the send released, which orders it")]),
                lockOrdered: !lockFree.contains(where: { policyName($0) == policyName(policy) }),
                jobA: true, jobB: false,
                make: { executor in parkSendScenario(policy, otherSubscribers: 0, executor) }))
    }

    // row-1 claims: DRF-RESUME-ONCE
    // Row 1 again, with more subscribers than `BroadcastState.directWakeLimit`:
    // the send looks at `parkedCount` after its fence before any park word
    // (with one subscriber it looks at the park word at once). The other
    // subscribers are never read.
    rows.append(
        Row(
            number: 1, name: "park / send, unbounded, 6 subscribers (parked count)",
            shown: [.wakeSkipsFence],
            notShown: [(.parkSkipsFence, "the reader's CAS to parked drains its buffer in a TSO model (C11 needs the fence: an acq_rel CAS does not order a later load of another word)")],
            lockOrdered: false,
            jobA: true, jobB: false,
            make: { executor in parkSendScenario(.unbounded, otherSubscribers: 5, executor) }))

    // row-2 claims: SEQ-FINISH-IDLE-LEAVES
    // Row 2: pop / finish (the drained subscriber that stayed counted). The
    // consumer takes its last element (head store, fence when drained, loads
    // terminalHint); `finish` stores terminalHint, fences, loads the head.
    for policy in lockFree + [.bufferingNewest(4)] {
        let isLockFree = lockFree.contains(where: { policyName($0) == policyName(policy) })
        let isBounded = policyName(policy).hasPrefix("bounded")
        rows.append(
            Row(
                number: 2, name: "last pop / finish, \(policyName(policy))",
                shown: !isLockFree ? [] : isBounded ? [.finishSkipsFence] : [.popSkipsFence, .finishSkipsFence],
                notShown: !isLockFree
                    ? [
                        (.popSkipsFence, "a locked buffer: pop and finish's count take the subscriber lock"),
                        (.finishSkipsFence, "a locked buffer: pop and finish's count take the subscriber lock"),
                    ]
                    : isBounded
                        ? [(.popSkipsFence, "a .bounded pop stores its head seq_cst and then loads the emitter flag seq_cst, which drains in a TSO model (C11 orders only the seq_cst load, not the acquire load of terminalHint after it)")]
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
            rows.append(
                Row(
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
                            cleanup: {
                                executor.runUntilIdle(); task = nil; _ = (subscription, sequence)
                            })
                    }))
        }
    }

    // row-5 claims: SEQ-EMIT-WAITS-WHILE-FULL
    // Row 5: a full `.bounded` subscriber's consumer / an emitter looking for
    // room. The consumer publishes its head (seq_cst) and loads the emitter flag
    // (seq_cst); the emitter stores the flag (seq_cst) and loads the head (seq_cst).
    rows.append(
        Row(
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
                    cleanup: {
                        sequence.finish(); executor.runUntilIdle(); emitter = nil; _ = subscription
                    })
            }))

    // row-6 claims: DRF-RESUME-ONCE
    // Row 6: BroadcastValue park / change. The reader joins the parked list under
    // the value's lock, parks, and looks again under the lock; a change updates
    // the version and wakes the list under the lock.
    rows.append(
        Row(
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
                    cleanup: {
                        value.finish(); executor.runUntilIdle(); task = nil; _ = subscription
                    })
            }))

    // row-7 claims: DRF-RESUME-ONCE
    // Row 7: BroadcastPromise waiter / completion, both under the promise's lock.
    rows.append(
        Row(
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
                    cleanup: {
                        executor.runUntilIdle(); task = nil
                    })
            }))
    // Rows 8 and 9: an events reader parks (or reads) while its subscriber is
    // ended by another thread with a gap still unreported: an evicting send
    // (row 8: a soft limit on a manual clock that has run out) or `cancel()`
    // (row 9). The ending side counts its drops (under the sequence lock), then
    // stores `evicted` (row 8), `terminalHint` and `ended` (release), fences and
    // looks at the park word (`SubscriberCore.end`, the same fence as row 4).
    // The reader loads `ended` (acquire), then `dropped` (acquire) for its last
    // `.lagged` (`takeFinalLag`). Checked: the reader is not left parked; once
    // it has read `nil`, its `.lagged` counts add up to `droppedCount`, and an
    // evicted one says `isEvicted`.
    for (number, event) in [(8, "an evicting send"), (9, "cancel()")] {
        for policy in [BroadcastBufferingPolicy.bufferingOldest(2), .bufferingNewest(2)] {
            let isLockFree = policyName(policy).hasPrefix("bufferingOldest")
            rows.append(
                Row(
                    number: number, name: "events reader parks / \(event) with a gap pending, \(policyName(policy))",
                    // An eviction stores `terminalHint` and `ended` inside the send,
                    // then its ending takes the sequence lock again to unregister
                    // it: in TSO that acquisition drains the stores before the
                    // fence, so only `cancel()` (row 9) shows the fence is needed.
                    shown: isLockFree && number == 9 ? [.cancelSkipsFence] : [],
                    notShown: [(.parkSkipsFence, "the reader's CAS to parked drains its buffer in a TSO model")]
                        + (!isLockFree
                            ? [(.cancelSkipsFence, "a locked buffer: the reader's look takes the subscriber lock the ending released")]
                            : number == 8
                                ? [(.cancelSkipsFence, "the eviction's ending takes the sequence lock (to unregister it) after storing terminalHint and ended, which drains them in a TSO model before the fence (C11: a lock acquisition is only an acquire, it does not order an earlier store before a later load; row 9 shows the same fence is needed)")]
                                : []),
                    lockOrdered: !isLockFree,
                    jobA: true, jobB: false,
                    make: { executor in
                        let clock = ManualClock()
                        let sequence = BroadcastSequence<Int, Never>()
                        let subscription =
                            number == 8
                            ? sequence.subscribe(bufferingPolicy: policy, eviction: .softLimit(1, for: .seconds(1)), clock: clock)
                            : sequence.subscribe(bufferingPolicy: policy)
                        // Holds 2, over its soft limit since the 3rd send, which
                        // dropped one: a gap of 1, not reported yet.
                        for value in 1...3 { _ = sequence.send(value) }
                        clock.advance(by: .seconds(1))
                        let mailbox = Mailbox()
                        let events = Locked<[BroadcastEvent<Int>]>([])
                        var task: Task<Void, Never>? = Task(executorPreference: executor) {
                            for await event in subscription.events { events.withLock { $0.append(event) } }
                            mailbox.done = true
                        }
                        var sent: BroadcastSendResult?
                        return Scenario(
                            sideA: { step(task, executor) },
                            sideB: { if number == 8 { sent = sequence.send(4) } else { subscription.cancel() } },
                            check: {
                                // A reader that ran first took what it held: then
                                // the send finds it under its limit and delivers,
                                // and a reader that has read that too waits on.
                                if number == 8, sent?.evicted == 0, !mailbox.done, subscription.bufferedCount == 0 { return nil }
                                guard mailbox.done else { return readerCanGoOn(task, mailbox, executor, event) }
                                if number == 8, sent?.evicted != 1 { return "the reader ended, yet the send did not evict it: \(String(describing: sent))" }
                                let lagged = events.value.reduce(0) {
                                    if case .lagged(let n) = $1 { return $0 + n }; return $0
                                }
                                if lagged != subscription.droppedCount {
                                    return "the ended reader's .lagged counts add up to \(lagged), droppedCount is \(subscription.droppedCount) (events \(events.value))"
                                }
                                if number == 8 && !subscription.isEvicted { return "the reader got nil, yet isEvicted is false" }
                                return nil
                            },
                            cleanup: {
                                sequence.finish(); executor.runUntilIdle(); task = nil; _ = subscription
                            })
                    }))
        }
    }

    // Row 10: readiness. A subscriber waits in `upstreamReady()` (it joins the
    // readiness waiters under the sequence lock after looking at the ready
    // generation there); the listener's `sink.ready()` records the ready
    // generation and takes the waiters under the same lock, then resumes them.
    rows.append(
        Row(
            number: 10, name: "upstreamReady() waits / sink.ready()", shown: [], notShown: [], lockOrdered: true,
            jobA: true, jobB: false,
            make: { executor in
                let sinks = Locked<[BroadcastSink<Int, Never>]>([])
                let sequence = BroadcastSequence<Int, Never>(register: { sink in
                    sinks.withLock { $0.append(sink) }
                    return {}
                })
                let subscription = sequence.subscribe()  // registers the listener
                let mailbox = Mailbox()
                var task: Task<Void, Never>? = Task(executorPreference: executor) {
                    mailbox.value = (try? await subscription.upstreamReady()).map { $0 ? 1 : 0 }
                    mailbox.done = true
                }
                return Scenario(
                    sideA: { step(task, executor) },
                    sideB: { sinks.value.first?.ready() },
                    check: {
                        if mailbox.done { return mailbox.value == 1 ? nil : "upstreamReady() returned \(String(describing: mailbox.value)), not true" }
                        return readerCanGoOn(task, mailbox, executor, "sink.ready()")
                    },
                    cleanup: {
                        sequence.finish(); executor.runUntilIdle(); task = nil; _ = subscription
                    })
            }))

    // Row 11: a listener's stop / start. The last subscriber leaves (its
    // removal decides the stop under the sequence lock, then calls the
    // unregister closure with no lock held) while a new subscriber arrives
    // (its registration decides the start under the lock; a start that finds
    // the previous run stopping waits, and the stopping side starts it once its
    // unregister returned). For a plain sequence (`whileSubscribed`) and for a
    // topic (the new subscriber's generation starts blocked behind the retiring
    // one, `TopicRegistry.generationChanged`). Checked: register and unregister
    // never overlap, alternate, and one registration is active at the end.
    for topic in [false, true] {
        rows.append(
            Row(
                number: 11, name: "last subscriber leaves / a new one subscribes, listener of \(topic ? "a topic" : "a sequence")",
                shown: [], notShown: [], lockOrdered: true,
                jobA: false, jobB: false,
                make: { executor in
                    final class Calls: @unchecked Sendable { var active = 0; var overlaps = 0; var registers = 0 }
                    let calls = Calls()
                    let register: @Sendable (BroadcastSink<Int, Never>) -> @Sendable () -> Void = { _ in
                        if calls.active != 0 { calls.overlaps += 1 }
                        calls.active += 1
                        calls.registers += 1
                        return {
                            calls.active -= 1
                            if calls.active != 0 { calls.overlaps += 1 }
                        }
                    }
                    let sequence = topic ? nil : BroadcastSequence<Int, Never>(started: .whileSubscribed(), register: register)
                    let topics = topic ? BroadcastTopics<String, Int, Never>(register: { _, sink in register(sink) }) : nil
                    func subscribe() -> BroadcastSequence<Int, Never>.Subscription {
                        sequence?.subscribe() ?? topics!.subscribe(to: "a")
                    }
                    let first = subscribe()
                    var second: BroadcastSequence<Int, Never>.Subscription?
                    return Scenario(
                        sideA: { first.cancel() },
                        sideB: { second = subscribe() },
                        check: {
                            if calls.overlaps != 0 { return "register and unregister overlapped" }
                            if calls.active != 1 { return "\(calls.active) registrations active with one subscriber (\(calls.registers) registers)" }
                            return nil
                        },
                        cleanup: {
                            second?.cancel(); second = nil; sequence?.finish(); topics?.finish()
                        })
                }))
    }

    // Row 12: a topic's generation retires / a subscriber joins. The last
    // subscriber's removal retires the generation under the shard lock only if
    // it is still idle there (`retireIfIdle` under its sequence lock); a
    // subscribe takes the shard lock, finds the live generation or makes one,
    // and registers in it. A subscribe from a cancelled task (the second form)
    // never stores a generation: a send while it runs keeps nothing for a real
    // subscriber arriving then. Checked: the new subscriber is on the live
    // generation (a send after it reaches it), and a real subscriber never
    // starts with an element sent while no real subscriber existed.
    for cancelled in [false, true] {
        rows.append(
            Row(
                number: 12,
                name: cancelled
                    ? "a subscribe from a cancelled task / a send and a real subscribe, topic with replay"
                    : "last subscriber leaves / a subscribe(to:), topic with replay",
                shown: [], notShown: [], lockOrdered: true,
                jobA: cancelled, jobB: false,
                make: { executor in
                    let topics = BroadcastTopics<String, Int, Never>(replay: 2)
                    let first: BroadcastSequence<Int, Never>.Subscription? = cancelled ? nil : topics.subscribe(to: "a")
                    if !cancelled { _ = topics.send(1, to: "a") }
                    var task: Task<Void, Never>? =
                        cancelled
                        ? Task(executorPreference: executor) {
                            withUnsafeCurrentTask { $0?.cancel() }
                            _ = topics.subscribe(to: "a").poll()
                        } : nil
                    var second: BroadcastSequence<Int, Never>.Subscription?
                    var sent: BroadcastSendResult?
                    return Scenario(
                        sideA: { if cancelled { step(task, executor) } else { first?.cancel() } },
                        sideB: {
                            if cancelled { sent = topics.send(1, to: "a") }
                            second = topics.subscribe(to: "a")
                            if !cancelled { sent = topics.send(2, to: "a") }
                        },
                        check: {
                            guard let second else { return "no second subscriber" }
                            if cancelled {
                                if sent?.delivered != 0 { return "a send while only a cancelled subscribe ran delivered: \(String(describing: sent))" }
                                let held = second.bufferedCount
                                return held == 0 ? nil : "the real subscriber started with \(held) element(s) sent while no real subscriber existed"
                            }
                            if sent.map({ $0.delivered < 1 }) ?? true { return "the send after the subscribe reached nobody: \(String(describing: sent))" }
                            let count = topics.subscriberCount(of: "a")
                            if count != 1 { return "the topic counts \(count) subscribers, not 1" }
                            return second.bufferedCount >= 1 ? nil : "the new subscriber is not on the live generation: the send after it did not reach it"
                        },
                        cleanup: {
                            second?.cancel(); second = nil; topics.finish(); executor.runUntilIdle(); task = nil; _ = first
                        })
                }))
    }
    // Row 13: a request waits on the sequence lock / the holder unlocks
    // (`SequenceGate`). Side A holds the lock and unlocks; side B makes a
    // request: it pushes itself on the lock word's stack, or, if the word
    // is 0, takes the lock. Both are read-modify-writes of the one word, so
    // one sees the other: no fence is needed, and there is none to remove.
    // Checked: the request was served exactly once (a combinable one: its
    // body ran, by the holder or by B), or granted the lock (an exclusive
    // one), never left waiting with the lock free. Shown: an unlock that
    // releases the word without looking (GATE_UNLOCK_IGNORES_REQUESTS) loses
    // the request.
    for exclusive in [false, true] {
        rows.append(
            Row(
                number: 13,
                name: exclusive ? "a sender waits for the sequence lock / the holder unlocks" : "a request waits on the sequence lock / the holder unlocks",
                shown: [.gateUnlockIgnoresRequests], notShown: [], lockOrdered: false,
                jobA: false, jobB: false,
                make: { _ in
                    let probe = SequenceGateProbe(exclusiveRequest: exclusive)
                    return Scenario(
                        sideA: { probe.unlockAsHolder() },
                        sideB: { probe.request() },
                        check: { probe.failure },
                        cleanup: { probe.cleanup() })
                }))
    }
    return rows
}
