public import _CAtomics  // `cab_cpu_relax`, `cab_thread_yield` (inlinable callers)

/// Keeps a producer that sends without pause from starving `subscribe()` and
/// `cancel()` of the sequence lock.
///
/// A send to N subscribers holds the lock for about 10 ns × N, and the OS
/// mutex is not fair: a producer that unlocks and sends again retakes the
/// lock before a registrant woken in the kernel gets to run. Measured before
/// this existed (`fanout-compare --filter "scale: registration"`), one
/// `subscribe()` waited through many sends: p50 8 ms at N = 1,024 and
/// seconds at N = 100,000, where one send takes about 6 ms.
///
/// The protocol, two words:
/// - A registrant counts itself in `arrived` before it asks for the lock,
///   spins for a bounded while on `tryLock` (the send in progress is short
///   at small N, and a sleeping waiter pays the kernel's wake-up), then
///   blocks; holding the lock, it counts itself in `served`.
/// - A sender, before it asks for the lock, compares the two. If
///   registrants arrived that are not served yet, it waits (spinning, then
///   yielding the CPU) until `served` reaches the `arrived` it read.
///
/// So a registrant that is on a CPU waits for at most the send in progress,
/// and a sender for at most the registrations that arrived before it looked
/// (and never for more than `senderYields` yields of the CPU, once per
/// group of registrants): neither side can starve the other, and nobody waits while holding the lock (a sender
/// waits before locking, a registrant is inside only to do its O(1) work).
/// The fast path of a send is two relaxed loads of a line that only
/// registrations write.
///
/// Ordering: none needed for correctness. A stale `arrived` means a sender
/// does not defer to a registrant that arrived a moment ago (it will on its
/// next send); `served` only grows, and the sender re-reads it until it has
/// caught up. Registrants write `served` only while holding the lock, so the
/// plain increment is not lost.
///
/// The deterministic schedulers (`ASYNCBROADCAST_WEAK_MEMORY`) leave this
/// out: it changes who waits, never what anyone sees, and a spin there would
/// only grow the schedules they explore.
@usableFromInline
struct RegistrationFairness: @unchecked Sendable {
    /// Word 0: `arrived`, word 1: `served` (written only by registrations),
    /// word 2: `abandoned` (written only by senders).
    @usableFromInline let block: AtomicBlock

    @inlinable init() { block = AtomicBlock(wordCount: 3) }

    @inlinable func destroy() { block.destroy() }

    @inlinable var arrived: AtomicInt { block.word(0) }
    @inlinable var served: AtomicInt { block.word(1) }
    /// The last `arrived` a sender stopped waiting for (see `senderYields`):
    /// later sends do not wait for the same registrants again, only for
    /// newer ones, so a registrant kept off the CPU costs the senders one
    /// bounded wait, not one per send.
    @inlinable var abandoned: AtomicInt { block.word(2) }

    /// `tryLock` attempts before a registrant blocks: about 20-50 µs of
    /// spinning, longer than a send to 1,024 subscribers.
    @inlinable static var registrantSpins: Int { 2_048 }
    /// A sender's spins before it starts yielding the CPU.
    @inlinable static var senderSpins: Int { 128 }
    /// A sender's yields before it stops waiting and takes the lock anyway:
    /// a registrant that arrived gets the lock within microseconds unless
    /// the scheduler keeps it off the CPU (a real-time sender on the same
    /// core, which `sched_yield` does not step aside for). Then deferring
    /// further would only stall the sender, so the wait is bounded.
    @inlinable static var senderYields: Int { 1_024 }

    /// Takes `lock` for `subscribe()` or `cancel()`.
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
        var spins = 0
        while !lock.tryLock() {
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

    /// Call before a send locks: lets registrants that are already waiting
    /// go first.
    @inlinable @inline(__always)
    func senderWillLock() {
        #if !ASYNCBROADCAST_WEAK_MEMORY
        if Fault.unfairRegistration { return }
        let arrived = arrived.loadRelaxed()
        if arrived != served.loadRelaxed() { waitForRegistrations(arrivedBefore: arrived) }
        #endif
    }

    /// Out of line, the `abandoned` check included: every send's inlined
    /// part is only the two loads above. With that check inlined too, a
    /// send to one subscriber measured about 25 % slower (`fanout-compare`,
    /// unbounded, N = 1: 99-116 against 78-87 ns per delivery, interleaved).
    @inlinable @inline(never)
    func waitForRegistrations(arrivedBefore target: Int) {
        if target == abandoned.loadRelaxed() { return }
        var spins = 0
        // Wrapping difference: the counters may wrap, never by half a word
        // between two looks.
        while served.loadRelaxed() &- target < 0 {
            if spins < Self.senderSpins {
                cab_cpu_relax()
            } else if spins < Self.senderSpins + Self.senderYields {
                cab_thread_yield()
            } else {
                abandoned.storeRelaxed(target)
                return
            }
            spins += 1
        }
    }
}
