/// Frees most of an array's storage once it is mostly empty.
///
/// Registries and parked lists only ever grew: after a burst of 100,000
/// subscribers the sequence kept their capacity for life. This reallocates
/// at half the old capacity's worth of room once the array uses under a
/// quarter of it (and more than `minimumCapacity` is reserved), so the
/// copy is amortized O(1) per removal and a steady population never
/// reallocates. Call it under the owner's lock: it runs no user code (the
/// elements are moved, none is released for good).
@inlinable
func shrinkIfSparse<T>(_ array: inout [T], minimumCapacity: Int = 64) {
    let capacity = array.capacity
    guard capacity > minimumCapacity, array.count < capacity / 4 else { return }
    var smaller: [T] = []
    smaller.reserveCapacity(Swift.max(array.count * 2, minimumCapacity))
    smaller.append(contentsOf: array)
    array = smaller
}
