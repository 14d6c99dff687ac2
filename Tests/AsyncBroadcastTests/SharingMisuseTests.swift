import Foundation
import Testing
@_spi(Testing) @testable import AsyncBroadcast

/// SHARING 14: the sharing initialisers trap on a bad replay or policy as
/// the plain one does, and a negative `stopAfter` traps, each with a
/// message naming it (see MisuseTests for the pattern).
// claims: MISUSE-NEGATIVE-REPLAY
@Suite struct SharingMisuseTests {
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s14NegativeReplayTrapsInTheUpstreamInit() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            _ = BroadcastSequence<Int, Never>(replay: -1) { AsyncStream<Int> { $0.finish() } }
        }
        expectMessage(result, "AsyncBroadcast misuse: replay must not be negative (got -1)")
    }

    // claims: MISUSE-NEGATIVE-REPLAY
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s14NegativeReplayTrapsInTheRegisterInit() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            _ = BroadcastSequence<Int, Never>(replay: -2, started: .eagerly) { _ in {} }
        }
        expectMessage(result, "AsyncBroadcast misuse: replay must not be negative (got -2)")
    }

    // claims: MISUSE-NEGATIVE-REPLAY
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s14NegativeReplayTrapsInTheUntypedInitAndBroadcast() async {
        let untyped = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            _ = BroadcastSequence<Int, any Error>(replay: -3, upstream: { AsyncStream<Int>(unfolding: { nil }) })
        }
        expectMessage(untyped, "AsyncBroadcast misuse: replay must not be negative (got -3)")
        let broadcast = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            _ = AsyncStream<Int> { $0.finish() }.broadcast(replay: -4)
        }
        expectMessage(broadcast, "AsyncBroadcast misuse: replay must not be negative (got -4)")
    }

    // claims: MISUSE-BOUNDED-ZERO, MISUSE-NEGATIVE-CAPACITY
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s14ABadPolicyTrapsInTheSharingInits() async {
        let upstream = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            _ = BroadcastSequence<Int, Never>(bufferingPolicy: .bounded(0)) { AsyncStream<Int> { $0.finish() } }
        }
        expectMessage(upstream, "AsyncBroadcast misuse: bufferingPolicy: .bounded capacity must be at least 1 (got 0)")
        let register = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            _ = BroadcastSequence<Int, Never>(bufferingPolicy: .bufferingNewest(-1)) { _ in {} }
        }
        expectMessage(register, "AsyncBroadcast misuse: bufferingPolicy: .bufferingNewest capacity must not be negative (got -1)")
    }

    /// The trap comes before anything starts: an `.eagerly` register is never called.
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s14TheInitTrapsBeforeRegisterIsCalled() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            _ = BroadcastSequence<Int, Never>(replay: -1, started: .eagerly) { _ in
                FileHandle.standardError.write(Data("register was called\n".utf8))
                return {}
            }
        }
        expectMessage(result, "replay must not be negative")
        if let result {
            let stderr = String(decoding: result.standardErrorContent, as: UTF8.self)
            #expect(!stderr.contains("register was called"))
        }
    }

    // claims: MISUSE-NEGATIVE-STOPAFTER
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @Test func s14NegativeStopAfterTraps() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            _ = BroadcastStart.whileSubscribed(stopAfter: .seconds(-1))
        }
        expectMessage(result, "AsyncBroadcast misuse: whileSubscribed(stopAfter:) must not be negative")
        let manual = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            _ = BroadcastStart.whileSubscribed(stopAfter: .milliseconds(-5), clock: ManualClock())
        }
        expectMessage(manual, "AsyncBroadcast misuse: whileSubscribed(stopAfter:) must not be negative")
    }
}
