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

    public init(metrics: FeedMetrics? = nil) {
        self.metrics = metrics
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
        "rssBytes":\(rss),"cpuSeconds":\(cpu)}
        """
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
