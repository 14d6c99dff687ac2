#if ASYNCBROADCAST_WEAK_MEMORY
public import _CAtomics  // the run-time fault switches below (inlinable)
#endif
#if ASYNCBROADCAST_RUNTIME_FAULTS && canImport(Glibc)
import Glibc  // getenv, for RuntimeFault
#elseif ASYNCBROADCAST_RUNTIME_FAULTS && canImport(Darwin)
import Darwin
#endif

/// Deliberate faults, compiled in only with `-DASYNCBROADCAST_FAULT_<NAME>`,
/// or all of them, switched at run time, in a build with
/// `ASYNCBROADCAST_RUNTIME_FAULTS=1` (see `RuntimeFault`, at the end).
///
/// They exist to prove that the checkers catch real bugs:
/// `scripts/stress-faults.sh`, `scripts/test-faults.sh` and
/// `Fuzz/fault-check.sh` run the library with each one and require the
/// stress run, a unit test or a fuzz target to fail. Every `#if` for a fault
/// lives here; the code consults these constants, which fold to `false` in
/// a normal build.
@usableFromInline
enum Fault {
    /// A producer never wakes a parked consumer.
    @inlinable static var skipWake: Bool {
        #if ASYNCBROADCAST_FAULT_SKIP_WAKE
        return true
        #elseif ASYNCBROADCAST_RUNTIME_FAULTS
        return RuntimeFault.isOn("SKIP_WAKE")
        #else
        return false
        #endif
    }

    /// Ended subscribers stay registered (`subscriberCount` never drops).
    @inlinable static var leakSubscriber: Bool {
        #if ASYNCBROADCAST_FAULT_LEAK_SUBSCRIBER
        return true
        #elseif ASYNCBROADCAST_RUNTIME_FAULTS
        return RuntimeFault.isOn("LEAK_SUBSCRIBER")
        #else
        return false
        #endif
    }

    /// The sequence lock's unlock releases the word whatever it holds
    /// (`SequenceGate`): a request pushed while the lock was held is lost,
    /// its requester waits forever.
    @inlinable static var gateUnlockIgnoresRequests: Bool {
        #if ASYNCBROADCAST_FAULT_GATE_UNLOCK_IGNORES_REQUESTS
        return true
        #elseif ASYNCBROADCAST_WEAK_MEMORY
        return cab_wm_faults() & 128 != 0  // WeakMemoryModel.Ordering.gateUnlockIgnoresRequests
        #elseif ASYNCBROADCAST_RUNTIME_FAULTS
        return RuntimeFault.isOn("GATE_UNLOCK_IGNORES_REQUESTS")
        #else
        return false
        #endif
    }

    /// The sequence lock's holder never serves a waiting request itself: it
    /// grants the lock to the first waiter (a plain queue lock), so a
    /// producer's unlock hands the lock to a registrant asleep in the
    /// kernel, and every registration costs the producer a wake.
    @inlinable static var gateHolderNeverServes: Bool {
        #if ASYNCBROADCAST_FAULT_GATE_HOLDER_NEVER_SERVES
        return true
        #elseif ASYNCBROADCAST_RUNTIME_FAULTS
        return RuntimeFault.isOn("GATE_HOLDER_NEVER_SERVES")
        #else
        return false
        #endif
    }

    /// `bufferedCount` of a lock-free buffer loads `head`, then `tail`, as two
    /// separate reads (as before the snapshot): an observer preempted
    /// between them counts elements read meanwhile.
    @inlinable static var tornBufferedCount: Bool {
        #if ASYNCBROADCAST_FAULT_TORN_BUFFERED_COUNT
        return true
        #elseif ASYNCBROADCAST_RUNTIME_FAULTS
        return RuntimeFault.isOn("TORN_BUFFERED_COUNT")
        #else
        return false
        #endif
    }

    /// A topic is dropped when its last subscriber leaves without checking,
    /// under the shard lock, that it is still idle: the race of a
    /// hand-built dictionary of sequences (a subscriber that joined in
    /// between is left on a sequence no send reaches).
    @inlinable static var topicRetiresBusy: Bool {
        #if ASYNCBROADCAST_FAULT_TOPIC_RETIRES_BUSY
        return true
        #elseif ASYNCBROADCAST_RUNTIME_FAULTS
        return RuntimeFault.isOn("TOPIC_RETIRES_BUSY")
        #else
        return false
        #endif
    }

    /// A topic's notice checks whether its generation is idle (the sequence
    /// lock) while holding the shard lock, as it did before: a send to the
    /// generation then holds up every topic of the shard.
    @inlinable static var topicRetiresUnderShardLock: Bool {
        #if ASYNCBROADCAST_FAULT_TOPIC_RETIRES_UNDER_SHARD_LOCK
        return true
        #elseif ASYNCBROADCAST_RUNTIME_FAULTS
        return RuntimeFault.isOn("TOPIC_RETIRES_UNDER_SHARD_LOCK")
        #else
        return false
        #endif
    }

    /// A topic's new generation starts its listener without waiting for
    /// the previous generation's unregister (`register` and unregister may
    /// overlap).
    @inlinable static var topicStartsUnblocked: Bool {
        #if ASYNCBROADCAST_FAULT_TOPIC_STARTS_UNBLOCKED
        return true
        #elseif ASYNCBROADCAST_RUNTIME_FAULTS
        return RuntimeFault.isOn("TOPIC_STARTS_UNBLOCKED")
        #else
        return false
        #endif
    }

    /// A full `.bufferingNewest` subscriber's eviction is not counted in
    /// `droppedCount`.
    @inlinable static var miscountEviction: Bool {
        #if ASYNCBROADCAST_FAULT_MISCOUNT_EVICTION
        return true
        #elseif ASYNCBROADCAST_RUNTIME_FAULTS
        return RuntimeFault.isOn("MISCOUNT_EVICTION")
        #else
        return false
        #endif
    }

    /// A lock-free buffer's lag marker is recorded one element late: the
    /// events reader reports `.lagged(n)` after the element that follows the
    /// gap instead of before it.
    @inlinable static var lagMarkerOffByOne: Bool {
        #if ASYNCBROADCAST_FAULT_LAG_MARKER_OFF_BY_ONE
        return true
        #elseif ASYNCBROADCAST_RUNTIME_FAULTS
        return RuntimeFault.isOn("LAG_MARKER_OFF_BY_ONE")
        #else
        return false
        #endif
    }

    /// The hard eviction limit compares what a subscriber holds after a send
    /// with the limit, instead of asking whether the send made it hold more:
    /// a lossy subscriber over-filled by replay is evicted by a send its
    /// policy drops.
    @inlinable static var evictionComparesHeld: Bool {
        #if ASYNCBROADCAST_FAULT_EVICTION_COMPARES_HELD
        return true
        #elseif ASYNCBROADCAST_RUNTIME_FAULTS
        return RuntimeFault.isOn("EVICTION_COMPARES_HELD")
        #else
        return false
        #endif
    }

    /// The events reader of a subscriber that ended (evicted, cancelled)
    /// returns the end without the gap still pending: its `.lagged` counts
    /// fall short of `droppedCount`.
    @inlinable static var endSkipsPendingLag: Bool {
        #if ASYNCBROADCAST_FAULT_END_SKIPS_PENDING_LAG
        return true
        #elseif ASYNCBROADCAST_RUNTIME_FAULTS
        return RuntimeFault.isOn("END_SKIPS_PENDING_LAG")
        #else
        return false
        #endif
    }

    /// A subscribe from a cancelled task creates the topic's generation,
    /// stores it as live and retires it only after the shard lock is
    /// released: a send in between fills its replay window, which a real
    /// subscriber arriving then starts with.
    @inlinable static var cancelledSubscribeGoesLive: Bool {
        #if ASYNCBROADCAST_FAULT_CANCELLED_SUBSCRIBE_GOES_LIVE
        return true
        #elseif ASYNCBROADCAST_RUNTIME_FAULTS
        return RuntimeFault.isOn("CANCELLED_SUBSCRIBE_GOES_LIVE")
        #else
        return false
        #endif
    }

    /// `subscribe(to:)` returns its subscriber without checking, once its
    /// follow-up has run, that its generation is still the topic's live one:
    /// a `finish(topic:)` in between leaves it on a generation no later send
    /// reaches.
    @inlinable static var subscribeIgnoresFinish: Bool {
        #if ASYNCBROADCAST_FAULT_SUBSCRIBE_IGNORES_FINISH
        return true
        #elseif ASYNCBROADCAST_RUNTIME_FAULTS
        return RuntimeFault.isOn("SUBSCRIBE_IGNORES_FINISH")
        #else
        return false
        #endif
    }

    /// The hard eviction limit is off by one: a send that makes a
    /// subscriber hold `u` (not `u + 1`) unread elements ends it.
    @inlinable static var evictionOffByOne: Bool {
        #if ASYNCBROADCAST_FAULT_EVICTION_OFF_BY_ONE
        return true
        #elseif ASYNCBROADCAST_RUNTIME_FAULTS
        return RuntimeFault.isOn("EVICTION_OFF_BY_ONE")
        #else
        return false
        #endif
    }

    /// `send(_:replayable: false)` is stored in the replay window like any
    /// send: a later subscriber starts with it.
    @inlinable static var replayableIgnored: Bool {
        #if ASYNCBROADCAST_FAULT_REPLAYABLE_IGNORED
        return true
        #elseif ASYNCBROADCAST_RUNTIME_FAULTS
        return RuntimeFault.isOn("REPLAYABLE_IGNORED")
        #else
        return false
        #endif
    }

    /// `sink.ready()` records the run as ready but does not wake the
    /// `upstreamReady()` callers already waiting (a lost wake-up).
    @inlinable static var readyIgnored: Bool {
        #if ASYNCBROADCAST_FAULT_READY_IGNORED
        return true
        #elseif ASYNCBROADCAST_RUNTIME_FAULTS
        return RuntimeFault.isOn("READY_IGNORED")
        #else
        return false
        #endif
    }

    /// A served `emit` reports success but delivers nothing.
    @inlinable static var dropEmit: Bool {
        #if ASYNCBROADCAST_FAULT_DROP_EMIT
        return true
        #elseif ASYNCBROADCAST_RUNTIME_FAULTS
        return RuntimeFault.isOn("DROP_EMIT")
        #else
        return false
        #endif
    }

    /// A `BroadcastValue` change does not wake its parked readers.
    @inlinable static var valueSkipWake: Bool {
        #if ASYNCBROADCAST_FAULT_VALUE_SKIP_WAKE
        return true
        #elseif ASYNCBROADCAST_RUNTIME_FAULTS
        return RuntimeFault.isOn("VALUE_SKIP_WAKE")
        #else
        return false
        #endif
    }

    /// A `BroadcastValue` reader does not always record the version it took,
    /// so it can return the same change twice.
    @inlinable static var valueDuplicate: Bool {
        #if ASYNCBROADCAST_FAULT_VALUE_DUPLICATE
        return true
        #elseif ASYNCBROADCAST_RUNTIME_FAULTS
        return RuntimeFault.isOn("VALUE_DUPLICATE")
        #else
        return false
        #endif
    }

    /// A cancelled `BroadcastPromise` waiter's slot is never freed.
    @inlinable static var promiseLeakCancelled: Bool {
        #if ASYNCBROADCAST_FAULT_PROMISE_LEAK_CANCELLED
        return true
        #elseif ASYNCBROADCAST_RUNTIME_FAULTS
        return RuntimeFault.isOn("PROMISE_LEAK_CANCELLED")
        #else
        return false
        #endif
    }

    /// `BroadcastValue` never compares: an equal send or update is a change.
    @inlinable static var valueEqualIsChange: Bool {
        #if ASYNCBROADCAST_FAULT_VALUE_EQUAL_IS_CHANGE
        return true
        #elseif ASYNCBROADCAST_RUNTIME_FAULTS
        return RuntimeFault.isOn("VALUE_EQUAL_IS_CHANGE")
        #else
        return false
        #endif
    }

    /// A later `succeed`/`fail` also wins: it returns `true` and replaces
    /// the result.
    @inlinable static var promiseDoubleComplete: Bool {
        #if ASYNCBROADCAST_FAULT_PROMISE_DOUBLE_COMPLETE
        return true
        #elseif ASYNCBROADCAST_RUNTIME_FAULTS
        return RuntimeFault.isOn("PROMISE_DOUBLE_COMPLETE")
        #else
        return false
        #endif
    }

    /// A shared sequence never stops a run: the upstream task is not
    /// cancelled, the unregister closure never called.
    @inlinable static var sharingSkipStop: Bool {
        #if ASYNCBROADCAST_FAULT_SHARING_SKIP_STOP
        return true
        #elseif ASYNCBROADCAST_RUNTIME_FAULTS
        return RuntimeFault.isOn("SHARING_SKIP_STOP")
        #else
        return false
        #endif
    }

    /// A stopped run's elements (its task's, its sink's) are still delivered.
    @inlinable static var sharingStaleDelivery: Bool {
        #if ASYNCBROADCAST_FAULT_SHARING_STALE_DELIVERY
        return true
        #elseif ASYNCBROADCAST_RUNTIME_FAULTS
        return RuntimeFault.isOn("SHARING_STALE_DELIVERY")
        #else
        return false
        #endif
    }

    /// `subscriberCounts` misses the changes made by subscribers leaving.
    @inlinable static var countsSkipRemoval: Bool {
        #if ASYNCBROADCAST_FAULT_COUNTS_SKIP_REMOVAL
        return true
        #elseif ASYNCBROADCAST_RUNTIME_FAULTS
        return RuntimeFault.isOn("COUNTS_SKIP_REMOVAL")
        #else
        return false
        #endif
    }

    /// An asynchronous listener's next run starts as soon as the previous
    /// one is stopped, without waiting for its take-down to return.
    @inlinable static var sharingRestartBeforeTakeDown: Bool {
        #if ASYNCBROADCAST_FAULT_SHARING_RESTART_BEFORE_TAKEDOWN
        return true
        #elseif ASYNCBROADCAST_RUNTIME_FAULTS
        return RuntimeFault.isOn("SHARING_RESTART_BEFORE_TAKEDOWN")
        #else
        return false
        #endif
    }

    /// A thread claims the sharing reconciler role even while another holds
    /// it, so starts and stops (register and unregister) can overlap.
    @inlinable static var sharingParallelReconcilers: Bool {
        #if ASYNCBROADCAST_FAULT_SHARING_PARALLEL_RECONCILERS
        return true
        #elseif ASYNCBROADCAST_RUNTIME_FAULTS
        return RuntimeFault.isOn("SHARING_PARALLEL_RECONCILERS")
        #else
        return false
        #endif
    }

    // MARK: Removed orderings (one per row of Handshakes.md)
    //
    // Each takes away one fence or sequentially consistent access of a
    // cross-thread handshake; the litmus runner (Sources/broadcast-litmus) and
    // the weak-memory fuzz targets must then find the lost wake-up or the
    // stuck subscriber it causes. A weak-memory build can also switch each
    // one at run time (`WeakMemoryModel.removedOrderings`), so one build
    // checks them all.

    /// A reader parks without the fence between announcing itself and its
    /// last look for work (`Parking.park`).
    @inlinable static var parkSkipsFence: Bool {
        #if ASYNCBROADCAST_FAULT_PARK_SKIPS_FENCE
        return true
        #elseif ASYNCBROADCAST_WEAK_MEMORY
        return cab_wm_faults() & 1 != 0  // WeakMemoryModel.Ordering.parkSkipsFence
        #else
        return false
        #endif
    }

    /// A send looks for parked readers without the fence after publishing
    /// (`Parking.producerMayNeedToWake`).
    @inlinable static var wakeSkipsFence: Bool {
        #if ASYNCBROADCAST_FAULT_WAKE_SKIPS_FENCE
        return true
        #elseif ASYNCBROADCAST_WEAK_MEMORY
        return cab_wm_faults() & 2 != 0  // WeakMemoryModel.Ordering.wakeSkipsFence
        #else
        return false
        #endif
    }

    /// `finish` reads a subscriber's head and park word without the fence
    /// after recording the terminal event (`BroadcastState.finish`).
    @inlinable static var finishSkipsFence: Bool {
        #if ASYNCBROADCAST_FAULT_FINISH_SKIPS_FENCE
        return true
        #elseif ASYNCBROADCAST_WEAK_MEMORY
        return cab_wm_faults() & 4 != 0  // WeakMemoryModel.Ordering.finishSkipsFence
        #else
        return false
        #endif
    }

    /// A consumer that has just taken its last element reads the terminal
    /// hint without the fence after publishing its head (`SubscriberCore.pop`).
    @inlinable static var popSkipsFence: Bool {
        #if ASYNCBROADCAST_FAULT_POP_SKIPS_FENCE
        return true
        #elseif ASYNCBROADCAST_WEAK_MEMORY
        return cab_wm_faults() & 8 != 0  // WeakMemoryModel.Ordering.popSkipsFence
        #else
        return false
        #endif
    }

    /// `cancel()` reads the park word without the fence after ending the
    /// subscriber (`SubscriberCore.cancel`).
    @inlinable static var cancelSkipsFence: Bool {
        #if ASYNCBROADCAST_FAULT_CANCEL_SKIPS_FENCE
        return true
        #elseif ASYNCBROADCAST_WEAK_MEMORY
        return cab_wm_faults() & 16 != 0  // WeakMemoryModel.Ordering.cancelSkipsFence
        #else
        return false
        #endif
    }

    /// A `.bounded` consumer publishes its head with a release store, not a
    /// sequentially consistent one (`SubscriberBuffer.pop`).
    @inlinable static var boundedHeadRelease: Bool {
        #if ASYNCBROADCAST_FAULT_BOUNDED_HEAD_RELEASE
        return true
        #elseif ASYNCBROADCAST_WEAK_MEMORY
        return cab_wm_faults() & 32 != 0  // WeakMemoryModel.Ordering.boundedHeadRelease
        #else
        return false
        #endif
    }

    /// An emitter announces its check for room with a release store, not a
    /// sequentially consistent one (`BroadcastStorage.announceEmitterCheck`).
    @inlinable static var emitterFlagRelease: Bool {
        #if ASYNCBROADCAST_FAULT_EMITTER_FLAG_RELEASE
        return true
        #elseif ASYNCBROADCAST_WEAK_MEMORY
        return cab_wm_faults() & 64 != 0  // WeakMemoryModel.Ordering.emitterFlagRelease
        #else
        return false
        #endif
    }
}

#if ASYNCBROADCAST_RUNTIME_FAULTS
/// The fault scripts' build (`ASYNCBROADCAST_RUNTIME_FAULTS=1`, see
/// `Package.swift`): every fault above the removed orderings is compiled in,
/// and the one named by the environment variable `ASYNCBROADCAST_FAULT`
/// (`SKIP_WAKE`, ...; the name after `ASYNCBROADCAST_FAULT_`) is on for the
/// whole process. One build then serves every fault of a script, where a
/// `-D` flag per fault rebuilt the library and everything above it each
/// time. Each check costs a string comparison: never for users.
@usableFromInline
enum RuntimeFault {
    /// Read once, when a fault is first consulted.
    @usableFromInline static let selected: String = getenv("ASYNCBROADCAST_FAULT").map { String(cString: $0) } ?? ""

    @inlinable static func isOn(_ name: String) -> Bool { selected == name }
}
#endif
