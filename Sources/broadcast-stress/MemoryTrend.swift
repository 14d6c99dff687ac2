/// Resident memory across rounds: after warm-up it must not keep growing.
///
/// The baseline is the peak RSS during warm-up (the first 20% of the time
/// budget, or of the rounds). Allocators keep freed pages, so RSS follows the
/// largest round seen so far rather than the current one; a leak instead
/// grows without bound. The run fails if the final RSS exceeds the baseline
/// by more than max(64 MB, 50% of the baseline). Exact per-round leak
/// detection is the live-payload counter; this is the coarse backstop for
/// everything the counter cannot see (subscriber cores, buffers, tasks).
struct MemoryTrend {
    let warmUpSeconds: Double?
    let warmUpRounds: Int?
    private(set) var baseline = 0
    private(set) var peak = 0
    private(set) var last = 0
    private(set) var roundsAfterWarmUp = 0
    private var warm = false

    init(warmUpSeconds: Double?, warmUpRounds: Int?) {
        self.warmUpSeconds = warmUpSeconds
        self.warmUpRounds = warmUpRounds
    }

    mutating func record(_ rss: Int, round: Int, elapsed: Double) {
        last = rss
        peak = max(peak, rss)
        if !warm {
            baseline = max(baseline, rss)
            let bySeconds = warmUpSeconds.map { elapsed >= $0 } ?? false
            let byRounds = warmUpRounds.map { round >= $0 } ?? false
            warm = (bySeconds || byRounds) && round >= 2
        } else {
            roundsAfterWarmUp += 1
        }
    }

    func verdict() -> (flat: Bool, text: String) {
        guard last > 0 else { return (true, "VmRSS unavailable") }
        let allowed = max(64 * 1024 * 1024, baseline / 2)
        let growth = last - baseline
        let figures =
            "RSS after warm-up \(formatMB(baseline)), final \(formatMB(last)), peak \(formatMB(peak)), "
            + "growth \(growth >= 0 ? "+" : "-")\(formatMB(abs(growth))) (allowed +\(formatMB(allowed))) over \(roundsAfterWarmUp) rounds after warm-up"
        guard roundsAfterWarmUp >= 3 else { return (true, figures + "; too few rounds to judge") }
        return growth > allowed ? (false, figures + ": GROWING") : (true, figures + ": flat")
    }
}
