import AsyncBroadcast

// A reference model of one BroadcastValue, written for clarity: the current
// value (as a key: `[Int]`, see `FuzzValue.key` in fuzz-value), a version
// number that counts changes, and per subscriber the version it returned
// last. It follows the contract in the DocC catalog (Semantics.md, "Current
// values"); where the contract leaves a choice to the implementation and
// the choice is observable, the model makes the library's choice and says
// so ("implementation choice").

/// One `next()` of a BroadcastValue subscription.
public enum ValueRead: Equatable, CustomStringConvertible {
    case value([Int])
    case end
    case failure(Int)

    public var description: String {
        switch self {
        case .value(let key): return describeKey(key)
        case .end: return "nil"
        case .failure(let code): return "throw(\(code))"
        }
    }
}

public func describeKey(_ key: [Int]) -> String {
    "<" + key.map(String.init).joined(separator: ",") + ">"
}

public final class ValueModelSubscriber: CustomStringConvertible {
    public let name: String
    /// Counted in `subscriberCount`.
    public var registered: Bool
    /// The version this subscriber returned last; `version - 1` at
    /// subscribe, so that its first `next()` returns the current value (or a
    /// newer one).
    public var lastSeen: Int
    /// `next()` returns `nil` from now on: cancelled (`cancel()`, release,
    /// task cancellation noticed) or its end (or error) was delivered.
    public var ended = false
    public var cancelled = false
    /// Subscribed after finish or from a cancelled task: never registered;
    /// yields the value once, then ends with `endEvent`, whatever its task's
    /// state.
    public let unregistered: Bool
    /// For an unregistered subscriber: how it ends after its value.
    public let endEvent: ModelTerminal
    /// References that keep the `Subscription` alive (the driver's slot, a
    /// reading task's iterator). At 0 it is released, which cancels it.
    public var holders = 0
    /// A reader is suspended in `next()`, waiting for a change.
    public var parked = false
    /// A parked reader was resumed and has not run yet.
    public var woken = false
    /// On the value's parked list (`parkedSubscriberCount`). Implementation
    /// choice: a reader goes on it when it finds nothing new and parks;
    /// a change or finish empties the list; the subscriber leaves it when
    /// it leaves the value. A reader whose task is cancelled while parked
    /// stays on it until it runs (the cancellation handler takes no lock).
    public var listed = false
    /// For an unregistered subscriber: the value at subscribe.
    /// Implementation choice: the subscription keeps a copy of it (alive
    /// until taken or the subscription is released) and yields that copy,
    /// even if the value changed since.
    public var snapshot: [Int]?

    init(name: String, lastSeen: Int, unregistered: Bool, endEvent: ModelTerminal) {
        self.name = name
        self.lastSeen = lastSeen
        self.unregistered = unregistered
        self.registered = !unregistered
        self.endEvent = endEvent
    }

    public var description: String {
        var s = "\(name) lastSeen=v\(lastSeen)"
        s += registered ? " registered" : (unregistered ? " never registered (ends with \(endEvent))" : " left")
        if ended { s += " ended" }
        if cancelled { s += " cancelled" }
        if let snapshot { s += " snapshot=\(describeKey(snapshot))" }
        if parked { s += " parked" }
        if woken { s += " woken" }
        if listed { s += " listed" }
        s += " holders=\(holders)"
        return s
    }
}

public final class ValueModel {
    /// `Value: Equatable`: a send or update that leaves the value equal is
    /// not a change.
    public let isEquatable: Bool
    public private(set) var current: [Int]
    /// Version 0 is the initial value; each change adds one.
    public private(set) var version = 0
    public private(set) var changeCount = 0
    /// Parked readers woken by a change or by finish.
    public private(set) var wakeCount = 0
    public private(set) var terminal: ModelTerminal?
    public private(set) var subscribers: [ValueModelSubscriber] = []
    /// The value each version had (for the failure report).
    public private(set) var history: [[Int]]

    public init(initial: [Int], isEquatable: Bool) {
        current = initial
        history = [initial]
        self.isEquatable = isEquatable
    }

    public var subscriberCount: Int { subscribers.filter(\.registered).count }
    public var parkedCount: Int { subscribers.filter(\.listed).count }

    // MARK: Subscribing

    /// Registered now, holding the current value: its first read returns it
    /// (or a newer one). After finish or from a cancelled task it is never
    /// registered and yields the value once, then ends.
    public func subscribe(name: String, fromCancelledTask: Bool = false) -> ValueModelSubscriber {
        let unregistered = terminal != nil || fromCancelledTask
        let s = ValueModelSubscriber(name: name, lastSeen: version - 1, unregistered: unregistered,
                                     endEvent: terminal ?? .finished)
        if unregistered { s.snapshot = current }
        subscribers.append(s)
        return s
    }

    // MARK: Changing

    /// A `send` or `update` left the value `newKey`. Returns whether it is
    /// a change (after finish nothing is).
    @discardableResult
    public func set(_ newKey: [Int]) -> Bool {
        guard terminal == nil else { return false }
        if isEquatable && newKey == current { return false }
        current = newKey
        version += 1
        changeCount += 1
        history.append(newKey)
        wakeParked()
        return true
    }

    /// Empties the parked list, waking every reader parked on it (counted
    /// in `wakeCount`); a reader whose task was cancelled is only removed.
    func wakeParked() {
        for s in subscribers where s.listed {
            s.listed = false
            if s.parked { wake(s, counted: true) }
        }
    }

    func wake(_ s: ValueModelSubscriber, counted: Bool) {
        s.parked = false
        s.woken = true
        if counted { wakeCount += 1 }
    }

    func unregister(_ s: ValueModelSubscriber) {
        s.registered = false
        s.listed = false
    }

    /// A reader found nothing new and parked (only registered readers can).
    public func park(_ s: ValueModelSubscriber) {
        s.parked = true
        s.listed = s.registered
    }

    /// First call wins. A registered subscriber that has seen the last value
    /// leaves at once; one that has not counts until it takes it. Parked
    /// readers are woken.
    public func finish(_ event: ModelTerminal) {
        guard terminal == nil else { return }
        terminal = event
        wakeParked()
        for s in subscribers where s.registered && s.lastSeen >= version { unregister(s) }
    }

    // MARK: Reading and ending

    /// Whether a `next()` now returns without waiting.
    public func hasWork(_ s: ValueModelSubscriber) -> Bool {
        s.ended || s.unregistered || s.lastSeen < version || terminal != nil
    }

    /// One `next()` that does not wait; `nil` if it would wait.
    public func read(_ s: ValueModelSubscriber) -> ValueRead? {
        if s.ended { return .end }
        if s.unregistered {
            if let snapshot = s.snapshot {
                s.snapshot = nil
                return .value(snapshot)
            }
            s.ended = true
            return s.endEvent == .finished ? .end : .failure(s.endEvent.code)
        }
        if s.lastSeen < version {
            s.lastSeen = version
            // Finished: it took the last value, so it leaves now (not when it
            // takes the end).
            if terminal != nil { unregister(s) }
            return .value(current)
        }
        guard let terminal else { return nil }
        s.ended = true
        unregister(s)
        return terminal == .finished ? .end : .failure(terminal.code)
    }

    /// `cancel()`, the last reference went away, or the reader noticed its
    /// task's cancellation: ends now, a parked reader is woken (not counted
    /// in `wakeCount`) and returns `nil`.
    public func cancel(_ s: ValueModelSubscriber) {
        guard !s.cancelled else { return }
        s.cancelled = true
        s.ended = true
        unregister(s)
        if s.parked { wake(s, counted: false) }
    }

    /// The reader ended the subscriber for its task's cancellation: `nil`.
    public func endByTaskCancellation(_ s: ValueModelSubscriber) -> ValueRead {
        cancel(s)
        return .end
    }

    /// The task's cancellation handler woke a parked reader (not counted in
    /// `wakeCount`); it stays on the parked list until it runs.
    public func wakeForTaskCancellation(_ s: ValueModelSubscriber) {
        if s.parked { wake(s, counted: false) }
    }

    /// Token ids (`key.last`) the library must keep alive, given whether
    /// its storage is (the `BroadcastValue`, or a registered-kind
    /// subscription, keeps it): the current value and the snapshots not
    /// yet taken of live unregistered subscriptions.
    public func heldKeys(storageAlive: Bool) -> [[Int]] {
        var keys: [[Int]] = storageAlive ? [current] : []
        for s in subscribers where s.unregistered && s.holders > 0 {
            if let snapshot = s.snapshot { keys.append(snapshot) }
        }
        return keys
    }

    /// Whether a subscription that shares the storage is alive.
    public var registeredKindAlive: Bool {
        subscribers.contains { !$0.unregistered && $0.holders > 0 }
    }

    /// A reference to the subscription went away.
    public func release(_ s: ValueModelSubscriber) {
        s.holders -= 1
        precondition(s.holders >= 0)
        if s.holders == 0 { cancel(s) }
    }

    public func dump() -> String {
        var lines = ["model: value=\(describeKey(current)) version=v\(version) changeCount=\(changeCount) wakeCount=\(wakeCount) terminal=\(terminal.map { "\($0)" } ?? "none") subscriberCount=\(subscriberCount) parked=\(parkedCount)"]
        let recent = history.indices.suffix(6).map { "v\($0)=\(describeKey(history[$0]))" }
        lines.append("  history (last 6): " + recent.joined(separator: " "))
        for s in subscribers where !(s.ended && s.holders == 0 && !s.parked && !s.woken) { lines.append("  \(s)") }
        return lines.joined(separator: "\n")
    }
}
