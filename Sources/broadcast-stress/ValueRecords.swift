/// When a value subscriber subscribed, relative to the writers.
struct ValueJoinInfo: Sendable {
    /// Per producer: operations that had *returned* before `subscribe` was called.
    let completedBefore: [Int]
    /// Exact modes: the highest seq certainly committed before `subscribe`
    /// was called (its first value is at least that, or the final value).
    let committedBefore: Int
    /// A `finish` had returned before `subscribe` was called: the
    /// subscriber gets exactly the final value, then the end.
    let afterFinish: Bool
    /// A finish had started by the time `subscribe` returned: it may not be
    /// registered (then it ignores its task's cancellation).
    let finishStartedBefore: Bool
    /// The subscribing task was cancelled when `subscribe` returned: the
    /// library may have seen it cancelled (a subscriber made inside a
    /// consumer task that was cancelled before it ran), and then the
    /// subscriber is a snapshot of the value current at `subscribe`, not
    /// registered. (False: the library certainly saw a live task.)
    var cancelledAtSubscribe = false

    static func beforeWriting(producers: Int) -> ValueJoinInfo {
        ValueJoinInfo(
            completedBefore: Array(repeating: 0, count: producers), committedBefore: 0, afterFinish: false,
            finishStartedBefore: false)
    }
}

struct ValueConsumerRecord: Sendable {
    let id: Int
    var joined = false
    var join: ValueJoinInfo?
    /// Seqs of the values `next()` returned, in order.
    var received: [Int] = []
    /// Exact modes: the highest seq certainly committed just before each of
    /// those `next()` calls (the call returns at least that, or the final value).
    var floors: [Int] = []
    var end: ConsumerEnd = .notJoined
    var notes: [String] = []
    /// The consumer cancelled its own task after this many calls of `next()`.
    var ownTaskCancelledAfter: Int?
}

struct ValueOpRecord: Sendable {
    let kind: ValueOpKind
    /// Fresh writes: the seq written. `update` bodies that keep the content:
    /// the seq they saw. `send(equal)`: the seq of the content sent.
    /// Reads: the seq read.
    let seq: Int
    /// Returned before any finish started: it certainly took effect.
    let certain: Bool
}

struct ValueProducerRecord: Sendable {
    let id: Int
    var ops: [ValueOpRecord] = []
}

/// One write, as the harness saw it where its order is known: inside an
/// `update` body (under the value's lock) or under the `.serialized` lock.
struct ChangeLog: Sendable {
    /// Position in that order (`.racing`: meaningless across sends).
    let order: Int
    /// -1: the harness's own probe write.
    let producer: Int
    let op: Int
    let kind: ValueOpKind
    /// The seq an `update` body saw (nil for `send`).
    let prev: Int?
    /// The content's seq afterwards.
    let new: Int
    /// A new seq: a change (unless discarded after finish).
    let fresh: Bool
    /// Same content written again to a non-Equatable value: still a change.
    let republish: Bool

    var who: String { producer < 0 ? "the harness probe" : "p\(producer)#\(op)" }
}
