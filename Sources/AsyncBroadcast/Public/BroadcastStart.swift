/// When a shared sequence runs its upstream: see
/// `AsyncSequence.broadcast(bufferingPolicy:replay:started:)`,
/// ``BroadcastSequence/init(bufferingPolicy:replay:started:upstream:)-55nxr`` and
/// ``BroadcastSequence/init(bufferingPolicy:replay:started:register:)``.
///
/// ```swift
/// // A listener registered while anyone listens, removed 5 s after the last one leaves.
/// let snapshots = BroadcastSequence<Snapshot, StoreError>(started: .whileSubscribed(stopAfter: .seconds(5))) { sink in
///     let registration = store.addListener { sink.send($0) }
///     return { registration.remove() }
/// }
/// ```
public struct BroadcastStart: Sendable {
    @usableFromInline
    enum Mode: Sendable {
        case eagerly
        case lazily
        case whileSubscribed(StopDelay)
    }

    @usableFromInline let mode: Mode

    init(mode: Mode) { self.mode = mode }

    /// Starts the upstream when the sequence is created, subscribers or not.
    /// It then runs until it ends (or the sequence is finished or released);
    /// subscribers leaving do not stop it.
    /// <!-- restates: SHARE-EAGERLY -->
    public static var eagerly: BroadcastStart { BroadcastStart(mode: .eagerly) }

    /// Starts the upstream at the first subscriber. It then runs until it
    /// ends (or the sequence is finished or released); subscribers leaving
    /// do not stop it.
    /// <!-- restates: SHARE-LAZILY -->
    public static var lazily: BroadcastStart { BroadcastStart(mode: .lazily) }

    /// Starts the upstream at the first subscriber and stops it once the
    /// last one has been gone for `stopAfter`; the next subscriber starts a
    /// fresh one (a new `upstream()` or `register` call) on the same
    /// sequence.
    /// <!-- restates: SHARE-RESTART -->
    ///
    /// With `.zero` (the default), the stop happens inside the call that
    /// removed the last subscriber (its `cancel()`, its release, or its
    /// `for await` loop ending). <!-- restates: SHARE-WHILE-SUBSCRIBED-STOP --> With a delay, a subscriber that arrives
    /// before it has elapsed keeps the running upstream: nothing restarts. <!-- restates: SHARE-PENDING-STOP-CANCELLED -->
    /// The replay window carries over from one run to the next. <!-- restates: SHARE-REPLAY-CARRIES -->
    ///
    /// A negative `stopAfter` traps with a message naming it. <!-- restates: MISUSE-NEGATIVE-STOPAFTER -->
    @available(macOS 13, iOS 16, tvOS 16, watchOS 9, *)
    public static func whileSubscribed(stopAfter: Duration = .zero) -> BroadcastStart {
        whileSubscribed(stopAfter: stopAfter, clock: ContinuousClock())
    }
}

@available(macOS 13, iOS 16, tvOS 16, watchOS 9, *)
extension BroadcastStart {
    /// ``whileSubscribed(stopAfter:)`` timed by `clock` (tests drive a manual clock).
    @_spi(Testing)
    public static func whileSubscribed<C: Clock>(stopAfter: C.Duration, clock: C) -> BroadcastStart {
        if stopAfter < .zero { misuse("whileSubscribed(stopAfter:) must not be negative (got \(stopAfter))") }
        if stopAfter == .zero { return BroadcastStart(mode: .whileSubscribed(StopDelay(sleep: nil))) }
        return BroadcastStart(
            mode: .whileSubscribed(
                StopDelay(sleep: {
                    // Cancelled when a subscriber arrives or the sequence ends; the
                    // timer's token decides either way, so the error carries nothing.
                    try? await clock.sleep(for: stopAfter)
                })))
    }
}

/// The delay of `whileSubscribed(stopAfter:)`, as a closure so that
/// `BroadcastStart` stores no `Duration` (macOS 13) and stays available on
/// every platform.
@usableFromInline
struct StopDelay: Sendable {
    /// `nil` for `.zero`: stop at once, in the call that removed the last subscriber.
    let sleep: (@Sendable () async -> Void)?

    var isZero: Bool { sleep == nil }
}
