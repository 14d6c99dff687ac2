import Foundation
import Synchronization

/// What `GET /stats` reports. Counters only: the connections update them
/// with relaxed atomics, off every lock. With ``FeedMetrics``, every change
/// goes to the metrics too (`GET /metrics`), from the same call.
public final class ServerStats: Sendable {
    public let subscribers = Atomic<Int>(0)
    public let delivered = Atomic<Int>(0)
    public let dropped = Atomic<Int>(0)
    public let evicted = Atomic<Int>(0)
    public let connectionsTotal = Atomic<Int>(0)
    /// Batches the pumps wrote, each with one flush: below `delivered` when batches held several.
    public let writes = Atomic<Int>(0)
    /// Where the counters also go; nil: `/stats` only (`feed-server --no-metrics`).
    public let metrics: FeedMetrics?
    /// The process's topics, their cap and their recovery windows' bytes, when given.
    public let sequencers: Sequencers?
    private let refusalsReported = Atomic<Int>(0)

    public init(metrics: FeedMetrics? = nil, sequencers: Sequencers? = nil) {
        self.metrics = metrics
        self.sequencers = sequencers
        if let metrics, let sequencers {
            metrics.topicsLimit.set(sequencers.maximumTopics)
            metrics.historyLimitBytes.set(sequencers.budget?.limit ?? 0)
        }
    }

    /// Sets the gauges that are read rather than counted, when `/metrics` is scraped.
    public func scraped(topics: Int) {
        guard let metrics else { return }
        metrics.setTopics(topics)
        guard let sequencers else { return }
        metrics.liveTopics.set(sequencers.count)
        metrics.historyBytes.set(sequencers.budget?.held ?? 0)
        let refused = sequencers.refused
        let before = refusalsReported.exchange(refused, ordering: .relaxed)
        if refused > before { metrics.topicsRefused.increment(by: refused - before) }
    }

    public enum Counter: Sendable { case subscribers, delivered, dropped, evicted, connectionsTotal, writes }

    public func add(_ counter: Counter, _ n: Int = 1) {
        switch counter {
        case .subscribers: subscribers.add(n, ordering: .relaxed)
        case .delivered: delivered.add(n, ordering: .relaxed)
        case .dropped: dropped.add(n, ordering: .relaxed)
        case .evicted: evicted.add(n, ordering: .relaxed)
        case .connectionsTotal: connectionsTotal.add(n, ordering: .relaxed)
        case .writes: writes.add(n, ordering: .relaxed)
        }
        guard let metrics else { return }
        switch counter {
        case .subscribers: metrics.subscribers.increment(by: Double(n))
        case .delivered: if !FaultInjection.metricsMissDelivered { metrics.delivered.increment(by: n) }
        case .dropped: metrics.dropped.increment(by: n)
        case .evicted: metrics.evicted.increment(by: n)
        case .connectionsTotal, .writes: break
        }
    }

    /// One observation of `feed_fanout_latency_seconds`: call it once a
    /// connection's write of `message` has completed (beside `add(.delivered)`).
    public func observeFanOut(of message: FeedMessage) {
        guard let metrics else { return }
        let now = monotonicNanoseconds()
        metrics.fanOutLatency.recordNanoseconds(Int64(clamping: now &- min(now, message.received)))
    }

    /// The JSON body of `GET /stats`.
    /// `connections`: TCP connections open now (HTTP and WebSocket), when the server counts them.
    /// `listeningTopics`: topics LISTENed now (`listening` is whether any is);
    /// `topics`: topics live in the hub.
    public func json(hub: String, listeningTopics: Int, topics: Int, connections: Int? = nil) -> String {
        let (rss, cpu) = Self.processUsage()
        return """
        {"hub":"\(hub)","listening":\(listeningTopics > 0),"listeningTopics":\(listeningTopics),"topics":\(topics),\
        "subscribers":\(subscribers.load(ordering: .relaxed)),\
        "connectionsTotal":\(connectionsTotal.load(ordering: .relaxed)),\
        "delivered":\(delivered.load(ordering: .relaxed)),"dropped":\(dropped.load(ordering: .relaxed)),\
        "evicted":\(evicted.load(ordering: .relaxed)),"writes":\(writes.load(ordering: .relaxed)),\(connections.map { "\"connections\":\($0)," } ?? "")\
        \(sequencers.map(Self.limitsJSON) ?? "")\
        "rssBytes":\(rss),"cpuSeconds":\(cpu)}
        """
    }

    /// `liveTopics` (with a connection or a LISTEN: what `--max-topics`
    /// caps), `topicsLimit`, `topicsRefused`, `historyBytes` (every recovery
    /// window together) and `historyLimitBytes` (`--history-bytes`), each
    /// followed by a comma.
    static func limitsJSON(_ sequencers: Sequencers) -> String {
        #""liveTopics":\#(sequencers.count),"topicsLimit":\#(sequencers.maximumTopics),"topicsRefused":\#(sequencers.refused),"#
            + #""historyBytes":\#(sequencers.budget?.held ?? 0),"historyLimitBytes":\#(sequencers.budget?.limit ?? 0),"#
    }

    /// Resident set size (from /proc/self/statm) and user+system CPU seconds.
    public static func processUsage() -> (rssBytes: Int, cpuSeconds: Double) {
        var rss = 0
        if let statm = try? String(contentsOfFile: "/proc/self/statm", encoding: .utf8) {
            let fields = statm.split(separator: " ")
            if fields.count > 1, let pages = Int(fields[1]) { rss = pages * Int(sysconf(Int32(_SC_PAGESIZE))) }
        }
        var usage = rusage()
        getrusage(__rusage_who_t(RUSAGE_SELF.rawValue), &usage)
        let cpu = Double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec)
            + Double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1_000_000
        return (rss, (cpu * 1000).rounded() / 1000)
    }
}
