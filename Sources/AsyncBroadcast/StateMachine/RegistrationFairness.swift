public import _CAtomics  // `cab_cpu_relax`, `cab_thread_yield`, `cab_monotonic_nanos` (inlinable callers)

/// Keeps senders and registrants (`subscribe()`, `cancel()`) from starving
/// each other of the sequence lock: they take turns, in phases.
///
/// The OS mutex is not fair. A send to N subscribers holds the lock for
/// about 10-60 ns × N; a producer that unlocks and sends again retakes the
/// lock before a registrant woken in the kernel runs (measured before this
/// existed: one `subscribe()` waited p50 8 ms at N = 1,024, seconds at
/// N = 100,000). The other way round, registrants that spin on the lock
/// without pause win it against a sender asleep in the kernel (measured
/// with the first half of this alone: 1 sender, 1,024 idle subscribers and
/// 8 threads doing subscribe + cancel, the sender completed 3 % of its
/// sends and one send waited 65 ms).
///
/// The protocol, counters on one cache line:
/// - A registrant counts itself in `arrived`. If a sender has announced
///   itself (`sendersWaiting`), it waits, yielding the CPU and never
///   touching the lock, until that sender holds the lock (bounded in
///   time). Then it spins on `tryLock` for about 3 µs (not trying while a
///   sender is announced) and blocks in the kernel; holding the lock, it
///   counts itself in `served`.
/// - A sender whose fast path fails (registrants arrived and are not
///   served, or the lock is taken) first waits until `served` reaches the
///   `arrived` it read (spinning 30 µs, then sleeping between looks;
///   bounded in time): the registrants that came before it go first. Then
///   it announces itself in `sendersWaiting`, so that registrants
///   arriving from now on wait for it, takes the lock (spinning up to
///   50 µs, then blocking), and withdraws the announcement.
///
/// So a send waits for at most the registrations that arrived before it
/// looked, and is never made to wait again by registrants that arrived
/// after; a registration waits for at most the sends announced before it
/// arrived (and the send in progress). Every wait is bounded in time
/// (`senderWaitNanos`, `registrantWaitNanos`), so a thread the scheduler
/// keeps off the CPU while the other side waits for it stalls that side
/// once, briefly: a sender's given-up wait is recorded in `abandoned` and
/// not repeated for the same registrants for 40 ms. Nobody waits while
/// holding the lock. A send's fast path is two relaxed loads and a
/// `tryLock`.
///
/// What it cannot do: with more busy threads than cores, every thread
/// gets its share of the CPU, and a thread preempted while it holds the
/// lock holds up everyone. Measured with 8 threads doing subscribe + cancel
/// without pause against one sender on this 2-core machine (see
/// Performance): the phases keep the sender's turns, the CPU it gets is
/// the scheduler's.
///
/// Ordering: none needed for correctness. The counters decide only who
/// waits; a stale read makes someone wait a little more or less, never
/// lets two threads hold the lock. `served` is written only while holding
/// the lock, so its plain increment is not lost.
///
/// The deterministic schedulers (`ASYNCBROADCAST_WEAK_MEMORY`) leave this
/// out: it changes who waits, never what anyone sees, and a spin there would
/// only grow the schedules they explore.
@usableFromInline
struct RegistrationFairness: @unchecked Sendable {
    /// Word 0: `arrived`, word 1: `served` (written only by registrations),
    /// words 2 and 4: `abandoned` and `abandonedAt` (written only by
    /// senders), word 3: `sendersWaiting`: words 0-4 of the block it is
    /// given (a sequence's own: see `BroadcastStorage.Word`).
    @usableFromInline let block: AtomicBlock

    /// The gate on words 0-4 of `block`, whose owner frees it.
    @inlinable init(block: AtomicBlock) { self.block = block }

    /// A gate with a block of its own (tests), freed by `destroy()`.
    @inlinable init() { block = AtomicBlock(wordCount: 5) }

    @inlinable func destroy() { block.destroy() }

    @inlinable var arrived: AtomicInt { block.word(0) }
    @inlinable var served: AtomicInt { block.word(1) }
    /// The last `arrived` a sender stopped waiting for, and when: for
    /// `abandonRenewNanos` after that, sends do not wait for the same
    /// registrants again, only for newer ones, so a registrant kept off the
    /// CPU costs the senders one bounded wait per period, not one per send;
    /// after it, they wait again, so a registrant that was merely slow to
    /// wake is not overtaken by every later send.
    @inlinable var abandoned: AtomicInt { block.word(2) }
    @inlinable var abandonedAt: AtomicInt { block.word(4) }
    /// Senders between the end of their wait for registrants and holding
    /// the lock: registrants arriving meanwhile let them go first.
    @inlinable var sendersWaiting: AtomicInt { block.word(3) }

    /// `tryLock` attempts before a registrant blocks: about 3 µs of
    /// spinning (measured: 2,048 `pause`s take 50 µs on the 2-vCPU EPYC
    /// here), longer than a send to 64 subscribers. A registrant that
    /// arrives during a longer send blocks and is woken when it ends (the
    /// next send waits for it): spinning through a long send would take
    /// the CPU from the sender that holds the lock, and with more threads
    /// than cores (a storm of registrations) that starved the sender.
    @inlinable static var registrantSpins: Int { 128 }
    /// Spins before a waiting side starts yielding the CPU to the side it
    /// waits for (which may need this core).
    @inlinable static var spinsBeforeYielding: Int { 128 }
    /// How long an announced sender spins on `tryLock` before it blocks:
    /// the lock is then held by a long send (registrants arriving do not
    /// try), and spinning through it would only take a core from it.
    @inlinable static var senderLockNanos: Int { 50_000 }
    /// The longest a sender waits for registrants that arrived before it:
    /// a registrant woken in the kernel needs tens of microseconds to run
    /// on an idle core (and gets this one: the sender sleeps meanwhile), but
    /// on an overloaded machine one was seen to need over 5 ms (the test
    /// suite under ThreadSanitizer beside it); in a storm of registrations
    /// the wait ends as soon as as many have been served as had arrived,
    /// whoever they were. A registrant kept off the CPU longer is not
    /// waited for further (see `abandoned`): a send must not wait 10 ms.
    @inlinable static var senderWaitNanos: Int { 4_000_000 }
    /// The longest a registrant waits for an announced sender to get the
    /// lock.
    @inlinable static var registrantWaitNanos: Int { 4_000_000 }
    /// How long a sender spins, waiting for registrants, before it sleeps
    /// between looks (see `waitBounded`): long enough for a registrant
    /// running on another core.
    @inlinable static var spinNanos: Int { 30_000 }
    /// How long an abandoned wait stands (see `abandoned`): a registrant
    /// the scheduler keeps off the CPU delays the senders by at most a
    /// tenth of their time.
    @inlinable static var abandonRenewNanos: Int { 40_000_000 }

    // MARK: Registrants

    /// Takes `lock` for `subscribe()` or a subscriber's removal.
    @inlinable
    func lockForRegistration(_ lock: Lock) {
        #if ASYNCBROADCAST_WEAK_MEMORY
        lock.lock()
        #else
        if Fault.unfairRegistration {
            lock.lock()
            return
        }
        _ = arrived.fetchAddAcquiringAndReleasing(1)
        if sendersWaiting.loadRelaxed() != 0 { waitForAnnouncedSenders() }
        var spins = 0
        while true {
            // Not while a sender is announced: it goes first.
            if sendersWaiting.loadRelaxed() == 0 && lock.tryLock() { break }
            if spins == Self.registrantSpins {
                lock.lock()
                break
            }
            spins += 1
            cab_cpu_relax()
        }
        served.storeRelaxed(served.loadRelaxed() &+ 1)
        #endif
    }

    /// Waits (bounded in time) until no sender is announced, without
    /// touching the lock, so that the sender gets it first even if it is
    /// asleep in the kernel.
    @inlinable @inline(never)
    func waitForAnnouncedSenders() {
        _ = waitBounded(nanos: Self.registrantWaitNanos, spinNanos: 0, yields: true) { sendersWaiting.loadRelaxed() == 0 }
    }

    // MARK: Senders

    /// Takes `lock` for a send: first lets registrants that are already
    /// waiting go, then goes before those that arrive later.
    @inlinable @inline(__always)
    func lockForSending(_ lock: Lock) {
        #if ASYNCBROADCAST_WEAK_MEMORY
        lock.lock()
        #else
        if Fault.unfairRegistration {
            lock.lock()
            return
        }
        let arrived = arrived.loadRelaxed()
        if arrived == served.loadRelaxed() && lock.tryLock() { return }
        lockForSendingAfterWaiting(arrivedBefore: arrived, lock)
        #endif
    }

    /// The slow path, out of line: every send's inlined part is only the
    /// two loads and the `tryLock` above. (With the `abandoned` check
    /// inlined too, a send to one subscriber measured about 25 % slower:
    /// `fanout-compare`, unbounded, N = 1, 99-116 against 78-87 ns per
    /// delivery, interleaved.)
    @inlinable @inline(never)
    func lockForSendingAfterWaiting(arrivedBefore target: Int, _ lock: Lock) {
        if target != abandoned.loadRelaxed()
            || Int(cab_monotonic_nanos()) &- abandonedAt.loadRelaxed() > Self.abandonRenewNanos
        {
            // Wrapping difference: the counters may wrap, never by half a
            // word between two looks.
            let served = waitBounded(nanos: Self.senderWaitNanos, spinNanos: Self.spinNanos) { self.served.loadRelaxed() &- target >= 0 }
            if !served {
                abandoned.storeRelaxed(target)
                abandonedAt.storeRelaxed(Int(cab_monotonic_nanos()))
            }
        }
        if Fault.sendersDoNotAnnounce {
            lock.lock()
            return
        }
        _ = sendersWaiting.fetchAddAcquiringAndReleasing(1)
        if !waitBounded(nanos: Self.senderLockNanos, spinNanos: Self.senderLockNanos, { lock.tryLock() }) { lock.lock() }
        _ = sendersWaiting.fetchAddAcquiringAndReleasing(-1)
    }

    // MARK: Waiting

    /// Waits until `done()` or `nanos` have passed; returns whether `done()`
    /// became true. Spins (checking the clock every 64 spins) for
    /// `spinNanos`, then gives up the CPU between looks: a sender sleeps
    /// for about 10 µs (plus the kernel's timer slack), a registrant
    /// (`yields`) yields.
    ///
    /// Why a sender sleeps rather than yields or spins on: the registrant
    /// it waits for may be waiting to run on this very core (a spinning
    /// thread keeps it for the rest of its time slice: a 1 ms spin-wait
    /// was seen to time out with the registrant runnable), and with more
    /// runnable threads than cores a `sched_yield` put the sender behind
    /// every registrant (measured: 8 registrant threads held the sender to
    /// 4 % of the CPU and 3-6 % of its sends; sleeping, to 24 % and 17 %).
    /// A sleeper leaves the run queue, and the scheduler runs it soon after
    /// it wakes. A registrant that waits for an announced sender yields:
    /// the sender may need that CPU.
    @inlinable
    func waitBounded(nanos: Int, spinNanos: Int, yields: Bool = false, _ done: () -> Bool) -> Bool {
        var spins = 0
        var start = 0
        while !done() {
            spins += 1
            if spins & 63 != 0 {
                cab_cpu_relax()
                continue
            }
            let now = Int(cab_monotonic_nanos())
            if start == 0 { start = now }
            let waited = now - start
            if waited > nanos { return false }
            if waited > spinNanos {
                if yields { cab_thread_yield() } else { cab_thread_sleep(10_000) }
            }
        }
        return true
    }
}
