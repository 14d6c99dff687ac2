import NIOConcurrencyHelpers
import NIOCore
import NIOWebSocket

/// Writes a batch of text frames to one WebSocket connection with one flush.
///
/// hummingbird-websocket's `WebSocketOutboundWriter` (swift-websocket 1.6.2,
/// `WebSocketHandler.write(frame:)`) takes one frame per call, through a hop
/// onto its `WebSocketHandler` actor, and swift-nio's `NIOAsyncChannelHandler`
/// flushes after each (`_doOutboundWrite`): one `writev` per frame, which was
/// about half of the broadcast server's time at 1,000 connections
/// (`results/2026-11-26-perf-before.txt`). Nothing public there writes
/// several frames with one flush, so this writer goes below it: one
/// event-loop task writes the frames through a handler of ours placed just
/// before NIO's frame encoder, then flushes once.
///
/// At most two batches are in flight: ``write(_:)`` returns once its batch is
/// handed to the event loop, after waiting for the previous batch to reach
/// the socket. A fast client's previous batch is long written when the next
/// one comes, so its pump does not wait at all; a slow client's pump stays
/// blocked on its full socket, and its policy sees it fall behind, as before
/// (NIO's buffer holds at most the two batches).
///
/// The server configures no WebSocket extension (no compression), so the
/// frames need none of `WebSocketHandler`'s processing. The close handshake
/// stays Hummingbird's, but for an evicted client's close frame, which
/// ``close(code:reason:)`` writes behind the batches. Once a close frame has
/// gone out through the pipeline, ``CloseGate`` refuses every later frame,
/// so none can follow it (RFC 6455, 5.5.1): Hummingbird's own close after
/// ours is dropped.
public struct FeedFrameWriter: Sendable {
    let channel: any Channel
    let gate: NIOLoopBound<CloseGate>
    /// Batches whose write completed (on the event loop), and whether one failed.
    let completed = NIOLockedValueBox<(count: Int, failed: (any Error)?)>((0, nil))
    private var issued = 0
    private var previous: EventLoopFuture<Void>?

    /// Installs the gate on an upgraded WebSocket channel (after NIO's
    /// `WebSocketFrameEncoder`, so every outbound frame passes it).
    public static func install(on channel: any Channel) async throws -> FeedFrameWriter {
        try await channel.eventLoop.submit {
            let gate = CloseGate()
            let pipeline = channel.pipeline.syncOperations
            let encoder = try pipeline.handler(type: WebSocketFrameEncoder.self)
            try pipeline.addHandler(gate, position: .after(encoder))
            return FeedFrameWriter(channel: channel, gate: NIOLoopBound(gate, eventLoop: channel.eventLoop))
        }.get()
    }

    private init(channel: any Channel, gate: NIOLoopBound<CloseGate>) {
        self.channel = channel
        self.gate = gate
    }

    /// Hands `frames` (text, final) to the event loop, to be written in order
    /// with one flush, once the previous batch is in the socket. Throws if
    /// the connection closed, sent its close frame, or failed a write;
    /// throws `CancellationError` at once when the task is cancelled while
    /// it waits.
    public mutating func write(_ frames: [ByteBuffer], isolation: isolated (any Actor)? = #isolation) async throws {
        guard !frames.isEmpty else { return }
        try Task.checkCancellation()
        let (count, failed) = completed.withLockedValue { $0 }
        if let failed { throw failed }
        if count < issued, let previous {
            try await WriteWait.wait(for: previous)
        }
        let promise = channel.eventLoop.makePromise(of: Void.self)
        let gate = self.gate
        let completed = self.completed
        promise.futureResult.whenComplete { result in
            completed.withLockedValue { state in
                state.count += 1
                if case .failure(let error) = result, state.failed == nil { state.failed = error }
            }
        }
        onLoop { gate.value.write(frames, promise: promise) }
        issued += 1
        previous = promise.futureResult
    }

    /// Writes a close frame behind every batch handed over so far and
    /// returns once it is in the socket (or throws if the connection closed
    /// first, or `CancellationError` when the task is cancelled).
    ///
    /// hummingbird-websocket's own close cannot be awaited that far: its
    /// writer hands the frame to NIO and returns while our batches still
    /// hold the socket, and its close handshake then ends at once (the
    /// connection's reader is gone), closing the channel with the close
    /// frame still queued. A slow client that read again got its backlog and
    /// no close frame. Once this frame is out, the gate refuses
    /// hummingbird-websocket's.
    public func close(code: WebSocketErrorCode, reason: String) async throws {
        var data = channel.allocator.buffer(capacity: 2 + reason.utf8.count)
        data.write(webSocketErrorCode: code)
        data.writeString(reason)
        let frame = WebSocketFrame(fin: true, opcode: .connectionClose, data: data)
        let promise = channel.eventLoop.makePromise(of: Void.self)
        let gate = self.gate
        onLoop { gate.value.writeClose(frame, promise: promise) }
        try await WriteWait.wait(for: promise.futureResult)
    }

    /// Runs `body` on the channel's event loop: in place when already there
    /// (the pump runs on it, ``EventLoopActor``), else as a task for it.
    private func onLoop(_ body: @escaping @Sendable () -> Void) {
        if channel.eventLoop.inEventLoop {
            body()
        } else {
            channel.eventLoop.execute(body)
        }
    }
}

/// Sits before NIO's WebSocket frame encoder: writes our batches, and
/// refuses any frame after a close frame.
final class CloseGate: ChannelOutboundHandler, RemovableChannelHandler {
    typealias OutboundIn = WebSocketFrame
    typealias OutboundOut = WebSocketFrame

    private var context: ChannelHandlerContext?
    private var closeSent = false

    func handlerAdded(context: ChannelHandlerContext) { self.context = context }
    func handlerRemoved(context: ChannelHandlerContext) { self.context = nil }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        let frame = unwrapOutboundIn(data)
        if closeSent {
            promise?.fail(ChannelError.outputClosed)
            return
        }
        if frame.opcode == .connectionClose { closeSent = true }
        context.write(data, promise: promise)
    }

    func writeClose(_ frame: WebSocketFrame, promise: EventLoopPromise<Void>) {
        guard let context, !closeSent else {
            promise.fail(ChannelError.outputClosed)
            return
        }
        closeSent = true
        context.writeAndFlush(wrapOutboundOut(frame), promise: promise)
    }

    func write(_ frames: [ByteBuffer], promise: EventLoopPromise<Void>) {
        guard let context, !closeSent else {
            promise.fail(ChannelError.outputClosed)
            return
        }
        for (index, frame) in frames.enumerated() {
            let data = wrapOutboundOut(WebSocketFrame(fin: true, opcode: .text, data: frame))
            context.write(data, promise: index == frames.count - 1 ? promise : nil)
        }
        context.flush()
    }
}

@available(*, unavailable)
extension CloseGate: Sendable {}

/// An actor whose executor is one NIO event loop (swift-nio's
/// `EventLoop.executor`): code isolated to it runs on that loop's thread,
/// where the channel's pipeline can be written without a hop.
actor EventLoopActor {
    private let executor: any SerialExecutor

    init(_ loop: any EventLoop) {
        executor = loop.executor
    }

    nonisolated var unownedExecutor: UnownedSerialExecutor { executor.asUnownedSerialExecutor() }
}

/// Waits for a write's future, or for the task's cancellation, whichever
/// comes first: a write stuck on a full socket must not hold the pump (the
/// connection waits for it before closing). The continuation is resumed
/// exactly once, never under the lock.
final class WriteWait: Sendable {
    private enum State {
        case idle
        case waiting(CheckedContinuation<Void, any Error>)
        case resolved(Result<Void, any Error>)
        case done
    }
    private let state = NIOLockedValueBox<State>(.idle)

    static func wait(for future: EventLoopFuture<Void>) async throws {
        let wait = WriteWait()
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                wait.arm(continuation)
                future.whenComplete { wait.resolve($0) }
            }
        } onCancel: {
            wait.resolve(.failure(CancellationError()))
        }
    }

    private func arm(_ continuation: CheckedContinuation<Void, any Error>) {
        let early: Result<Void, any Error>? = state.withLockedValue { state in
            if case .resolved(let result) = state {
                state = .done
                return result
            }
            state = .waiting(continuation)
            return nil
        }
        if let early { continuation.resume(with: early) }
    }

    private func resolve(_ result: Result<Void, any Error>) {
        let waiting: CheckedContinuation<Void, any Error>? = state.withLockedValue { state in
            switch state {
            case .idle:
                state = .resolved(result)
                return nil
            case .waiting(let continuation):
                state = .done
                return continuation
            case .resolved, .done:
                return nil
            }
        }
        waiting?.resume(with: result)
    }
}
