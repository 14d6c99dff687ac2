// Target 1 (`seq`): sequential model check.
//
// The input is a program on one BroadcastSequence and up to 8 subscriber
// slots. Each step runs on the library and on `BroadcastModel`; after every
// step everything observable is compared: send results, what each read
// returns (element, empty, end, thrown error), droppedCount,
// subscriberCount, isFinished, waitingEmitterCount, isConsumerWaiting and
// the number of live payloads (so freed buffers are really freed).
//
// Input layout: byte 0 the default policy, byte 1 the replay, then one
// opcode byte per step followed by its operands.

@_spi(Testing) import AsyncBroadcast
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
        let opcode = input.below(16)
        switch opcode {
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
        }
        let storageAlive = sequence != nil || slots.contains { $0 != nil }
        let held = model.heldPayloads(storageAlive: storageAlive)
        if livePayloads - baseline != held.count {
            trace.fail("live payloads: expected \(held.count) (\(held.sorted())), got \(livePayloads - baseline)",
                       details: model.dump())
        }
    }
}
