#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import AsyncBroadcast

// A reference model of one BroadcastSequence, written for clarity: plain
// arrays and counters, no rings, no atomics. Elements are payload ids.
//
// It follows API.md and the doc comments. Where the contract leaves a
// choice to the implementation and the choice is observable, the model
// makes the same choice and says so ("implementation choice").

/// The sequence's terminal event.
public enum ModelTerminal: Equatable, CustomStringConvertible {
    case finished
    case failed(Int)

    public var description: String {
        switch self {
        case .finished: return "finished"
        case .failed(let code): return "failed(\(code))"
        }
    }
}

/// A subscriber's terminal state.
public enum SubTerminal: Equatable, CustomStringConvertible {
    /// The sequence finished: drain, then end.
    case finished
    /// The sequence failed: drain, throw once, then end.
    case failed(Int)
    /// The consuming task was cancelled: drain, then end (never an error).
    case cancelled
    /// The end was delivered, or `cancel()` was called.
    case ended

    public var description: String {
        switch self {
        case .finished: return "finished"
        case .failed(let code): return "failed(\(code))"
        case .cancelled: return "cancelled"
        case .ended: return "ended"
        }
    }
}

/// What a parked consumer is resumed with (see `SubscriberCore`).
public enum ModelWake: Equatable, CustomStringConvertible {
    /// Handed straight to the parked reader (subscribers with a locked ring).
    case element(Int)
    /// Look again: a lock-free buffer got an element, the end, or `cancel()`.
    case retry
    /// The reader's task was cancelled.
    case cancelled

    public var description: String {
        switch self {
        case .element(let id): return "element(\(id))"
        case .retry: return "retry"
        case .cancelled: return "cancelled"
        }
    }
}

/// One read: `poll()` or one `next()`.
public enum ReadResult: Equatable, CustomStringConvertible {
    case element(Int)
    case empty
    case end
    case failure(Int)

    public var description: String {
        switch self {
        case .element(let id): return "#\(id)"
        case .empty: return "empty"
        case .end: return "end"
        case .failure(let code): return "throw(\(code))"
        }
    }

    public var endsRead: Bool {
        switch self {
        case .end, .failure: return true
        default: return false
        }
    }
}

public final class ModelSubscriber: CustomStringConvertible {
    public let name: String
    public let policy: BroadcastBufferingPolicy
    /// Implementation choice, observable through counts: `.bufferingNewest`
    /// and `.bufferingOldest(0)` hand an element straight to a parked
    /// reader (it is then in flight, not buffered); the other policies
    /// buffer it and wake the reader to look.
    public let handsOffToParkedReader: Bool
    public var buffer: [Int] = []
    public var dropped = 0
    public var registered = false
    public var terminal: SubTerminal?
    /// The consuming task was cancelled while inside the wait (or entered
    /// it cancelled): no element reaches this subscriber any more, and the
    /// next wait ends at once. Implementation choice: the cancellation
    /// handler takes no lock, so the subscriber leaves the registry only
    /// when its reader runs again.
    public var tombstone = false
    /// A reader is suspended in `next()`.
    public var parked = false
    /// A suspended reader was resumed with this and has not run yet.
    public var wake: ModelWake?
    /// References that keep the `Subscription` alive (the driver's slot,
    /// a reading task). At 0 it is released, which cancels it.
    public var holders = 0
    /// Known-bug mode only: the library's "full" mark (set when a send or
    /// emit leaves a `.bounded` subscriber at its capacity or above, never
    /// by replay).
    public var markedFull = false
    /// The task reading this subscriber now was cancelled (set by the
    /// scheduling target), and the sequence failed after that.
    public var readerTaskCancelled = false
    public var failedAfterReaderCancelled = false

    init(name: String, policy: BroadcastBufferingPolicy) {
        self.name = name
        self.policy = policy
        switch policy {
        case .bufferingNewest: handsOffToParkedReader = true
        case .bufferingOldest(let n): handsOffToParkedReader = n == 0
        case .unbounded, .bounded: handsOffToParkedReader = false
        }
    }

    public var boundedCapacity: Int? {
        if case .bounded(let n) = policy { return n }
        return nil
    }

    public var description: String {
        var s = "\(name) \(describe(policy)) buffer=\(buffer) dropped=\(dropped)"
        s += registered ? " registered" : " unregistered"
        if let terminal { s += " terminal=\(terminal)" }
        if tombstone { s += " tombstone" }
        if parked { s += " parked" }
        if let wake { s += " wake=\(wake)" }
        return s
    }
}

public enum EmitOutcomeModel: Equatable, CustomStringConvertible {
    case delivered(BroadcastSendResult)
    case cancelled

    public var description: String {
        switch self {
        case .delivered(let result): return describe(result)
        case .cancelled: return "CancellationError"
        }
    }
}

public final class ModelEmit {
    public let payload: Int
    public var outcome: EmitOutcomeModel?
    public init(payload: Int) { self.payload = payload }
}

/// Library bugs the fuzzers found. All are fixed, so by default the model
/// checks the contract for each. `FUZZ_STRICT=none` makes it expect the old
/// (buggy) behaviour instead, to fuzz an older library; `FUZZ_STRICT=name,name`
/// checks only the named ones strictly.
public enum KnownBugs {
    static let strict: [String]? = getenv("FUZZ_STRICT").map {
        String(cString: $0).split(separator: ",").map(String.init)
    }
    public static let replayOverfill = isTolerated("replay-overfill")
    public static let cancelledReaderThrows = isTolerated("cancelled-reader-throws")
    public static let staleTombstone = isTolerated("stale-tombstone")

    static func isTolerated(_ name: String) -> Bool {
        // All three were fixed in the library; they stay listed so an
        // older library can still be fuzzed with FUZZ_STRICT=none.
        guard let strict, !strict.contains("none") else { return strict == nil ? false : true }
        return !(strict.contains(name) || strict.contains("1") || strict.contains("all"))
    }

    public static let list = [
        "replay-overfill: a .bounded(n) subscriber that replay filled to n or more does not make emit wait (API.md: emit waits while a .bounded subscriber holds n or more)",
        "cancelled-reader-throws: a reader whose task was cancelled while in next() throws the error of a finish(throwing:) that came after the cancellation, before the reader ran (README: a cancelled consuming task gets nil, never an error)",
        "stale-tombstone: a reader task cancelled after it was resumed but before it ran leaves its subscriber registered (subscriberCount) while every later send skips it (neither delivered nor dropped), until next() is called again (API.md: an ended subscriber is removed promptly)",
    ]
}

public final class BroadcastModel {
    public let defaultPolicy: BroadcastBufferingPolicy
    public let replayLimit: Int
    public var replay: [Int] = []
    public var terminal: ModelTerminal?
    /// Every subscriber ever made (registered or not), in creation order.
    public var subscribers: [ModelSubscriber] = []
    /// Waiting emitters, in arrival order.
    public var emitQueue: [ModelEmit] = []
    /// Elements released by the library; if an id shows up in a read later,
    /// something kept a freed element.
    public var nextPayload = 1

    public init(defaultPolicy: BroadcastBufferingPolicy, replay: Int) {
        self.defaultPolicy = defaultPolicy
        self.replayLimit = replay
    }

    public func makePayloadID() -> Int {
        defer { nextPayload += 1 }
        return nextPayload
    }

    public var subscriberCount: Int { subscribers.filter(\.registered).count }

    // MARK: Subscribing

    public func subscribe(name: String, policy: BroadcastBufferingPolicy?, fromCancelledTask: Bool = false) -> ModelSubscriber {
        let subscriber = ModelSubscriber(name: name, policy: policy ?? defaultPolicy)
        subscribers.append(subscriber)
        // Replay goes through the policy like a send (drops are counted);
        // nobody is parked on a new subscriber.
        for id in replay { _ = offer(id, to: subscriber) }
        subscriber.markedFull = false  // the library ignores replay's outcome (known bug replay-overfill)
        if let terminal {
            subscriber.terminal = terminal == .finished ? .finished : .failed(terminal.code)
        } else if fromCancelledTask {
            subscriber.terminal = .cancelled
        } else {
            subscriber.registered = true
        }
        return subscriber
    }

    // MARK: Sending

    public enum Offer { case delivered, deliveredEvicting, dropped, skipped }

    func offer(_ id: Int, to s: ModelSubscriber) -> Offer {
        if s.tombstone { return .skipped }
        if s.handsOffToParkedReader {
            if s.terminal != nil { return .skipped }
            if s.parked {
                s.parked = false
                s.wake = .element(id)
                return .delivered
            }
        }
        switch s.policy {
        case .unbounded:
            s.buffer.append(id)
            return .delivered
        case .bounded(let n):
            s.buffer.append(id)
            if s.buffer.count >= n { s.markedFull = true }
            return .delivered
        case .bufferingOldest(let n):
            if s.buffer.count >= n {  // includes n == 0 with no reader waiting
                s.dropped += 1
                return .dropped
            }
            s.buffer.append(id)
            return .delivered
        case .bufferingNewest(let n):
            if n == 0 {
                s.dropped += 1
                return .dropped
            }
            if s.buffer.count >= n {
                s.buffer.removeFirst()
                s.dropped += 1
                s.buffer.append(id)
                return .deliveredEvicting
            }
            s.buffer.append(id)
            return .delivered
        }
    }

    /// Hands `id` to every registered subscriber.
    func deliver(_ id: Int) -> BroadcastSendResult {
        var result = BroadcastSendResult()
        for s in subscribers where s.registered {
            switch offer(id, to: s) {
            case .delivered: result.delivered += 1
            case .deliveredEvicting: result.delivered += 1; result.dropped += 1
            case .dropped: result.dropped += 1
            case .skipped: break
            }
        }
        // Parked readers of buffering subscribers are woken to look.
        for s in subscribers where s.registered && s.parked && !s.handsOffToParkedReader {
            s.parked = false
            s.wake = .retry
        }
        if replayLimit > 0 {
            if replay.count == replayLimit { replay.removeFirst() }
            replay.append(id)
        }
        return result
    }

    public func send(_ id: Int) -> BroadcastSendResult {
        if terminal != nil { return BroadcastSendResult(isFinished: true) }
        return deliver(id)
    }

    // MARK: Emitting

    /// A `.bounded(n)` subscriber holding n or more unread elements (also
    /// when `send` or replay over-filled it) makes `emit` wait.
    public func isFull(_ s: ModelSubscriber) -> Bool {
        guard s.registered, let n = s.boundedCapacity, s.buffer.count >= n else { return false }
        if KnownBugs.replayOverfill && !s.markedFull { return false }
        return true
    }

    public var hasFullSubscriber: Bool { subscribers.contains(where: isFull) }

    /// An `emit` call starts. Returns `true` if it waits.
    public func emitBegins(_ e: ModelEmit, taskCancelled: Bool) -> Bool {
        if terminal != nil {
            e.outcome = .delivered(BroadcastSendResult(isFinished: true))
            return false
        }
        if emitQueue.isEmpty && !hasFullSubscriber {
            e.outcome = .delivered(deliver(e.payload))
            return false
        }
        if taskCancelled {  // the cancellation handler runs at once
            e.outcome = .cancelled
            return false
        }
        emitQueue.append(e)
        return true
    }

    /// Serves waiting emitters, oldest first, while nobody is full.
    public func serveEmitters() {
        while let first = emitQueue.first, !hasFullSubscriber {
            emitQueue.removeFirst()
            first.outcome = .delivered(deliver(first.payload))
        }
    }

    /// The emitter's task was cancelled.
    public func cancelEmit(_ e: ModelEmit) {
        guard let index = emitQueue.firstIndex(where: { $0 === e }) else { return }
        emitQueue.remove(at: index)
        e.outcome = .cancelled
    }

    // MARK: Finishing

    public func finish(_ event: ModelTerminal) {
        guard terminal == nil else { return }
        terminal = event
        for s in subscribers where s.registered {
            if s.terminal == nil {
                s.terminal = event == .finished ? .finished : .failed(event.code)
                if event != .finished && s.readerTaskCancelled { s.failedAfterReaderCancelled = true }
            }
            if s.parked {
                s.parked = false
                s.wake = .retry
            }
        }
        for e in emitQueue { e.outcome = .delivered(BroadcastSendResult(isFinished: true)) }
        emitQueue.removeAll()
    }

    // MARK: Reading and ending

    /// Unregisters `s`; emitters that waited on it may go.
    public func remove(_ s: ModelSubscriber) {
        s.registered = false
        serveEmitters()
    }

    /// One non-suspending read.
    public func poll(_ s: ModelSubscriber) -> ReadResult {
        if !s.buffer.isEmpty {
            let id = s.buffer.removeFirst()
            if s.boundedCapacity != nil { serveEmitters() }
            return .element(id)
        }
        switch s.terminal {
        case nil:
            return .empty
        case .ended:
            return .end
        case .finished, .cancelled:
            s.terminal = .ended
            remove(s)
            return .end
        case .failed(let code):
            s.terminal = .ended
            remove(s)
            return .failure(code)
        }
    }

    /// `cancel()`, or the last reference to the subscription went away:
    /// unregister, free the buffer, wake a parked reader (it gets `nil`).
    public func cancel(_ s: ModelSubscriber) {
        remove(s)
        s.buffer.removeAll()
        s.terminal = .ended
        if s.parked {
            s.parked = false
            s.wake = .retry
        }
    }

    /// The reading task noticed its cancellation: no new elements; what is
    /// buffered is still read, then `nil`.
    public func endForTaskCancellation(_ s: ModelSubscriber) {
        remove(s)
        switch s.terminal {
        case nil, .finished, .failed:
            // README: "A cancelled consuming task gets nil (never an error)".
            s.terminal = .cancelled
        case .cancelled, .ended:
            break
        }
    }

    /// A reference to the subscription went away.
    public func release(_ s: ModelSubscriber) {
        s.holders -= 1
        precondition(s.holders >= 0)
        if s.holders == 0 { cancel(s) }
    }

    // MARK: Observing

    /// Payload ids the library must still hold: replay and buffers.
    public func heldPayloads(storageAlive: Bool) -> Set<Int> {
        var held = Set<Int>()
        if storageAlive { held.formUnion(replay) }
        for s in subscribers where s.holders > 0 || s.registered {
            held.formUnion(s.buffer)
            if case .element(let id) = s.wake { held.insert(id) }
        }
        for e in emitQueue { held.insert(e.payload) }
        return held
    }

    public func dump() -> String {
        var lines = ["model: terminal=\(terminal.map { "\($0)" } ?? "none") replay=\(replay) emitQueue=\(emitQueue.map(\.payload)) subscriberCount=\(subscriberCount)"]
        for s in subscribers { lines.append("  \(s)") }
        return lines.joined(separator: "\n")
    }
}

extension ModelTerminal {
    var code: Int {
        if case .failed(let code) = self { return code }
        return 0
    }
}
