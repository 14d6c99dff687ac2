internal import _CAtomics

/// The sequence lock's hand-off, one step at a time, for the litmus rows
/// (Handshakes.md row 13): side A holds the lock and unlocks; side B makes
/// one request (pushes it or, with the lock free, takes the lock) and does
/// not wait, since a modelled thread never blocks. The check then asks what
/// became of the request. Not API.
@_spi(Testing)
public final class SequenceGateProbe: @unchecked Sendable {
    let gate = SequenceGate()
    let node = UnsafeMutablePointer<cab_atomic_int>.allocate(capacity: SequenceGate.nodeWords)
    /// The request's body, where the holder finds it (a stable address),
    /// called with the node's address as its context.
    let body = UnsafeMutablePointer<(UnsafeMutableRawPointer) -> Void>.allocate(capacity: 1)
    /// Times the request's body ran (by the holder, or by side B itself).
    @_spi(Testing) public private(set) var bodyRuns = 0
    var tookTheLock = false
    let exclusive: Bool

    /// A probe whose lock is held (by side A, without the model's lock
    /// count: `unlockAsHolder` counts it).
    @_spi(Testing) public init(exclusiveRequest: Bool) {
        exclusive = exclusiveRequest
        body.initialize(to: { _ in })
        body.pointee = { [unowned self] _ in bodyRuns += 1 }
        gate.word.storeRelaxed(SequenceGate.locked)
        AtomicInt(unowned: node).storeRelaxed(0)
        AtomicInt(unowned: node + 1).storeRelaxed(SequenceGate.waiting)
    }

    /// Side A: the holder's unlock.
    @_spi(Testing) public func unlockAsHolder() {
        gate.noteLock(1)
        gate.unlock()
    }

    /// Side B: a combinable request (`withLock`) or an exclusive one
    /// (`lock()`), up to the point where it would wait.
    @_spi(Testing) public func request() {
        AtomicInt(unowned: node + 2).storeRelaxed(exclusive ? 0 : Int(bitPattern: UnsafeMutableRawPointer(body)))
        AtomicInt(unowned: node + 3).storeRelaxed(exclusive ? 0 : Int(bitPattern: node))
        if gate.push(node) {
            gate.noteLock(1)
            gate.modelAcquired()
            tookTheLock = true
            if !exclusive { bodyRuns += 1 }
            gate.unlock()
        }
    }

    /// What became of the request (checker's view): `nil` if it was served
    /// once, granted the lock, or took it itself.
    @_spi(Testing) public var failure: String? {
        let state = AtomicInt(unowned: node + 1).loadAcquire()
        let word = gate.word.loadAcquire()
        if tookTheLock { return bodyRuns == (exclusive ? 0 : 1) ? nil : "the request took the lock, its body ran \(bodyRuns) times" }
        switch state {
        case SequenceGate.done:
            return !exclusive && bodyRuns == 1 ? nil : "served: body ran \(bodyRuns) times"
        case SequenceGate.granted:
            return exclusive && word & SequenceGate.locked != 0 ? nil : "granted, but the lock word is \(word)"
        default:
            return "the request was lost: still waiting, lock word \(word)"
        }
    }

    /// Releases a granted lock and frees the probe's memory.
    @_spi(Testing) public func cleanup() {
        if AtomicInt(unowned: node + 1).loadAcquire() == SequenceGate.granted {
            gate.noteLock(1)
            gate.unlock()
        }
        #if ASYNCBROADCAST_WEAK_MEMORY
        cab_wm_forget(node, SequenceGate.nodeWords * MemoryLayout<Int>.size)
        #endif
        node.deallocate()
        body.deinitialize(count: 1)
        body.deallocate()
        gate.destroy()
    }
}
