// The floor: what fanning M Ints out to N buffers costs with no concurrency
// at all, so that every table shows how far each peer is from it.
//
// One thread, no tasks, no locks, no atomics, no wake-ups, no allocation in
// the timed part. Per chunk of `floorChunk` elements: each element is copied
// into each of the N rings in turn (element by element, as a `send` visits
// every subscriber), then each ring is drained into that subscriber's
// `Tally` (count, sum, order: the same bookkeeping the other peers'
// consumers do). A ring is a power-of-two array of slots with its own head
// and tail, allocated separately per subscriber before the clock starts.
//
// What it leaves out is exactly what a broadcaster adds: handing elements to
// other threads (publication, cache-line transfers), waking consumers, the
// consumers' `next()` calls, buffer growth. The tallies are checked like any
// other run's, so the optimiser cannot drop the copies: every value read
// back out of a ring reaches the checked sum.

/// Elements per chunk, and each ring's capacity (the SPSC ring's first
/// segment held 64 too when the floor was written; it now holds 16 `Int`s
/// and grows, and a consumer that lags by a chunk lives in a 64-slot one).
let floorChunk = 64

public enum FloorPeer {
    public static let name = "floor (1 thread, N rings)"
}

/// One subscriber's ring in the floor run.
struct FloorRing {
    var slots: UnsafeMutablePointer<Int>
    var head = 0
    var tail = 0
}

/// Copies `items` into `n` rings and drains them, single-threaded; ns per
/// delivery over M·N.
@inline(never)
public func runFloor(items: [Int], subscribers n: Int, meter: AllocMeter?) -> RunResult {
    let mask = floorChunk - 1
    let rings = UnsafeMutableBufferPointer<FloorRing>.allocate(capacity: n)
    for r in 0..<n { (rings.baseAddress! + r).initialize(to: FloorRing(slots: .allocate(capacity: floorChunk))) }
    var tallies = [Tally](repeating: Tally(), count: n)
    let m = items.count

    meter?.start()
    let t0 = nowNanos()
    items.withUnsafeBufferPointer { source in
        tallies.withUnsafeMutableBufferPointer { tallies in
            var lo = 0
            while lo < m {
                let hi = Swift.min(lo + floorChunk, m)
                for i in lo..<hi {
                    let value = source[i]
                    for r in 0..<n {
                        rings[r].slots[rings[r].tail & mask] = value
                        rings[r].tail &+= 1
                    }
                }
                for r in 0..<n {
                    var ring = rings[r]
                    var tally = tallies[r]
                    while ring.head != ring.tail {
                        tally.add(ring.slots[ring.head & mask])
                        ring.head &+= 1
                    }
                    rings[r] = ring
                    tallies[r] = tally
                }
                lo = hi
            }
        }
    }
    let t1 = nowNanos()
    let mallocs = meter?.stop()

    for r in 0..<n { rings[r].slots.deallocate() }
    rings.deallocate()
    return RunResult(nanos: t1 &- t0, units: m * n, mallocs: mallocs,
                     error: checkAll(tallies, .all(count: m, ordered: true)))
}
