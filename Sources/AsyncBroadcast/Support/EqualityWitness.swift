/// Finds `==` for a type at run time, so that `BroadcastValue` can skip
/// changes that leave its value equal also when it is created from generic
/// code that knows nothing of `Equatable`.
///
/// Both functions are inlinable: specialized for a concrete `T` in the
/// client, the cast folds to a constant and `==` is called directly.
@usableFromInline
enum EqualityWitness {
    /// `==` for `T` if `T` is `Equatable`, else `nil`.
    @inlinable
    static func comparator<T>(for type: T.Type) -> ((T, T) -> Bool)? {
        guard let equatable = type as? any Equatable.Type else { return nil }
        return comparing(as: equatable, T.self)
    }

    /// `E` is `T` itself (the cast above succeeded), so a `T` may be viewed
    /// as an `E` in place.
    @inlinable
    static func comparing<E: Equatable, T>(as _: E.Type, _: T.Type) -> (T, T) -> Bool {
        { lhs, rhs in
            withUnsafePointer(to: lhs) { lhsPointer in
                withUnsafePointer(to: rhs) { rhsPointer in
                    UnsafeRawPointer(lhsPointer).assumingMemoryBound(to: E.self).pointee
                        == UnsafeRawPointer(rhsPointer).assumingMemoryBound(to: E.self).pointee
                }
            }
        }
    }
}
