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
/// before NIO's frame encoder, then flushes once, and the caller waits for
/// the last write to reach the socket (a slow client's pump stays blocked,
/// and its policy sees it fall behind, as before).
///
/// The server configures no WebSocket extension (no compression), so the
/// frames need none of `WebSocketHandler`'s processing. The close handshake
/// stays Hummingbird's: once a close frame has gone out through the
/// pipeline, ``CloseGate`` refuses every later frame, so none of ours can
/// follow it (RFC 6455, 5.5.1).
public struct FeedFrameWriter: Sendable {
    let channel: any Channel
    let gate: NIOLoopBound<CloseGate>

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

    /// Writes `frames` (text, final) in order with one flush, and returns
    /// once the last is in the socket. Throws if the connection closed or
    /// sent its close frame; throws `CancellationError` at once when the
    /// task is cancelled (the frames may still go out, ahead of a close frame).
    public func write(_ frames: [ByteBuffer]) async throws {
        guard !frames.isEmpty else { return }
        try Task.checkCancellation()
        let promise = channel.eventLoop.makePromise(of: Void.self)
        let gate = self.gate
        channel.eventLoop.execute {
            gate.value.write(frames, promise: promise)
        }
        try await WriteWait.wait(for: promise.futureResult)
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
