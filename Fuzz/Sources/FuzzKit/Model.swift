#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import AsyncBroadcast

// A reference model of one BroadcastSequence, written for clarity: plain
// arrays and counters, no rings, no atomics. Elements are payload ids.
//
// It follows the contract (see the DocC catalog
// Sources/AsyncBroadcast/AsyncBroadcast.docc/Semantics.md) and the doc
// comments. Where the contract leaves a choice to the implementation and the
// choice is observable, the model makes the same choice and says so
// ("implementation choice").

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
    /// The sequence finished (or the subscriber was created from a cancelled
    /// task): drain, then end.
    case finished
    /// The sequence failed: drain, throw once, then end.
    case failed(Int)
    /// The end was delivered, or the subscriber was cancelled (`cancel()`,
    /// release, or its consuming task's cancellation).
    case ended

    public var description: String {
        switch self {
        case .finished: return "finished"
        case .failed(let code): return "failed(\(code))"
        case .ended: return "ended"
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

/// One events read: a gap, or what a plain read gives.
public enum EventResult: Equatable, CustomStringConvertible {
    case lagged(Int)
    case read(ReadResult)

    public var description: String {
        switch self {
        case .lagged(let n): return ".lagged(\(n))"
        case .read(let r): return r.description
        }
    }
}

public final class ModelSubscriber: CustomStringConvertible {
    public let name: String
    public let policy: BroadcastBufferingPolicy
    /// Implementation choice, observable through live payloads: the buffer of
    /// `.unbounded`, `.bounded` and `.bufferingOldest(n > 0)` is lock-free
    /// and only its consumer frees it; `cancel()` while a reader holds the
    /// consumer slot (suspended inside `next()`) leaves the elements to that
    /// reader, which frees them when it runs again. The other policies
    /// (`.bufferingNewest`, capacity 0) free their buffer inside `cancel()`.
    public let isLockFree: Bool
    public var buffer: [Int] = []
    /// Elements of a cancelled lock-free buffer that its consumer (holding
    /// the slot) has not freed yet: still alive, never read.
    public var awaitingFree: [Int] = []
    public var dropped = 0
    public var registered = false
    public var terminal: SubTerminal?
    /// `cancel()` ran (explicitly, by release, or by the reader noticing its
    /// task's cancellation).
    public var cancelled = false
    /// Subscribed from a cancelled task or after finish: never registered,
    /// it yields the replay window (and the terminal event) whatever its
    /// consuming task's state.
    public var ignoresTaskCancellation = false
    /// The consuming task was cancelled while inside the wait (or entered
    /// it cancelled): no element reaches this subscriber any more, and its
    /// reader ends it as soon as it runs. Implementation choice: the
    /// cancellation handler takes no lock, so the subscriber leaves the
    /// registry only when its reader runs again.
    public var tombstone = false
    /// A reader is suspended in `next()` (parked).
    public var parked = false
    /// A parked reader was resumed and has not run yet.
    public var woken = false
    /// A reader holds the consumer slot: it is suspended inside `next()`
    /// (parked, or resumed and not yet run).
    public var consumerBusy = false
    /// References that keep the `Subscription` alive (the driver's slot,
    /// a reading task). At 0 it is released, which cancels it.
    public var holders = 0
    /// Known-bug mode only: the library's "full" mark (set when a send or
    /// emit leaves a `.bounded` subscriber at its capacity or above, never
    /// by replay).
    public var markedFull = false
    /// Its eviction limits (`subscribe(bufferingPolicy:eviction:)`), if any.
    public var eviction: ModelEviction?
    /// Ended by its eviction limit (`isEvicted`).
    public var evicted = false
    /// Where its policy dropped elements, for the events reader: `position`
    /// counts the held elements before the gap (0: before the next one;
    /// `buffer.count`: after every held one). Ascending, equal positions
    /// merged.
    public var gaps: [(position: Int, count: Int)] = []
    /// Gaps a plain read (`poll()`) went past: the next events read reports
    /// them first (with the gap before the element next).
    public var passedLag = 0
    /// The `.lagged` counts the events reads returned.
    public var lagReported = 0

    init(name: String, policy: BroadcastBufferingPolicy) {
        self.name = name
        self.policy = policy
        switch policy {
        case .unbounded, .bounded: isLockFree = true
        case .bufferingOldest(let n): isLockFree = n > 0
        case .bufferingNewest: isLockFree = false
        }
    }

    /// The policy dropped `count` elements; the gap sits after `position`
    /// held elements.
    func addGap(at position: Int, count: Int = 1) {
        var index = gaps.count
        while index > 0, gaps[index - 1].position > position { index -= 1 }
        if index > 0, gaps[index - 1].position == position {
            gaps[index - 1].count += count
        } else {
            gaps.insert((position, count), at: index)
        }
    }

    /// The oldest held element leaves the buffer: gaps before it move to
    /// before the next one (`passed`: the reader went past them without
    /// reporting; else they stay due at position 0, merged).
    func shiftGaps(passed: Bool) {
        if passed, let first = gaps.first, first.position == 0 {
            passedLag += first.count
            gaps.removeFirst()
        }
        for index in gaps.indices where gaps[index].position > 0 { gaps[index].position -= 1 }
        // Two gaps that meet at 0 merge.
        if gaps.count > 1, gaps[1].position == 0 {
            gaps[0].count += gaps[1].count
            gaps.remove(at: 1)
        }
    }

    /// The capacity a lossy policy keeps (`.max` for `.unbounded` and
    /// `.bounded`, which `send` can always grow).
    public var growthLimit: Int {
        switch policy {
        case .unbounded, .bounded: return .max
        case .bufferingOldest(let n), .bufferingNewest(let n): return n
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
        if cancelled { s += " cancelled" }
        if !awaitingFree.isEmpty { s += " awaitingFree=\(awaitingFree)" }
        if let eviction { s += " eviction=\(eviction)" }
        if evicted { s += " evicted" }
        if !gaps.isEmpty { s += " gaps=\(gaps.map { "\($0.count)@\($0.position)" })" }
        if passedLag > 0 { s += " passedLag=\(passedLag)" }
        if lagReported > 0 { s += " lagReported=\(lagReported)" }
        if ignoresTaskCancellation { s += " ignoresTaskCancellation" }
        if tombstone { s += " tombstone" }
        if parked { s += " parked" }
        if woken { s += " woken" }
        if consumerBusy { s += " consumerBusy" }
        return s
    }
}

/// A subscriber's eviction limits (`BroadcastEviction`), times in whole
/// seconds of the model's clock.
public final class ModelEviction: CustomStringConvertible {
    public let hard: Int
    public let soft: Int
    public let softSeconds: Int
    /// When a send first found it over its soft limit (every send since has).
    public var overSince: Int?

    public init(hard: Int = .max, soft: Int = .max, softSeconds: Int = 0) {
        self.hard = hard
        self.soft = soft
        self.softSeconds = softSeconds
    }

    public var description: String {
        var parts: [String] = []
        if hard != .max { parts.append("hard \(hard)") }
        if soft != .max { parts.append("soft \(soft) for \(softSeconds)s" + (overSince.map { " (over since \($0)s)" } ?? "")) }
        return "[" + parts.joined(separator: ", ") + "]"
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
/// (buggy) behaviour instead where the model can still express it
/// (replay-overfill, stale-tombstone); `FUZZ_STRICT=name,name` checks only
/// the named ones strictly.
public enum KnownBugs {
    static let strict: [String]? = getenv("FUZZ_STRICT").map {
        String(cString: $0).split(separator: ",").map(String.init)
    }
    public static let replayOverfill = isTolerated("replay-overfill")
    public static let staleTombstone = isTolerated("stale-tombstone")

    static func isTolerated(_ name: String) -> Bool {
        // All were fixed in the library; they stay listed so an older
        // library can still be fuzzed with FUZZ_STRICT=none.
        guard let strict, !strict.contains("none") else { return strict == nil ? false : true }
        return !(strict.contains(name) || strict.contains("1") || strict.contains("all"))
    }

    public static let list = [
        "replay-overfill: a .bounded(n) subscriber that replay filled to n or more does not make emit wait (the contract: emit waits while a .bounded subscriber holds n or more, however it got them)",
        "cancelled-reader-throws: a reader whose task was cancelled while in next() throws the error of a finish(throwing:) that came after the cancellation, before the reader ran (the contract: a cancelled consumer gets nil, never an error; always checked)",
        "stale-tombstone: a reader task cancelled after it was resumed but before it ran leaves its subscriber registered (subscriberCount) while every later send skips it (neither delivered nor dropped), until next() is called again (the contract: an ended subscriber leaves at once)",
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
    public var nextPayload = 1
    /// The manual clock of the soft eviction limits, in seconds.
    public var now = 0

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

    /// A new subscriber gets the whole replay window whatever its policy
    /// (nothing counts as dropped); the policy governs later sends, and a
    /// subscriber holding its capacity or more counts as full.
    public func subscribe(name: String, policy: BroadcastBufferingPolicy?, fromCancelledTask: Bool = false,
                          eviction: ModelEviction? = nil) -> ModelSubscriber {
        let subscriber = ModelSubscriber(name: name, policy: policy ?? defaultPolicy)
        subscriber.eviction = eviction
        subscribers.append(subscriber)
        subscriber.buffer = replay
        subscriber.markedFull = false  // the library ignored replay's outcome (known bug replay-overfill)
        if let terminal {
            subscriber.terminal = terminal == .finished ? .finished : .failed(terminal.code)
            subscriber.ignoresTaskCancellation = true
        } else if fromCancelledTask {
            subscriber.terminal = .finished  // the replay window, then nil
            subscriber.ignoresTaskCancellation = true
        } else {
            subscriber.registered = true
        }
        return subscriber
    }

    // MARK: Sending

    public enum Offer { case delivered, deliveredEvicting, dropped, skipped }

    func offer(_ id: Int, to s: ModelSubscriber) -> Offer {
        if s.tombstone { return .skipped }  // its reader is about to end it
        switch s.policy {
        case .unbounded:
            s.buffer.append(id)
            return .delivered
        case .bounded(let n):
            s.buffer.append(id)
            if s.buffer.count >= n { s.markedFull = true }
            return .delivered
        case .bufferingOldest(let n):
            // Capacity 0: only a reader waiting with an empty buffer takes it.
            if n == 0 && s.parked && s.buffer.isEmpty {
                s.buffer.append(id)
                return .delivered
            }
            if s.buffer.count >= n {  // includes n == 0 with no reader waiting
                s.dropped += 1
                s.addGap(at: s.buffer.count)  // after every held element
                return .dropped
            }
            s.buffer.append(id)
            return .delivered
        case .bufferingNewest(let n):
            if s.parked && s.buffer.isEmpty {  // a reader waits: it gets the element
                s.buffer.append(id)
                return .delivered
            }
            if n == 0 {
                s.dropped += 1
                s.addGap(at: s.buffer.count)  // after what it holds
                return .dropped
            }
            if s.buffer.count >= n {  // full, or over-filled by replay
                s.buffer.removeFirst()
                s.shiftGaps(passed: false)
                s.dropped += 1
                s.addGap(at: 0)  // before the element that is now its oldest
                s.buffer.append(id)
                return .deliveredEvicting
            }
            s.buffer.append(id)
            return .delivered
        }
    }

    /// Hands `id` to every registered subscriber, then wakes every parked
    /// reader (the element is in its buffer; the continuation carries no
    /// payload).
    /// `replayable: false` (`send(_:replayable:)`): the replay window keeps what it had.
    func deliver(_ id: Int, replayable: Bool = true) -> BroadcastSendResult {
        deliver(batch: [id], replayable: replayable)
    }

    /// `send(contentsOf:)`: each subscriber's limits are checked once for
    /// the whole batch (one that the batch would take past its hard limit
    /// gets none of it), then the elements are offered as consecutive
    /// sends would. One element: `send`.
    func deliver(batch: [Int], replayable: Bool = true) -> BroadcastSendResult {
        var result = BroadcastSendResult()
        guard !batch.isEmpty else { return result }
        var evictedNow: [ModelSubscriber] = []
        for s in subscribers where s.registered {
            if s.tombstone { continue }
            if s.evicted { continue }  // waiting for its removal
            if s.eviction != nil, evicts(s, adding: batch.count) {
                s.evicted = true
                evictedNow.append(s)
                result.evicted += 1
                continue
            }
            for id in batch {
                switch offer(id, to: s) {
                case .delivered: result.delivered += 1
                case .deliveredEvicting: result.delivered += 1; result.dropped += 1
                case .dropped: result.dropped += 1
                case .skipped: break
                }
            }
        }
        for s in subscribers where s.registered && s.parked { wake(s) }
        if replayLimit > 0 && replayable {
            for id in batch {
                if replay.count == replayLimit { replay.removeFirst() }
                replay.append(id)
            }
        }
        // An evicted subscriber ends as after `cancel()`, once the send's
        // critical section is over.
        for s in evictedNow { cancel(s) }
        return result
    }

    /// The limits of `s` before a send hands it `adding` elements. The hard
    /// limit asks what the send does: its policy's drops and evictions do
    /// not make it hold more, so a lossy subscriber that replay over-filled
    /// past the limit is not ended by them. The soft limit: a send that
    /// finds it over `soft`, when every send for `softSeconds` has, ends it.
    func evicts(_ s: ModelSubscriber, adding: Int) -> Bool {
        guard let limits = s.eviction else { return false }
        let count = s.buffer.count
        let after = count >= s.growthLimit ? count : Swift.min(count + adding, s.growthLimit)
        if after > limits.hard && after > count { return true }
        if count > limits.soft {
            let since = limits.overSince ?? now
            limits.overSince = since
            return now - since >= limits.softSeconds
        }
        limits.overSince = nil
        return false
    }

    /// `send(contentsOf:)`.
    public func send(batch: [Int]) -> BroadcastSendResult {
        if terminal != nil { return BroadcastSendResult(isFinished: true) }
        return deliver(batch: batch)
    }

    func wake(_ s: ModelSubscriber) {
        s.parked = false
        s.woken = true
    }

    public func send(_ id: Int, replayable: Bool = true) -> BroadcastSendResult {
        if terminal != nil { return BroadcastSendResult(isFinished: true) }
        return deliver(id, replayable: replayable)
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

    /// A registered subscriber whose buffer is empty leaves at once; one
    /// that holds elements leaves when its consumer takes the last one.
    public func finish(_ event: ModelTerminal) {
        guard terminal == nil else { return }
        terminal = event
        for e in emitQueue { e.outcome = .delivered(BroadcastSendResult(isFinished: true)) }
        emitQueue.removeAll()
        for s in subscribers where s.registered {
            if s.terminal == nil { s.terminal = event == .finished ? .finished : .failed(event.code) }
            if s.parked { wake(s) }
            if s.buffer.isEmpty { s.registered = false }
        }
    }

    // MARK: Reading and ending

    /// Unregisters `s`; emitters that waited on it may go.
    public func remove(_ s: ModelSubscriber) {
        s.registered = false
        serveEmitters()
    }

    /// One non-suspending read (`poll()`, or the synchronous part of `next()`).
    public func poll(_ s: ModelSubscriber) -> ReadResult {
        if s.cancelled {
            s.awaitingFree.removeAll()  // the consumer frees what cancel() left to it
            return .end
        }
        if !s.buffer.isEmpty {
            let id = s.buffer.removeFirst()
            s.shiftGaps(passed: true)
            if s.boundedCapacity != nil { serveEmitters() }
            // Finished and now drained: it leaves now, not when it takes
            // the terminal event.
            if s.terminal != nil && s.buffer.isEmpty { remove(s) }
            return .element(id)
        }
        switch s.terminal {
        case nil:
            return .empty
        case .ended:
            return .end
        case .finished:
            s.terminal = .ended
            remove(s)
            return .end
        case .failed(let code):
            s.terminal = .ended
            remove(s)
            return .failure(code)
        }
    }

    /// `cancel()`, the last reference to the subscription went away, or the
    /// reader noticed its task's cancellation: unregister, discard the
    /// buffer, wake a parked reader (it gets `nil`). Only the first call
    /// does anything.
    public func cancel(_ s: ModelSubscriber) {
        guard !s.cancelled else { return }
        s.cancelled = true
        remove(s)
        s.terminal = .ended
        if s.isLockFree && s.consumerBusy {
            s.awaitingFree += s.buffer  // the reader holding the slot frees them
        }
        s.buffer.removeAll()
        s.gaps.removeAll()
        s.passedLag = 0
        if s.parked { wake(s) }
    }

    /// One non-suspending events read (`events`' `next()` that does not
    /// wait): a gap due before the next element (or one a plain read went
    /// past) first, as one `.lagged(n)`; once the subscriber has ended
    /// (cancelled, evicted, its task cancelled), what is still unreported,
    /// then the end; else as `poll(_:)`.
    public func pollEvent(_ s: ModelSubscriber) -> EventResult {
        if s.cancelled {
            s.awaitingFree.removeAll()
            let due = s.dropped - s.lagReported
            if due > 0 {
                s.lagReported += due
                return .lagged(due)
            }
            return .read(.end)
        }
        var due = s.passedLag
        if let first = s.gaps.first, first.position == 0 {
            due += first.count
            s.gaps.removeFirst()
        }
        if due > 0 {
            s.passedLag = 0
            s.lagReported += due
            return .lagged(due)
        }
        return .read(poll(s))
    }

    /// The events reader noticed its task's cancellation: the subscriber
    /// ends as with `cancel()`, and the reader reports the gap still
    /// unreported before `nil`.
    public func endEventsByConsumer(_ s: ModelSubscriber) -> EventResult {
        cancel(s)
        return pollEvent(s)
    }

    /// The reader noticed its task's cancellation (`endByConsumer`): the
    /// subscriber ends exactly as with `cancel()`, and the reader frees what
    /// is left. `next()` returns nil.
    public func endByConsumer(_ s: ModelSubscriber) -> ReadResult {
        cancel(s)
        s.awaitingFree.removeAll()
        return .end
    }

    /// A reference to the subscription went away.
    public func release(_ s: ModelSubscriber) {
        s.holders -= 1
        precondition(s.holders >= 0)
        if s.holders == 0 { cancel(s) }
    }

    // MARK: Observing

    /// Payload ids the library must still hold: replay, buffers and waiting
    /// emitters' elements.
    public func heldPayloads(storageAlive: Bool) -> Set<Int> {
        var held = Set<Int>()
        if storageAlive { held.formUnion(replay) }
        for s in subscribers where s.holders > 0 || s.registered {
            held.formUnion(s.buffer)
            held.formUnion(s.awaitingFree)
        }
        for e in emitQueue { held.insert(e.payload) }
        return held
    }

    public func dump() -> String {
        var lines = ["model: terminal=\(terminal.map { "\($0)" } ?? "none") replay=\(replay) emitQueue=\(emitQueue.map(\.payload)) subscriberCount=\(subscriberCount) now=\(now)s"]
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
