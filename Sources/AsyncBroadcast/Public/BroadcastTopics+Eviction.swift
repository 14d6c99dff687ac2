extension BroadcastTopics {
    /// Registers a subscriber of `topic` now, as
    /// ``subscribe(to:bufferingPolicy:)`` does, that is ended instead of
    /// holding more once it passes `eviction`'s limits (see
    /// ``BroadcastEviction``). An evicted subscriber leaves its topic as a
    /// cancelled one does (a topic left without subscribers is retired).
    /// <!-- restates: EVICT-ENDS-LIKE-CANCEL -->
    ///
    /// ```swift
    /// let member = rooms.subscribe(to: room, eviction: .hardLimit(500))
    /// for await message in member { try await socket.write(message) }
    /// if member.isEvicted { try await socket.close(code: .policyViolation) }
    /// ```
    @inlinable
    public func subscribe(
        to topic: Topic, bufferingPolicy: BufferingPolicy? = nil,
        eviction: BroadcastEviction
    ) -> Subscription {
        let policy = bufferingPolicy ?? registry.defaultPolicy
        policy.validate(argument: "subscribe(to:bufferingPolicy:eviction:)")
        return Subscription(core: registry.subscribe(to: topic, policy: policy, eviction: SubscriberEviction.make(eviction)))
    }
}
