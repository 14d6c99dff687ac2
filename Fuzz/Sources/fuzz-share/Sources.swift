@_spi(Testing) import AsyncBroadcast
import AsyncBroadcastTestSupport
import FuzzKit
#if canImport(Glibc)
import Glibc
#endif

// What feeds the fuzzed sequence: a fake listener (`register`) or an
// upstream whose elements the driver hands over one at a time (`Gate`).
// Both record what the library did to them, from whatever thread it did it,
// so the driver can wait for an exact state instead of guessing.

/// The fuzzed sequence's failure type, either `FuzzError` (the typed
/// `init(upstream:)`) or `any Error` (the untyped overload, what systems
/// before macOS 15 / iOS 18 use), so both upstream loops run.
struct ErrorCoding<Failure: Error>: Sendable {
    let isTyped: Bool
    let make: @Sendable (Int) -> Failure
    let code: @Sendable (Failure) -> Int
}

extension ErrorCoding where Failure == FuzzError {
    static var typed: Self { Self(isTyped: true, make: { FuzzError(code: $0) }, code: { $0.code }) }
}

extension ErrorCoding where Failure == any Error {
    static var untyped: Self { Self(isTyped: false, make: { FuzzError(code: $0) }, code: { ($0 as? FuzzError)?.code ?? -1 }) }
}

/// Live `Item`s. Items are made and released on the library's threads too
/// (upstream tasks, stop timers, unregister closures), hence the lock.
let liveItems = Locked(0)

/// The element type: a class, so that a leaked or double-kept element shows.
final class Item: Sendable {
    let id: Int
    init(_ id: Int) {
        self.id = id
        liveItems.withLock { $0 += 1 }
    }
    deinit { liveItems.withLock { $0 -= 1 } }
}

/// Held only by the closures the sequence keeps (`register` / `upstream`):
/// when it goes, the sequence's storage has gone, so no task, timer or
/// listener still holds it.
final class StorageProbe: Sendable {}

/// Shared between the driver and the closures the library calls.
final class Recorder<Failure: Error>: @unchecked Sendable {
    typealias Sink = BroadcastSink<Item, Failure>
    let errors: ErrorCoding<Failure>
    let plans: [ListenerPlan]
    let cancelModes: [CancelMode]
    /// What `register` and unregister closures did, in order.
    let log = Locked<[ListenerEvent]>([])
    /// Every sink handed to `register`, in order (run k's is at k - 1).
    let sinks = Locked<[Sink]>([])
    /// Every upstream made by `upstream()`, in order.
    let gates = Locked<[Gate]>([])
    /// Contract violations seen inside the closures, reported by the driver.
    let violations = Locked<[String]>([])
    /// `register` or an unregister closure is running.
    private let busy = Locked<String?>(nil)
    /// The thread that runs the program (and so starts every run).
    let driverThread = pthread_self()

    init(errors: ErrorCoding<Failure>, plans: [ListenerPlan], cancelModes: [CancelMode]) {
        self.errors = errors
        self.plans = plans
        self.cancelModes = cancelModes
    }

    func violation(_ message: String) { violations.withLock { $0.append(message) } }

    /// `register` and unregister closures must never overlap.
    private func enter(_ what: String) {
        let other: String? = busy.withLock { busy in
            defer { if busy == nil { busy = what } }
            return busy
        }
        if let other { violation("\(what) ran while \(other) was still running") }
    }

    private func leave() { busy.withLock { $0 = nil } }

    func register(_ sink: Sink) -> @Sendable () -> Void {
        let run = sinks.withLock { sinks in
            sinks.append(sink)
            return sinks.count
        }
        enter("register #\(run)")
        let plan = plans[(run - 1) % plans.count]
        var sent: [SentElement] = []
        for i in 0..<plan.syncSends {
            let id = registerElementID(run: run, index: i)
            sent.append(SentElement(id: id, result: sink.send(Item(id))))
        }
        switch plan.syncEnd {
        case .finish?: sink.finish()
        case .fail(let code)?: sink.finish(throwing: errors.make(code))
        case nil: break
        }
        // Leave before logging: the driver moves on once it sees the entry.
        leave()
        log.withLock { $0.append(.register(run: run, sent: sent, end: plan.syncEnd)) }
        let calls = Locked(0)
        return { [self] in
            enter("unregister #\(run)")
            if calls.withLock({ $0 += 1; return $0 }) > 1 { violation("unregister #\(run) called twice") }
            var sent: SentElement? = nil
            switch plan.onUnregister {
            case .nothing: break
            case .send:
                let id = unregisterElementID(run: run)
                sent = SentElement(id: id, result: sink.send(Item(id)))
            case .finish: sink.finish()
            case .fail: sink.finish(throwing: errors.make(77))
            }
            leave()
            log.withLock { $0.append(.unregister(run: run, sent: sent)) }
        }
    }

    func makeUpstream() -> GateUpstream {
        if pthread_equal(pthread_self(), driverThread) != 0 {
            violation("upstream() was called on the thread that started the run, not in the library's task")
        }
        if withUnsafeCurrentTask(body: { $0 == nil }) { violation("upstream() was called outside a task") }
        // A detached task: nothing of the subscriber's task carries over.
        if let value = SubscriberContext.marker { violation("upstream() sees the subscribing task's task-local value \(value)") }
        if Task.currentPriority >= .high { violation("upstream() runs at the subscribing task's priority \(Task.currentPriority)") }
        let gate = gates.withLock { gates in
            let gate = Gate(run: gates.count + 1, mode: cancelModes[gates.count % cancelModes.count])
            gates.append(gate)
            return gate
        }
        return GateUpstream(gate: gate, recorder: self)
    }

    /// The typed initializer iterates with `next(isolation:)`, the untyped
    /// one with `next()`.
    func upstreamCalled(isolated: Bool) {
        if isolated != errors.isTyped {
            violation("the \(errors.isTyped ? "typed" : "untyped") upstream loop called next(\(isolated ? "isolation:" : ""))")
        }
    }
}

/// Set around a subscribe made from a task, to show that the upstream task
/// does not inherit it.
enum SubscriberContext {
    @TaskLocal static var marker: Int?
}

/// An upstream's `next()`: suspends until the driver hands it an element or
/// its end. One per run.
final class Gate: @unchecked Sendable {
    enum Handed {
        case element(Item)
        case end
        case fail(Int)
        case cancelled
    }

    /// What the driver compares with the model.
    struct Observed: Equatable, CustomStringConvertible {
        var waiting: Bool
        var nextCalls: Int
        var sawCancel: Bool
        var description: String {
            (waiting ? "waiting" : "not waiting") + ", next() calls \(nextCalls)" + (sawCancel ? ", saw cancellation" : "")
        }
    }

    let run: Int
    let mode: CancelMode
    private let lock = Locked<(continuation: CheckedContinuation<Handed, Never>?, nextCalls: Int, sawCancel: Bool)>(
        (nil, 0, false))

    init(run: Int, mode: CancelMode) {
        self.run = run
        self.mode = mode
    }

    var observed: Observed {
        lock.withLock { Observed(waiting: $0.continuation != nil, nextCalls: $0.nextCalls, sawCancel: $0.sawCancel) }
    }

    func next() async throws(FuzzError) -> Item? {
        let handed: Handed = await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Handed, Never>) in
                let resumeNow: Bool = lock.withLock { state in
                    state.nextCalls += 1
                    if state.sawCancel && mode != .ignore { return true }
                    state.continuation = continuation
                    return false
                }
                if resumeNow { continuation.resume(returning: .cancelled) }
            }
        } onCancel: {
            let continuation: CheckedContinuation<Handed, Never>? = lock.withLock { state in
                state.sawCancel = true
                guard mode != .ignore else { return nil }
                defer { state.continuation = nil }
                return state.continuation
            }
            continuation?.resume(returning: .cancelled)
        }
        switch handed {
        case .element(let item): return item
        case .end: return nil
        case .fail(let code): throw FuzzError(code: code)
        case .cancelled:
            if mode == .fail { throw FuzzError(code: 900) }
            return nil
        }
    }

    /// Hands the waiting `next()` its result. `false` if nobody waits.
    func hand(_ handed: Handed) -> Bool {
        guard let continuation = lock.withLock({ state -> CheckedContinuation<Handed, Never>? in
            defer { state.continuation = nil }
            return state.continuation
        }) else { return false }
        continuation.resume(returning: handed)
        return true
    }
}

/// The recorder is type-erased to a callback so that the upstream type is
/// the same for both failure types.
struct GateUpstream: AsyncSequence, Sendable {
    typealias Element = Item
    typealias Failure = FuzzError
    let gate: Gate
    let called: @Sendable (_ isolated: Bool) -> Void

    init<F: Error>(gate: Gate, recorder: Recorder<F>) {
        self.gate = gate
        called = { recorder.upstreamCalled(isolated: $0) }
    }

    struct AsyncIterator: AsyncIteratorProtocol {
        typealias Element = Item
        typealias Failure = FuzzError
        let upstream: GateUpstream
        mutating func next() async throws(FuzzError) -> Item? {
            upstream.called(false)
            return try await upstream.gate.next()
        }
        mutating func next(isolation actor: isolated (any Actor)?) async throws(FuzzError) -> Item? {
            upstream.called(true)
            return try await upstream.gate.next()
        }
    }

    func makeAsyncIterator() -> AsyncIterator { AsyncIterator(upstream: self) }
}
