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
    }

    /// Reads the window once and decides every frame.
    public func plan() -> Plan {
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
        switch sequence.history.read(since: request.since) {
        case .notCovered(let last, let reason):
            return Plan(frames: [ControlFrame.ready(epoch: epoch, seq: last), ControlFrame.resync(reason: reason)],
                        through: 0, recovered: 0, resyncReason: reason)
        case .covered(var messages, let last):
            if FaultInjection.recoverySkipsOne && !messages.isEmpty { messages.removeFirst() }
            var frames = [ControlFrame.ready(epoch: epoch, seq: last)]
            frames += messages.map(\.frame)
            frames.append(ControlFrame.recovered(from: request.since + 1, to: last))
            return Plan(frames: frames, through: last, recovered: messages.count)
        }
    }

    /// Writes the plan's frames with `write` (the connection's own) and
    /// returns ``Plan/through``.
    public func run(write: (ByteBuffer) async throws -> Void) async throws -> Int {
        let plan = plan()
        for frame in plan.frames { try await write(frame) }
        return plan.through
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
