import Metrics
import Foundation

/// The server's metrics, through swift-metrics: whatever backend the
/// process bootstrapped (feed-server: Prometheus, served at `GET /metrics`).
///
/// ``ServerStats`` forwards its counters here as they move, so the metrics
/// follow every caller of ``ServerStats/add(_:_:)`` and never disagree with
/// `/stats` by more than what happened between two reads.
///
/// ```swift
/// MetricsSystem.bootstrap(PrometheusMetricsFactory(registry: registry))
/// let stats = ServerStats(metrics: FeedMetrics())   // after the bootstrap
/// stats.add(.delivered)                             // feed_delivered_total + 1
/// ```
public final class FeedMetrics: Sendable {
    /// The names, as Prometheus shows them.
    public enum Name {
        public static let subscribers = "feed_subscribers"
        public static let topics = "feed_topics"
        public static let delivered = "feed_delivered_total"
        public static let dropped = "feed_dropped_total"
        public static let evicted = "feed_evicted_total"
        public static let fanOutLatency = "feed_fanout_latency_seconds"
        public static let liveTopics = "feed_live_topics"
        public static let topicsLimit = "feed_topics_limit"
        public static let topicsRefused = "feed_topics_refused_total"
        public static let historyBytes = "feed_history_bytes"
        public static let historyLimitBytes = "feed_history_limit_bytes"
    }

    /// The fan-out latency histogram's buckets (upper bounds, in seconds once
    /// exposed): from 100 µs (a quiet process writes to a fast client within
    /// a few hundred µs) to 30 s (a slow client's backlog).
    public static let fanOutBuckets: [Duration] = [
        .microseconds(100), .microseconds(250), .microseconds(500),
        .milliseconds(1), .milliseconds(2), .milliseconds(5), .milliseconds(10), .milliseconds(25),
        .milliseconds(50), .milliseconds(100), .milliseconds(250), .milliseconds(500),
        .seconds(1), .milliseconds(2500), .seconds(5), .seconds(10), .seconds(30),
    ]

    let subscribers = Meter(label: Name.subscribers)
    let topics = Meter(label: Name.topics)
    let delivered = Counter(label: Name.delivered)
    let dropped = Counter(label: Name.dropped)
    let evicted = Counter(label: Name.evicted)
    let fanOutLatency = Metrics.Timer(label: Name.fanOutLatency)
    let liveTopics = Meter(label: Name.liveTopics)
    let topicsLimit = Meter(label: Name.topicsLimit)
    let topicsRefused = Counter(label: Name.topicsRefused)
    let historyBytes = Meter(label: Name.historyBytes)
    let historyLimitBytes = Meter(label: Name.historyLimitBytes)

    /// Creates the metrics in the bootstrapped system: call it after `MetricsSystem.bootstrap`.
    public init() {}

    /// `feed_topics`: set when scraped (the hub's count is asynchronous).
    public func setTopics(_ count: Int) { topics.set(count) }
}

/// Nanoseconds on the monotonic clock: when a notification was received and
/// when its write completed, for ``FeedMetrics/fanOutLatency``.
public func monotonicNanoseconds() -> UInt64 {
    var now = timespec()
    clock_gettime(CLOCK_MONOTONIC, &now)
    return UInt64(now.tv_sec) * 1_000_000_000 + UInt64(now.tv_nsec)
}
