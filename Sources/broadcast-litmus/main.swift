// The litmus runner: runs every row of Sources/LitmusRows (the handshake
// table, Sources/AsyncBroadcast/Subscriber/Handshakes.md) under the
// weak-memory model. Prints a line per check and `N passed, N failed` last.
@_spi(Testing) import AsyncBroadcast
@_spi(Testing) import LitmusRows

#if canImport(Glibc)
import Glibc
#endif

// MARK: Main

guard WeakMemoryModel.isCompiledIn else {
    print("litmus: the library was built without ASYNCBROADCAST_WEAK_MEMORY=1: nothing to check")
    print("0 passed, 1 failed")
    exit(1)
}
WeakMemoryModel.setEnabled(true)
WeakMemoryModel.setPreemptionHook(preemptionHook)
var passed = 0, failed = 0
func report(_ ok: Bool, _ line: String) {
    if ok { passed += 1 } else { failed += 1 }
    print((ok ? "PASS  " : "FAIL  ") + line)
}
let only = CommandLine.arguments.dropFirst().compactMap { Int($0) }
for row in rows where only.isEmpty || only.contains(row.number) {
    let label = "row \(row.number) (\(row.name))"
    let baseline = firstFailure(row, removed: [])
    if let found = baseline.found {
        report(false, "\(label): fails with every ordering in place: \(found.failure) [\(found.schedule)]")
    } else {
        report(true, "\(label): all \(baseline.tried) schedules pass")
    }
    for ordering in row.shown {
        if let found = firstFailure(row, removed: [ordering]).found {
            report(true, "\(label) without \(ordering.faultName): caught: \(found.failure) [\(found.schedule)]")
        } else {
            report(false, "\(label) without \(ordering.faultName): no schedule fails: the check cannot see this ordering")
        }
    }
    if row.lockOrdered {
        if let found = firstFailure(row, removed: WeakMemoryModel.memoryOrderings).found {
            report(false, "\(label) with every ordering removed: \(found.failure): it is not ordered by the lock alone [\(found.schedule)]")
        } else {
            report(true, "\(label) with every ordering removed: still passes (the lock orders it)")
        }
    }
    for (ordering, why) in row.notShown {
        print("NOTE  \(label) without \(ordering.faultName): not shown here: \(why)")
    }
}
let statistics = WeakMemoryModel.statistics
print("weak memory: \(statistics.buffered) stores buffered, \(statistics.staleLoads) loads read a value another thread had already replaced")
print("\(passed) passed, \(failed) failed")
exit(failed == 0 ? 0 : 1)
