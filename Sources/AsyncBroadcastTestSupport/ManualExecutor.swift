/// A task executor that only queues jobs; the caller decides when, and in
/// which order, they run. Tasks started with `Task(executorPreference:)` on
/// it make interleavings deterministic: the unit tests step it with
/// `runUntilIdle()`, the `sched` fuzz target picks each next job from its
/// input. Not part of AsyncBroadcast's API.
///
/// ```swift
/// let executor = ManualExecutor()
/// let reader = Task(executorPreference: executor) { await iterator.next() }
/// executor.runUntilIdle()   // the reader runs until it suspends
/// ```
@available(macOS 15.0, iOS 18.0, tvOS 18.0, watchOS 11.0, *)
public final class ManualExecutor: TaskExecutor, @unchecked Sendable {
    private let jobs = Locked<[UnownedJob]>([])
    private let hook = Locked<(@Sendable (UnsafeRawPointer) -> Void)?>(nil)

    public init() {}

    public func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        if let onEnqueue = hook.value { onEnqueue(Self.address(of: job)) }
        jobs.withLock { $0.append(job) }
    }

    /// Called for every enqueue (with the job's address), before it is queued.
    public func setOnEnqueue(_ body: (@Sendable (UnsafeRawPointer) -> Void)?) { hook.value = body }

    /// A task's job is the task itself: the same address as its `Task`
    /// handle. Other jobs (the runtime's own, e.g. behind `Task.yield()`)
    /// have other addresses.
    public static func address(of job: UnownedJob) -> UnsafeRawPointer { unsafeBitCast(job, to: UnsafeRawPointer.self) }
    public static func address<S, F>(of task: Task<S, F>) -> UnsafeRawPointer { unsafeBitCast(task, to: UnsafeRawPointer.self) }

    public var queuedCount: Int { jobs.withLock { $0.count } }

    /// The queued jobs' addresses, oldest first.
    public var queuedAddresses: [UnsafeRawPointer] { jobs.withLock { $0.map(Self.address(of:)) } }

    /// Runs the job at `index` of the queue (oldest first) on this thread.
    public func run(at index: Int) {
        let job = jobs.withLock { $0.remove(at: index) }
        job.runSynchronously(on: asUnownedTaskExecutor())
    }

    /// Runs queued jobs, oldest first, until none is left.
    public func runUntilIdle() {
        while let job = jobs.withLock({ $0.isEmpty ? nil : $0.removeFirst() }) {
            job.runSynchronously(on: asUnownedTaskExecutor())
        }
    }
}
