import Testing
@_spi(Testing) @testable import AsyncBroadcast

/// A send to more subscribers than one wake chunk (`BroadcastState.wakeChunk`,
/// 128) and past the prefetch threshold (512): every parked reader, in
/// every chunk including a partial last one, is woken with its element.
/// A chunk boundary that skipped a subscriber would leave its reader
/// parked, and the deadline would name it.
@Suite struct LargeWakeTests {
    static let readerCount = 2 * 256 + 128 + 37  // 677: five whole chunks and a partial one

    @Test(arguments: [false, true])
    func everyParkedReaderInEveryChunkIsWoken(batch: Bool) async throws {
        #expect(BroadcastState<Int, Never>.wakeChunk == 128, "the reader count is chosen around a chunk of 128")
        let sequence = BroadcastSequence(of: Int.self)
        let policies: [BroadcastBufferingPolicy] = [.unbounded, .bounded(4), .bufferingNewest(2), .bufferingOldest(3)]
        let subscriptions = (0..<Self.readerCount).map { sequence.subscribe(bufferingPolicy: policies[$0 % policies.count]) }
        let readers = subscriptions.map { subscription in
            Task {
                var iterator = subscription.makeAsyncIterator()
                return await iterator.next()
            }
        }
        try await waitUntil("all \(Self.readerCount) readers parked") {
            subscriptions.allSatisfy { $0.isConsumerWaiting }
        }
        if batch {
            _ = sequence.send(contentsOf: [7, 8])
        } else {
            _ = sequence.send(7)
        }
        for (index, reader) in readers.enumerated() {
            let value = try await withDeadline("reader \(index) of \(Self.readerCount) woken") { await reader.value }
            #expect(value == 7, "reader \(index) got \(String(describing: value))")
        }
    }
}
