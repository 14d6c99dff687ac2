/// What a subscriber's events reader takes (``BroadcastSequence/Subscription/events``):
/// an element, or how many elements its buffering policy dropped at this
/// point of its stream (tokio's `Lagged(n)`).
///
/// ```swift
/// for try await event in subscription.events {
///     switch event {
///     case .element(let quote): show(quote)
///     case .lagged(let missed): showGap(missed)   // `missed` quotes were dropped here
///     }
/// }
/// ```
public enum BroadcastEvent<Element: Sendable>: Sendable {
    /// The next element of the subscriber's stream.
    case element(Element)
    /// `n ≥ 1` elements were dropped here, between the events before and
    /// after this one (see "Lag in-band" in Semantics.md for where each
    /// policy puts it).
    /// <!-- restates: EVENTS-LAGGED-WHERE-DROPPED -->
    case lagged(Int)
}

extension BroadcastEvent: Equatable where Element: Equatable {}
extension BroadcastEvent: Hashable where Element: Hashable {}
