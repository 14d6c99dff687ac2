import NIOCore

/// What a reconnecting client asks for: `since=SEQ&epoch=E` in `GET /feed`.
///
/// `epoch` is the `ready` frame's: it names one numbering of the topic's
/// `seq` (per server process, and new each time the topic comes back after
/// it had gone), so a `since` from another numbering is never mistaken for
/// one of this.
public struct RecoveryRequest: Sendable, Equatable {
    /// The last `seq` the client got (or the `ready` frame's `seq` if it got none since).
    public var since: Int
    public var epoch: Int

    public init(since: Int, epoch: Int) {
        self.since = since
        self.epoch = epoch
    }
}

/// A connection's first frames: `ready`, and for a client that came back
/// with ``RecoveryRequest``, what it missed.
///
/// The connection's subscription exists before this runs, and the topic's
/// LISTEN loop puts each message in the ``History`` window before the hub
/// gets it: every message after the window's last `seq` at the time of the
/// read is in the subscription. So the phase sends the window's messages
/// after `since`, then `recovered`, and the pump then skips the live
/// messages it already sent (`seq` up to ``Plan/through``): no duplicate, no
/// hole between the two.
///
/// The missed messages are read in pages (``plan(pageLimit:pageBytes:)``,
/// then ``page(after:through:pageLimit:pageBytes:)`` while ``Plan/next`` is
/// set), each written before the next is read: a client that asked for the
/// whole window and stopped reading holds one page, not the window. If the
/// window lets go of the rest meanwhile (its limits, the process-wide cap,
/// an outage), the last page is a `resync` with the reason.
///
/// ```swift
/// var plan = phase.plan(pageLimit: 64, pageBytes: 1 << 20)
/// try await write(plan.frames)
/// while let next = plan.next {
///     plan = phase.page(after: next, through: plan.through, pageLimit: 64, pageBytes: 1 << 20)
///     try await write(plan.frames)
/// }
/// ```
public struct RecoveryPhase: Sendable {
    public let request: RecoveryRequest?
    public let sequence: Sequencer

    public init(request: RecoveryRequest?, sequence: Sequencer) {
        self.request = request
        self.sequence = sequence
    }

    public struct Plan: Sendable {
        /// In order: `ready`, the missed messages, then `recovered` or `resync`.
        public var frames: [ByteBuffer]
        /// Live messages with a `seq` up to this were among `frames` (0: none
        /// were; a new client still gets the hub's replayed message).
        public var through: Int
        /// Messages sent from the window.
        public var recovered: Int
        /// Set when the client was told to `resync`.
        public var resyncReason: String?
        /// Set while missed messages are left: the last `seq` sent so far
        /// (the next page starts after it).
        public var next: Int?
    }

    /// Reads the window and decides the first frames: `ready`, the first
    /// page of missed messages (at most `pageLimit` of them and `pageBytes`
    /// of ``FeedMessage/bytes``, at least one), and `recovered` or `resync`
    /// if that is the end.
    public func plan(pageLimit: Int = .max, pageBytes: Int = .max) -> Plan {
        let epoch = sequence.epoch
        guard let request else {
            let last = sequence.history.last
            return Plan(frames: [ControlFrame.ready(epoch: epoch, seq: last)], through: 0, recovered: 0)
        }
        guard request.epoch == epoch else {
            let last = sequence.history.last
            let reason = "epoch \(request.epoch) is not this topic's numbering here (\(epoch)): the topic restarted, or this is another server process"
            return Plan(frames: [ControlFrame.ready(epoch: epoch, seq: last), ControlFrame.resync(reason: reason)],
                        through: 0, recovered: 0, resyncReason: reason)
        }
        switch sequence.history.read(since: request.since, limit: pageLimit, maximumBytes: pageBytes) {
        case .notCovered(let last, let reason):
            return Plan(frames: [ControlFrame.ready(epoch: epoch, seq: last), ControlFrame.resync(reason: reason)],
                        through: 0, recovered: 0, resyncReason: reason)
        case .covered(var messages, let last):
            let reached = messages.last?.seq ?? request.since
            if FaultInjection.recoverySkipsOne && !messages.isEmpty { messages.removeFirst() }
            var plan = Plan(frames: [ControlFrame.ready(epoch: epoch, seq: last)], through: last, recovered: 0)
            finish(&plan, with: messages, reached: reached, since: request.since)
            return plan
        }
    }

    /// The page after `cursor` (a plan's ``Plan/next``), up to `through`
    /// (its ``Plan/through``): messages, and `recovered` on the last page; a
    /// `resync` with the reason if the window no longer holds them.
    public func page(after cursor: Int, through: Int, pageLimit: Int = .max, pageBytes: Int = .max) -> Plan {
        let since = request?.since ?? cursor
        switch sequence.history.read(since: cursor, through: through, limit: pageLimit, maximumBytes: pageBytes) {
        case .notCovered(_, let reason):
            return Plan(frames: [ControlFrame.resync(reason: reason)], through: through, recovered: 0, resyncReason: reason)
        case .covered(let messages, _):
            guard let reached = messages.last?.seq else {
                // Cannot happen (a window holds every seq from its floor to its last); never loop on it.
                let reason = "seq \(cursor + 1) is no longer held"
                return Plan(frames: [ControlFrame.resync(reason: reason)], through: through, recovered: 0, resyncReason: reason)
            }
            var plan = Plan(frames: [], through: through, recovered: 0)
            finish(&plan, with: messages, reached: reached, since: since)
            return plan
        }
    }

    /// Adds a page's messages, and `recovered` if it reached `through`.
    private func finish(_ plan: inout Plan, with messages: [FeedMessage], reached: Int, since: Int) {
        plan.frames += messages.map(\.frame)
        plan.recovered = messages.count
        if reached >= plan.through {
            plan.frames.append(ControlFrame.recovered(from: since + 1, to: plan.through))
        } else {
            plan.next = reached
        }
    }
}

extension ControlFrame {
    /// `{"type":"ready","epoch":E,"seq":S}`: S is the topic's last `seq` when
    /// the connection started; every message after it reaches the client
    /// (or is counted in a `gap`).
    public static func ready(epoch: Int, seq: Int) -> ByteBuffer {
        ByteBuffer(string: #"{"type":"ready","epoch":\#(epoch),"seq":\#(seq)}"#)
    }
    /// `{"type":"recovered","from":A,"to":B}`: the messages `seq` A to B
    /// were sent just before (none when B = A - 1: nothing was missed).
    public static func recovered(from: Int, to: Int) -> ByteBuffer {
        ByteBuffer(string: #"{"type":"recovered","from":\#(from),"to":\#(to)}"#)
    }
    /// A recovery that could not be served: as an outage's `resync`, with the reason.
    public static func resync(reason: String) -> ByteBuffer {
        ByteBuffer(string: #"{"type":"resync","reason":\#(jsonString(reason))}"#)
    }
}
