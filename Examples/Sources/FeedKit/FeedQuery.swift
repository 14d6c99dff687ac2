import AsyncBroadcast

/// What a client asks for in `GET /feed?topic=NAME&policy=P&capacity=N`.
public struct FeedQuery: Sendable, Equatable {
    public enum Policy: String, Sendable, CaseIterable {
        case newest, oldest, bounded, unbounded
    }
    /// The topic: its messages travel on the channel `PREFIX.TOPIC` (``ChannelNamespace``).
    public var topic: String = FeedTopic.default
    public var policy: Policy = .newest
    public var capacity: Int = 64
    /// `since=SEQ&epoch=E`: a client that comes back for what it missed (``RecoveryPhase``).
    public var recovery: RecoveryRequest?

    public init(topic: String = FeedTopic.default, policy: Policy = .newest, capacity: Int = 64,
                recovery: RecoveryRequest? = nil) {
        self.topic = topic
        self.policy = policy
        self.capacity = capacity
        self.recovery = recovery
    }

    /// Parses the query parameters. Every input the library would reject by
    /// trapping (`.bounded(0)`, a negative capacity) is refused here, with a
    /// one-line reason, before any subscription exists.
    /// `maximumCapacity` is the server's ceiling (``FeedLimits/maximumCapacity``).
    public init(parameters: [(name: String, value: String)], maximumCapacity: Int = FeedLimits().maximumCapacity) throws(BadFeedQuery) {
        var since: Int?
        var epoch: Int?
        for (name, value) in parameters {
            switch name {
            case "topic":
                topic = try FeedTopic.validated(value)
            case "policy":
                guard let policy = Policy(rawValue: value) else {
                    throw BadFeedQuery("unknown policy '\(value)': use newest, oldest, bounded or unbounded")
                }
                self.policy = policy
            case "capacity":
                guard let capacity = Int(value) else {
                    throw BadFeedQuery("capacity '\(value)' is not an integer")
                }
                guard capacity >= 0 else { throw BadFeedQuery("capacity \(capacity) is negative") }
                guard capacity <= maximumCapacity else {
                    throw BadFeedQuery("capacity \(capacity) is above \(maximumCapacity), this server's ceiling (--max-capacity)")
                }
                self.capacity = capacity
            case "since":
                guard let value = Int(value) else { throw BadFeedQuery("since '\(value.prefix(40))' is not an integer") }
                guard value >= 0 else { throw BadFeedQuery("since \(value) is negative: it is the last seq you got") }
                since = value
            case "epoch":
                guard let value = Int(value) else { throw BadFeedQuery("epoch '\(value.prefix(40))' is not an integer") }
                guard value > 0 else { throw BadFeedQuery("epoch \(value) is not positive: it is the ready frame's epoch") }
                epoch = value
            default:
                continue  // unknown parameters are ignored, as browsers add their own
            }
        }
        if policy == .bounded && capacity == 0 {
            throw BadFeedQuery("capacity 0 with policy bounded: a bounded subscriber needs room for at least one element")
        }
        switch (since, epoch) {
        case (let since?, let epoch?): recovery = RecoveryRequest(since: since, epoch: epoch)
        case (_?, nil): throw BadFeedQuery("since without epoch: give the ready frame's epoch too, so seq is read in the right numbering")
        case (nil, _?): throw BadFeedQuery("epoch without since: give the last seq you got as since")
        case (nil, nil): break
        }
    }

    /// The library's policy for this query.
    public var bufferingPolicy: BroadcastBufferingPolicy {
        switch policy {
        case .newest: .bufferingNewest(capacity)
        case .oldest: .bufferingOldest(capacity)
        case .bounded: .bounded(capacity)
        case .unbounded: .unbounded
        }
    }
}

/// Topic names: `[a-z0-9_-]{1,48}`. A topic's messages travel on the
/// PostgreSQL channel `PREFIX.TOPIC` (``ChannelNamespace``: LISTEN quotes it,
/// `pg_notify` takes it as text), so the name must be one that neither can
/// misread, and short enough that the channel stays within PostgreSQL's
/// 63-byte identifiers.
public enum FeedTopic {
    /// The topic of a request that names none.
    public static let `default` = "feed"
    public static let maximumLength = 48

    /// `name` if it is a valid topic name; the reason otherwise.
    public static func validated(_ name: String) throws(BadFeedQuery) -> String {
        guard !name.isEmpty else { throw BadFeedQuery("topic is empty: use 1 to \(maximumLength) of a-z, 0-9, _ and -") }
        guard name.utf8.count <= maximumLength else {
            throw BadFeedQuery("topic is \(name.utf8.count) bytes long: at most \(maximumLength)")
        }
        guard name.utf8.allSatisfy({ (0x61...0x7A).contains($0) || (0x30...0x39).contains($0) || $0 == 0x5F || $0 == 0x2D }) else {
            throw BadFeedQuery("topic '\(name.prefix(maximumLength))' has a character other than a-z, 0-9, _ and -")
        }
        return FaultInjection.topicCrosstalk ? Self.default : name
    }

    /// The `topic` parameter of a request (the default if it has none); the
    /// last one wins, as in ``FeedQuery``.
    public static func from(parameters: [(name: String, value: String)]) throws(BadFeedQuery) -> String {
        var topic = Self.default
        for (name, value) in parameters where name == "topic" { topic = try validated(value) }
        return topic
    }
}

public struct BadFeedQuery: Error, Sendable, Equatable, CustomStringConvertible {
    public let reason: String
    public init(_ reason: String) { self.reason = reason }
    public var description: String { reason }
}

/// The per-connection limits of `/feed` (flags of `feed-server`).
public struct FeedLimits: Sendable {
    /// Bytes of messages one connection may hold unread before it is closed
    /// with 1013 (`--queue-bytes`, default 4 MiB: Centrifugo closes at 1 MB,
    /// Redis' pub/sub output buffer at 32 MB, or 8 MB for 60 s).
    public var queueBytes: Int
    /// The largest `capacity` a client may ask for (`--max-capacity`): at most
    /// `queueBytes / FeedMessage.largestBytes`, so that a `newest` or `oldest`
    /// queue full of the largest messages stays within the budget.
    public var maximumCapacity: Int
    /// A connection whose pump has been in one write this long (its client
    /// stopped reading) is closed with 1013, whether or not anything is
    /// published (`--send-timeout`, default 30 s; ``LiveConnections``).
    public var sendTimeout: Duration

    public static let defaultQueueBytes = 4 << 20
    public static let defaultSendTimeout = Duration.seconds(30)

    public init(queueBytes: Int = Self.defaultQueueBytes, maximumCapacity: Int? = nil,
                sendTimeout: Duration = Self.defaultSendTimeout) {
        self.queueBytes = queueBytes
        self.maximumCapacity = maximumCapacity ?? Self.ceiling(queueBytes: queueBytes)
        self.sendTimeout = sendTimeout
    }

    /// `queueBytes / FeedMessage.largestBytes`: the most a queue of that many bytes can hold.
    public static func ceiling(queueBytes: Int) -> Int { queueBytes / FeedMessage.largestBytes }
}
