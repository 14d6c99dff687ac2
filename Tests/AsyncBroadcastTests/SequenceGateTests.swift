import Foundation
import Testing
import _CAtomics
@testable import AsyncBroadcast

/// The sequence lock (`SequenceGate`): who runs a waiting request and in
/// which order, driven step by step. Each step waits for the gate's own
/// counts (a request is on the stack: `waitingCount`; a waiter blocked:
/// `cab_park_wait_count`), never for time; a hang fails after the test
/// support's deadline with a message.
@Suite(.serialized) struct SequenceGateTests {
    /// What ran where: a request's label and the thread its body ran on.
    final class Log: @unchecked Sendable {
        let entries = Locked<[(String, Int)]>([])
        func record(_ label: String) { entries.withLock { $0.append((label, Lock.currentThreadID())) } }
        var labels: [String] { entries.value.map(\.0) }
        func thread(of label: String) -> Int? { entries.value.first { $0.0 == label }?.1 }
    }

    /// Spins (yielding) until `count` requests wait on `gate`.
    func waitForWaiters(_ gate: SequenceGate, _ count: Int) {
        while gate.waitingCount < count { sched_yield() }
    }

    /// A request pushed while a send holds the lock is served by that
    /// sender's unlock: its body runs on the sender's thread, and the
    /// requester gets the body's result. Under
    /// `GATE_HOLDER_NEVER_SERVES` the body runs on the requester's thread
    /// (the lock was granted to it); under `GATE_UNLOCK_IGNORES_REQUESTS`
    /// the request is lost and the requester never returns (the deadline).
    // claims: GATE-REQUEST-SERVED-BY-HOLDER
    @Test func aRequestPushedWhileASendHoldsTheLockIsServedByItsUnlock() async throws {
        let gate = SequenceGate()
        defer { gate.destroy() }
        let log = Log()
        let senderThread = Locked(0)
        let result = Locked(0)
        // A lost request hangs its requester: a failed expectation, not
        // only the deadline's error.
        do {
            try await raceOnThreads(2, "a request waiting while a sender holds the lock") { role in
                if role == 0 {
                    gate.lock()
                    senderThread.value = Lock.currentThreadID()
                    waitForWaiters(gate, 1)
                    gate.unlock()
                } else {
                    while senderThread.value == 0 { sched_yield() }
                    result.value = gate.withLock {
                        log.record("request")
                        return 42
                    }
                }
            }
        } catch {
            #expect(Bool(false), "the request pushed while the lock was held was never served: \(error)")
            return
        }
        #expect(result.value == 42)
        #expect(log.thread(of: "request") == senderThread.value,
                "the request's body ran on the thread that held the lock")
        #expect(gate.word.loadAcquire() == 0, "the lock is free and nobody waits")
    }

    /// Arrival order, counted: a request, then a sender, then another
    /// request, all waiting while the lock is held. The holder's unlock
    /// serves the first request, then grants the lock to the sender (who
    /// waited for exactly the request that came before it); the sender's
    /// unlock serves the late request.
    // claims: GATE-SENDER-AFTER-EARLIER, GATE-REQUEST-SERVED-BY-HOLDER
    @Test func aWaitingSenderIsGrantedTheLockAfterEarlierRequestsOnly() async throws {
        let gate = SequenceGate()
        defer { gate.destroy() }
        let log = Log()
        let holderThread = Locked(0)
        let senderThread = Locked(0)
        let turn = Locked(0)
        try await raceOnThreads(4, "a request, a sender and a late request queued behind a holder") { role in
            switch role {
            case 0:
                gate.lock()
                holderThread.value = Lock.currentThreadID()
                turn.value = 1
                waitForWaiters(gate, 3)
                gate.unlock()
            case 1:
                while turn.value < 1 { sched_yield() }
                gate.withLock { log.record("early request") }
            case 2:
                while turn.value < 1 || gate.waitingCount < 1 { sched_yield() }
                senderThread.value = Lock.currentThreadID()
                gate.lock()
                log.record("sender")
                gate.unlock()
            default:
                while senderThread.value == 0 || gate.waitingCount < 2 { sched_yield() }
                gate.withLock { log.record("late request") }
            }
        }
        #expect(log.labels == ["early request", "sender", "late request"])
        #expect(log.thread(of: "early request") == holderThread.value, "served by the holder's unlock")
        #expect(log.thread(of: "sender") == senderThread.value)
        #expect(log.thread(of: "late request") == senderThread.value, "served by the sender's unlock")
        #expect(gate.word.loadAcquire() == 0)
    }

    /// The holder serves one batch, not more: a request that arrives while
    /// the batch runs is not served by the same unlock; the lock is granted
    /// to it, and it runs its own body on its own thread.
    // claims: GATE-ONE-BATCH-PER-UNLOCK
    @Test func afterOneBatchTheLockPassesToTheNextWaiter() async throws {
        let gate = SequenceGate()
        defer { gate.destroy() }
        let log = Log()
        let holderThread = Locked(0)
        let lateThread = Locked(0)
        let lateMayGo = Locked(false)
        try await raceOnThreads(3, "a request arriving during the holder's batch") { role in
            switch role {
            case 0:
                gate.lock()
                holderThread.value = Lock.currentThreadID()
                waitForWaiters(gate, 1)
                gate.unlock()
            case 1:
                while holderThread.value == 0 { sched_yield() }
                gate.withLock {
                    log.record("batch")
                    // Runs in the holder's batch: let the late request
                    // push itself now, and wait until it has.
                    lateMayGo.value = true
                    while gate.word.loadAcquire() & ~SequenceGate.flags == 0 { sched_yield() }
                }
            default:
                while !lateMayGo.value { sched_yield() }
                lateThread.value = Lock.currentThreadID()
                gate.withLock { log.record("late") }
            }
        }
        #expect(log.labels == ["batch", "late"])
        #expect(log.thread(of: "batch") == holderThread.value)
        #expect(log.thread(of: "late") == lateThread.value, "granted the lock, it ran its own body")
        #expect(gate.word.loadAcquire() == 0)
    }

    /// A waiter that is not served while it spins blocks in the kernel (a
    /// futex here; the mutex/condition table of Apple platforms when an
    /// internal-checks build runs with ASYNCBROADCAST_PARK_TABLE=1, as CI
    /// does once) and is woken by its server.
    // claims: GATE-PARKS-FUTEX-OR-TABLE
    @Test func aWaiterBlocksOnTheFutexAndIsWoken() async throws {
        #if os(Linux)
        let table = internalChecksEnabled && getenv("ASYNCBROADCAST_PARK_TABLE").map { String(cString: $0) } == "1"
        #expect(cab_park_mechanism() == (table ? 2 : 1), table ? "the table, as asked" : "Linux parks on a futex")
        #endif
        let gate = SequenceGate()
        defer { gate.destroy() }
        let waiterCounter = Locked(0)
        let served = Locked(false)
        try await raceOnThreads(2, "a waiter that blocks") { role in
            if role == 0 {
                gate.lock()
                while waiterCounter.value == 0 { sched_yield() }
                let blocked = AtomicInt(unowned: UnsafeMutablePointer(bitPattern: waiterCounter.value)!)
                // Until the waiter has given up spinning and called the futex.
                while blocked.loadRelaxed() == 0 { sched_yield() }
                gate.unlock()
            } else {
                while gate.word.loadAcquire() == 0 { sched_yield() }
                let counter = cab_park_thread_waits()
                waiterCounter.value = Int(bitPattern: counter)
                gate.withLock { served.value = true }
            }
        }
        #expect(served.value)
    }

    /// `isFinished` does not take the sequence lock: it answers while the
    /// lock is held (taking it would wait here for ever).
    // claims: SEQ-ISFINISHED-NO-LOCK
    @Test func isFinishedReadsNoLock() async throws {
        let sequence = BroadcastSequence<Int, Never>()
        sequence.finish()
        let storage = sequence.storage
        storage.lock.lock()
        defer { storage.lock.unlock() }
        try await withDeadline("isFinished while the sequence lock is held") {
            #expect(sequence.isFinished)
        }
    }

    @Test func registrationWaitsForAtMostTheSendInProgress() async throws {
        let subscriberCount = 4_096
        let registrations = 21
        let sequence = BroadcastSequence<Int, Never>()
        let idle = (0..<subscriberCount).map { _ in sequence.subscribe(bufferingPolicy: .bufferingNewest(1)) }
        let sends = Locked(0)
        let stop = Locked(false)
        let waited = Locked<(subscribe: [Int], cancel: [Int])>(([], []))

        try await raceOnThreads(2, "a producer sending while registrations run") { role in
            if role == 0 {
                var value = 0
                while !stop.value {
                    value += 1
                    _ = sequence.send(value)
                    sends.withLock { $0 += 1 }
                }
            } else {
                while sends.value < 3 { sched_yield() }
                var subscribes: [Int] = []
                var cancels: [Int] = []
                for index in 0..<registrations {
                    // Arrive somewhere inside a send rather than right after
                    // one ended (when the lock is free anyway): wait for the
                    // producer to complete one more send, then a varying
                    // stretch of busy work.
                    let target = sends.value + 1
                    while sends.value < target { sched_yield() }
                    var work = 0
                    for step in 0..<(index &* 7_919 % 20_000) { work &+= step }
                    blackHole(work)
                    let before = sends.value
                    let subscription = sequence.subscribe(bufferingPolicy: .bufferingNewest(1))
                    let subscribed = sends.value
                    subscription.cancel()
                    let cancelled = sends.value
                    subscribes.append(subscribed - before)
                    cancels.append(cancelled - subscribed)
                }
                waited.value = (subscribes, cancels)
                stop.value = true
            }
        }

        // Typically 1: the send that held the lock when the registrant
        // arrived. The median, and a limit well above 1 (without the gate
        // the median is in the tens to hundreds), leave room for a loaded
        // machine: a registrant descheduled between its two reads of the
        // counter, or kept off the CPU past a sender's bounded wait.
        for (what, counts) in [("subscribe()", waited.value.subscribe), ("cancel()", waited.value.cancel)] {
            let sorted = counts.sorted()
            let median = sorted[sorted.count / 2]
            print("registration fairness: sends completed during one \(what), sorted: \(sorted)")
            #expect(median <= 10, "sends completed during one \(what): median \(median), all \(sorted)")
        }
        #expect(sequence.subscriberCount == subscriberCount)
        withExtendedLifetime(idle) {}
    }
}

@inline(never)
private func blackHole(_ value: Int) {
    if value == -1 { print(value) }
}
