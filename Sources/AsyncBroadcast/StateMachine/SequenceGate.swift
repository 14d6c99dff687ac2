public import _CAtomics  // `cab_park_*`, `cab_cpu_relax`, `cab_wm_*` (inlinable callers)

/// The sequence lock: a lock in one word whose waiters queue, and whose
/// holder runs the short requests of the waiters (subscribe, cancel,
/// finish, every `withLock`) for them when it unlocks. Who waits, and for
/// how long, is a count of requests, never a duration.
///
/// The OS mutex it replaces is not fair: a producer that unlocks and sends
/// again retakes it before a waiter woken in the kernel runs (one
/// `subscribe()` waited p50 8 ms at N = 1,024), and registrants spinning on
/// it win it against a sender asleep in the kernel (a sender kept 3 % of its
/// sends against 8 registrant threads). The gate that came next bounded
/// both sides' waits with clocks tuned on one machine.
///
/// The word (`word`): bit 0 `locked`, bit 1 `queued` (the holder's queue
/// is not empty), the other bits the top of a stack of request nodes pushed
/// by waiters. The word is 0 exactly when nobody holds the lock and nobody
/// waits, so:
/// - `tryLock` is one compare-exchange 0 → `locked`: it fails whenever
///   anyone waits (nobody barges past a waiter);
/// - `unlock` is one compare-exchange `locked` → 0: it fails whenever a
///   request arrived or the queue is not empty, and the holder then serves
///   (`unlockSlow`). A request pushed while the lock is held and an unlock
///   are read-modify-writes of this one word, so one of them sees the
///   other: there is no store-buffering pair to fence (Handshakes.md,
///   row 9).
///
/// A request that finds the lock taken pushes a node living on its own
/// stack and waits on it (spinning `spins` times, then blocking: a futex on
/// Linux, `cab_park_wait`). The holder, unlocking, moves the pushed nodes
/// into its queue (`queueHead`/`queueTail`, only ever touched by the holder,
/// so the order is arrival order) and then:
/// - once, after its own critical section, runs the *combinable* requests
///   at the head of the queue (a `withLock` body: a subscribe's, a
///   cancel's, a finish's state transition) and marks each `done`; their
///   requesters run the effects themselves, after they see it;
/// - then, if anyone still waits, it does not serve again: it grants the
///   lock to the first waiter (an *exclusive* one, a sender; or a
///   combinable one that arrived after the batch, which then runs its own
///   body and serves the next batch at its unlock) and returns. The lock
///   passes from thread to thread without ever being free while someone
///   waits.
///
/// So a send pays, beyond its own critical section, at most the batch of
/// requests pending when it unlocks (a count); a request waits for at most
/// the critical section in progress, the requests and grants queued before
/// it (a count); a sender that waits is granted the lock after exactly the
/// requests that arrived before it. Nobody waits while holding the lock,
/// and no body runs user code (the bodies are state transitions; effects
/// run outside).
///
/// Ordering: the push is a release (the node's words before it), the
/// holder's take of the stack an acquire; a node's completion is an
/// acquire-release exchange of its `state` read with acquire by its
/// requester, so what the body wrote (the requester's result and effects,
/// the state) and, for a grant, everything the previous holder wrote, is
/// visible to the requester. Fast-path lock and unlock are acquire-release
/// compare-exchanges.
///
/// No owner thread: a lock granted to a thread is unlocked by it, but
/// nothing records which thread holds it (a mutex would refuse the hand-off).
@usableFromInline
struct SequenceGate: @unchecked Sendable {
    /// Words 0-2 of `block` (the lock word, the holder's queue), word 3
    /// (`finished`, set once the sequence's terminal is) and word 4
    /// (`spinner`).
    @usableFromInline let block: AtomicBlock

    @inlinable init(block: AtomicBlock) { self.block = block }

    /// A gate with a block of its own (tests), freed by `destroy()`.
    @inlinable init() { block = AtomicBlock(wordCount: 5) }

    @inlinable func destroy() { block.destroy() }

    @inlinable var word: AtomicInt { block.word(0) }
    @inlinable var queueHead: AtomicInt { block.word(1) }
    @inlinable var queueTail: AtomicInt { block.word(2) }
    /// 1 once the sequence's terminal event is set (under the lock): read
    /// without it (`isFinished`).
    @inlinable var finished: AtomicInt { block.word(3) }
    /// 1 while one waiter spins long (`longSpins`); the others block after
    /// `spins`.
    @inlinable var spinner: AtomicInt { block.word(4) }

    @inlinable static var locked: Int { 1 }
    @inlinable static var queued: Int { 2 }
    @inlinable static var flags: Int { 3 }

    /// Node words: `next` (a node's address or 0), `state`, `body` (the
    /// address of the requester's `(UnsafeMutableRawPointer) -> Void`, or 0
    /// for an exclusive request) and `context` (what the holder passes it:
    /// the requester's `QueuedRequest`).
    @inlinable static var nodeWords: Int { 4 }
    @inlinable static var waiting: Int { 0 }
    @inlinable static var sleeping: Int { 1 }
    @inlinable static var done: Int { 2 }
    @inlinable static var granted: Int { 3 }
    /// Spin-loop hints a waiter gives before it blocks. One waiter at a
    /// time (`spinner`) spins `longSpins`, about as long as a send to 64
    /// subscribers (about 6 µs on the 2-vCPU EPYC of the benchmarks): a
    /// registrant beside such a producer is then served without sleeping,
    /// and its server pays no wake. The others spin `spins` (a batch of
    /// requests is a few state transitions) and block: spinners take the CPU
    /// from the holder they wait for (with 1,024 long spins, about 25 µs,
    /// eight registrant threads held a sender to 0.05-0.17 of its solo sends
    /// on two cores at load 8-11, against 0.49-0.57 with 128 for every
    /// waiter: Benchmarks/results/2026-11-28-gate.md, rounds A and 0).
    @inlinable static var spins: Int { 32 }
    @inlinable static var longSpins: Int { 256 }

    // MARK: Taking and releasing

    /// Takes the lock if nobody holds it and nobody waits.
    @inlinable @inline(__always)
    func tryLock() -> Bool {
        guard word.compareExchange(expected: 0, desired: Self.locked).exchanged else { return false }
        noteLock(1)
        modelAcquired()
        return true
    }

    /// Takes the lock (a sender: the holder's batch of earlier requests
    /// runs first, then the lock is granted to it, in arrival order).
    @inlinable @inline(__always)
    func lock() {
        checkNoShardLockHeld()
        if tryLock() { return }
        _ = waitInLine(body: 0, context: 0)
    }

    @inlinable @inline(__always)
    func unlock() {
        if Fault.gateUnlockIgnoresRequests {
            noteLock(-1)
            word.storeRelease(0)
            return
        }
        if releaseCompareExchange(expected: Self.locked, desired: 0) {
            noteLock(-1)
            return
        }
        unlockSlow()
    }

    /// Runs `body` under the lock: on this thread if the lock is free,
    /// else by the holder on its way out (this thread waits), or, if the
    /// lock is granted to this thread, here. `body` must not take this lock
    /// or depend on which thread runs it (no task-local, no
    /// `Task.isCancelled`): whatever it needs from the caller, decide it
    /// before.
    @inlinable
    func withLock<R>(_ body: () -> R) -> R {
        checkNoShardLockHeld()
        if tryLock() {
            let result = body()
            unlock()
            return result
        }
        return withLockQueued(body)
    }

    /// A request that waits: its body and result live in a `QueuedRequest`
    /// on this stack, and the holder runs it through a closure that
    /// captures nothing (once specialized its context is null). A closure
    /// capturing `result` and `body` cost four allocations per queued
    /// request; one remains, the context `withoutActuallyEscaping` makes.
    @inlinable
    func withLockQueued<R>(_ body: () -> R) -> R {
        withoutActuallyEscaping(body) { body in
            var request = QueuedRequest(body: body)
            var run: (UnsafeMutableRawPointer) -> Void = { QueuedRequest<R>.run($0) }
            let grantedToUs = withUnsafeMutablePointer(to: &request) { request in
                withUnsafeMutablePointer(to: &run) { run in
                    waitInLine(
                        body: Int(bitPattern: UnsafeMutableRawPointer(run)),
                        context: Int(bitPattern: UnsafeMutableRawPointer(request)))
                }
            }
            if grantedToUs {
                request.result = body()
                unlock()
            }
            guard let result = request.result else {
                internalInconsistency("a queued request returned neither served nor granted")
            }
            return result
        }
    }

    /// Internal checks: nobody takes a sequence lock while holding a topic
    /// shard's lock (`ShardLock`), whether or not it would wait.
    @inlinable @inline(__always)
    func checkNoShardLockHeld() {
        #if ASYNCBROADCAST_INTERNAL_CHECKS
        if cab_shard_locks_held() != 0 {
            internalInconsistency("a sequence lock taken while holding a topic shard's lock")
        }
        #endif
    }

    // MARK: Waiting

    /// Pushes a request node (exclusive if `body` is 0) and waits until it
    /// is served (`false`: the body ran) or the lock is ours (`true`).
    @usableFromInline @inline(never)
    func waitInLine(body: Int, context: Int) -> Bool {
        withUnsafeTemporaryAllocation(of: cab_atomic_int.self, capacity: Self.nodeWords) { buffer in
            let node = buffer.baseAddress!
            let next = AtomicInt(unowned: node)
            let state = AtomicInt(unowned: node + 1)
            next.storeRelaxed(0)
            state.storeRelaxed(Self.waiting)
            AtomicInt(unowned: node + 2).storeRelaxed(body)
            AtomicInt(unowned: node + 3).storeRelaxed(context)
            defer { forgetNode(node) }
            if push(node) {
                noteLock(1)
                modelAcquired()
                return true
            }
            #if !ASYNCBROADCAST_WEAK_MEMORY
            var spun = 0
            var spinsAllowed = Self.spins
            var longSpinner = spinner.compareExchange(expected: 0, desired: 1).exchanged
            if longSpinner { spinsAllowed = Self.longSpins }
            defer { if longSpinner { spinner.storeRelaxed(0) } }
            #endif
            while true {
                let now = state.loadAcquire()
                if now == Self.granted {
                    noteLock(1)
                    return true
                }
                if now == Self.done { return false }
                #if ASYNCBROADCAST_WEAK_MEMORY
                // The checkers never block a modelled thread.
                cab_thread_yield()
                continue
                #else
                if spun < spinsAllowed {
                    spun += 1
                    cab_cpu_relax()
                    continue
                }
                if longSpinner {
                    // Blocking: let the next waiter spin long.
                    spinner.storeRelaxed(0)
                    longSpinner = false
                }
                if now == Self.waiting {
                    if !state.compareExchange(expected: Self.waiting, desired: Self.sleeping).exchanged { continue }
                }
                cab_park_wait(state.raw, Self.sleeping)
                #endif
            }
        }
    }

    /// Pushes `node` (its `next` is set here) on the stack, or, if nobody
    /// holds the lock and nobody waits, takes the lock instead (`true`).
    @inlinable
    func push(_ node: UnsafeMutablePointer<cab_atomic_int>) -> Bool {
        let next = AtomicInt(unowned: node)
        let address = Int(bitPattern: node)
        var current = word.loadRelaxed()
        while true {
            if current == 0 {
                let attempt = word.compareExchange(expected: 0, desired: Self.locked)
                if attempt.exchanged { return true }
                current = attempt.original
                continue
            }
            next.storeRelaxed(current & ~Self.flags)
            let attempt = word.compareExchange(expected: current, desired: address | (current & Self.flags))
            if attempt.exchanged { return false }
            current = attempt.original
        }
    }

    /// Marks `node` served (`done`) or the lock's (`granted`) and wakes its
    /// requester, which may return (its node gone) right after the exchange.
    @inlinable
    func complete(_ node: UnsafeMutablePointer<cab_atomic_int>, _ outcome: Int) {
        let state = AtomicInt(unowned: node + 1)
        if state.exchangeAcquiringAndReleasing(outcome) == Self.sleeping {
            cab_park_wake(state.raw)
        }
    }

    // MARK: Serving

    /// The holder's way out when someone waits: take the new requests into
    /// the queue, serve one batch of combinable ones, then grant the lock
    /// to the next waiter or release it.
    @usableFromInline @inline(never)
    func unlockSlow() {
        // The served requesters that sleep are woken after the lock is
        // released or passed on, not while it is held: on a busy core a
        // woken thread may preempt its waker, which would then hold the
        // lock while it does not run.
        withUnsafeTemporaryAllocation(of: Int.self, capacity: Self.deferredWakes) { wakes in
            var wakeCount = 0
            defer {
                for index in 0..<wakeCount {
                    cab_park_wake(UnsafeMutablePointer(bitPattern: wakes[index])!)
                }
            }
            var served = false
            while true {
                var current = word.loadAcquire()
                if current & ~Self.flags != 0 {
                    let taken = word.compareExchange(expected: current, desired: Self.locked | Self.queued)
                    if !taken.exchanged { continue }
                    enqueue(stackTop: taken.original & ~Self.flags)
                    current = Self.locked | Self.queued
                }
                guard let first = node(queueHead.loadRelaxed()) else {
                    if releaseCompareExchange(expected: current, desired: 0) {
                        noteLock(-1)
                        return
                    }
                    continue
                }
                if !served && !Fault.gateHolderNeverServes {
                    served = true
                    serveBatch(deferringWakesTo: wakes, count: &wakeCount)
                    continue
                }
                let next = takeNextHolder(first)
                if queueHead.loadRelaxed() == 0 { clearQueued() }
                // The lock passes to `next`'s thread: this one no longer holds it.
                noteLock(-1)
                complete(next, Self.granted)
                return
            }
        }
    }

    /// Sleeping requesters a holder wakes after letting go of the lock; more
    /// in one batch are woken at once.
    @inlinable static var deferredWakes: Int { 16 }

    /// Takes the waiter the lock goes to out of the queue: the first, if it
    /// is exclusive (senders keep their turn); else the first combinable
    /// request before the next exclusive one whose thread still spins (it
    /// runs at once; one asleep would leave the lock idle until it wakes),
    /// or the first if all sleep. The ones it passes are at the head of the
    /// queue, served by its unlock.
    @inlinable
    func takeNextHolder(_ first: UnsafeMutablePointer<cab_atomic_int>) -> UnsafeMutablePointer<cab_atomic_int> {
        var previous: UnsafeMutablePointer<cab_atomic_int>? = nil
        var cursor: UnsafeMutablePointer<cab_atomic_int>? = first
        while let candidate = cursor, AtomicInt(unowned: candidate + 2).loadRelaxed() != 0 {
            let next = AtomicInt(unowned: candidate).loadRelaxed()
            if AtomicInt(unowned: candidate + 1).loadRelaxed() == Self.waiting {
                if let previous {
                    AtomicInt(unowned: previous).storeRelaxed(next)
                    if next == 0 { queueTail.storeRelaxed(Int(bitPattern: previous)) }
                    return candidate
                }
                break
            }
            previous = candidate
            cursor = node(next)
        }
        popFirst(first)
        return first
    }

    /// Runs the combinable requests at the head of the queue, in arrival
    /// order, up to the first exclusive one.
    @inlinable
    func serveBatch(deferringWakesTo wakes: UnsafeMutableBufferPointer<Int>, count: inout Int) {
        while let first = node(queueHead.loadRelaxed()) {
            let body = AtomicInt(unowned: first + 2).loadRelaxed()
            if body == 0 { return }
            let context = AtomicInt(unowned: first + 3).loadRelaxed()
            popFirst(first)
            UnsafeMutableRawPointer(bitPattern: body)!
                .assumingMemoryBound(to: ((UnsafeMutableRawPointer) -> Void).self)
                .pointee(UnsafeMutableRawPointer(bitPattern: context)!)
            // Once `done` is stored the requester may return and its node
            // be gone: a deferred wake then reaches a word nobody waits on
            // (or a later waiter, which looks again), never freed memory
            // that is read.
            let state = AtomicInt(unowned: first + 1)
            if state.exchangeAcquiringAndReleasing(Self.done) == Self.sleeping {
                if count < wakes.count {
                    wakes[count] = Int(bitPattern: state.raw)
                    count += 1
                } else {
                    cab_park_wake(state.raw)
                }
            }
        }
    }

    /// Appends the pushed nodes (newest first from `stackTop`) to the queue,
    /// oldest first.
    @inlinable
    func enqueue(stackTop: Int) {
        var reversed = 0
        var cursor = stackTop
        while let node = node(cursor) {
            let next = AtomicInt(unowned: node)
            cursor = next.loadRelaxed()
            next.storeRelaxed(reversed)
            reversed = Int(bitPattern: node)
        }
        if let tail = node(queueTail.loadRelaxed()) {
            AtomicInt(unowned: tail).storeRelaxed(reversed)
        } else {
            queueHead.storeRelaxed(reversed)
        }
        queueTail.storeRelaxed(stackTop)
    }

    @inlinable
    func popFirst(_ first: UnsafeMutablePointer<cab_atomic_int>) {
        let next = AtomicInt(unowned: first).loadRelaxed()
        queueHead.storeRelaxed(next)
        if next == 0 { queueTail.storeRelaxed(0) }
    }

    @inlinable
    func clearQueued() {
        var current = word.loadRelaxed()
        while true {
            let attempt = word.compareExchange(expected: current, desired: current & ~Self.queued)
            if attempt.exchanged { return }
            current = attempt.original
        }
    }

    @inlinable
    func node(_ address: Int) -> UnsafeMutablePointer<cab_atomic_int>? {
        UnsafeMutablePointer(bitPattern: address)
    }

    // MARK: The weak-memory model

    /// The checkers' build: no preemption point while the gate is held, as
    /// for a mutex (`cab_wm_note_lock`).
    @inlinable @inline(__always)
    func noteLock(_ delta: Int) {
        #if ASYNCBROADCAST_WEAK_MEMORY
        cab_wm_note_lock(delta)
        #endif
    }

    /// The release of the lock word: in the checkers' build a release
    /// only, as a mutex's unlock is modelled (`cab_wm_cas_release`), so that
    /// a fence the lock does not give is still missed there.
    @inlinable @inline(__always)
    func releaseCompareExchange(expected: Int, desired: Int) -> Bool {
        #if ASYNCBROADCAST_WEAK_MEMORY
        var expected = expected
        return cab_wm_cas_release(word.raw, &expected, desired)
        #else
        return word.compareExchange(expected: expected, desired: desired).exchanged
        #endif
    }

    /// After taking the lock word: in the checkers' build, what the last
    /// releaser stored before its release becomes visible.
    @inlinable @inline(__always)
    func modelAcquired() {
        #if ASYNCBROADCAST_WEAK_MEMORY
        cab_wm_word_lock_acquired(word.raw)
        #endif
    }

    @inlinable @inline(__always)
    func forgetNode(_ node: UnsafeMutablePointer<cab_atomic_int>) {
        #if ASYNCBROADCAST_WEAK_MEMORY
        cab_wm_forget(node, Self.nodeWords * MemoryLayout<Int>.size)
        #endif
    }

    // MARK: Tests

    /// Requests pushed and not yet served or granted (the holder's queue
    /// and the stack): for tests, read while the lock is held by the test.
    @usableFromInline var waitingCount: Int {
        var count = 0
        var cursor = word.loadAcquire() & ~Self.flags
        while let node = node(cursor) {
            count += 1
            cursor = AtomicInt(unowned: node).loadRelaxed()
        }
        cursor = queueHead.loadRelaxed()
        while let node = node(cursor) {
            count += 1
            cursor = AtomicInt(unowned: node).loadRelaxed()
        }
        return count
    }
}
