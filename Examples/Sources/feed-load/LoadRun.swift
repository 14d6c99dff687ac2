import AsyncBroadcast
import FeedKit
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import HummingbirdWSClient
import Logging
import Synchronization

struct LoadOptions: Sendable {
    var servers: [String]
    var rate: Int
    var seconds: Int
    var hub: String
    var fastCapacity: Int
    var slowQuery: String
    var payloadBytes: Int
    var topics: Int
    /// Share of the fast clients that leave mid-run and come back with `since` (`--reconnect`).
    var reconnect: Double = 0
    var reconnectPause: Duration = .seconds(1)

    /// Topic `t`'s name: the default topic when there is one topic.
    func topicName(_ t: Int) -> String { topics == 1 ? "feed" : "t\(t)" }
    /// Messages topic `t` gets of the run's `expected` (message n goes to topic n mod N).
    func expected(_ expected: Int, topic t: Int) -> Int { expected / topics + (t < expected % topics ? 1 : 0) }
}

/// The server's `/stats`, as far as the load tool reads it.
struct ServerSample: Sendable {
    var hub = ""
    var subscribers = 0
    var listeningTopics = 0
    var topics = 0
    var rssBytes = 0
    var cpuSeconds = 0.0
}

/// One run: ramp the connections, publish for `seconds`, drain, close, measure.
struct LoadRun {
    let options: LoadOptions
    let fast: Int
    let slow: Int

    struct Result {
        var options: LoadOptions
        var fast: Int
        var slow: Int
        var published: Int
        var publishFailures: Int
        var records: [ClientRecord]
        var publishSeconds: Double
        var deliverySeconds: Double
        var statsBefore: [ServerSample]
        var statsConnected: [ServerSample]
        var statsAfter: [ServerSample]
        var allConnectedSeen: Bool
        var readyCount: Int
        /// `listeningTopics` on every server once the clients had gone (nil: never 0 within 15 s).
        var unlistenedAfter: Double?
        var listeningAtEnd: [Int]
        var maxListening: [Int]
    }

    func execute() async throws -> Result {
        let run = Int.random(in: 1...999_999_999)
        let total = fast + slow
        let expected = options.rate * options.seconds
        let servers = options.servers
        let stop = BroadcastPromise<Void, Never>()
        let counters = RunCounters()
        let logger = Logger(label: "feed-load", factory: { _ in SwiftLogNoOpLogHandler() })
        let statsBefore = try await sampleAll()
        FileHandle.standardError.write(Data("run \(run): \(fast) fast + \(slow) slow clients on \(servers.count) server(s), \(options.hub)\n".utf8))

        // Slow clients every (total / slow)th position, so both servers get some.
        let slowEvery = slow > 0 ? max(1, total / slow) : Int.max
        var made: [ClientRecord] = []
        var slowLeft = slow
        for i in 0..<total {
            let isSlow = slowLeft > 0 && i % slowEvery == slowEvery - 1 || (total - i) == slowLeft
            if isSlow { slowLeft -= 1 }
            // Topics and servers both cycle with i: with as many topics as
            // servers (or a multiple), a topic's clients would all be on one
            // server; shift the topic by the round so each topic spans servers.
            let topic = (i + i / max(1, options.topics) ) % options.topics
            made.append(ClientRecord(server: i % servers.count, servers: servers.count, isSlow: isSlow, run: run,
                                     expected: options.expected(expected, topic: topic), topic: topic, counters: counters))
        }
        // Reconnecting clients: evenly spread over the fast ones (so over servers and topics).
        let fastRecords = made.filter { !$0.isSlow }
        let reconnecting = Int((Double(fastRecords.count) * options.reconnect).rounded())
        if reconnecting > 0 {
            for j in 0..<reconnecting { fastRecords[j * fastRecords.count / reconnecting].reconnects = true }
        }

        // Ramp: at most 64 handshakes at a time.
        let records = made
        let clients = Task {
            await withTaskGroup(of: Void.self) { group in
                var inFlight = 0
                for record in records {
                    let (host, port) = split(servers[record.server])
                    if record.isSlow {
                        let client = SlowClient(host: host, port: port, path: "/feed?topic=\(options.topicName(record.topic))&\(options.slowQuery)", record: record)
                        group.addTask {
                            await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
                                let thread = Thread {
                                    client.run(shouldStop: { counters.stop.load(ordering: .relaxed) })
                                    done.resume()
                                }
                                thread.start()
                            }
                        }
                        continue
                    }
                    // Wait for earlier handshakes while 64 are in flight.
                    while inFlight - counters.ready.load(ordering: .relaxed) - counters.failed.load(ordering: .relaxed) >= 64 && !Task.isCancelled {
                        try? await Task.sleep(for: .milliseconds(5))
                    }
                    inFlight += 1
                    record.started = record.clock.now
                    let url = "ws://\(host):\(port)/feed?topic=\(options.topicName(record.topic))&policy=newest&capacity=\(options.fastCapacity)"
                    let pause = options.reconnectPause
                    group.addTask {
                        do {
                            // A reconnecting client's first connection ends once it has half its
                            // messages; the second asks for what it missed meanwhile.
                            var since = ""
                            while true {
                            try await WebSocketClient.connect(url: url + since, configuration: .init(maxFrameSize: 1 << 16), logger: logger) { inbound, outbound, _ in
                                try await withThrowingTaskGroup(of: Bool.self) { connection in
                                    connection.addTask {
                                        for try await message in inbound.messages(maxSize: 1 << 16) {
                                            if case .text(let text) = message { record.handle(text) }
                                            if record.leaving { break }
                                        }
                                        return true
                                    }
                                    connection.addTask {
                                        try await stop.value
                                        try await outbound.close(.normalClosure, reason: nil)
                                        return false
                                    }
                                    // The reader ends when the connection does: either side closed it.
                                    while let readerEnded = try await connection.next() {
                                        if readerEnded { connection.cancelAll(); break }
                                    }
                                }
                            }
                            guard record.leaving, !counters.stop.load(ordering: .relaxed) else { break }
                            try await Task.sleep(for: pause)
                            since = "&since=\(max(record.lastSeq, record.readySeq))&epoch=\(record.epoch)"
                            record.leaving = false
                            record.reconnected = true
                            }
                        } catch {
                            record.fail("\(error)")
                        }
                    }
                }
            }
        }

        // Wait until every client is ready and /stats counts them all.
        let clock = ContinuousClock()
        let rampDeadline = clock.now + .seconds(60 + total / 20)
        var readyCount = 0
        var allConnectedSeen = false
        var statsConnected = statsBefore
        while clock.now < rampDeadline {
            readyCount = counters.ready.load(ordering: .relaxed)
            let failed = counters.failed.load(ordering: .relaxed)
            if readyCount == total {
                statsConnected = try await sampleAll()
                if statsConnected.reduce(0, { $0 + $1.subscribers }) >= total { allConnectedSeen = true; break }
            }
            if failed > 0 && readyCount + failed >= total { break }
            try await Task.sleep(for: .milliseconds(100))
        }
        statsConnected = try await sampleAll()

        // Publish at the rate, alternating servers, one request at a time:
        // the order in which they return is the publish order.
        let padding = String(repeating: "x", count: max(0, options.payloadBytes))
        let publishStart = clock.now
        var publishFailures = 0
        for n in 0..<expected {
            let due = publishStart + .seconds(Double(n) / Double(options.rate))
            if due > clock.now { try await Task.sleep(until: due) }
            let via = n % servers.count
            // Message n goes to topic n mod N as that topic's k-th message.
            let topic = n % options.topics
            let k = n / options.topics
            let body = #"{"run":\#(run),"topic":\#(topic),"k":\#(k),"via":\#(via),"sent":\#(epochMilliseconds()),"us":\#(wallMicros()),"pad":"\#(padding)"}"#
            if !(await post(servers[via], path: "/publish?topic=\(options.topicName(topic))", body: body)) { publishFailures += 1 }
        }
        let publishSeconds = (clock.now - publishStart).seconds
        counters.catchUp.store(true, ordering: .relaxed)

        // Drain: until every fast client has every message, or 15 s.
        let drainDeadline = clock.now + .seconds(15)
        while clock.now < drainDeadline {
            if counters.complete.load(ordering: .relaxed) + counters.failed.load(ordering: .relaxed) >= fast { break }
            try await Task.sleep(for: .milliseconds(50))
        }
        let statsAfter = try await sampleAll()
        let maxListening = statsConnected.map(\.listeningTopics)
        // Slow clients catch up: until none has read anything for 1 s, or 20 s.
        if slow > 0 {
            let catchUpDeadline = clock.now + .seconds(20)
            var last = -1
            while clock.now < catchUpDeadline {
                try await Task.sleep(for: .seconds(1))
                let now = counters.slowFrames.load(ordering: .relaxed)
                if now == last { break }
                last = now
            }
        }

        counters.stop.store(true, ordering: .relaxed)
        stop.succeed()
        let closeDeadline = Task { try await Task.sleep(for: .seconds(30)); clients.cancel() }
        await clients.value
        closeDeadline.cancel()
        // Every client has ended: its record is safe to read.
        let lastReceive = records.compactMap({ $0.lastReceive }).max() ?? clock.now
        let deliverySeconds = max(0.001, (lastReceive - publishStart).seconds)
        // Let the servers see the closes before the next run's baseline.
        let settleDeadline = clock.now + .seconds(10)
        while clock.now < settleDeadline, (try? await sampleAll().reduce(0, { $0 + $1.subscribers })) ?? 0 > 0 {
            try await Task.sleep(for: .milliseconds(100))
        }
        // And the LISTENs: every topic UNLISTENs once its clients have gone
        // (the broadcast hub 5 s after), so the next run starts from none.
        let gone = clock.now
        let unlistenDeadline = gone + .seconds(15)
        var unlistenedAfter: Double?
        var listeningAtEnd = maxListening
        while clock.now < unlistenDeadline {
            listeningAtEnd = try await sampleAll().map(\.listeningTopics)
            if listeningAtEnd.allSatisfy({ $0 == 0 }) { unlistenedAfter = (clock.now - gone).seconds; break }
            try await Task.sleep(for: .milliseconds(100))
        }

        return Result(
            options: options, fast: fast, slow: slow, published: expected, publishFailures: publishFailures,
            records: records, publishSeconds: publishSeconds, deliverySeconds: deliverySeconds,
            statsBefore: statsBefore, statsConnected: statsConnected, statsAfter: statsAfter,
            allConnectedSeen: allConnectedSeen, readyCount: readyCount,
            unlistenedAfter: unlistenedAfter, listeningAtEnd: listeningAtEnd, maxListening: maxListening)
    }

    func sampleAll() async throws -> [ServerSample] {
        var samples: [ServerSample] = []
        for server in options.servers { samples.append(await sample(server)) }
        return samples
    }
}

func split(_ server: String) -> (String, Int) {
    let parts = server.split(separator: ":")
    return (String(parts.first ?? "127.0.0.1"), parts.count > 1 ? Int(parts[1]) ?? 80 : 80)
}

func sample(_ server: String) async -> ServerSample {
    guard let data = await get(server, path: "/stats"),
          let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any]
    else { return ServerSample() }
    return ServerSample(
        hub: object["hub"] as? String ?? "",
        subscribers: (object["subscribers"] as? NSNumber)?.intValue ?? 0,
        listeningTopics: (object["listeningTopics"] as? NSNumber)?.intValue ?? 0,
        topics: (object["topics"] as? NSNumber)?.intValue ?? 0,
        rssBytes: (object["rssBytes"] as? NSNumber)?.intValue ?? 0,
        cpuSeconds: (object["cpuSeconds"] as? NSNumber)?.doubleValue ?? 0)
}

let session: URLSession = {
    let configuration = URLSessionConfiguration.ephemeral
    configuration.timeoutIntervalForRequest = 10
    configuration.httpMaximumConnectionsPerHost = 4
    return URLSession(configuration: configuration)
}()

func get(_ server: String, path: String) async -> Data? {
    guard let url = URL(string: "http://\(server)\(path)"),
          let (data, response) = try? await session.data(from: url),
          (response as? HTTPURLResponse)?.statusCode == 200
    else { return nil }
    return data
}

func post(_ server: String, path: String, body: String) async -> Bool {
    guard let url = URL(string: "http://\(server)\(path)") else { return false }
    var request = URLRequest(url: url)
    request.httpMethod = "POST"
    request.httpBody = Data(body.utf8)
    guard let (_, response) = try? await session.data(for: request) else { return false }
    return (response as? HTTPURLResponse)?.statusCode == 200
}

extension Duration {
    var seconds: Double { Double(components.seconds) + Double(components.attoseconds) / 1e18 }
}
