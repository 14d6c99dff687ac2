// The one-shot result workload (`promise`): W tasks wait for one result; time
// from completing it until the last waiter runs. BroadcastPromise against an
// actor with checked continuations and a `Task` awaited by every waiter.
@_spi(Testing) import AsyncBroadcast
import Synchronization

/// One result, many waiters.
protocol PromisePeer: Sendable {
    static var name: String { get }
    init()
    /// Before any waiter: whatever must be in place for `complete` to work.
    func prepare() async
    func wait() async throws -> Int
    /// Timing starts just before this call.
    func complete(_ value: Int) async
    /// Waiters parked now, if the peer can tell (checked before timing).
    func waiterCount() async -> Int?
}

extension PromisePeer {
    func prepare() async {}
}

// MARK: BroadcastPromise

struct BroadcastPromisePeer: PromisePeer {
    static var name: String { "BroadcastPromise" }
    let promise = BroadcastPromise<Int, Never>()
    init() {}
    func wait() async throws -> Int { try await promise.value }
    func complete(_ value: Int) async { promise.succeed(value) }
    func waiterCount() async -> Int? { promise.waiterCount }
}

// MARK: An actor with checked continuations

/// The usual hand-written one-shot result (an actor over checked continuations), plus a
/// waiter count for the harness.
public actor SingleOutput<Value: Sendable> {
    private var result: Result<Value, Error>?
    private var waiters: [CheckedContinuation<Value, Error>] = []
    public func wait() async throws -> Value {
        if let result { return try result.get() }
        return try await withCheckedThrowingContinuation { cont in waiters.append(cont) }
    }
    public func succeed(_ value: Value) { finish(.success(value)) }
    public func fail(_ error: Error) { finish(.failure(error)) }
    private func finish(_ result: Result<Value, Error>) {
        guard self.result == nil else { return }
        self.result = result
        let continuations = waiters; waiters.removeAll()
        for continuation in continuations { continuation.resume(with: result) }
    }
    var waiterCount: Int { waiters.count }
}

struct ActorPromisePeer: PromisePeer {
    static var name: String { "actor SingleOutput" }
    let output = SingleOutput<Int>()
    init() {}
    func wait() async throws -> Int { try await output.wait() }
    func complete(_ value: Int) async { await output.succeed(value) }
    func waiterCount() async -> Int? { await output.waiterCount }
}

// MARK: A Task awaited by every waiter

/// Holds the continuation the task waits on until `complete`.
final class Gate: Sendable {
    let slot = Mutex<CheckedContinuation<Int, Never>?>(nil)
    let armed = Latch(1)
}

/// `Task<Int, Never>` that waits for `complete`, then returns its value;
/// every waiter does `await task.value`.
struct TaskPromisePeer: PromisePeer {
    static var name: String { "Task.value" }
    let gate: Gate
    let task: Task<Int, Never>

    init() {
        let gate = Gate()
        self.gate = gate
        task = Task.detached {
            await withCheckedContinuation { (c: CheckedContinuation<Int, Never>) in
                gate.slot.withLock { $0 = c }
                gate.armed.arrive()
            }
        }
    }

    func prepare() async { await gate.armed.wait() }
    func wait() async throws -> Int { await task.value }
    func complete(_ value: Int) async {
        let c = gate.slot.withLock { $0.take() }
        c?.resume(returning: value)
    }
    func waiterCount() async -> Int? { nil }
}

// MARK: The workload

final class PromiseEnd: Sendable {
    struct State {
        var end: UInt64 = 0
        var mallocs: Int? = nil
    }
    let state = Mutex(State())
}

/// `w` tasks wait (all parked before the result comes: each has said it is
/// about to wait, then 2 ms pass, then, where the peer can tell, every one
/// is counted as parked); one task completes the promise with 42. Time and
/// allocations run from just before the completing call until the last
/// waiter has its value (it counts itself the w-th of a shared counter).
func runPromise<P: PromisePeer>(_: P.Type, waiters w: Int, meter: AllocMeter?) async -> RunResult {
    let peer = P()
    await peer.prepare()
    let ready = Latch(w)
    let done = Latch(1)
    let resumed = Counter()
    let wrong = Counter()
    let final = PromiseEnd()
    let waiters = (0..<w).map { _ in
        Task.detached {
            ready.arrive()
            let value = try? await peer.wait()
            if value != 42 { wrong.increment() }
            if resumed.next() == w {
                let end = nowNanos()
                let mallocs = meter?.stop()
                final.state.withLock { $0 = .init(end: end, mallocs: mallocs) }
                done.arrive()
            }
        }
    }
    await ready.wait()
    try? await Task.sleep(for: .milliseconds(2))
    var notParked: String? = nil
    if await peer.waiterCount() != nil {
        let deadline = nowNanos() + 5_000_000_000
        while let c = await peer.waiterCount(), c < w {
            if nowNanos() > deadline {
                notParked = "only \(c) of \(w) waiters parked after 5 s"
                break
            }
            try? await Task.sleep(for: .microseconds(200))
        }
    }
    let start = await Task.detached { () -> UInt64 in
        meter?.start()
        let start = nowNanos()
        await peer.complete(42)
        return start
    }.value
    await done.wait()
    for task in waiters { await task.value }
    let (end, mallocs) = final.state.withLock { ($0.end, $0.mallocs) }
    let error = wrong.current > 0 ? "\(wrong.current) of \(w) waiters got a wrong value" : notParked
    return RunResult(nanos: end &- start, units: 1, mallocs: mallocs, error: error)
}

// MARK: Cells

let promiseInfo = V2Info(unit: "ns succeed→last resumed", allocUnit: "waiter", allocsPerN: true,
    how: "W waiting tasks, all parked before the result; one task completes it (succeed / await actor.succeed / "
        + "resuming the continuation the Task waits on); time from just before that call until the last waiter "
        + "has its value (it counts itself the W-th); allocations over the same window, per waiter")

func promiseGroups(_ o: CompareOptions) -> [Group] {
    [1, 100, 10_000].map { w in
        func cell<P: PromisePeer>(_ p: P.Type) -> PeerCell {
            PeerCell(peer: P.name) { meter in await runPromise(P.self, waiters: w, meter: meter) }
        }
        return Group(workload: "promise", n: w, peers: [
            cell(BroadcastPromisePeer.self), cell(ActorPromisePeer.self), cell(TaskPromisePeer.self),
        ], v2: promiseInfo)
    }
}
