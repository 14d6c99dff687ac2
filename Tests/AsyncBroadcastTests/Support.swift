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

// MARK: - BroadcastValue and BroadcastPromise helpers

/// Reads `count` values (or until the end) from a `BroadcastValue` subscription.
func take<Value: Sendable>(
    _ count: Int, from subscription: BroadcastValue<Value, Never>.Subscription
) async throws -> [Value] {
    try await withDeadline("\(count) values") {
        var iterator = subscription.makeAsyncIterator()
        var result: [Value] = []
        while result.count < count, let value = await iterator.next() { result.append(value) }
        return result
    }
}

/// Reads a `BroadcastValue` subscription until it ends.
func drain<Value: Sendable>(_ subscription: BroadcastValue<Value, Never>.Subscription) async throws -> [Value] {
    try await withDeadline("end of value subscription") {
        var result: [Value] = []
        for await value in subscription { result.append(value) }
        return result
    }
}

/// What a throwing `BroadcastValue` subscription yields, in order.
enum ValueEvent<Value: Sendable & Equatable>: Equatable, Sendable {
    case value(Value)
    case error(TestError)
    case end
}

/// Reads until `nil`, recording values and thrown errors (and reading on
/// after an error, to see what follows it). One more `next()` after the end:
/// anything but `nil` there is recorded too. Stops after `limit` events.
func events<Value: Sendable & Equatable>(
    _ subscription: BroadcastValue<Value, TestError>.Subscription, limit: Int = 1000
) async throws -> [ValueEvent<Value>] {
    try await withDeadline("end of throwing value subscription") {
        var iterator = subscription.makeAsyncIterator()
        return await recordEvents(limit: limit) { () async throws(TestError) -> Value? in try await iterator.next() }
    }
}

/// The loop behind both `events(_:)`: `next` is one iterator's `next()`.
func recordEvents<Element>(
    limit: Int, _ next: () async throws(TestError) -> Element?
) async -> [ValueEvent<Element>] {
    var result: [ValueEvent<Element>] = []
    while result.count < limit {
        do throws(TestError) {
            guard let element = try await next() else { result.append(.end); break }
            result.append(.value(element))
        } catch {
            result.append(.error(error))
        }
    }
    do throws(TestError) {
        if let extra = try await next() { result.append(.value(extra)) }
    } catch {
        result.append(.error(error))
    }
    return result
}

/// Runs `body` on a thread of its own (not the cooperative pool), failing
/// with `DeadlineExceeded` if it does not return: for calls that would
/// deadlock if the library held a lock where it must not.
func onThread<T: Sendable>(_ what: String, _ body: @escaping @Sendable () -> T) async throws -> T {
    try await withDeadline(what) {
        let result = Locked<T?>(nil)
        await withUnsafeContinuation { (continuation: UnsafeContinuation<Void, Never>) in
            Thread.detachNewThread {
                let value = body()
                result.value = value
                continuation.resume()
            }
        }
        return result.value!
    }
}

/// Runs `body(0)` ... `body(count - 1)` on `count` threads of their own,
/// released together (each spins until all have started); returns when all
/// are done.
func raceOnThreads(_ count: Int, _ what: String, _ body: @escaping @Sendable (Int) -> Void) async throws {
    try await withDeadline(what) {
        let started = Locked(0)
        let finished = Locked(0)
        await withUnsafeContinuation { (continuation: UnsafeContinuation<Void, Never>) in
            for index in 0..<count {
                Thread.detachNewThread {
                    started.withLock { $0 += 1 }
                    while started.value < count { sched_yield() }
                    body(index)
                    if finished.withLock({ $0 += 1; return $0 }) == count { continuation.resume() }
                }
            }
        }
    }
}

/// A weak reference the tests can read from any thread.
final class WeakBox<Object: AnyObject>: @unchecked Sendable {
    private struct Reference { weak var object: Object? }
    private let reference = Locked(Reference())
    init(_ object: Object? = nil) { reference.withLock { $0.object = object } }
    var object: Object? {
        get { reference.withLock { $0.object } }
        set { reference.withLock { $0.object = newValue } }
    }
    var isNil: Bool { object == nil }
}

/// How a wait on a `BroadcastPromise<_, TestError>` ended.
enum PromiseOutcome<Value: Sendable & Equatable>: Equatable, Sendable {
    case success(Value)
    case failure(TestError)
    case cancelled
    case other(String)

    init(_ result: Result<Value, TestError>) {
        switch result {
        case .success(let value): self = .success(value)
        case .failure(let error): self = .failure(error)
        }
    }
}

/// Waits on `promise.value` and reports how it ended.
func outcome<Value: Sendable & Equatable>(of promise: BroadcastPromise<Value, TestError>) async -> PromiseOutcome<Value> {
    do {
        return .success(try await promise.value)
    } catch let error as TestError {
        return .failure(error)
    } catch is CancellationError {
        return .cancelled
    } catch {
        return .other("\(error)")
    }
}

/// For exit tests: a body that neither traps nor returns within
/// `stepDeadline` (a deadlock, a lost wake-up) makes the child process exit
/// with `code`, chosen as the opposite of what the test expects, so the
/// test fails instead of hanging the run. A timer, not synchronization.
func startExitTestWatchdog(exitingWith code: Int32) {
    Thread.detachNewThread {
        Thread.sleep(forTimeInterval: stepDeadline)
        FileHandle.standardError.write(Data("exit test watchdog: no outcome within \(stepDeadline)s\n".utf8))
        exit(code)
    }
}

// MARK: - Sharing helpers

/// What a throwing `BroadcastSequence` subscription yields, in order (the
/// sequence form of `events(_:)` above).
func events<Element: Sendable & Equatable>(
    _ subscription: BroadcastSequence<Element, TestError>.Subscription, limit: Int = 1000
) async throws -> [ValueEvent<Element>] {
    try await withDeadline("end of throwing subscription") {
        var iterator = subscription.makeAsyncIterator()
        return await recordEvents(limit: limit) { () async throws(TestError) -> Element? in try await iterator.next() }
    }
}

/// Things recorded from any thread, in the order they happened.
final class EventLog<Event: Sendable>: Sendable {
    private let events = Locked<[Event]>([])
    func append(_ event: Event) { events.withLock { $0.append(event) } }
    var all: [Event] { events.value }
    var count: Int { events.withLock { $0.count } }
}

/// One run of a `Feed`: the upstream a shared sequence iterates, driven
/// element by element by the test. Its `next()` suspends until the test
/// sends, ends or fails it; when `honoursCancellation`, cancelling the
/// iterating task makes that `next()` return `nil` at once (as
/// `AsyncStream` does).
final class FeedRun<Failure: Error>: Sendable {
    enum Item: Sendable {
        case element(Int)
        case end
        case failure(Failure)
        case cancelled
    }

    private struct State {
        var queue: [Item] = []
        var waiter: UnsafeContinuation<Item, Never>?
        var cancelled = false
        var ended = false
        var pulls = 0
        var iterators = 0
    }

    let number: Int
    let honoursCancellation: Bool
    private let state = Locked(State())

    init(number: Int, honoursCancellation: Bool) {
        self.number = number
        self.honoursCancellation = honoursCancellation
    }

    /// Elements handed to the iterating task so far: how far the upstream ran.
    var pulls: Int { state.withLock { $0.pulls } }
    /// `makeAsyncIterator()` calls on this run's sequence.
    var iterators: Int { state.withLock { $0.iterators } }
    /// The iterating task's cancellation reached the upstream.
    var sawCancellation: Bool { state.withLock { $0.cancelled } }
    /// The iterating task is suspended in `next()`, waiting for the test.
    var isWaiting: Bool { state.withLock { $0.waiter != nil } }
    /// `next()` returned `nil` or threw: the iteration is over.
    var ended: Bool { state.withLock { $0.ended } }

    func send(_ element: Int) { push(.element(element)) }
    func send<S: Sequence<Int>>(contentsOf elements: S) { for element in elements { push(.element(element)) } }
    func finish() { push(.end) }
    func fail(_ error: Failure) { push(.failure(error)) }

    private func push(_ item: Item) {
        let waiter = state.withLock { state -> UnsafeContinuation<Item, Never>? in
            if let waiter = state.waiter {
                state.waiter = nil
                state.pulls += 1
                return waiter
            }
            state.queue.append(item)
            return nil
        }
        waiter?.resume(returning: item)
    }

    fileprivate func iteratorMade() { state.withLock { $0.iterators += 1 } }

    fileprivate func take() async -> Item {
        let item: Item
        if honoursCancellation {
            item = await withTaskCancellationHandler {
                await wait()
            } onCancel: {
                let waiter = state.withLock { state -> UnsafeContinuation<Item, Never>? in
                    state.cancelled = true
                    defer { state.waiter = nil }
                    return state.waiter
                }
                waiter?.resume(returning: .cancelled)
            }
        } else {
            item = await wait()
        }
        switch item {
        case .element: break
        case .end, .failure, .cancelled: state.withLock { $0.ended = true }
        }
        return item
    }

    private func wait() async -> Item {
        await withUnsafeContinuation { (continuation: UnsafeContinuation<Item, Never>) in
            let ready = state.withLock { state -> Item? in
                if honoursCancellation && state.cancelled { return .cancelled }
                if !state.queue.isEmpty {
                    state.pulls += 1
                    return state.queue.removeFirst()
                }
                state.waiter = continuation
                return nil
            }
            if let ready { continuation.resume(returning: ready) }
        }
    }
}

/// The sequence of one `FeedRun`.
struct FeedSequence<RunFailure: Error>: AsyncSequence, Sendable {
    typealias Element = Int
    typealias Failure = RunFailure
    let run: FeedRun<RunFailure>

    struct AsyncIterator: AsyncIteratorProtocol {
        typealias Element = Int
        typealias Failure = RunFailure
        let run: FeedRun<RunFailure>
        var done = false

        mutating func next() async throws(RunFailure) -> Int? {
            if done { return nil }
            switch await run.take() {
            case .element(let element): return element
            case .end, .cancelled:
                done = true
                return nil
            case .failure(let error):
                done = true
                throw error
            }
        }

        mutating func next(isolation actor: isolated (any Actor)?) async throws(RunFailure) -> Int? {
            try await next()
        }
    }

    func makeAsyncIterator() -> AsyncIterator {
        run.iteratorMade()
        return AsyncIterator(run: run)
    }
}

/// A task-local value `Feed` records at each `upstream()` call: whether
/// that call inherited the subscriber's task-local context.
enum FeedMarker {
    @TaskLocal static var value: Int?
}

/// A test upstream factory: each `make()` (one per `upstream()` call, so
/// one per run) creates a new `FeedRun`, numbered from 1, and records
/// where it was called.
final class Feed<Failure: Error>: Sendable {
    struct CallSite: Sendable {
        var inTask: Bool
        var thread: ObjectIdentifier
        var marker: Int?
    }

    let honoursCancellation: Bool
    private let runs = Locked<[FeedRun<Failure>]>([])
    private let sites = Locked<[CallSite]>([])

    init(of: Failure.Type = Failure.self, honoursCancellation: Bool = true) {
        self.honoursCancellation = honoursCancellation
    }

    /// `upstream()` calls so far.
    var made: Int { runs.withLock { $0.count } }
    var callSites: [CallSite] { sites.value }

    /// Run `number` (1-based), once `upstream()` made it.
    func run(_ number: Int) -> FeedRun<Failure> { runs.withLock { $0[number - 1] } }

    /// Waits until run `number` exists and is suspended in `next()`.
    func waitForRun(_ number: Int) async throws -> FeedRun<Failure> {
        try await waitUntil("upstream run \(number) waiting for its next element") {
            self.runs.withLock { $0.count >= number && $0[number - 1].isWaiting }
        }
        return run(number)
    }

    func make() -> FeedSequence<Failure> {
        let site = CallSite(inTask: withUnsafeCurrentTask { $0 != nil },
                            thread: ObjectIdentifier(Thread.current), marker: FeedMarker.value)
        sites.withLock { $0.append(site) }
        let run = runs.withLock { runs in
            let run = FeedRun<Failure>(number: runs.count + 1, honoursCancellation: honoursCancellation)
            runs.append(run)
            return run
        }
        return FeedSequence(run: run)
    }
}

/// An endless upstream: element `tag * 1_000_000 + i` for i = 1, 2, ...,
/// yielding between elements. Ends when its task is cancelled, unless it
/// `ignoresCancellation` (then it runs until the library refuses an element).
struct Ticker: AsyncSequence, Sendable {
    typealias Element = Int
    typealias Failure = Never
    let tag: Int
    var ignoresCancellation = false

    struct AsyncIterator: AsyncIteratorProtocol {
        typealias Element = Int
        typealias Failure = Never
        let tag: Int
        let ignoresCancellation: Bool
        var index = 0
        mutating func next() async -> Int? {
            await Task.yield()
            if Task.isCancelled && !ignoresCancellation { return nil }
            index += 1
            return tag * 1_000_000 + index
        }
        mutating func next(isolation actor: isolated (any Actor)?) async -> Int? { await next() }
    }

    func makeAsyncIterator() -> AsyncIterator { AsyncIterator(tag: tag, ignoresCancellation: ignoresCancellation) }
}

/// Counts a listener's register and unregister calls, and notices any two
/// of them running at the same time.
final class ListenerLog: Sendable {
    enum Event: Equatable, Sendable { case register, unregister }
    private struct State {
        var events: [Event] = []
        var inside = 0
        var overlaps = 0
    }
    private let state = Locked(State())

    var events: [Event] { state.withLock { $0.events } }
    var registers: Int { state.withLock { $0.events.filter { $0 == .register }.count } }
    var unregisters: Int { state.withLock { $0.events.filter { $0 == .unregister }.count } }
    /// Register/unregister calls that began while another was running.
    var overlaps: Int { state.withLock { $0.overlaps } }
    /// No `record` body runs now: a register counted in `registers` has
    /// also finished its body (stored its sink).
    var isOutside: Bool { state.withLock { $0.inside == 0 } }

    /// Records `event` around `body` (user code the library runs).
    @discardableResult
    func record<T>(_ event: Event, _ body: () -> T) -> T {
        state.withLock { state in
            if state.inside > 0 { state.overlaps += 1 }
            state.inside += 1
            state.events.append(event)
        }
        // Widen the window in which an overlapping call would be seen.
        for _ in 0..<3 { sched_yield() }
        defer { state.withLock { $0.inside -= 1 } }
        return body()
    }

    /// Whether the events are register, unregister, register, ... (ending
    /// with unregister when `closed`).
    func alternates(closed: Bool) -> Bool {
        let events = self.events
        for (index, event) in events.enumerated() where event != (index % 2 == 0 ? .register : .unregister) {
            return false
        }
        return !closed || events.count % 2 == 0
    }
}

/// Waits until every run of `shared` is over: no upstream task or stop
/// timer left, and each start stopped. A run that ends on its own returns
/// from its task before the stop is recorded, so `liveUpstreamTasks == 0`
/// alone can be seen a moment early.
func waitUntilRunsAreOver<Element, Failure>(_ shared: BroadcastSequence<Element, Failure>, _ what: String) async throws {
    try await waitUntil(what) {
        let counters = shared.sharingCounters
        return counters.liveUpstreamTasks == 0 && counters.liveTimerTasks == 0
            && counters.starts == counters.stops && !counters.isRunning
    }
}
