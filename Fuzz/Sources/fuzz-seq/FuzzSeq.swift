// Target 1 (`seq`): sequential model check.
//
// The input is a program on one BroadcastSequence and up to 8 subscriber
// slots. Each step runs on the library and on `BroadcastModel`; after every
// step everything observable is compared: send results, what each read
// returns (element, empty, end, thrown error), droppedCount,
// subscriberCount, isFinished, waitingEmitterCount, isConsumerWaiting and
// the number of live payloads (so freed buffers are really freed).
//
// v5: subscribers with eviction limits (hard, soft on a `ManualClock`,
// both), `send(_:replayable: false)`, `send(contentsOf:)`, reads through
// `events` (`.lagged(n)` placement; a read that would wait is cancelled:
// the gap still pending, then `nil`), and `isEvicted`.
//
// Input layout: byte 0 the default policy, byte 1 the replay, then one
// opcode byte per step followed by its operands. Opcode bytes 0-207 keep
// their older meaning (`byte % 16`); 208-255 are the v5 operations.

@_spi(Testing) import AsyncBroadcast
import AsyncBroadcastTestSupport
import FuzzKit

typealias Broadcast = BroadcastSequence<Payload, FuzzError>
typealias Subscription = Broadcast.Subscription

let slotCount = 8

struct Slot {
    let subscription: Subscription
    let model: ModelSubscriber
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzSeq(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let bytes = ByteReader(data, size)
    Trace.rerunTraced = {
        var program = SeqProgram(input: bytes, trace: Trace(enabled: true))
        program.run()
    }
    var program = SeqProgram(input: bytes, trace: Trace())
    program.run()
    Trace.rerunTraced = nil
    return 0
}

struct SeqProgram {
    var input: ByteReader
    let trace: Trace
    /// Payloads alive before this program (a traced re-run starts while
    /// the failed run still holds its own).
    let baseline = livePayloads
    let model: BroadcastModel
    var sequence: Broadcast?
    var slots: [Slot?] = Array(repeating: nil, count: slotCount)
    var subscriberSerial = 0
    /// The soft eviction limits' time.
    let clock = ManualClock()
    /// Runs the events reads (`next()` of `events` is async) on this thread.
    let executor = ManualExecutor()

    init(input: ByteReader, trace: Trace) {
        self.input = input
        self.trace = trace
        let policy = decodePolicy(self.input.byte())
        let replay = replayTable[self.input.below(replayTable.count)]
        model = BroadcastModel(defaultPolicy: policy, replay: replay)
        sequence = Broadcast(bufferingPolicy: policy, replay: replay)
        trace.add("create(bufferingPolicy: \(describe(policy)), replay: \(replay))")
    }

    mutating func run() {
        var steps = 0
        while !input.isAtEnd && steps < 2000 {
            step()
            check()
            steps += 1
        }
        // Epilogue: let everything go; nothing may stay alive.
        trace.add("release every subscription and the sequence")
        for index in slots.indices { slots[index] = nil }
        sequence = nil
        if livePayloads != baseline {
            trace.fail("\(livePayloads - baseline) payloads still alive after releasing everything", details: model.dump())
        }
    }

    /// The slot at `index`, or the next occupied one.
    func occupiedSlot(from index: Int) -> Int? {
        for k in 0..<slotCount where slots[(index + k) % slotCount] != nil { return (index + k) % slotCount }
        return nil
    }

    mutating func step() {
        let byte = input.byte()
        if byte >= 208 {
            v5Step((byte - 208) / 8)
            return
        }
        switch byte % 16 {
        case 0, 1:
            let byte = input.byte()
            let policy: BroadcastBufferingPolicy? = byte & 0x80 != 0 ? nil : decodePolicy(byte)
            guard let sequence, let index = slots.firstIndex(where: { $0 == nil }) else { return }
            subscriberSerial += 1
            let name = "s\(subscriberSerial)"
            trace.add("\(name) = subscribe(bufferingPolicy: \(policy.map(describe) ?? "nil"))  [slot \(index)]")
            let subscription = sequence.subscribe(bufferingPolicy: policy)
            let m = model.subscribe(name: name, policy: policy)
            m.holders = 1
            slots[index] = Slot(subscription: subscription, model: m)
        case 2, 3, 4:
            send(count: 1)
        case 5:
            send(count: input.byte() & 127 + 1)
        case 6:
            guard let sequence else { return }
            trace.add("finish()")
            sequence.finish()
            model.finish(.finished)
        case 7:
            let code = input.byte()
            guard let sequence else { return }
            trace.add("finish(throwing: FuzzError(\(code)))")
            sequence.finish(throwing: FuzzError(code: code))
            model.finish(.failed(code))
        case 8:
            guard let index = occupiedSlot(from: input.byte()), let slot = slots[index] else { return }
            trace.add("\(slot.model.name).cancel()")
            slot.subscription.cancel()
            model.cancel(slot.model)
        case 9:
            guard let index = occupiedSlot(from: input.byte()), let slot = slots[index] else { return }
            trace.add("release \(slot.model.name)")
            slots[index] = nil
            model.release(slot.model)
        case 10, 11, 12:
            guard let index = occupiedSlot(from: input.byte()), let slot = slots[index] else { return }
            trace.add("\(slot.model.name).poll()")
            read(slot)
        case 13, 14:
            guard let index = occupiedSlot(from: input.byte()), let slot = slots[index] else { return }
            trace.add("\(slot.model.name): poll() until empty")
            var results: [ReadResult] = []
            while results.count < 10_000 {
                let r = read(slot, annotate: false)
                results.append(r)
                if r == .empty || r.endsRead { break }
            }
            trace.annotate(" -> \(results)")
        default:
            // Rare on purpose: ends the interesting part of the program.
            guard input.byte() < 40, sequence != nil else { return }
            trace.add("release the sequence (finishes it)")
            sequence = nil
            model.finish(.finished)
        }
    }

    // MARK: v5

    mutating func v5Step(_ operation: Int) {
        switch operation {
        case 0:
            subscribeWithEviction()
        case 1:
            guard let sequence else { return }
            let id = model.makePayloadID()
            trace.add("send(#\(id), replayable: false)")
            let actual = sequence.send(Payload(id), replayable: false)
            let expected = model.send(id, replayable: false)
            trace.annotate(" -> \(describe(actual))")
            if actual != expected {
                trace.fail("send(#\(id), replayable: false) returned \(describe(actual)), expected \(describe(expected))",
                           details: model.dump())
            }
        case 2:
            let count = input.byte() % 40 + 1
            guard let sequence else { return }
            let ids = (0..<count).map { _ in model.makePayloadID() }
            trace.add("send(contentsOf: #\(ids[0])...#\(ids[count - 1]))")
            let actual = sequence.send(contentsOf: ids.map { Payload($0) })
            let expected = model.send(batch: ids)
            trace.annotate(" -> \(describe(actual))")
            if actual != expected {
                trace.fail("send(contentsOf:) returned \(describe(actual)), expected \(describe(expected))",
                           details: model.dump())
            }
        case 3:
            let operand = input.byte()
            guard let index = occupiedSlot(from: operand), let slot = slots[index] else { return }
            if operand & 0x80 != 0 {
                trace.add("\(slot.model.name): events until empty")
                var results: [EventResult] = []
                while results.count < 10_000, let r = readEvent(slot, cancelIfWaiting: false, annotate: false) {
                    results.append(r)
                    if r == .read(.end) || r == .read(.empty) { break }
                    if case .read(.failure) = r { break }
                }
                trace.annotate(" -> \(results)")
            } else {
                trace.add("\(slot.model.name): events.next()" + (operand & 0x40 != 0 ? ", its task cancelled if it waits" : ""))
                readEvent(slot, cancelIfWaiting: operand & 0x40 != 0)
            }
        case 4:
            let seconds = input.byte() % 3 + 1
            model.now += seconds
            trace.add("clock.advance(by: .seconds(\(seconds)))  [now \(model.now)s]")
            clock.advance(by: .seconds(seconds))
        default:
            let operand = input.byte()
            if operand & 0x80 != 0 {
                emit()
            } else {
                // Plain sends are most of what moves a subscriber past its limits.
                send(count: operand % 8 + 1)
            }
        }
    }

    /// One `emit` in a task on the manual executor, only where it does not
    /// wait (no full `.bounded` subscriber): it delivers as `send` does,
    /// eviction included.
    mutating func emit() {
        guard let sequence else { return }
        if model.terminal == nil && (!model.emitQueue.isEmpty || model.hasFullSubscriber) { return }
        let id = model.makePayloadID()
        trace.add("emit(#\(id)) in a task")
        let box = EmitResultBox()
        let payload = Payload(id)
        Task(executorPreference: executor) {
            box.result = try? await sequence.emit(payload)
            box.done = true
        }
        executor.runUntilIdle()
        let e = ModelEmit(payload: id)
        if model.emitBegins(e, taskCancelled: false) {
            trace.fail("the model makes emit(#\(id)) wait, though nobody was full", details: model.dump())
        }
        guard box.done, let actual = box.result else {
            trace.fail("emit(#\(id)) did not return in one run of the executor (nobody is full)", details: model.dump())
        }
        trace.annotate(" -> \(describe(actual))")
        if EmitOutcomeModel.delivered(actual) != e.outcome {
            trace.fail("emit(#\(id)) returned \(describe(actual)), expected \(e.outcome.map { "\($0)" } ?? "nothing")",
                       details: model.dump())
        }
    }

    static let hardTable = [1, 1, 2, 3, 4, 5, 8, 16, 17, 64]
    static let softTable = [0, 1, 2, 3, 4, 8, 16]

    mutating func subscribeWithEviction() {
        let byte = input.byte()
        let policy: BroadcastBufferingPolicy? = byte & 0x80 != 0 ? nil : decodePolicy(byte)
        let limits = input.byte()
        let hard = Self.hardTable[(limits & 15) % Self.hardTable.count]
        let soft = Self.softTable[(limits >> 4) % Self.softTable.count]
        let seconds = input.byte() % 4
        guard let sequence, let index = slots.firstIndex(where: { $0 == nil }) else { return }
        let eviction: BroadcastEviction
        let limitsModel: ModelEviction
        let text: String
        switch limits >> 7 == 0 ? (limits >> 6) & 1 : 2 {
        case 0:
            eviction = .hardLimit(hard)
            limitsModel = ModelEviction(hard: hard)
            text = ".hardLimit(\(hard))"
        case 1:
            eviction = .softLimit(soft + 1, for: .seconds(seconds))
            limitsModel = ModelEviction(soft: soft + 1, softSeconds: seconds)
            text = ".softLimit(\(soft + 1), for: .seconds(\(seconds)))"
        default:
            eviction = .limits(hard: hard, soft: soft + 1, for: .seconds(seconds))
            limitsModel = ModelEviction(hard: hard, soft: soft + 1, softSeconds: seconds)
            text = ".limits(hard: \(hard), soft: \(soft + 1), for: .seconds(\(seconds)))"
        }
        subscriberSerial += 1
        let name = "s\(subscriberSerial)"
        trace.add("\(name) = subscribe(bufferingPolicy: \(policy.map(describe) ?? "nil"), eviction: \(text), clock: manual)  [slot \(index)]")
        let subscription = sequence.subscribe(bufferingPolicy: policy, eviction: eviction, clock: clock)
        let m = model.subscribe(name: name, policy: policy, eviction: limitsModel)
        m.holders = 1
        slots[index] = Slot(subscription: subscription, model: m)
    }

    /// One `next()` of the subscription's `events`, in a task on the manual
    /// executor. If the model says it has to wait: with `cancelIfWaiting`
    /// the task is cancelled once it waits (the reader ends the subscriber
    /// and reports the gap still pending, then `nil`); without, the read is
    /// left out (`nil`).
    @discardableResult
    func readEvent(_ slot: Slot, cancelIfWaiting: Bool, annotate: Bool = true) -> EventResult? {
        let before = trace.enabled ? model.dump() : ""
        let expected: EventResult
        let waits = peekEvent(slot.model) == .read(.empty)
        if waits {
            guard cancelIfWaiting else {
                if annotate { trace.annotate(" -> (would wait: not read)") }
                return .read(.empty)
            }
            expected = model.endEventsByConsumer(slot.model)
        } else {
            expected = model.pollEvent(slot.model)
        }
        let box = EventBox()
        let subscription = slot.subscription
        let task = Task(executorPreference: executor) {
            var iterator = subscription.events.makeAsyncIterator()
            do {
                box.event = try await iterator.next()
            } catch {
                box.error = error as? FuzzError
            }
            box.done = true
        }
        executor.runUntilIdle()
        if waits {
            if box.done {
                trace.fail("\(slot.model.name): events.next() returned \(box.describe) at once, expected it to wait",
                           details: before)
            }
            task.cancel()
            executor.runUntilIdle()
        }
        guard box.done else {
            trace.fail("\(slot.model.name): events.next() waits, expected \(expected)", details: before)
        }
        let actual: EventResult
        switch box.event {
        case .element(let payload)?: actual = .read(.element(payload.id))
        case .lagged(let n)?: actual = .lagged(n)
        case nil: actual = box.error.map { .read(.failure($0.code)) } ?? .read(.end)
        }
        if annotate { trace.annotate(" -> \(actual)") }
        if actual != expected {
            trace.fail("\(slot.model.name): events.next() returned \(actual), expected \(expected)", details: before)
        }
        if expected == .read(.end) && slot.model.lagReported != slot.model.dropped {
            trace.fail("\(slot.model.name): the events ended with .lagged counts summing to \(slot.model.lagReported), droppedCount \(slot.model.dropped)",
                       details: model.dump())
        }
        return actual
    }

    /// What `pollEvent` would return, without changing the model.
    func peekEvent(_ s: ModelSubscriber) -> EventResult {
        if s.cancelled { return s.dropped > s.lagReported ? .lagged(s.dropped - s.lagReported) : .read(.end) }
        if s.passedLag > 0 || s.gaps.first?.position == 0 { return .lagged(1) }
        if !s.buffer.isEmpty { return .read(.element(s.buffer[0])) }
        return s.terminal == nil ? .read(.empty) : .read(.end)
    }

    mutating func send(count: Int) {
        guard let sequence else { return }
        let first = model.nextPayload
        trace.add(count == 1 ? "send(#\(first))" : "send(#\(first)...#\(first + count - 1))")
        var results: [String] = []
        for _ in 0..<count {
            let id = model.makePayloadID()
            let actual = sequence.send(Payload(id))
            let expected = model.send(id)
            if actual != expected {
                trace.fail("send(#\(id)) returned \(describe(actual)), expected \(describe(expected))",
                           details: model.dump())
            }
            if trace.enabled, count == 1 || results.last != describe(actual) { results.append(describe(actual)) }
        }
        trace.annotate(" -> " + results.joined(separator: " / "))
    }

    @discardableResult
    func read(_ slot: Slot, annotate: Bool = true) -> ReadResult {
        let actual: ReadResult
        switch slot.subscription.poll() {
        case .element(let payload): actual = .element(payload.id)
        case .empty: actual = .empty
        case .end: actual = .end
        case .failure(let error): actual = .failure(error.code)
        }
        let before = trace.enabled ? model.dump() : ""
        let expected = model.poll(slot.model)
        if annotate { trace.annotate(" -> \(actual)") }
        if actual != expected {
            trace.fail("\(slot.model.name).poll() returned \(actual), expected \(expected)", details: before)
        }
        return actual
    }

    func check() {
        if let sequence {
            expectEqual(sequence.subscriberCount, model.subscriberCount, "subscriberCount", trace, details: model.dump())
            expectEqual(sequence.isFinished, model.terminal != nil, "isFinished", trace, details: model.dump())
            expectEqual(sequence.waitingEmitterCount, 0, "waitingEmitterCount", trace)
        }
        for slot in slots {
            guard let slot else { continue }
            expectEqual(slot.subscription.droppedCount, slot.model.dropped, "\(slot.model.name).droppedCount", trace,
                        details: model.dump())
            expectEqual(slot.subscription.isConsumerWaiting, false, "\(slot.model.name).isConsumerWaiting", trace)
            expectEqual(slot.subscription.isEvicted, slot.model.evicted, "\(slot.model.name).isEvicted", trace,
                        details: model.dump())
        }
        let storageAlive = sequence != nil || slots.contains { $0 != nil }
        let held = model.heldPayloads(storageAlive: storageAlive)
        if livePayloads - baseline != held.count {
            trace.fail("live payloads: expected \(held.count) (\(held.sorted())), got \(livePayloads - baseline)",
                       details: model.dump())
        }
    }
}

/// What an events read's task got.
final class EventBox: @unchecked Sendable {
    var event: BroadcastEvent<Payload>?
    var error: FuzzError?
    var done = false

    var describe: String {
        switch event {
        case .element(let payload)?: return "#\(payload.id)"
        case .lagged(let n)?: return ".lagged(\(n))"
        case nil: return error.map { "throw(\($0.code))" } ?? "end"
        }
    }
}

/// What an `emit` task got.
final class EmitResultBox: @unchecked Sendable {
    var result: BroadcastSendResult?
    var done = false
}
