@_spi(Testing) import AsyncBroadcast
import AsyncBroadcastTestSupport

/// One subscriber's shared state during a round: its join bracket, consumer
/// task, live progress (for quiescence and the watchdog), and final record.
final class SubscriberSlot: Sendable {
    let plan: SubscriberPlan
    /// The effective policy (the sequence's default resolved).
    let policy: BroadcastBufferingPolicy
    let summary: String

    private struct State {
        var join: JoinInfo?
        /// Held only for subscribers that a producer cancels (`cancel()` or
        /// task cancellation), so it can reach them.
        var strong: Stream.Subscription?
        /// For status and `droppedCount` while running; never keeps it alive.
        weak var observed: Stream.Subscription?
        var task: Task<Void, Never>?
        var received = 0
        var ended = false
        var record: ConsumerRecord?
    }

    private let state = Locked(State())

    init(plan: SubscriberPlan, policy: BroadcastBufferingPolicy, summary: String) {
        self.plan = plan
        self.policy = policy
        self.summary = summary
    }

    /// The argument for `subscribe(bufferingPolicy:)`.
    var policyArgument: BroadcastBufferingPolicy? {
        switch plan.policy {
        case .sequenceDefault: return nil
        case .explicit(let policy): return policy
        }
    }

    var needsStrongReference: Bool {
        switch plan.leave {
        case .externalCancel, .externalTaskCancel: return true
        default: return false
        }
    }

    func setJoin(_ join: JoinInfo) { state.withLock { $0.join = join } }
    var join: JoinInfo? { state.withLock { $0.join } }

    func attach(_ subscription: Stream.Subscription) {
        let strong = needsStrongReference
        state.withLock {
            $0.observed = subscription
            if strong { $0.strong = subscription }
        }
    }

    func setTask(_ task: Task<Void, Never>) { state.withLock { $0.task = task } }
    var task: Task<Void, Never>? { state.withLock { $0.task } }

    var strongSubscription: Stream.Subscription? { state.withLock { $0.strong } }
    var observedSubscription: Stream.Subscription? { state.withLock { $0.observed } }

    func setReceived(_ count: Int) { state.withLock { $0.received = count } }
    var received: Int { state.withLock { $0.received } }
    var hasEnded: Bool { state.withLock { $0.ended } }

    var isParked: Bool { observedSubscription?.isConsumerWaiting ?? false }

    func finish(_ record: ConsumerRecord) {
        state.withLock {
            $0.record = record
            $0.ended = true
        }
    }

    var record: ConsumerRecord? { state.withLock { $0.record } }

    /// Drops the harness's references at the end of the round.
    func release() {
        state.withLock {
            $0.strong = nil
            $0.task = nil
        }
    }

    /// For the watchdog.
    func status() -> String {
        let (received, ended, subscription) = state.withLock { ($0.received, $0.ended, $0.observed) }
        var text = "subscriber \(plan.id) [\(summary)]: received \(received)"
        if ended { return text + ", ended" }
        if let subscription {
            text += subscription.isConsumerWaiting ? ", parked in next()" : ", not parked"
            text += ", droppedCount \(subscription.droppedCount)"
        }
        return text
    }
}
