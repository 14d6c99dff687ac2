import AsyncAlgorithms
import Foundation
import Logging

/// The hub of Hummingbird's websocket-chat example: an actor holding an
/// `AsyncChannel` per connection, sending to each in turn.
///
/// `AsyncChannel.send` waits until that connection's reader takes the
/// element, so one slow connection holds up the loop for everyone behind it,
/// and the notifications queue up in front of the hub. Nothing is ever
/// dropped, so there are no gaps to report. It LISTENs from start-up.
public final class ActorChannelHub: FeedHub {
    public let name = "actor-channel"
    public let listening = ListenState(false)
    private let loop: ListenLoop
    private let connections = Connections()

    actor Connections {
        var channels: [UUID: AsyncChannel<FeedEvent>] = [:]

        func add(_ id: UUID, _ channel: AsyncChannel<FeedEvent>) { channels[id] = channel }
        func remove(_ id: UUID) { channels[id] = nil }
        var count: Int { channels.count }

        func send(_ event: FeedEvent) async {
            for channel in channels.values {
                await channel.send(event)
            }
        }
    }

    public init(target: PostgresTarget, sequence: Sequencer, logger: Logger) {
        loop = ListenLoop(target: target, listening: listening, sequence: sequence, logger: logger)
    }

    public func run() async {
        await loop.run { event in await self.connections.send(event) }
    }

    public func subscribe(_ query: FeedQuery) async -> Subscription {
        let channel = AsyncChannel<FeedEvent>()
        let id = UUID()
        await connections.add(id, channel)
        return Subscription(channel: channel, remove: { [connections] in
            channel.finish()
            Task { await connections.remove(id) }
        })
    }

    public func watchOnline(_ body: @Sendable (Int) async throws -> Void) async throws {
        while true {
            try await body(await connections.count)
            try await Task.sleep(for: .seconds(1))
        }
    }

    public struct Subscription: FeedSubscription {
        let channel: AsyncChannel<FeedEvent>
        let remove: @Sendable () -> Void
        public var droppedCount: Int { 0 }
        public var bufferedCount: Int { 0 }
        public func cancel() { remove() }
        public func makeAsyncIterator() -> AsyncChannel<FeedEvent>.AsyncIterator { channel.makeAsyncIterator() }
    }
}
