/// How many of a `BroadcastTopics`' listeners run, for `listenersStopped()`:
/// one count from just before a topic's `register` or `listen` is called
/// until its unregister or take-down has returned.
///
/// Entered by a topic's sequence in the section of its lock that decides a
/// run's start (`Sharing.startDecided`), before `register` or `listen` is
/// called: a `listenersStopped()` that follows a `finish()` cannot miss a
/// run decided before it (a `listen` task not scheduled yet). Left by the
/// registry's wrappers around the user's closures, after the unregister or
/// take-down: `finish()` lets go of generations whose listener is still
/// stopping, and this count still waits for them. Every decided start calls
/// the closure once and its unregister or take-down once.
final class ListenerActivity: @unchecked Sendable {
    // `running` and `waiters` are guarded by `lock`; waiters are resumed
    // after it is released.
    private let lock = Lock()
    private var running = 0
    /// Runs counted now (tests).
    var runningCount: Int { lock.withLock { running } }
    private var waiters = SharingWaiters()

    init() {}

    deinit { lock.destroy() }

    func enter() {
        lock.withLock { running += 1 }
    }

    func leave() {
        let woken: WaiterTable? = lock.withLock {
            running -= 1
            if running < 0 { internalInconsistency("a topic listener left twice") }
            return running == 0 && !waiters.isEmpty ? waiters.takeAll() : nil
        }
        woken?.resumeWaiting()
    }

    /// Returns once no listener runs, or when the task is cancelled.
    func waitUntilIdle() async {
        while true {
            lock.lock()
            if running == 0 || Task.isCancelled {
                lock.unlock()
                return
            }
            let ticket = waiters.reserve()
            lock.unlock()
            await withTaskCancellationHandler {
                await withUnsafeContinuation { (continuation: UnsafeContinuation<Void, Never>) in
                    if !lock.withLock({ waiters.store(continuation, ticket) }) { Parking.resume(continuation) }
                }
            } onCancel: {
                if let continuation = lock.withLock({ waiters.cancel(ticket) }) { Parking.resume(continuation) }
            }
            lock.withLock { waiters.leave(ticket) }
        }
    }

    /// Wraps a topic's `register` so that the count covers it and its unregister.
    func counting<Topic, Element, Failure>(
        _ register: @escaping @Sendable (Topic, BroadcastSink<Element, Failure>) -> @Sendable () -> Void
    ) -> @Sendable (Topic, BroadcastSink<Element, Failure>) -> @Sendable () -> Void {
        { [self] topic, sink in
            let unregister = register(topic, sink)
            return {
                unregister()
                self.leave()
            }
        }
    }

    /// Wraps a topic's `listen` so that the count covers it and its take-down
    /// (which the library always runs once `listen` has returned).
    func counting<Topic, Element, Failure>(
        _ listen: @escaping @Sendable (Topic, BroadcastSink<Element, Failure>) async -> @Sendable () async -> Void
    ) -> @Sendable (Topic, BroadcastSink<Element, Failure>) async -> @Sendable () async -> Void {
        { [self] topic, sink in
            let takeDown = await listen(topic, sink)
            return {
                await takeDown()
                self.leave()
            }
        }
    }
}
