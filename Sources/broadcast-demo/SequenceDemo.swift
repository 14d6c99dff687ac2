import AsyncBroadcast

/// One producer fans events out to four subscribers with different
/// buffering policies, then prints what each received and dropped.
func sequenceDemo() async throws {
    let events = BroadcastSequence(of: Int.self, bufferingPolicy: .bufferingNewest(10))

    // Subscribe before sending: every element sent after `subscribe` returns is
    // buffered for the subscriber, even before it starts iterating.
    let subscribers: [(name: String, subscription: BroadcastSequence<Int, Never>.Subscription)] = [
        ("ui      .bufferingNewest(10) (default)", events.subscribe()),
        ("logger  .unbounded", events.subscribe(bufferingPolicy: .unbounded)),
        ("preview .bufferingOldest(3)", events.subscribe(bufferingPolicy: .bufferingOldest(3))),
        ("metrics .bounded(4)", events.subscribe(bufferingPolicy: .bounded(4))),
    ]

    // Phase 1: a burst of 20 `send`s while nobody reads. `send` never waits:
    // dropping policies drop, `.bounded` over-fills rather than lose anything.
    for event in 1...20 {
        events.send(event)
    }

    // Phase 2: consumers start; 20 more events go out through `emit`, which
    // waits whenever the `.bounded(4)` subscriber holds 4 unread events.
    let consumers = subscribers.map { entry in
        Task { () -> (String, [Int], Int) in
            var received: [Int] = []
            for await event in entry.subscription { received.append(event) }
            return (entry.name, received, entry.subscription.droppedCount)
        }
    }
    for event in 21...40 {
        try await events.emit(event)
    }
    events.finish()

    for consumer in consumers {
        let (name, received, dropped) = await consumer.value
        print("\(name): received \(received.count), dropped \(dropped)")
        print("    \(received.map(String.init).joined(separator: " "))")
    }
    print("subscribers left after finish: \(events.subscriberCount)")
}
