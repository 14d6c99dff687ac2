// broadcast-demo: one producer fans 20 events out to four subscribers with
// different buffering policies, then prints what each received and dropped.
import AsyncBroadcast

enum AppEvent: Sendable, CustomStringConvertible {
    case message(Int)
    var description: String {
        switch self { case .message(let n): return "event-\(n)" }
    }
}

let events = BroadcastSequence(of: AppEvent.self, bufferingPolicy: .bufferingNewest(10), replay: 0)

// Subscribe before sending so nobody misses the first element.
let subscribers: [(name: String, subscription: BroadcastSequence<AppEvent, Never>.Subscription)] = [
    ("ui      (default .bufferingNewest(10))", events.subscribe()),
    ("logger  (.unbounded)", events.subscribe(bufferingPolicy: .unbounded)),
    ("slow    (.bufferingOldest(3))", events.subscribe(bufferingPolicy: .bufferingOldest(3))),
    ("metrics (.bounded(4), paced by emit)", events.subscribe(bufferingPolicy: .bounded(4))),
]

let consumers = subscribers.map { entry in
    Task { () -> (String, [String], Int) in
        var received: [String] = []
        for await event in entry.subscription {
            received.append(event.description)
        }
        return (entry.name, received, entry.subscription.droppedCount)
    }
}

// `emit` waits while the .bounded(4) subscriber holds 4 unread events, so it
// never loses one; the dropping subscribers may lose some if they fall behind.
for n in 1...20 {
    try await events.emit(.message(n))
}
events.finish()

for consumer in consumers {
    let (name, received, dropped) = await consumer.value
    print("\(name): received \(received.count), dropped \(dropped)")
    print("    \(received.joined(separator: " "))")
}
print("subscribers left: \(events.subscriberCount)")
