@_spi(Testing) import AsyncBroadcast
import AsyncBroadcastTestSupport
import Foundation

/// A litmus round: one row of the handshake table
/// (Sources/AsyncBroadcast/Subscriber/Handshakes.md) hammered on two real
/// threads, released together by a spin barrier with jitter, many times
/// (`LitmusPair`). Store buffering needs the two sides to overlap within a
/// few dozen nanoseconds, which the other round kinds hit about once in
/// 200,000 tries; these rounds line exactly that pair up.
///
/// Rows: 2 (the consumer takes its last element while `finish()` runs: the
/// subscriber must not stay counted), 1, 3, 4 (a reader parks while a send,
/// `finish()` or `cancel()` runs: it must wake), 5 (a full `.bounded`
/// subscriber's consumer takes an element while an emitter looks for room:
/// the emitter must go on).
struct LitmusRoundPlan: Sendable {
    let seed: UInt64
    let row: Int
    let policy: BroadcastBufferingPolicy
    let pairs: Int

    static let policies: [BroadcastBufferingPolicy] = [.unbounded, .bounded(4), .bufferingOldest(4), .bufferingNewest(4), .bufferingOldest(0)]

    static func generate(seed: UInt64, options: Options) -> LitmusRoundPlan {
        var rng = SplitMix64(seed: seed)
        // Row 2 is the one an x86 machine can show (its other fences sit next
        // to locked instructions), so it gets most rounds.
        let row = [2, 2, 2, 2, 1, 3, 4, 5][Int(rng.next() % 8)]
        let policy = row == 5 ? .bounded(1) : policies[Int(rng.next() % UInt64(policies.count))]
        return LitmusRoundPlan(seed: seed, row: row, policy: policy, pairs: row == 2 ? 5_000 : 150)
    }

    var summary: String { "litmus row \(row), \(policy), \(pairs) pairs" }
    var details: [String] { [summary] }
}

enum LitmusRoundRunner {
    static func run(_ plan: LitmusRoundPlan, header: [String], options: Options) async -> RoundReport {
        let start = monotonicSeconds()
        watchdog.beginRound(
            .init(
                number: 0, header: header, deadlineAt: start + options.deadline,
                deadline: options.deadline, sequenceState: { plan.summary }))
        defer { watchdog.endRound() }
        let outcome: LitmusPair.Outcome = await withUnsafeContinuation { continuation in
            Thread.detachNewThread {
                continuation.resume(returning: hammer(plan, seconds: options.deadline / 2))
            }
        }
        var violations = ViolationList()
        for failure in outcome.failures {
            violations.add("litmus row \(plan.row)", "\(plan.policy): \(failure) (\(outcome.failedRounds) of \(outcome.rounds) pairs failed)")
        }
        return RoundReport(
            violations: violations.all, duration: monotonicSeconds() - start,
            ops: outcome.rounds, delivered: 0, received: 0)
    }

    final class World: @unchecked Sendable {
        let sequence: BroadcastSequence<Int, Never>
        let subscription: BroadcastSequence<Int, Never>.Subscription
        let done = Locked(false)
        /// What row 1's send delivered (capacity 0 drops it unless the
        /// reader waits at that moment).
        var delivered = 0
        init(policy: BroadcastBufferingPolicy) {
            sequence = BroadcastSequence()
            subscription = sequence.subscribe(bufferingPolicy: policy)
        }
    }

    static func hammer(_ plan: LitmusRoundPlan, seconds: Double) -> LitmusPair.Outcome {
        let row = plan.row, policy = plan.policy
        let jitter = row == 2 ? 64 : 2_000
        return LitmusPair.run(rounds: plan.pairs, seconds: seconds, maxJitter: jitter) { () -> World in
            let world = World(policy: policy)
            if row == 2 || row == 5 { world.sequence.send(1) }
            return world
        } sideA: { world in
            switch row {
            case 2, 5:
                _ = world.subscription.poll()
            default:
                let subscription = world.subscription, done = world.done
                Task.detached {
                    var iterator = subscription.makeAsyncIterator()
                    _ = await iterator.next()
                    done.value = true
                }
            }
        } sideB: { world in
            switch row {
            case 1: world.delivered = world.sequence.send(2).delivered
            case 2, 3: world.sequence.finish()
            case 4: world.subscription.cancel()
            default:
                let sequence = world.sequence, done = world.done
                Task.detached {
                    _ = try? await sequence.emit(2)
                    done.value = true
                }
            }
        } check: { world in
            switch row {
            case 2:
                return world.sequence.subscriberCount == 0
                    ? nil
                    : "a finished subscriber that took its last element is still counted"
            case 5:
                return LitmusPair.waitFor(world.done, "the emitter")
            case 1 where world.delivered == 0:
                // Dropped for a capacity-0 reader that was not waiting yet:
                // the reader waits for more, legitimately; the end wakes it.
                world.sequence.finish()
                return LitmusPair.waitFor(world.done, "the reader, after finish()")
            default:
                return LitmusPair.waitFor(world.done, "the reader")
            }
        }
    }
}
