import ArgumentParser
import FeedKit
import Foundation

@main
struct FeedLoad: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "feed-load",
        abstract: "Load-tests feed-server processes with WebSocket clients and checks what they received.",
        discussion: """
        For each connection count: a run with fast clients only, then a run with --slow of \
        them reading 10 messages a second. Prints each run, a table, the checks, and \
        'N passed, N failed' last; exits 1 if a check failed.
        """)

    @Option(help: "host:port of each server, comma-separated; connections and publishes alternate between them.")
    var servers: String = "127.0.0.1:8080"

    @Option(help: "Connection counts, comma-separated: one pair of runs per count.")
    var connections: String = "100"

    @Option(help: "Messages published per second (POST /publish, alternating servers).")
    var rate: Int = 100

    @Option(help: "Seconds of publishing per run.")
    var seconds: Int = 20

    @Option(help: "Share of the connections that are slow, e.g. 5%.")
    var slow: String = "5%"

    @Option(help: "The hub the servers run (checked against /stats): broadcast, lock-stream, actor-channel.")
    var hub: String = "broadcast"

    @Option(help: "The fast clients' policy capacity (newest).")
    var fastCapacity: Int = 250

    @Option(help: "The slow clients' query.")
    var slowQuery: String = "policy=newest&capacity=64"

    @Option(help: "Bytes of padding in each published body (a real message is rarely 60 bytes).")
    var payloadBytes: Int = 256

    @Flag(help: "A short run for CI: 8 s of publishing per run.")
    var smoke = false

    @Option(help: "Topics the clients spread over (client i on topic t(i mod N), message n to topic t(n mod N)); 1 uses the default topic 'feed'.")
    var topics: Int = 1

    @Option(help: "Share of the fast clients that close once they have half their messages, wait --reconnect-pause, and come back with since= and epoch=, e.g. 20%: each must get every message exactly once, in order, across its two connections.")
    var reconnect: String = "0%"

    @Option(help: "Milliseconds a reconnecting client stays away (messages published meanwhile must be recovered).")
    var reconnectPause: Int = 1000

    @Option(help: "Write the report (markdown) to this file as well.")
    var report: String?

    func run() async throws {
        let addresses = servers.split(separator: ",").map(String.init)
        let counts = connections.split(separator: ",").compactMap { Int($0.trimmingCharacters(in: .whitespaces)) }
        guard !addresses.isEmpty, !counts.isEmpty else { throw ValidationError("--servers and --connections need at least one value") }
        guard let slowShare = Double(slow.replacingOccurrences(of: "%", with: "")).map({ $0 / 100 }), slowShare >= 0, slowShare < 1 else {
            throw ValidationError("--slow must look like 5%")
        }
        guard topics >= 1 else { throw ValidationError("--topics must be at least 1") }
        guard let reconnectShare = Double(reconnect.replacingOccurrences(of: "%", with: "")).map({ $0 / 100 }),
              reconnectShare >= 0, reconnectShare <= 1, reconnectPause >= 0 else {
            throw ValidationError("--reconnect must look like 20% and --reconnect-pause be at least 0")
        }
        let options = LoadOptions(
            servers: addresses, rate: rate, seconds: smoke ? min(seconds, 8) : seconds,
            hub: hub, fastCapacity: fastCapacity, slowQuery: slowQuery, payloadBytes: payloadBytes, topics: topics,
            reconnect: reconnectShare, reconnectPause: .milliseconds(reconnectPause))
        var checks = Checks()
        var report = Report(options: options)
        for count in counts {
            let slowCount = slowShare > 0 ? max(1, Int((Double(count) * slowShare).rounded())) : 0
            let baseline = try await LoadRun(options: options, fast: count, slow: 0).execute()
            report.add(baseline)
            baseline.check(into: &checks, baseline: nil)
            if slowCount > 0 {
                let withSlow = try await LoadRun(options: options, fast: count - slowCount, slow: slowCount).execute()
                report.add(withSlow)
                withSlow.check(into: &checks, baseline: baseline)
            }
        }
        let text = report.markdown()
        print(text)
        if let path = self.report { try text.write(toFile: path, atomically: true, encoding: .utf8) }
        checks.printAll()
        if checks.failed > 0 { throw ExitCode(1) }
    }
}
