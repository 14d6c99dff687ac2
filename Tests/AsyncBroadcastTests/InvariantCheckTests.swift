import Testing
@_spi(Testing) @testable import AsyncBroadcast

/// Each `_checkInvariants()` catches a deliberately broken structure. They
/// exist only in builds with `ASYNCBROADCAST_INTERNAL_CHECKS` (CI's debug,
/// ThreadSanitizer and fuzz builds), so these tests run only there.
@Suite(.enabled(if: internalChecksEnabled, "needs ASYNCBROADCAST_INTERNAL_CHECKS=1"))
struct InvariantCheckTests {
    @Test func ringBufferCheckCatchesABadCount() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            var ring = RingBuffer<Int>(initialCapacity: 4)
            ring.append(1)
            ring.count = 9  // the fault: more than the capacity
            ring._checkInvariants()
            ring.count = 1
        }
        expectMessage(result, "AsyncBroadcast internal inconsistency (please report): ring count 9 outside 0...4")
    }

    @Test func spscRingCheckCatchesAStaleTail() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let block = AtomicBlock(wordCount: 16, extraBytes: SPSCSegment<Int>.byteCount(capacity: 4), extraAlignment: 8)
            let ring = SPSCRing<Int>(producerWords: block.word(0), consumerWords: block.word(8),
                                     firstSegment: block.extra(wordCount: 16, extraAlignment: 8), capacity: 4)
            ring.push(1)
            block.word(0).storeRelease(5)  // the fault: published tail ahead of the producer
            ring._checkProducerInvariants()
        }
        expectMessage(result, "published tail 5 != producer tail 1")
    }

    @Test func spscRingCheckCatchesALinkedProducerSegment() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let block = AtomicBlock(wordCount: 16, extraBytes: SPSCSegment<Int>.byteCount(capacity: 4), extraAlignment: 8)
            let ring = SPSCRing<Int>(producerWords: block.word(0), consumerWords: block.word(8),
                                     firstSegment: block.extra(wordCount: 16, extraAlignment: 8), capacity: 4)
            ring.push(1)
            // The fault: a successor linked without closing the segment.
            ring.producerSegment.next = SPSCSegment<Int>.allocate(base: 4, capacity: 8)
            ring._checkProducerInvariants()
        }
        expectMessage(result, "the producer's segment has a successor")
    }

    @Test func registryCheckCatchesSwappedIndices() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let sequence = BroadcastSequence(of: Int.self)
            let first = sequence.subscribe()
            let second = sequence.subscribe()
            sequence.storage.lock.withLock {
                first.core.registryIndex = 1  // the fault
                second.core.registryIndex = 0
            }
            sequence.send(1)  // every transition checks the registry
        }
        expectMessage(result, "registry entry 0 records index Optional(1)")
    }

    /// With more subscribers than one check's window, successive
    /// transitions still reach a broken entry far from the start.
    @Test func windowedRegistryCheckReachesEveryEntry() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let sequence = BroadcastSequence(of: Int.self)
            let subscriptions = (0..<300).map { _ in sequence.subscribe() }
            sequence.storage.lock.withLock {
                subscriptions[250].core.registryIndex = 7  // the fault
            }
            for i in 0..<10 { sequence.send(i) }  // 64 entries per check: the fifth reaches it
            withExtendedLifetime(subscriptions) {}
        }
        expectMessage(result, "registry entry 250 records index Optional(7)")
    }

    /// And the checks stay silent on a healthy workload.
    @Test func healthyStructuresPass() {
        let sequence = BroadcastSequence(of: Int.self, bufferingPolicy: .bufferingNewest(2), replay: 3)
        let subscriptions = (0..<5).map { _ in sequence.subscribe() }
        for i in 0..<100 { sequence.send(i) }
        subscriptions[2].cancel()
        #expect(pollAll(subscriptions[0]) == [98, 99])
        sequence.finish()
    }
}
