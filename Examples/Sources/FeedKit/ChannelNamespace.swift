/// The PostgreSQL channels a server's topics travel on: `PREFIX.TOPIC`
/// (`--channel-prefix`, default `livefeed`).
///
/// A client names a topic, never a channel: without the prefix,
/// `/feed?topic=otherapp_jobs` would LISTEN to another application's channel
/// on the same database and `POST /publish?topic=otherapp_jobs` would NOTIFY
/// it. Every channel this server touches starts with `PREFIX.`, and a topic
/// (`[a-z0-9_-]{1,48}`) has no `.`, so no topic reaches a channel outside the
/// namespace, and two prefixes never share a channel (`a` + `b.c` cannot
/// equal `a.b` + `c`).
///
/// ```swift
/// let namespace = try ChannelNamespace(prefix: "livefeed")
/// namespace.channel(for: "chat")   // "livefeed.chat"
/// ```
///
/// Lengths: PostgreSQL's identifiers are at most 63 bytes (NAMEDATALEN - 1).
/// `pg_notify` refuses a longer channel, but `LISTEN` truncates it with only
/// a notice, so a long name would LISTEN on one channel and NOTIFY another.
/// The prefix is therefore at most 63 - 1 - 48 = 14 bytes. Quoting:
/// PostgresNIO sends `LISTEN "channel"` without escaping, and `pg_notify`
/// binds the channel as a parameter; the prefix's characters
/// (`[a-z0-9_]`), the dot and a topic's need no escaping in either, and
/// keep their case in both.
public struct ChannelNamespace: Sendable, Equatable {
    public let prefix: String

    public static let defaultPrefix = "livefeed"
    /// PostgreSQL's longest identifier, in bytes.
    public static let maximumChannelBytes = 63
    public static let maximumPrefixBytes = maximumChannelBytes - 1 - FeedTopic.maximumLength
    public static let `default` = ChannelNamespace(checked: defaultPrefix)

    public init(prefix: String) throws(BadFeedQuery) {
        guard !prefix.isEmpty, prefix.utf8.count <= Self.maximumPrefixBytes else {
            throw BadFeedQuery("--channel-prefix must be 1 to \(Self.maximumPrefixBytes) bytes (a channel is PREFIX.TOPIC, at most \(Self.maximumChannelBytes) bytes in PostgreSQL, and a topic up to \(FeedTopic.maximumLength))")
        }
        guard prefix.utf8.allSatisfy({ (0x61...0x7A).contains($0) || (0x30...0x39).contains($0) || $0 == 0x5F }) else {
            throw BadFeedQuery("--channel-prefix '\(prefix)' has a character other than a-z, 0-9 and _")
        }
        self.prefix = prefix
    }

    private init(checked prefix: String) { self.prefix = prefix }

    /// The channel of `topic` (a validated topic name).
    public func channel(for topic: String) -> String { prefix + "." + topic }
}
