/// What feeds a shared sequence, with the upstream's type erased (the
/// storage is generic over the element and failure only).
@usableFromInline
enum SharedSource<Element: Sendable, Failure: Error>: Sendable {
    /// Launches the task that iterates a fresh upstream for run `generation`.
    case upstream(launch: @Sendable (BroadcastStorage<Element, Failure>, UInt64) -> Task<Void, Never>)
    /// Registers a listener; returns its unregister closure.
    case listener(register: @Sendable (BroadcastSink<Element, Failure>) -> @Sendable () -> Void)
    /// Sets a listener up in a task the library owns; returns its take-down.
    case asyncListener(listen: @Sendable (BroadcastSink<Element, Failure>) async -> @Sendable () async -> Void)

    @usableFromInline var runsAreTasks: Bool {
        switch self {
        case .upstream, .asyncListener: return true
        case .listener: return false
        }
    }

    @usableFromInline var hasListener: Bool {
        switch self {
        case .listener, .asyncListener: return true
        case .upstream: return false
        }
    }

    @usableFromInline var awaitsTakeDown: Bool {
        if case .asyncListener = self { return true }
        return false
    }
}

/// A shared sequence's configuration, handed to its storage.
@usableFromInline
struct Sharing<Element: Sendable, Failure: Error>: Sendable {
    @usableFromInline let start: BroadcastStart
    @usableFromInline let source: SharedSource<Element, Failure>
    /// Called under the sequence lock in the section that decides a run's
    /// start (a topic's `ListenerActivity`): whoever takes that lock after
    /// it, a `finish()` then `listenersStopped()` among them, sees the run
    /// counted, although `register` or `listen` has not been called yet.
    @usableFromInline let startDecided: (@Sendable () -> Void)?

    @usableFromInline
    init(start: BroadcastStart, source: SharedSource<Element, Failure>, startDecided: (@Sendable () -> Void)? = nil) {
        self.start = start
        self.source = source
        self.startDecided = startDecided
    }
}

extension SharedSource {
    /// Each run calls `makeUpstream()` inside a task the library owns and
    /// iterates it with typed throws.
    @available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
    @inlinable
    static func typed<Upstream: AsyncSequence & Sendable>(
        _ makeUpstream: @escaping @Sendable () -> Upstream
    ) -> SharedSource where Upstream.Element == Element, Upstream.Failure == Failure {
        .upstream { storage, generation in
            Task.detached {
                var iterator = makeUpstream().makeAsyncIterator()
                var end: BroadcastState<Element, Failure>.Terminal? = nil
                do throws(Failure) {
                    while true {
                        guard let element = try await iterator.next(isolation: nil) else {
                            end = .finished
                            break
                        }
                        // `false`: this run was stopped or the sequence finished.
                        guard await storage.emitFromUpstream(element, generation: generation) else { break }
                    }
                } catch {
                    end = .failed(error)
                }
                storage.runEnded(generation: generation, end: end, taskReturned: true)
            }
        }
    }
}

extension SharedSource where Failure == any Error {
    /// `typed` for systems without `AsyncSequence.Failure` (before macOS 15 /
    /// iOS 18): iterates with the untyped `next()`.
    ///
    /// The loop repeats `typed`'s on purpose: sharing it would mean passing
    /// `next` as a typed-throws closure, and typed-throws function types
    /// need the macOS 15 runtime, which this form must not.
    @inlinable
    static func untyped<Upstream: AsyncSequence & Sendable>(
        _ makeUpstream: @escaping @Sendable () -> Upstream
    ) -> SharedSource where Upstream.Element == Element {
        .upstream { storage, generation in
            Task.detached {
                var iterator = makeUpstream().makeAsyncIterator()
                var end: BroadcastState<Element, Failure>.Terminal? = nil
                do {
                    while true {
                        guard let element = try await iterator.next() else {
                            end = .finished
                            break
                        }
                        // `false`: this run was stopped or the sequence finished.
                        guard await storage.emitFromUpstream(element, generation: generation) else { break }
                    }
                } catch {
                    end = .failed(error)
                }
                storage.runEnded(generation: generation, end: end, taskReturned: true)
            }
        }
    }
}
