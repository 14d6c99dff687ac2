extension BroadcastSequence {
    /// Registers a subscriber now, as ``subscribe(bufferingPolicy:)`` does,
    /// that is ended instead of holding more once it passes `eviction`'s
    /// limits (see ``BroadcastEviction``).
    /// <!-- restates: EVICT-HARD -->
    ///
    /// ```swift
    /// let client = feed.subscribe(bufferingPolicy: .unbounded, eviction: .hardLimit(1_000))
    /// for await message in client { try await socket.write(message) }
    /// if client.isEvicted { try await socket.close(code: .policyViolation) }
    /// ```
    @inlinable
    public func subscribe(bufferingPolicy: BufferingPolicy? = nil, eviction: BroadcastEviction) -> Subscription {
        let policy = bufferingPolicy ?? storage.defaultPolicy
        policy.validate(argument: "subscribe(bufferingPolicy:eviction:)")
        return Subscription(core: storage.subscribe(policy: policy, eviction: SubscriberEviction.make(eviction)))
    }

    /// ``subscribe(bufferingPolicy:eviction:)`` with the soft limit's time
    /// read from `clock` (tests drive a manual one).
    @available(macOS 13, iOS 16, tvOS 16, watchOS 9, *)
    @_spi(Testing)
    public func subscribe<C: Clock>(
        bufferingPolicy: BufferingPolicy? = nil, eviction: BroadcastEviction,
        clock: C
    ) -> Subscription where C.Duration == Duration {
        let policy = bufferingPolicy ?? storage.defaultPolicy
        policy.validate(argument: "subscribe(bufferingPolicy:eviction:clock:)")
        return Subscription(core: storage.subscribe(policy: policy, eviction: SubscriberEviction.make(eviction, clock: clock)))
    }
}

extension BroadcastSequence.Subscription {
    /// True once this subscriber was ended by its eviction limit
    /// (``BroadcastEviction``): its reader got `nil`, as at a normal end.
    /// `false` after ``cancel()``, its task's cancellation or the
    /// sequence's end.
    /// <!-- restates: EVICT-ISEVICTED -->
    ///
    /// ```swift
    /// for await message in client { try await socket.write(message) }
    /// if client.isEvicted { log.warning("client fell too far behind") }
    /// ```
    public var isEvicted: Bool { core.isEvicted }
}
