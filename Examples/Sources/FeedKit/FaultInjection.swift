import Foundation

/// Deliberate faults, switched on by the environment, so the checks can be
/// shown to catch them (`scripts/smoke.sh` does). Never set in real use.
///
/// `FEED_SERVER_FAULT=skip-gaps`: the server drops like it should but never
/// tells the client: no `gap` frames.
///
/// `FEED_SERVER_FAULT=no-eviction`: a stalled client is never closed (neither
/// a `.bounded` one that stays full nor a `bounded`/`unbounded` one over the
/// byte budget), and its backlog grows without limit.
///
/// `FEED_SERVER_FAULT=topic-crosstalk`: topic names are still validated (a
/// bad one is still a 400) but then ignored: every connection subscribes to,
/// and every publish goes to, the default topic `feed`, so every client gets
/// every topic's messages.
///
/// `FEED_SERVER_FAULT=recovery-skips-one`: a client that comes back with
/// `since` is sent what it missed but the first, and still told `recovered`.
/// `FEED_SERVER_FAULT=metrics-miss-delivered`: `/stats` counts deliveries,
/// `/metrics`' `feed_delivered_total` does not (the rest of the metrics move).
///
/// `FEED_SERVER_FAULT=count-drops-twice`: a broadcast connection's drops,
/// already counted at each send, are added to `/stats` again when it closes
/// (the bug 3a371de fixed).
///
/// `FEED_SERVER_FAULT=keep-evicted-open`: an evicted client's connection
/// stays open until its close frame is in the socket, however long that takes
/// (a client that never reads again keeps it for good).
public enum FaultInjection {
    public static let fault = ProcessInfo.processInfo.environment["FEED_SERVER_FAULT"] ?? ""
    public static let skipGapFrames = fault == "skip-gaps"
    public static let neverEvict = fault == "no-eviction"
    public static let topicCrosstalk = fault == "topic-crosstalk"
    public static let recoverySkipsOne = fault == "recovery-skips-one"
    public static let metricsMissDelivered = fault == "metrics-miss-delivered"
    public static let countDropsTwice = fault == "count-drops-twice"
    public static let keepEvictedOpen = fault == "keep-evicted-open"
}
