import Foundation
import Testing
@_spi(Testing) @testable import AsyncBroadcast
@_exported import AsyncBroadcastTestSupport

/// How long any single awaited step may take before the test fails. Generous
/// so that TSan and a loaded 2-core CI machine never trip it; it only exists
/// so that a hang fails with a message instead of blocking CI.
let stepDeadline: Double = 30

struct DeadlineExceeded: Error, CustomStringConvertible {
    let what: String
    var description: String { "timed out after \(stepDeadline)s waiting for: \(what)" }
}

/// Delivers the first of two racing outcomes exactly once. The waiter's
/// continuation carries no payload: the outcome travels through the locked
/// box, which ThreadSanitizer sees (as the library does it).
private final class FirstResult<T: Sendable>: Sendable {
    private struct State {
        var result: Result<T, any Error>?
        var waiter: UnsafeContinuation<Void, Never>?
    }
    private let state = Locked(State())

    func complete(_ value: Result<T, any Error>) {
        let waiter = state.withLock { state -> UnsafeContinuation<Void, Never>? in
            guard state.result == nil else { return nil }
            state.result = value
            defer { state.waiter = nil }
            return state.waiter
        }
        waiter?.resume()
    }

    func value() async -> Result<T, any Error> {
        await withUnsafeContinuation { (continuation: UnsafeContinuation<Void, Never>) in
            let ready = state.withLock { state -> Bool in
                if state.result != nil { return true }
                state.waiter = continuation
                return false
            }
            if ready { continuation.resume() }
        }
        return state.withLock { $0.result! }
    }
}

/// Runs `body`, failing with `DeadlineExceeded(what)` if it does not finish
/// within `stepDeadline`. A hung body is abandoned (not awaited), so the
/// test fails instead of hanging.
func withDeadline<T: Sendable>(
    _ what: String,
    _ body: @escaping @Sendable () async throws -> T
) async throws -> T {
    let first = FirstResult<T>()
    let work = Task {
        do { first.complete(.success(try await body())) } catch { first.complete(.failure(error)) }
    }
    let timer = Task {
        try? await Task.sleep(nanoseconds: UInt64(stepDeadline * 1_000_000_000))
        first.complete(.failure(DeadlineExceeded(what: what)))
    }
    // Cancelling the caller cancels the body too (it runs in its own task).
    let result = await withTaskCancellationHandler {
        await first.value()
    } onCancel: {
        work.cancel()
    }
    timer.cancel()
    if case .failure(let error) = result, error is DeadlineExceeded { work.cancel() }
    return try result.get()
}

/// Waits (yielding, never sleeping) until `condition` holds.
func waitUntil(_ what: String, _ condition: @escaping @Sendable () -> Bool) async throws {
    try await withDeadline(what) {
        while !condition() {
            await Task.yield()
            if Task.isCancelled { return }
        }
    }
}

/// Reads `count` elements (or until the end).
func take<Element: Sendable>(
    _ count: Int, from subscription: BroadcastSequence<Element, Never>.Subscription
) async throws -> [Element] {
    try await withDeadline("\(count) elements") {
        var iterator = subscription.makeAsyncIterator()
        var result: [Element] = []
        while result.count < count, let element = await iterator.next() { result.append(element) }
        return result
    }
}

/// Reads until the subscription ends.
func drain<Element: Sendable>(
    _ subscription: BroadcastSequence<Element, Never>.Subscription
) async throws -> [Element] {
    try await withDeadline("end of subscription") {
        var result: [Element] = []
        for await element in subscription { result.append(element) }
        return result
    }
}

/// Non-suspending read of everything buffered now.
func pollAll<Element, Failure>(_ subscription: BroadcastSequence<Element, Failure>.Subscription) -> [Element] {
    var result: [Element] = []
    while case .element(let element) = subscription.poll() { result.append(element) }
    return result
}

/// Counts live instances, to prove that buffers release their elements.
final class LiveCounter: Sendable {
    private let count = Locked(0)
    var live: Int { count.value }
    func increment() { count.withLock { $0 += 1 } }
    func decrement() { count.withLock { $0 -= 1 } }
}

/// One element without suspending (`nil` if nothing is buffered).
func pollOne<Element, Failure>(_ subscription: BroadcastSequence<Element, Failure>.Subscription) -> Element? {
    if case .element(let element) = subscription.poll() { return element }
    return nil
}

/// A point a task waits at until the test opens it (a task-side barrier
/// that needs no sleeping).
final class Gate: Sendable {
    private struct State {
        var isOpen = false
        var waiter: UnsafeContinuation<Void, Never>?
        var isWaiting = false
    }
    private let state = Locked(State())

    /// The task reached `pass()` and waits.
    var isWaiting: Bool { state.withLock { $0.isWaiting } }

    func pass() async {
        await withUnsafeContinuation { (continuation: UnsafeContinuation<Void, Never>) in
            let open = state.withLock { state -> Bool in
                if state.isOpen { return true }
                state.waiter = continuation
                state.isWaiting = true
                return false
            }
            if open { continuation.resume() }
        }
    }

    func open() {
        let waiter = state.withLock { state -> UnsafeContinuation<Void, Never>? in
            state.isOpen = true
            defer { state.waiter = nil }
            return state.waiter
        }
        waiter?.resume()
    }
}

/// A class payload that reports its lifetime to a `LiveCounter`.
final class Payload: Sendable {
    let value: Int
    let counter: LiveCounter
    init(_ value: Int, _ counter: LiveCounter) {
        self.value = value
        self.counter = counter
        counter.increment()
    }
    deinit { counter.decrement() }
}

struct TestError: Error, Equatable { let code: Int }
