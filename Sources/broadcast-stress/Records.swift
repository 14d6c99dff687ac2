import AsyncBroadcast

/// When a subscriber subscribed, relative to each producer's operations.
///
/// `completedBefore[p]`: producer p's operations that had *returned* before
/// `subscribe` was called (they cannot reach this subscriber).
/// `startedAfter[p]`: producer p's operations that had *started* when
/// `subscribe` returned (later ones must reach it, if delivered at all).
/// Operations in between raced the subscription: either outcome is valid.
struct JoinInfo: Sendable {
    let completedBefore: [Int]
    let startedAfter: [Int]
    /// A `finish` had returned (or a send had reported `isFinished`) before
    /// `subscribe` was called.
    let afterFinish: Bool

    static func beforeSending(producers: Int) -> JoinInfo {
        JoinInfo(
            completedBefore: Array(repeating: 0, count: producers),
            startedAfter: Array(repeating: 0, count: producers), afterFinish: false)
    }

    /// Whether every operation of every producer is on a known side of the subscription.
    var isExact: Bool { completedBefore == startedAfter }
}

/// How a consumer's loop ended.
enum ConsumerEnd: Sendable, Equatable, CustomStringConvertible {
    case notJoined
    /// `next()` returned nil.
    case end
    /// `next()` threw the sequence's error.
    case error(Int)
    /// The consumer called `cancel()` (and `next()` then returned nil).
    case cancelledByConsumer
    /// The consumer released its iterator.
    case droppedIterator

    var description: String {
        switch self {
        case .notJoined: return "never subscribed"
        case .end: return "nil"
        case .error(let code): return "threw StressError(\(code))"
        case .cancelledByConsumer: return "cancel()"
        case .droppedIterator: return "dropped iterator"
        }
    }
}

struct ConsumerRecord: Sendable {
    let id: Int
    let policy: BroadcastBufferingPolicy
    var joined = false
    var join: JoinInfo?
    /// Keys of the received elements, in order.
    var received: [Int] = []
    var end: ConsumerEnd = .notJoined
    /// Read after the subscriber ended (so it is final); nil where the
    /// harness holds no `Subscription` (iterator-only consumers).
    var droppedCount: Int?
    /// Problems the consumer saw itself (corrupt payload, element after end...).
    var notes: [String] = []
    /// The consumer cancelled its own task after this many calls of
    /// `next()` on its iterator (`cancelOwnTaskAfter`).
    var ownTaskCancelledAfter: Int?
}

enum OpOutcome: Sendable {
    case result(BroadcastSendResult)
    /// `emit` threw `CancellationError`.
    case cancelled

    var isFinished: Bool {
        if case .result(let result) = self { return result.isFinished }
        return false
    }
}

struct OpRecord: Sendable {
    let kind: OpKind
    let outcome: OpOutcome
    /// A finish had been observed (returned, or reported by a send) before
    /// this operation started.
    let finishSeenBefore: Bool
    /// The producer's index of the operation's first element: a producer
    /// numbers its elements, not its operations, so that a
    /// `send(contentsOf:)` of `elements` carries indices
    /// `firstIndex ..< firstIndex + elements`.
    var firstIndex: Int
    /// 1, or a batch's length.
    var elements: Int = 1

    /// The keys of the operation's elements, in order.
    func keys(producer: Int) -> Range<Int> {
        Item.key(producer: producer, index: firstIndex)..<Item.key(producer: producer, index: firstIndex + elements)
    }
}

struct ProducerRecord: Sendable {
    let id: Int
    var ops: [OpRecord] = []
}

struct Violation: Sendable, CustomStringConvertible {
    let invariant: String
    let detail: String
    var description: String { "[\(invariant)] \(detail)" }
}
