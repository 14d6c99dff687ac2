import Testing
@_spi(Testing) @testable import AsyncBroadcast

/// Registries and parked lists give memory back after a burst.
struct SparseArrayTests {
    @Test func aMostlyEmptyArrayIsReallocatedSmaller() {
        var array = Array(0..<1000)
        while array.count > 10 {
            array.removeLast()
            shrinkIfSparse(&array)
        }
        #expect(array == Array(0..<10))
        #expect(array.capacity <= 128)
    }

    @Test func aSteadyArrayIsLeftAlone() {
        var array = Array(0..<100)
        array.reserveCapacity(200)
        let capacity = array.capacity
        shrinkIfSparse(&array)  // 100 of ≥ 200: not sparse
        #expect(array.capacity == capacity)
    }

    @Test func theSequenceRegistryShrinksAfterABurst() {
        let sequence = BroadcastSequence(of: Int.self)
        var burst = (0..<2000).map { _ in sequence.subscribe() }
        let grown = sequence.storage.lock.withLock { sequence.storage.state.subscribers.capacity }
        #expect(grown >= 2000)
        let keeper = burst.removeFirst()
        for subscription in burst { subscription.cancel() }
        burst.removeAll()
        let after = sequence.storage.lock.withLock { sequence.storage.state.subscribers.capacity }
        #expect(after <= 128)
        sequence.send(1)
        guard case .element(1) = keeper.poll() else { Issue.record("the remaining subscriber missed the send"); return }
    }

    @Test func theValueRegistryShrinksAfterABurst() {
        let value = BroadcastValue(0)
        var burst = (0..<2000).map { _ in value.subscribe() }
        let keeper = burst.removeFirst()
        for subscription in burst { subscription.cancel() }
        burst.removeAll()
        let after = value.storage.withState { state, _ in state.subscribers.capacity }
        #expect(after <= 128)
        value.send(1)
        #expect(value.subscriberCount == 1)
        withExtendedLifetime(keeper) {}
    }
}
