/// SplitMix64: a tiny, fast, seedable PRNG, shared by the stress tool and
/// `LitmusPair`. Its own integer helpers (not `Int.random(in:using:)`) keep a
/// seed's round sequence stable. Not part of AsyncBroadcast's API.
public struct SplitMix64: RandomNumberGenerator, Sendable {
    private var state: UInt64

    public init(seed: UInt64) { state = seed }

    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    /// Uniform in `range` (modulo bias is negligible for our small ranges).
    public mutating func int(in range: ClosedRange<Int>) -> Int {
        let span = UInt64(range.upperBound - range.lowerBound) + 1
        return range.lowerBound + Int(next() % span)
    }

    /// `true` with probability `p`.
    public mutating func chance(_ p: Double) -> Bool {
        Double(next() >> 11) / Double(1 << 53) < p
    }

    public mutating func pick<T>(_ choices: [T]) -> T {
        choices[int(in: 0...(choices.count - 1))]
    }

    /// Picks an index by weight.
    public mutating func weighted(_ weights: [Int]) -> Int {
        var roll = int(in: 0...(weights.reduce(0, +) - 1))
        for (index, weight) in weights.enumerated() {
            if roll < weight { return index }
            roll -= weight
        }
        return weights.count - 1
    }

    /// A fresh seed for a sub-generator.
    public mutating func fork() -> UInt64 { next() }
}
