// misuse-probe CASE: commits one programmer error against AsyncBroadcast,
// which must trap with an `AsyncBroadcast misuse: ...` message on stderr.
// `none` is the control: correct use, exits 0. A misuse that does not trap
// prints "misuse-probe: CASE did not trap" and exits 0, which the script
// counts as a failure.
@_spi(Testing) import AsyncBroadcast
import Foundation

let cases = [
    "none", "negative-replay", "bounded-zero", "bounded-zero-subscribe",
    "negative-newest", "negative-oldest-subscribe", "concurrent-next",
    "value-update-reentered", "value-equality-reentered", "value-concurrent-next",
    "register-negative-replay", "upstream-negative-replay", "negative-stop-after",
    "topics-negative-replay", "topics-bounded-zero-subscribe", "batch-limit-zero",
    "events-then-next", "events-batch-limit-zero", "eviction-hard-zero", "eviction-soft-zero",
    "eviction-limits-hard-zero", "eviction-limits-soft-zero", "eviction-negative-duration",
    "listen-negative-replay", "topics-listen-negative-stop-after",
]

/// An `Equatable` value whose `==` reads the `BroadcastValue` it lives in.
struct Nosy: Equatable, Sendable {
    var number: Int
    nonisolated(unsafe) static var home: BroadcastValue<Nosy, Never>?
    static func == (lhs: Nosy, rhs: Nosy) -> Bool {
        _ = home?.value
        return lhs.number == rhs.number
    }
}

/// Like `concurrentNext()`, for a `BroadcastValue` subscription.
func valueConcurrentNext() async {
    let value = BroadcastValue(0)
    let subscription = value.subscribe()
    var primer = subscription.makeAsyncIterator()
    guard await primer.next() == 0 else { fail("value-concurrent-next: no initial value", status: 1) }
    await secondConsumerTraps("value-concurrent-next", isParked: { subscription.isConsumerWaiting },
                              first: { var iterator = subscription.makeAsyncIterator(); _ = await iterator.next() },
                              second: { var iterator = subscription.makeAsyncIterator(); _ = await iterator.next() },
                              end: { value.finish() })
}

/// Two consumers in `next()` on one subscription at once, deterministically:
/// `first` is parked in `next()` (seen through `isParked`) before `second`
/// calls `next()` from another task, which must trap.
func secondConsumerTraps(
    _ name: String, isParked: @escaping @Sendable () -> Bool,
    first: @escaping @Sendable () async -> Void, second: @escaping @Sendable () async -> Void,
    end: () -> Void
) async {
    let parked = Task.detached { await first() }
    let deadline = Date().addingTimeInterval(20)
    while !isParked() {
        if Date() > deadline { fail("\(name): the first consumer never parked in next()", status: 3) }
        await Task.yield()
    }
    await Task.detached { await second() }.value  // must trap before returning
    end()
    await parked.value
}

/// One element, then the end: an upstream for the shared initializers.
struct Single: AsyncSequence, Sendable {
    let element: Int

    func makeAsyncIterator() -> Iterator { Iterator(element: element) }

    struct Iterator: AsyncIteratorProtocol {
        var element: Int?

        mutating func next() async -> Int? {
            defer { element = nil }
            return element
        }
    }
}

/// Keeps `value` observable, so the optimizer cannot drop the call that made it.
@inline(never)
func use<T>(_ value: T) {
    withExtendedLifetime(value) {}
}

func fail(_ message: String, status: Int32) -> Never {
    FileHandle.standardError.write(Data("misuse-probe: \(message)\n".utf8))
    exit(status)
}

/// Two plain iterators in `next()` at once.
func concurrentNext() async {
    let sequence = BroadcastSequence(of: Int.self)
    let subscription = sequence.subscribe()
    await secondConsumerTraps("concurrent-next", isParked: { subscription.isConsumerWaiting },
                              first: { var iterator = subscription.makeAsyncIterator(); _ = await iterator.next() },
                              second: { var iterator = subscription.makeAsyncIterator(); _ = await iterator.next() },
                              end: { sequence.finish() })
}

/// The events view parked in `next()`, then a plain `next()`.
func eventsThenNext() async {
    let sequence = BroadcastSequence(of: Int.self)
    let subscription = sequence.subscribe()
    await secondConsumerTraps("events-then-next", isParked: { subscription.isConsumerWaiting },
                              first: { var events = subscription.events.makeAsyncIterator(); _ = await events.next() },
                              second: { var iterator = subscription.makeAsyncIterator(); _ = await iterator.next() },
                              end: { sequence.finish() })
}

let arguments = CommandLine.arguments.dropFirst()
guard arguments.count == 1, let name = arguments.first, cases.contains(name) else {
    fail("usage: misuse-probe CASE, CASE one of: \(cases.joined(separator: " "))", status: 2)
}

switch name {
case "none":
    // Correct use of everything the misuse cases get wrong.
    let sequence = BroadcastSequence(of: Int.self, bufferingPolicy: .bounded(1), replay: 1)
    let newest = sequence.subscribe(bufferingPolicy: .bufferingNewest(0))
    let oldest = sequence.subscribe(bufferingPolicy: .bufferingOldest(0))
    sequence.send(1)
    let late = sequence.subscribe(bufferingPolicy: .bounded(1))
    sequence.finish()
    var iterator = late.makeAsyncIterator()
    guard await iterator.next() == 1, await iterator.next() == nil else { fail("none: replay did not deliver 1, then nil", status: 1) }
    use((newest, oldest))
    let current = BroadcastValue(Nosy(number: 1))
    current.update { $0.number += 1 }
    guard current.value.number == 2 else { fail("none: update did not apply", status: 1) }
    // The shared initializers and start modes with the smallest valid arguments.
    let registered = BroadcastSequence<Int, Never>(replay: 0, started: .whileSubscribed(stopAfter: .zero), register: { sink in
        sink.send(1)
        return {}
    })
    let shared = BroadcastSequence<Int, Never>(replay: 0, started: .lazily, upstream: { Single(element: 3) })
    var fromUpstream = shared.makeAsyncIterator()
    guard await fromUpstream.next() == 3, await fromUpstream.next() == nil else { fail("none: the upstream did not deliver 3, then nil", status: 1) }
    use(registered)
    // The events view's batch read and the eviction limits at their smallest.
    let evented = BroadcastSequence(of: Int.self)
    let watched = evented.subscribe(eviction: .limits(hard: 1, soft: 1, for: .zero))
    use(BroadcastEviction.hardLimit(1))
    use(BroadcastEviction.softLimit(1, for: .zero))
    evented.send(4)
    evented.finish()
    var events = watched.events.makeAsyncIterator()
    var batch: [BroadcastEvent<Int>] = []
    guard await events.next(upTo: 1, into: &batch) == 1, batch == [.element(4)] else { fail("none: the events batch was not [4]", status: 1) }
    use(BroadcastSequence<Int, Never>(replay: 0, listen: { _ in { } }))
    use(BroadcastTopics<String, Int, Never>(stopAfter: .zero, listen: { _, _ in { } }))
    print("misuse-probe: none: ok")
    exit(0)
case "negative-replay":
    use(BroadcastSequence(of: Int.self, replay: -1))
case "bounded-zero":
    use(BroadcastSequence(of: Int.self, bufferingPolicy: .bounded(0)))
case "bounded-zero-subscribe":
    use(BroadcastSequence(of: Int.self).subscribe(bufferingPolicy: .bounded(0)))
case "negative-newest":
    use(BroadcastSequence(of: Int.self, bufferingPolicy: .bufferingNewest(-1)))
case "negative-oldest-subscribe":
    use(BroadcastSequence(of: Int.self).subscribe(bufferingPolicy: .bufferingOldest(-2)))
case "concurrent-next":
    await concurrentNext()
case "value-update-reentered":
    let value = BroadcastValue(1)
    value.update { number in number = value.value + 1 }
case "value-equality-reentered":
    let value = BroadcastValue(Nosy(number: 1))
    Nosy.home = value
    value.send(Nosy(number: 2))
case "value-concurrent-next":
    await valueConcurrentNext()
case "register-negative-replay":
    use(BroadcastSequence<Int, Never>(replay: -1, register: { _ in {} }))
case "upstream-negative-replay":
    use(BroadcastSequence<Int, Never>(replay: -2, upstream: { Single(element: 1) }))
case "negative-stop-after":
    use(BroadcastStart.whileSubscribed(stopAfter: .milliseconds(-1)))
case "topics-negative-replay":
    use(BroadcastTopics<String, Int, Never>(replay: -3))
case "topics-bounded-zero-subscribe":
    use(BroadcastTopics<String, Int, Never>().subscribe(to: "a", bufferingPolicy: .bounded(0)))
case "batch-limit-zero":
    let sequence = BroadcastSequence<Int, Never>()
    var iterator = sequence.subscribe().makeAsyncIterator()
    var batch: [Int] = []
    use(await iterator.next(upTo: 0, into: &batch))
case "events-then-next":
    await eventsThenNext()
case "events-batch-limit-zero":
    let sequence = BroadcastSequence<Int, Never>()
    var events = sequence.subscribe().events.makeAsyncIterator()
    var batch: [BroadcastEvent<Int>] = []
    use(await events.next(upTo: 0, into: &batch))
case "eviction-hard-zero":
    use(BroadcastSequence(of: Int.self).subscribe(eviction: .hardLimit(0)))
case "eviction-soft-zero":
    use(BroadcastSequence(of: Int.self).subscribe(eviction: .softLimit(0, for: .seconds(1))))
case "eviction-limits-hard-zero":
    use(BroadcastEviction.limits(hard: 0, soft: 1, for: .seconds(1)))
case "eviction-limits-soft-zero":
    use(BroadcastEviction.limits(hard: 1, soft: -1, for: .seconds(1)))
case "eviction-negative-duration":
    use(BroadcastEviction.softLimit(1, for: .milliseconds(-5)))
case "listen-negative-replay":
    use(BroadcastSequence<Int, Never>(replay: -4, listen: { _ in { } }))
case "topics-listen-negative-stop-after":
    use(BroadcastTopics<String, Int, Never>(stopAfter: .seconds(-1), listen: { _, _ in { } }))
default:
    fail("unknown case \(name)", status: 2)
}
print("misuse-probe: \(name) did not trap")
exit(0)
