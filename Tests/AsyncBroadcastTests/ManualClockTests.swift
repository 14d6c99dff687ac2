import Testing
import AsyncBroadcastTestSupport
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The manual clock the timer tests rely on: sleepers wake only when
/// `advance` reaches their deadline, cancellation wakes them at once, and
/// every sleep ends exactly once (a checked continuation would trap on a
/// second resume, and a lost one would hang past the step deadline).
@Suite struct ManualClockTests {
    /// How a sleep ended.
    enum Outcome: Equatable, Sendable {
        case woke
        case cancelled
        case other(String)
    }

    @available(macOS 13, iOS 16, tvOS 16, watchOS 9, *)
    static func sleep(on clock: ManualClock, until deadline: ManualClock.Instant) async -> Outcome {
        do {
            try await clock.sleep(until: deadline, tolerance: nil)
            return .woke
        } catch is CancellationError {
            return .cancelled
        } catch {
            return .other("\(error)")
        }
    }

    @available(macOS 13, iOS 16, tvOS 16, watchOS 9, *)
    static func at(_ seconds: Int) -> ManualClock.Instant { ManualClock.Instant(offset: .seconds(seconds)) }

    @available(macOS 13, iOS 16, tvOS 16, watchOS 9, *)
    @Test func instantArithmetic() {
        let start = ManualClock.Instant()
        let later = start.advanced(by: .seconds(3))
        #expect(later.offset == .seconds(3))
        #expect(start.duration(to: later) == .seconds(3))
        #expect(later.duration(to: start) == .seconds(-3))
        #expect(start < later)
        #expect(later - start == .seconds(3))
        #expect(later - .seconds(3) == start)
        #expect(start + .seconds(3) == later)
        #expect(ManualClock().now == start)
        #expect(ManualClock().minimumResolution == .zero)
    }

    @available(macOS 13, iOS 16, tvOS 16, watchOS 9, *)
    @Test func sleepResumesOnlyWhenAdvanceReachesTheDeadline() async throws {
        let clock = ManualClock()
        let woke = Locked(false)
        let sleeper = Task {
            let outcome = await Self.sleep(on: clock, until: Self.at(10))
            woke.value = true
            return outcome
        }
        try await withDeadline("the sleeper is asleep") { await clock.waitForSleepers(1) }
        #expect(clock.sleeperCount == 1)

        // Short of the deadline: still asleep. (`advance` resumes due
        // sleepers before it returns, so the count is exact right after it.)
        clock.advance(by: .seconds(4))
        clock.advance(by: .seconds(5))
        #expect(clock.now == Self.at(9))
        #expect(clock.sleeperCount == 1)
        #expect(!woke.value)

        clock.advance(by: .seconds(1))
        #expect(clock.now == Self.at(10))
        #expect(clock.sleeperCount == 0)
        #expect(try await withDeadline("the sleeper wakes") { await sleeper.value } == .woke)
        #expect(woke.value)
    }

    @available(macOS 13, iOS 16, tvOS 16, watchOS 9, *)
    @Test func pastDeadlineReturnsAtOnce() async throws {
        let clock = ManualClock()
        clock.advance(by: .seconds(5))
        try await withDeadline("deadlines not after now") {
            try await clock.sleep(until: Self.at(5), tolerance: nil)
            try await clock.sleep(until: Self.at(1), tolerance: nil)
            try await clock.sleep(for: .zero)
        }
        #expect(clock.sleeperCount == 0)
    }

    @available(macOS 13, iOS 16, tvOS 16, watchOS 9, *)
    @Test func sleepForUsesTheClocksNow() async throws {
        let clock = ManualClock()
        clock.advance(by: .seconds(100))
        let sleeper = Task { try await clock.sleep(for: .seconds(2)) }
        try await withDeadline("the sleeper is asleep") { await clock.waitForSleepers(1) }
        clock.advance(by: .seconds(1))
        #expect(clock.sleeperCount == 1)
        clock.advance(by: .seconds(1))
        #expect(clock.sleeperCount == 0)
        try await withDeadline("the sleeper wakes") { try await sleeper.value }
    }

    @available(macOS 13, iOS 16, tvOS 16, watchOS 9, *)
    @Test func cancelledBeforeSleepingThrowsAtOnce() async throws {
        let clock = ManualClock()
        let gate = Gate()
        let sleepers = Task { () -> [Outcome] in
            await gate.pass()
            // Cancelled by now: both a future and a past deadline throw.
            return [await Self.sleep(on: clock, until: Self.at(10)), await Self.sleep(on: clock, until: .init())]
        }
        try await waitUntil("the task waits at the gate") { gate.isWaiting }
        sleepers.cancel()
        gate.open()
        #expect(try await withDeadline("the cancelled sleeps") { await sleepers.value } == [.cancelled, .cancelled])
        #expect(clock.sleeperCount == 0)
    }

    @available(macOS 13, iOS 16, tvOS 16, watchOS 9, *)
    @Test func cancelledWhileSleepingThrowsAtOnce() async throws {
        let clock = ManualClock()
        let sleeper = Task { await Self.sleep(on: clock, until: Self.at(10)) }
        try await withDeadline("the sleeper is asleep") { await clock.waitForSleepers(1) }
        sleeper.cancel()
        #expect(clock.sleeperCount == 0)
        #expect(try await withDeadline("the cancelled sleep") { await sleeper.value } == .cancelled)
        clock.advance(by: .seconds(10))   // nothing left to resume
        #expect(clock.sleeperCount == 0)
    }

    /// 30 sleepers, ten each at 1 s, 2 s and 3 s: each advance wakes exactly
    /// its group; the others stay asleep.
    @available(macOS 13, iOS 16, tvOS 16, watchOS 9, *)
    @Test func concurrentSleepersWakeInDeadlineGroups() async throws {
        let clock = ManualClock()
        let woken = Locked<[Int: Set<Int>]>([:])   // second -> indices
        let sleepers = (0..<30).map { index in
            Task {
                let second = index % 3 + 1
                let outcome = await Self.sleep(on: clock, until: Self.at(second))
                woken.withLock { _ = $0[second, default: []].insert(index) }
                return outcome
            }
        }
        try await withDeadline("30 sleepers asleep") { await clock.waitForSleepers(30) }
        #expect(clock.sleeperCount == 30)

        clock.advance(by: .zero)
        #expect(clock.sleeperCount == 30)

        for second in 1...3 {
            clock.advance(by: .seconds(1))
            #expect(clock.sleeperCount == 30 - 10 * second)
            try await waitUntil("the \(second) s group has woken") {
                woken.withLock { $0[second]?.count == 10 }
            }
            let groups = woken.value
            #expect(groups[second] == Set((0..<30).filter { $0 % 3 + 1 == second }))
            #expect(groups.keys.allSatisfy { $0 <= second }, "only groups due by \(second) s woke")
        }
        for sleeper in sleepers {
            #expect(try await withDeadline("a sleeper's outcome") { await sleeper.value } == .woke)
        }
    }

    /// One advance past several deadlines wakes them all at once.
    @available(macOS 13, iOS 16, tvOS 16, watchOS 9, *)
    @Test func oneAdvanceWakesEveryDueDeadline() async throws {
        let clock = ManualClock()
        let sleepers = (1...5).map { second in Task { await Self.sleep(on: clock, until: Self.at(second)) } }
        try await withDeadline("5 sleepers asleep") { await clock.waitForSleepers(5) }
        clock.advance(by: .seconds(3))
        #expect(clock.sleeperCount == 2)
        clock.advance(by: .seconds(10))
        #expect(clock.sleeperCount == 0)
        for sleeper in sleepers {
            #expect(try await withDeadline("a sleeper's outcome") { await sleeper.value } == .woke)
        }
    }

    /// Cancellation racing with `advance` (on two threads, released
    /// together) while the task sleeps: the sleep ends exactly once, as
    /// woken or cancelled, and nothing is left registered.
    @available(macOS 13, iOS 16, tvOS 16, watchOS 9, *)
    @Test func cancellationRacingWithAdvanceResumesExactlyOnce() async throws {
        for round in 0..<300 {
            let clock = ManualClock()
            let sleeper = Task { await Self.sleep(on: clock, until: Self.at(1)) }
            try await withDeadline("the sleeper is asleep") { await clock.waitForSleepers(1) }
            try await raceOnThreads(2, "cancel against advance") { index in
                if index == 0 { sleeper.cancel() } else { clock.advance(by: .seconds(1)) }
            }
            let outcome = try await withDeadline("round \(round)'s sleep") { await sleeper.value }
            #expect(outcome == .woke || outcome == .cancelled, "round \(round)")
            #expect(clock.sleeperCount == 0, "round \(round)")
        }
    }

    /// A cancellation, or an advance past the deadline, from another thread
    /// while the sleep is still registering (between its deadline check and
    /// its continuation's registration: the tombstone and the late-advance
    /// paths), before, or after. A thread spins until the sleeping task
    /// starts, then a little longer, varied by round, so the rounds spread
    /// over the whole window. Without a timer involved the outcome is
    /// determined: cancelled rounds throw, advanced rounds wake.
    @available(macOS 13, iOS 16, tvOS 16, watchOS 9, *)
    @Test func cancellationOrAdvanceRacingWithTheSleepsRegistration() async throws {
        for round in 0..<1000 {
            let clock = ManualClock()
            let cancels = round.isMultiple(of: 2)
            let spin = round / 2 % 100
            let ready = Locked(false)
            let started = Locked(false)
            let sleeper = Locked<Task<Outcome, Never>?>(nil)
            let racer = Task {
                try await onThread("the racing thread") {
                    ready.value = true
                    // Yield while spinning: a bare spin starves the tasks of
                    // tests running beside this one on a 2-core machine.
                    while !started.value || sleeper.value == nil { sched_yield() }
                    for _ in 0..<spin { _ = started.value }   // a short, varied delay
                    if cancels { sleeper.value!.cancel() } else { clock.advance(by: .seconds(1)) }
                }
            }
            try await waitUntil("the racing thread runs") { ready.value }
            sleeper.value = Task {
                started.value = true
                return await Self.sleep(on: clock, until: Self.at(1))
            }
            try await racer.value
            let task = sleeper.value!
            let outcome = try await withDeadline("round \(round)'s sleep") { await task.value }
            #expect(outcome == (cancels ? .cancelled : .woke), "round \(round)")
            #expect(clock.sleeperCount == 0, "round \(round)")
        }
    }
}
