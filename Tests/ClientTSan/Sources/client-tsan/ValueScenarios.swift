@_spi(Testing) import AsyncBroadcast
import Foundation

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

// BroadcastValue and BroadcastPromise, hammered from tasks and OS threads.
// The checks are the basics (each reader sees strictly newer values of
// intact payloads, ends, and sees the last value; every waiter gets the one
// result); ThreadSanitizer does the rest.

/// Reads `subscription` to its end; returns the last payload index seen, or
/// a problem.
func readValues(_ subscription: BroadcastValue<Payload, Boom>.Subscription,
                progress: Counter? = nil) async -> (last: Int, problems: [String], thrown: Boom?) {
    var last = -1
    var problems: [String] = []
    var thrown: Boom?
    var iterator = subscription.makeAsyncIterator()
    while true {
        do {
            guard let payload = try await iterator.next() else { break }
            if !payload.isIntact { problems.append("a torn payload") }
            if payload.index <= last && payload.index >= 0 {
                problems.append("index \(payload.index) after \(last): not strictly newer")
            }
            last = max(last, payload.index)
            progress?.increment()
        } catch {
            if thrown != nil { problems.append("threw twice") }
            thrown = error
        }
    }
    return (last, problems, thrown)
}

// MARK: 11. value: sends and updates from tasks and threads, readers joining, leaving, cancelled

func valueFanOut(seed: UInt64, failures: Failures, scale: Int) async {
    var rng = SplitMix64(seed: seed)
    for k in 0..<(4 * scale) {
        let value = BroadcastValue(Payload(source: 0, index: -1), throwing: Boom.self)
        let counter = Counter()  // the update order: each change takes the next index inside `update`
        let readers = (0..<4).map { _ in value.subscribe() }
        let progress = readers.map { _ in Counter() }
        var tasks: [Task<(last: Int, problems: [String], thrown: Boom?), Never>] = []
        for (i, reader) in readers.enumerated() {
            let p = progress[i]
            tasks.append(Task.detached { await readValues(reader, progress: p) })
        }
        let perSource = 300 * scale
        @Sendable func change(_ i: Int) {
            if i % 2 == 0 {
                value.update { current in current = Payload(source: 1, index: counter.increment()) }
            } else {
                // `send` of a value made under no lock: its index may be
                // older than the current one, so it goes through `update`'s
                // ordering too (the check is strictly-newer per reader).
                value.update { current in current = Payload(source: 2, index: counter.increment()) }
            }
        }
        let threads = (0..<2).map { _ in startThread { for i in 0..<perSource { change(i); if i % 16 == 0 { sched_yield() } } } }
        await withTaskGroup(of: Void.self) { group in
            for _ in 0..<2 {
                group.addTask { for i in 0..<perSource { change(i); if i % 16 == 0 { await Task.yield() } } }
            }
            // Late readers: each leaves by cancel(), by task cancellation,
            // or by being released, at a random point.
            group.addTask {
                for j in 0..<20 {
                    let late = value.subscribe()
                    let reads = j % 2  // the value it holds at subscribe is always there; later ones may never come
                    let reader = Task.detached { () -> [String] in
                        var problems: [String] = []
                        var last = -1
                        var iterator = late.makeAsyncIterator()
                        for _ in 0..<reads {
                            guard let payload = try? await iterator.next() else { break }
                            if !payload.isIntact { problems.append("a torn payload") }
                            if payload.index <= last { problems.append("index \(payload.index) after \(last)") }
                            last = payload.index
                        }
                        if j % 3 == 0 { late.cancel() }
                        return problems
                    }
                    if j % 3 == 1 { reader.cancel() }
                    for problem in await reader.value { failures.record("value fan-out #\(k) late \(j): \(problem)") }
                    if j % 5 == 0 { await Task.yield() }
                }
            }
            await group.waitForAll()
        }
        for thread in threads { await thread.value }
        let final = counter.value
        if rng.chance(50) { value.finish(throwing: Boom(code: k)) } else { value.finish() }
        for (i, task) in tasks.enumerated() {
            let result = await task.value
            for problem in result.problems { failures.record("value fan-out #\(k) reader \(i): \(problem)") }
            failures.check(result.last == final, "value fan-out #\(k) reader \(i): ended at \(result.last), last value \(final)")
        }
        failures.check(value.subscriberCount == 0, "value fan-out #\(k): subscriberCount \(value.subscriberCount) after the end")
        _ = progress
    }
}

// MARK: 12. value: parked readers woken from threads, cancelled, finished, the value dropped

func valueWakes(seed: UInt64, failures: Failures, scale: Int) async {
    var rng = SplitMix64(seed: seed)
    for k in 0..<(30 * scale) {
        let ending = rng.below(4)
        // Every reference to the value lives in this call, so that when it
        // returns the value is released (and finished, if nothing else did).
        let tasks = await valueWakesRound(k: k, ending: ending, failures: failures)
        for (i, task) in tasks.enumerated() {
            let result = await task.value
            for problem in result.problems { failures.record("value wakes #\(k) reader \(i): \(problem)") }
            // Cancelled readers may stop anywhere; a finish racing the send
            // may come first, and then the send is ignored.
            let cancelledReader = (ending == 0 && i == 0) || (ending == 1 && i == 1)
            if !cancelledReader {
                failures.check(result.last == 1 || (ending == 2 && result.last == 0),
                               "value wakes #\(k) ending \(ending) reader \(i): last value \(result.last), expected 1")
            }
        }
    }
}

private func valueWakesRound(k: Int, ending: Int, failures: Failures)
    async -> [Task<(last: Int, problems: [String], thrown: Boom?), Never>] {
    let value = BroadcastValue(Payload(source: 0, index: 0), throwing: Boom.self)
    let readers = (0..<3).map { _ in value.subscribe() }
    let tasks = readers.map { reader in Task.detached { await readValues(reader) } }
    let parked = await waitUntil { readers.allSatisfy(\.isConsumerWaiting) }
    failures.check(parked, "value wakes #\(k): readers never parked")
    let waker = startThread { value.send(Payload(source: 0, index: 1)) }
    var ender: Task<Void, Never>?
    switch ending {
    case 0: readers[0].cancel()
    case 1: tasks[1].cancel()
    case 2: ender = startThread { value.finish() }
    default: break  // released below
    }
    await waker.value
    await ender?.value
    return tasks
}

// MARK: 13. promise: racing completions from threads, waiters cancelled and late

func promiseRaces(seed: UInt64, failures: Failures, scale: Int) async {
    var rng = SplitMix64(seed: seed)
    for k in 0..<(20 * scale) {
        let promise = BroadcastPromise(of: Payload.self, throwing: Boom.self)
        let waiters = 16
        let cancelled = Set((0..<waiters).filter { _ in rng.chance(25) })
        var tasks: [Task<Result<Int, any Error>, Never>] = []
        for _ in 0..<waiters {
            tasks.append(Task.detached {
                do { return .success(try await promise.value.index) } catch { return .failure(error) }
            })
        }
        _ = await waitUntil { promise.waiterCount >= waiters - 4 }
        for i in cancelled { tasks[i].cancel() }
        let wins = Counter()
        let completers = (0..<4).map { c in
            startThread {
                let won = c % 2 == 0 ? promise.succeed(Payload(source: 9, index: c)) : promise.fail(Boom(code: c))
                if won { wins.increment() }
            }
        }
        for completer in completers { await completer.value }
        failures.check(wins.value == 1, "promise #\(k): \(wins.value) completions won")
        guard let outcome = promise.result else {
            failures.record("promise #\(k): no result after completion")
            continue
        }
        let expected: Result<Int, Boom> = outcome.map(\.index)
        for (i, task) in tasks.enumerated() {
            let got = await task.value
            switch (got, expected) {
            case (.success(let a), .success(let b)) where a == b: break
            case (.failure(let error as Boom), .failure(let b)) where error == b: break
            case (.failure(is CancellationError), _) where cancelled.contains(i): break
            default: failures.record("promise #\(k) waiter \(i): got \(got), expected \(expected)")
            }
        }
        let late = try? await promise.value
        failures.check(late?.index == (try? expected.get()), "promise #\(k): a late waiter got another result")
        failures.check(promise.waiterCount == 0, "promise #\(k): \(promise.waiterCount) waiters left")
    }
}
