// Target `topics`: `BroadcastTopics` topic lifetime.
//
// The input builds ONE `BroadcastTopics<Int, TopicItem, Never>` over three
// topics, plain (`init(bufferingPolicy:replay:)`) or with a listener
// (`register(topic, sink)`, the `@_spi(Testing)` initializer taking a
// clock: `stopAfter` of 0, 1 or 2 s on a `ManualClock`), then a program
// of operations: subscribe to a topic, cancel or release a subscription,
// poll, poll until empty, send / send(contentsOf:) (array or lazy map) /
// emit (from a task on `ManualExecutor`) to a topic, finish(topic:),
// finish(), advance the clock (stop timers fire on their own threads), the
// current listener's `sink.send` / `sink.finish()`, and arm a topic: its
// next unregister closure subscribes to its own topic and sends to it
// (the subscribe that races the topic's stop: its last cancel, its stop
// timer, `finish(topic:)`, `sink.finish()`, `finish()`).
//
// `TopicsModel` predicts, after every operation, each topic's listener log
// (register, unregister and what an armed one did inside, with its send's
// result), the stop timers asleep on the clock and `topicCount`; the
// program waits for that state (stop timers run on the library's own
// tasks; at most 5 s, a log already longer than the model's fails at
// once), then compares every poll (exact sequence per subscriber; an
// element of another topic fails), every send result, `subscriberCount(of:)`
// of each topic, `topicCount` and `isFinished`. Inside the closures it
// checks that a topic's `register` and unregister never overlap and that
// each unregister runs once. Epilogue: cancel everything, advance the clock
// past every `stopAfter`: `topicCount` must be 0, every register balanced
// by an unregister, and once the subscriptions and sinks are released no
// element may stay alive (a topic that has gone holds nothing), and the
// `BroadcastTopics` must be freed.
//
// v5: a subscribe from a cancelled task (in a task on `ManualExecutor`
// cancelled before it subscribes), and operations put exactly in the window
// between a subscribe's shard lock and its return
// (`_runAfterSubscribeUnlocks`): a send to the topic, `finish(topic:)` of
// it, a subscribe from another thread, a send then such a subscribe. The
// model's rule: a subscribe that returns lands on a live generation (a
// finish in its window does not end it: it starts again); a cancelled
// subscribe never makes a topic live (it gets a live topic's replay window,
// then ends); a later subscriber never starts with elements sent while the
// topic was not live.
//
// Input layout: byte 0 the form (plain, `stopAfter` 0, 1 or 2 s), byte 1
// the replay (0-3), then one opcode byte per step followed by its
// operands. Every subscriber is `.unbounded` (the default policy).

@_spi(Testing) import AsyncBroadcast
import AsyncBroadcastTestSupport
import FuzzKit
#if canImport(Glibc)
import Glibc
#endif

let topicSpace = 3
let slotLimit = 8
/// How long a stop timer's effect may take before it counts as a hang.
let settleDeadlineSeconds = 5.0

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzTopics(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let bytes = ByteReader(data, size)
    Trace.rerunTraced = {
        FuzzWeakMemory.beginInput(bytes)
        TopicsProgram(input: bytes, trace: Trace(enabled: true)).run()
    }
    FuzzWeakMemory.beginInput(bytes)
    TopicsProgram(input: bytes, trace: Trace()).run()
    Trace.rerunTraced = nil
    return 0
}

/// What the program waits for after each step.
struct Observed: Equatable, CustomStringConvertible {
    var logs: [[ListenerEvent]] = []
    var sleepers = 0
    var counters = TopicsCounters()
    var holding: [Bool] = []
    var helpers = 0
    var violations: [String] = []

    var description: String {
        "logs \(logs.enumerated().map { "\($0.offset): \($0.element)" }), clock sleepers \(sleepers), topics (live \(counters.live), retiring \(counters.retiring), blockedStarts \(counters.blockedStarts)), held unregisters \(holding), finish(topic:) tasks running \(helpers)"
            + (violations.isEmpty ? "" : ", violations \(violations)")
    }
}

/// An `emit` made in a task on the manual executor.
final class EmitBox: @unchecked Sendable {
    var result: BroadcastSendResult?
    var done = false
}

/// What runs in a subscribe's window (`_runAfterSubscribeUnlocks`): set by
/// the driver just before the subscribe, taken once, on the driver's thread
/// only (a stop timer's inner subscribe must not take it). It must not keep
/// the topics (the registry holds the hook).
final class WindowHook: @unchecked Sendable {
    let pending = Locked<(() -> Void)?>(nil)
    let driverThread = pthread_self()

    func run() {
        guard pthread_equal(pthread_self(), driverThread) != 0 else { return }
        if let action = pending.withLock({ action in defer { action = nil }; return action }) { action() }
    }
}

/// Runs `body` on a new thread and waits for it: a subscribe from another
/// context (no task, so not the cancelled task the window may be in).
func onOtherThread(_ body: @escaping () -> Void) {
    final class Box { let body: () -> Void; init(_ body: @escaping () -> Void) { self.body = body } }
    var thread = pthread_t()
    let box = Unmanaged.passRetained(Box(body)).toOpaque()
    let status = pthread_create(&thread, nil, { raw in
        Unmanaged<Box>.fromOpaque(raw!).takeRetainedValue().body()
        return nil
    }, box)
    precondition(status == 0, "pthread_create failed")
    pthread_join(thread, nil)
}

/// A subscription made on another thread, or in a task.
final class SubscriptionBox: @unchecked Sendable {
    var subscription: BroadcastTopics<Int, TopicItem, Never>.Subscription?
    var sent: BroadcastSendResult?
    var done = false
}

final class TopicsProgram {
    typealias Topics = BroadcastTopics<Int, TopicItem, Never>

    struct Slot {
        let subscription: Topics.Subscription
        let model: SubscriberModel
    }

    var input: ByteReader
    let trace: Trace
    let model: TopicsModel
    let listener: Listener
    let clock = ManualClock()
    let executor = ManualExecutor()
    var topics: Topics?
    var slots: [Slot] = []
    var serial = 0
    var nextID = 1
    let window = WindowHook()
    /// Items alive before this program (a traced re-run starts while the
    /// failed run still holds its own).
    let baselineItems = liveItems.value

    init(input: ByteReader, trace: Trace) {
        self.input = input
        self.trace = trace
        let form = self.input.below(4)
        let replay = self.input.below(4)
        let stopAfter: Int? = form == 0 ? nil : form - 1
        model = TopicsModel(topicCount: topicSpace, replay: replay, stopAfter: stopAfter)
        listener = Listener(topicCount: topicSpace)
        if let stopAfter {
            trace.add("create BroadcastTopics(replay: \(replay), stopAfter: .seconds(\(stopAfter)), clock: manual, register:)")
            let listener = self.listener
            topics = Topics(replay: replay, stopAfter: .seconds(stopAfter), clock: clock) { topic, sink in
                listener.register(topic, sink)
            }
        } else {
            trace.add("create BroadcastTopics(replay: \(replay))")
            topics = Topics(replay: replay)
        }
        listener.topics = topics
        let window = self.window
        topics!._runAfterSubscribeUnlocks { window.run() }
        check()
    }

    var t: Topics { topics! }

    func makeID() -> Int {
        defer { nextID += 1 }
        return nextID
    }

    func run() {
        var steps = 0
        while !input.isAtEnd && steps < 500 {
            step()
            steps += 1
        }
        epilogue()
    }

    func slot(_ byte: Int) -> Int? { slots.isEmpty ? nil : byte % slots.count }

    func step() {
        let raw = input.byte()
        if raw >= 254 {
            // Weak memory: the driver's buffered stores become visible to
            // the stop timers' threads.
            trace.add("(memory) drain the driver's stores (\(FuzzWeakMemory.pending(FuzzWeakMemory.driver)) pending)")
            FuzzWeakMemory.drain(FuzzWeakMemory.driver)
            return
        }
        if raw >= 230 {
            v5Step(raw)
            return
        }
        switch raw % 18 {
        case 0, 1, 2:
            let topic = input.below(topicSpace)
            guard slots.count < slotLimit else { return }
            serial += 1
            let name = "s\(serial)"
            trace.add("\(name) = subscribe(to: \(topic))")
            let subscription = t.subscribe(to: topic)
            let m = model.subscribe(to: topic, name: name)
            model.startRuns()
            slots.append(Slot(subscription: subscription, model: m))
        case 3, 4:
            guard let index = slot(input.byte()) else { return }
            // Not while the topic's unregister is held (it would make the
            // held stop's outcome depend on the race).
            guard !model.topics[slots[index].model.topic].held else { return }
            let s = slots.remove(at: index)
            let cancel = raw % 18 == 3
            trace.add(cancel ? "\(s.model.name).cancel(), released" : "release \(s.model.name)")
            if cancel { s.subscription.cancel() }
            model.leave(s.model)
            // `s` goes here (the release).
        case 5, 6:
            guard let index = slot(input.byte()) else { return }
            trace.add("\(slots[index].model.name).poll()")
            poll(slots[index])
        case 7:
            guard let index = slot(input.byte()) else { return }
            trace.add("\(slots[index].model.name): poll() until empty")
            var results: [ReadResult] = []
            while results.count < 10_000 {
                let r = poll(slots[index], annotate: false)
                results.append(r)
                if r == .empty || r == .end { break }
            }
            trace.annotate(" -> \(results)")
        case 8, 9:
            let topic = input.below(topicSpace)
            let id = makeID()
            trace.add("send(#\(id), to: \(topic))")
            let actual = t.send(TopicItem(id, topic: topic), to: topic)
            let expected = model.send(id, to: topic)
            compare(actual, expected, "send(#\(id), to: \(topic))")
        case 10:
            let byte = input.byte()
            let topic = byte % topicSpace
            let count = (byte >> 2) % 4
            let contiguous = byte & 0x40 == 0
            let first = nextID
            nextID += count
            trace.add("send(contentsOf: #\(first)..<#\(first + count), to: \(topic))" + (contiguous ? "" : " as a lazy map"))
            let actual: BroadcastSendResult
            if contiguous {
                actual = t.send(contentsOf: (first..<first + count).map { TopicItem($0, topic: topic) }, to: topic)
            } else {
                actual = t.send(contentsOf: (first..<first + count).lazy.map { TopicItem($0, topic: topic) }, to: topic)
            }
            var expected = BroadcastSendResult(isFinished: model.finishedAll)
            for id in first..<first + count {
                let r = model.send(id, to: topic)
                expected.delivered += r.delivered
            }
            compare(actual, expected, "send(contentsOf:to: \(topic))")
        case 11:
            let topic = input.below(topicSpace)
            emit(to: topic)
        case 12:
            let byte = input.byte()
            let topic = byte % topicSpace
            guard !model.topics[topic].held else { return }
            if (byte >> 2) & 3 == 3, model.isListener, model.topics[topic].running, !model.anyHold {
                heldFinish(topic)
                break
            }
            trace.add("finish(topic: \(topic))")
            t.finish(topic: topic)
            model.finish(topic: topic)
        case 13:
            let seconds = [1, 1, 2, 3][input.below(4)]
            trace.add("clock.advance(by: .seconds(\(seconds)))  [now \(model.now + seconds)s]")
            clock.advance(by: .seconds(seconds))
            model.advance(by: seconds)
        case 14:
            let byte = input.byte()
            let topic = byte % topicSpace
            guard model.isListener else { return }
            if (byte >> 2) & 3 == 2 {
                // One hold at a time: a held unregister blocks a thread of
                // the cooperative pool (two on a 2-core machine).
                guard model.stopAfter! > 0, !model.anyHold else { return }
                trace.add("hold topic \(topic): its next stop timer's unregister blocks until released")
                listener.holdArmed.withLock { $0[topic] = true }
                model.topics[topic].holdArmed = true
            } else {
                trace.add("arm topic \(topic): its next unregister subscribes to it and sends")
                listener.armed.withLock { $0[topic] = true }
                model.topics[topic].armed = true
            }
        case 15:
            let byte = input.byte()
            let topic = byte % topicSpace
            guard model.isListener, model.topics[topic].running,
                  let sink = listener.sinks.withLock({ $0[topic] }) else { return }
            if (byte >> 2) & 3 == 3 {
                trace.add("topic \(topic)'s sink.finish()")
                sink.finish()
                model.finish(topic: topic)
            } else {
                let id = makeID()
                trace.add("topic \(topic)'s sink.send(#\(id))")
                let actual = sink.send(TopicItem(id, topic: topic))
                let expected = model.send(id, to: topic)
                compare(actual, expected, "sink.send(#\(id)) of topic \(topic)")
            }
        case 17:
            guard model.topics.contains(where: \.held) else { return }
            trace.add("release the held unregister")
            releaseHolds()
        default:
            // Rare: ends the interesting part of the program.
            guard input.byte() < 32, !model.topics.contains(where: \.held) else { return }
            trace.add("finish()")
            t.finish()
            model.finishAll()
        }
        settle()
        annotateListeners()
        pickUpInner()
        check()
    }

    // MARK: v5: cancelled subscribes, the subscribe's window

    /// The operation put in a subscribe's window.
    enum WindowAction {
        case nothing, send, finishTopic, subscribeElsewhere, sendThenSubscribeElsewhere
    }

    func v5Step(_ raw: Int) {
        let byte = input.byte()
        let topic = byte % topicSpace
        let other = (byte >> 2) % topicSpace
        let actions: [WindowAction] = [.nothing, .send, .finishTopic, .subscribeElsewhere, .sendThenSubscribeElsewhere]
        var action = actions[(byte >> 4) % actions.count]
        let cancelled = raw % 2 == 0
        // The window runs only while the topics are not finished, and one
        // thing at a time: no hold under way.
        guard slots.count < slotLimit - 1, !model.finishedAll, !model.anyHold else { return }
        if cancelled && action == .finishTopic { action = .sendThenSubscribeElsewhere }
        if action == .finishTopic {
            // With a listener only on a running topic (the subscribe joins
            // its run; no `register` of its own is pending) and not armed
            // (the unregister makes no inner subscriber).
            if model.isListener && (!model.topics[topic].running || model.topics[topic].armed) { action = .send }
        }
        serial += 1
        let name = "s\(serial)"
        let windowID = action == .send || action == .sendThenSubscribeElsewhere ? makeID() : 0
        let elsewhere = action == .subscribeElsewhere || action == .sendThenSubscribeElsewhere ? "s\(serial + 1)" : ""
        if !elsewhere.isEmpty { serial += 1 }
        var text = cancelled ? "\(name) = subscribe(to: \(topic)) from a cancelled task" : "\(name) = subscribe(to: \(topic))"
        switch action {
        case .nothing: break
        case .send: text += "; in its window: send(#\(windowID), to: \(topic))"
        case .finishTopic: text += "; in its window: finish(topic: \(topic))"
        case .subscribeElsewhere: text += "; in its window: \(elsewhere) = subscribe(to: \(other)) on another thread"
        case .sendThenSubscribeElsewhere:
            text += "; in its window: send(#\(windowID), to: \(topic)), then \(elsewhere) = subscribe(to: \(other)) on another thread"
        }
        trace.add(text)

        // The window's operations, on the library.
        let box = SubscriptionBox()
        let topics = t
        let windowBox = SubscriptionBox()
        switch action {
        case .nothing: break
        case .send:
            window.pending.value = { windowBox.sent = topics.send(TopicItem(windowID, topic: topic), to: topic) }
        case .finishTopic:
            window.pending.value = { topics.finish(topic: topic) }
        case .subscribeElsewhere, .sendThenSubscribeElsewhere:
            let sends = action == .sendThenSubscribeElsewhere
            window.pending.value = {
                if sends { windowBox.sent = topics.send(TopicItem(windowID, topic: topic), to: topic) }
                // A real thread: the weak-memory model's unmodelled threads
                // read memory, so the stores before its creation drain.
                FuzzWeakMemory.drainAll()
                onOtherThread { windowBox.subscription = topics.subscribe(to: other) }
            }
        }
        if cancelled {
            Task(executorPreference: executor) {
                withUnsafeCurrentTask { $0!.cancel() }
                box.subscription = topics.subscribe(to: topic)
                box.done = true
            }
            FuzzWeakMemory.drain(FuzzWeakMemory.driver)  // creating the task
            FuzzWeakMemory.runAs(FuzzWeakMemory.thread(ofTask: 0)) { executor.runUntilIdle() }
            FuzzWeakMemory.drain(FuzzWeakMemory.thread(ofTask: 0))
            if !box.done { trace.fail("a subscribe from a cancelled task did not complete", details: model.dump()) }
        } else {
            box.subscription = topics.subscribe(to: topic)
        }
        let leftOver = window.pending.withLock { action in defer { action = nil }; return action != nil }
        if leftOver && action != .nothing {
            trace.fail("subscribe(to: \(topic)) never ran its window (\(action))", details: model.dump())
        }

        // The model, in the order the operations took effect.
        var expectedSent: BroadcastSendResult?
        if action == .finishTopic {
            // The finish ended the generation the subscribe had joined: the
            // subscribe starts again, on a new one.
            model.finish(topic: topic)
        }
        let m = cancelled ? model.subscribeCancelled(to: topic, name: name) : model.subscribe(to: topic, name: name)
        if action == .send || action == .sendThenSubscribeElsewhere {
            expectedSent = model.send(windowID, to: topic)
        }
        var elsewhereModel: SubscriberModel?
        if !elsewhere.isEmpty { elsewhereModel = model.subscribe(to: other, name: elsewhere) }
        model.startRuns()
        slots.append(Slot(subscription: box.subscription!, model: m))
        if let elsewhereModel {
            guard let subscription = windowBox.subscription else {
                trace.fail("the window's subscribe on another thread did not return", details: model.dump())
            }
            slots.append(Slot(subscription: subscription, model: elsewhereModel))
        }
        if let expectedSent {
            compare(windowBox.sent!, expectedSent, "the window's send(#\(windowID), to: \(topic))")
        }
        settle()
        annotateListeners()
        pickUpInner()
        check()
    }

    /// Traced runs: what the listener did during the step.
    var loggedCounts = Array(repeating: 0, count: topicSpace)
    func annotateListeners() {
        guard trace.enabled else { return }
        for (topic, log) in model.topics.map(\.log).enumerated() where log.count > loggedCounts[topic] {
            trace.annotate("  [topic \(topic): \(log[loggedCounts[topic]...].map(\.description).joined(separator: ", "))]")
            loggedCounts[topic] = log.count
        }
    }

    // MARK: Operations

    func compare(_ actual: BroadcastSendResult, _ expected: BroadcastSendResult, _ what: String) {
        trace.annotate(" -> \(describe(actual))")
        if actual != expected {
            trace.fail("\(what) returned \(describe(actual)), expected \(describe(expected))", details: model.dump())
        }
    }

    @discardableResult
    func poll(_ slot: Slot, annotate: Bool = true) -> ReadResult {
        let actual: ReadResult
        switch slot.subscription.poll() {
        case .element(let item):
            if item.topic != slot.model.topic {
                trace.fail("\(slot.model.name) (topic \(slot.model.topic)) received #\(item.id) sent to topic \(item.topic)",
                           details: model.dump())
            }
            actual = .element(item.id)
        case .empty: actual = .empty
        case .end: actual = .end
        }
        let expected = model.poll(slot.model)
        if annotate { trace.annotate(" -> \(actual)") }
        if actual != expected {
            trace.fail("\(slot.model.name).poll() returned \(actual), expected \(expected)", details: model.dump())
        }
        return actual
    }

    func emit(to topic: Int) {
        let id = makeID()
        trace.add("emit(#\(id), to: \(topic)) in a task")
        let box = EmitBox()
        let topics = t
        let item = TopicItem(id, topic: topic)
        Task(executorPreference: executor) {
            box.result = try? await topics.emit(item, to: topic)
            box.done = true
        }
        FuzzWeakMemory.drain(FuzzWeakMemory.driver)  // creating the task
        FuzzWeakMemory.runAs(FuzzWeakMemory.thread(ofTask: 0)) { executor.runUntilIdle() }
        FuzzWeakMemory.drain(FuzzWeakMemory.thread(ofTask: 0))
        guard box.done, let actual = box.result else {
            trace.fail("emit to topic \(topic) did not complete in one run of the executor (every subscriber is .unbounded)")
        }
        compare(actual, model.send(id, to: topic), "emit(#\(id), to: \(topic))")
    }

    /// `finish(topic:)` on a task of its own, whose unregister blocks until
    /// the driver releases it: meanwhile the driver subscribes to the topic
    /// (a new generation, its start blocked) and sends to it.
    func heldFinish(_ topic: Int) {
        trace.add("finish(topic: \(topic)) in a detached task, its unregister held until released")
        listener.holdArmed.withLock { $0[topic] = true }
        listener.helpers.withLock { $0 += 1 }
        let topics = t
        let listener = listener
        FuzzWeakMemory.drain(FuzzWeakMemory.driver)  // creating the task
        Task.detached {
            topics.finish(topic: topic)
            listener.helpers.withLock { $0 -= 1 }
        }
        model.beginHeldFinish(topic)
    }

    func releaseHolds() {
        let held = model.topics.indices.filter { model.topics[$0].held }
        listener.released.withLock { released in for topic in held { released[topic] = true } }
        model.releaseHolds()
    }

    /// The subscriptions armed unregister closures made.
    func pickUpInner() {
        for m in model.newInner {
            guard let subscription = listener.inner.withLock({ $0.removeValue(forKey: m.name) }) else {
                trace.fail("the unregister closure's subscription \(m.name) is missing", details: model.dump())
            }
            slots.append(Slot(subscription: subscription, model: m))
        }
        model.newInner = []
    }

    // MARK: Waiting and checking

    func observe() -> Observed {
        var o = Observed()
        o.logs = listener.logs.value
        o.sleepers = clock.sleeperCount
        if let topics { o.counters = topics.topicsCounters }
        o.holding = listener.holding.value
        o.helpers = listener.helpers.value
        o.violations = listener.violations.value
        return o
    }

    func expectedObservation() -> Observed {
        var o = Observed()
        o.logs = model.topics.map(\.log)
        o.sleepers = model.pendingTimers
        // No retiring generation and no blocked start outlives a step (an
        // unregister that the step ran has returned), but a held one.
        o.counters = topics == nil ? TopicsCounters() : model.counters
        o.holding = model.topics.map(\.held)
        o.helpers = model.topics.filter(\.heldFinished).count
        return o
    }

    /// Waits until the stop timers' threads have done what the model says
    /// the step set off; fails if they have not within the deadline.
    func settle() {
        let expected = expectedObservation()
        var observed = observe()
        if observed == expected { return }
        // The timers run on real threads, unmodelled: they read memory, so
        // the driver's buffered stores drain before the wait (a real store
        // buffer drains within nanoseconds).
        FuzzWeakMemory.drainAll()
        let start = ContinuousClock.now
        var spins = 0
        while observed != expected {
            if !observed.violations.isEmpty {
                trace.fail("inside a listener: \(observed.violations.joined(separator: "; "))",
                           details: "expected: \(expected)\nobserved: \(observed)\n" + model.dump())
            }
            for (o, e) in zip(observed.logs, expected.logs) where o.count > e.count || o != Array(e.prefix(o.count)) {
                trace.fail("listener log went past or away from the model's: expected \(e), got \(o)",
                           details: "expected: \(expected)\nobserved: \(observed)\n" + model.dump())
            }
            if ContinuousClock.now - start > .seconds(settleDeadlineSeconds) {
                trace.fail("the library did not reach the expected state within \(settleDeadlineSeconds) s",
                           details: "expected: \(expected)\nobserved: \(observed)\n" + model.dump())
            }
            spins += 1
            if spins < 1000 { sched_yield() } else { usleep(100) }
            observed = observe()
        }
    }

    func check() {
        guard let topics else { return }
        for topic in 0..<topicSpace {
            expectEqual(topics.subscriberCount(of: topic), model.subscriberCount(of: topic),
                        "subscriberCount(of: \(topic))", trace, details: model.dump())
        }
        expectEqual(topics.topicCount, model.liveTopicCount, "topicCount", trace, details: model.dump())
        expectEqual(topics.topicsCounters, model.counters, "topicsCounters", trace, details: model.dump())
        expectEqual(topics.isFinished, model.finishedAll, "isFinished", trace, details: model.dump())
    }

    // MARK: Epilogue

    func epilogue() {
        if model.topics.contains(where: \.held) {
            trace.add("(epilogue) release the held unregister")
            releaseHolds()
            settle()
            pickUpInner()
        }
        // Disarmed: the last stops make no new subscribers and do not block.
        listener.armed.withLock { $0 = Array(repeating: false, count: topicSpace) }
        listener.holdArmed.withLock { $0 = Array(repeating: false, count: topicSpace) }
        for topic in 0..<topicSpace {
            model.topics[topic].armed = false
            model.topics[topic].holdArmed = false
        }
        trace.add("(epilogue) cancel every subscription, advance the clock past stopAfter")
        for s in slots {
            s.subscription.cancel()
            model.leave(s.model)
        }
        slots = []
        settle()  // the stop timers asleep on the clock before it moves
        clock.advance(by: .seconds(10))
        model.advance(by: 10)
        settle()
        check()
        precondition(model.liveTopicCount == 0 && model.topics.allSatisfy { !$0.running },
                     "the model leaves a topic live: \(model.dump())")
        for (topic, log) in listener.logs.value.enumerated() {
            let registers = log.filter { $0 == .register }.count
            if registers != log.count - registers {
                trace.fail("topic \(topic): \(registers) registers, \(log.count - registers) unregisters at the end", details: model.dump())
            }
        }
        if let topics, topics.topicCount != 0 {
            trace.fail("topicCount \(topics.topicCount) after every subscriber left and every stop timer fired", details: model.dump())
        }
        // A topic that has gone holds nothing: once the sinks are released,
        // no element may stay alive (the stop timers' tasks may still be
        // returning, hence the wait).
        FuzzWeakMemory.drainAll()
        listener.sinks.withLock { $0 = Array(repeating: nil, count: topicSpace) }
        let start = ContinuousClock.now
        while liveItems.value != baselineItems || clock.sleeperCount != 0 {
            if ContinuousClock.now - start > .seconds(settleDeadlineSeconds) {
                trace.fail("\(liveItems.value - baselineItems) elements still alive after every topic has gone (clock sleepers \(clock.sleeperCount))",
                           details: model.dump())
            }
            usleep(50)
        }
        trace.add("(epilogue) release the topics")
        weak let released = topics
        topics = nil
        listener.topics = nil
        if released != nil {
            trace.fail("the BroadcastTopics is still alive after its release: something keeps it", details: model.dump())
        }
    }
}
