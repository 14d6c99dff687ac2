import Foundation
import _CAtomics  // a spin barrier that TSan sees, without the Synchronization module

/// Hammers one cross-thread handshake on real threads: each round, `setup`
/// builds a fresh world, two threads are released together by a spin
/// barrier, each waits a small random spin (the jitter, so that every
/// relative timing comes up) and runs its side, and then `check` looks at the
/// outcome. Used by the handshake tests and the stress tool's litmus rounds;
/// not part of AsyncBroadcast's API.
///
/// ```swift
/// let outcome = LitmusPair.run(rounds: 100_000, seconds: 5) {
///     makeWorld()
/// } sideA: { world in world.a() } sideB: { world in world.b() } check: { world in world.problem }
/// #expect(outcome.failures.isEmpty)
/// ```
///
/// Store buffering needs the two sides to overlap within a few dozen
/// nanoseconds, so a bug may show once in 100,000 rounds: count on many
/// rounds, in a release build where possible.
public enum LitmusPair {
    public struct Outcome: Sendable {
        /// Rounds run (fewer than asked if `seconds` ran out).
        public var rounds = 0
        /// The first few failures, with their round.
        public var failures: [String] = []
        /// How many rounds failed.
        public var failedRounds = 0
    }

    /// Runs up to `rounds` rounds, or until `seconds` have passed, on two
    /// threads of its own; blocks the caller until both are done.
    public static func run<World>(
        rounds: Int, seconds: Double, maxJitter: Int = 64,
        setup: @escaping () -> World,
        sideA: @escaping (World) -> Void,
        sideB: @escaping @Sendable (World) -> Void,
        check: @escaping (World) -> String?
    ) -> Outcome {
        let shared = Shared<World>()
        let deadline = Date().addingTimeInterval(seconds)
        let threadB = Thread {
            var random = SplitMix64(seed: 0x9E37_79B9)
            var phase = 0
            while true {
                phase += 1
                shared.barrier.arrive(phase: phase)  // the world is ready, or we stop
                if shared.stop { break }
                spin(Int(random.next() % UInt64(maxJitter + 1)))
                sideB(shared.world!)
                phase += 1
                shared.barrier.arrive(phase: phase)  // both sides are done
            }
            shared.barrier.arrive(phase: phase + 1)
        }
        threadB.stackSize = 1 << 20
        threadB.start()
        var outcome = Outcome()
        var random = SplitMix64(seed: 0xD1B5_4A32)
        var phase = 0
        while true {
            let stop = outcome.rounds >= rounds || (outcome.rounds % 256 == 0 && Date() > deadline)
            shared.stop = stop
            if !stop { shared.world = setup() }
            phase += 1
            shared.barrier.arrive(phase: phase)
            if stop { break }
            spin(Int(random.next() % UInt64(maxJitter + 1)))
            sideA(shared.world!)
            phase += 1
            shared.barrier.arrive(phase: phase)
            if let failure = check(shared.world!) {
                outcome.failedRounds += 1
                if outcome.failures.count < 5 { outcome.failures.append("round \(outcome.rounds): \(failure)") }
            }
            shared.world = nil
            outcome.rounds += 1
        }
        shared.barrier.arrive(phase: phase + 1)  // thread B has left its loop
        shared.barrier.destroy()
        return outcome
    }

    /// Waits for `done` (a task's last step, set on another thread), and
    /// fails after `seconds`: a task that sleeps through its wake-up never
    /// sets it. For `check`.
    public static func waitFor(_ done: Locked<Bool>, _ what: String, seconds: Double = 5) -> String? {
        let deadline = Date().addingTimeInterval(seconds)
        while !done.value {
            if Date() > deadline { return "lost wake-up: \(what) still waits after \(Int(seconds)) s" }
            sched_yield()
        }
        return nil
    }

    private final class Shared<World>: @unchecked Sendable {
        // Written by the driver before a barrier, read by thread B after it:
        // the barrier's acquire-release read-modify-write orders them.
        var world: World?
        var stop = false
        let barrier = SpinBarrier()
    }

    /// Two threads meet at numbered phases: each adds one and spins until
    /// both have (sequentially consistent read-modify-writes: TSan sees
    /// the edge).
    private final class SpinBarrier: @unchecked Sendable {
        let count = cab_atomic_int_create(0)

        func arrive(phase: Int) {
            _ = cab_atomic_int_fetch_add_acq_rel(count, 1)
            var spins = 0
            while cab_atomic_int_load_acquire(count) < 2 * phase {
                spins += 1
                if spins & 1023 == 0 { sched_yield() }  // the other thread may share our core
            }
        }

        func destroy() { cab_atomic_int_destroy(count) }
    }

    @inline(never)
    static func spin(_ iterations: Int) {
        var i = 0
        while i < iterations { i += 1; _blackHole(i) }
    }

    @inline(never) static func _blackHole(_ value: Int) {}
}
