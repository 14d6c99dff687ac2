// The handshake table's rows as Swift Testing tests, under the weak-memory
// model: `bash scripts/litmus.sh --tests` (a build with
// ASYNCBROADCAST_WEAK_MEMORY=1; in a normal build they are skipped). Each row passes in every schedule, and the
// orderings that make it correct are each shown necessary: with the fix for
// the last-pop/finish race taken away (`popSkipsFence`, `finishSkipsFence`)
// row 2 fails, deterministically.
@_spi(Testing) import AsyncBroadcast
@_spi(Testing) import LitmusRows
import Testing

@Suite(.serialized, .enabled(if: WeakMemoryModel.isCompiledIn, "needs a weak-memory build: bash scripts/litmus.sh --tests"))
struct LitmusTests {
    init() {
        WeakMemoryModel.setEnabled(true)
        WeakMemoryModel.setPreemptionHook(preemptionHook)
    }

    @Test(arguments: rows.indices)
    func everyScheduleOfTheRowPasses(index: Int) {
        let row = rows[index]
        let result = firstFailure(row, removed: [])
        #expect(result.found == nil, "row \(row.number) (\(row.name)): \(result.found.map { "\($0.failure) [\($0.schedule)]" } ?? "")")
        #expect(result.tried > 0)
    }

    @Test(arguments: rows.indices)
    func everyOrderingTheRowReliesOnIsNecessary(index: Int) {
        let row = rows[index]
        for ordering in row.shown {
            #expect(firstFailure(row, removed: [ordering]).found != nil,
                    "row \(row.number) (\(row.name)) without \(ordering.faultName): no schedule fails")
        }
        if row.lockOrdered {
            let found = firstFailure(row, removed: WeakMemoryModel.memoryOrderings).found
            #expect(found == nil, "row \(row.number) (\(row.name)) is not ordered by its lock alone: \(found.map { "\($0.failure) [\($0.schedule)]" } ?? "")")
        }
    }

    /// The race a client found: a consumer that takes its last element while
    /// `finish()` runs stayed in `subscriberCount`. Without either fence of
    /// the fix the model finds the schedule that leaves it counted.
    @Test(arguments: [Ordering.popSkipsFence, .finishSkipsFence])
    func theLastPopRacingFinishIsFoundWithoutItsFix(removed: Ordering) throws {
        let row = try #require(rows.first { $0.number == 2 && $0.name.hasSuffix("unbounded") })
        let found = try #require(firstFailure(row, removed: [removed]).found)
        #expect(found.failure.contains("still counted"))
    }
}
