import Foundation
import Testing
@_spi(Testing) @testable import AsyncBroadcast

/// How long any single awaited step may take before the test fails. Generous
/// so that TSan and a loaded 2-core CI machine never trip it; it only exists
/// so that a hang fails with a message instead of blocking CI.
let stepDeadline: Double = 30

struct DeadlineExceeded: Error, CustomStringConvertible {
    let what: String
    var description: String { "timed out after \(stepDeadline)s waiting for: \(what)" }
}

/// Delivers the first of two racing outcomes exactly once.
private final class FirstResult<T: Sendable>: @unchecked Sendable {
    private let lock = NSLock()
    private var result: Result<T, any Error>?
    private var waiter: CheckedContinuation<Result<T, any Error>, Never>?

    func complete(_ value: Result<T, any Error>) {
        lock.lock()
        guard result == nil else { lock.unlock(); return }
        result = value
        let waiter = self.waiter
        self.waiter = nil
        lock.unlock()
        waiter?.resume(returning: value)
    }

    func value() async -> Result<T, any Error> {
        await withCheckedContinuation { continuation in
            lock.lock()
            if let result {
                lock.unlock()
                continuation.resume(returning: result)
            } else {
                waiter = continuation
                lock.unlock()
            }
        }
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
final class LiveCounter: @unchecked Sendable {
    private let lock = NSLock()
    private var count = 0
    var live: Int { lock.lock(); defer { lock.unlock() }; return count }
    func increment() { lock.lock(); count += 1; lock.unlock() }
    func decrement() { lock.lock(); count -= 1; lock.unlock() }
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
