import Foundation

/// Deliberate faults, switched on by the environment, so the checks can be
/// shown to catch them (`scripts/smoke.sh` does). Never set in real use.
///
/// `FEED_SERVER_FAULT=skip-gaps`: the server drops like it should but never
/// tells the client: no `gap` frames.
///
/// `FEED_SERVER_FAULT=no-eviction`: a stalled client is never closed (neither
/// a `.bounded` one that stays full nor a `bounded`/`unbounded` one over the
/// byte budget), and its backlog grows without limit.
public enum FaultInjection {
    public static let fault = ProcessInfo.processInfo.environment["FEED_SERVER_FAULT"] ?? ""
    public static let skipGapFrames = fault == "skip-gaps"
    public static let neverEvict = fault == "no-eviction"
}
