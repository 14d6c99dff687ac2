// The table for the value and promise workloads: each cell's unit, and the
// ratio of every peer to BroadcastValue or BroadcastPromise in the same cell.

/// What a value/promise cell measures, for its table.
struct V2Info: Sendable {
    /// The time column's unit.
    var unit: String
    /// What allocations are counted per.
    var allocUnit: String
    /// Allocations per run are divided by N (waiters) rather than by the run's units.
    var allocsPerN = false
    /// How it is measured, printed under the table.
    var how: String
}

func printV2Table(_ rows: [Row], _ o: CompareOptions) {
    func key(_ r: Row) -> String { "\(r.workload)|\(r.n)" }
    var ours = [String: (String, Double)]()
    for r in rows where r.isOurs { ours[key(r)] = (r.peer, r.median ?? .nan) }

    print("| workload | N | peer | unit | median | min | allocs | changes seen | ours faster by |")
    print("|---|---:|---|---|---:|---:|---:|---:|---:|")
    var notes: [String: String] = [:]
    var order: [String] = []
    for r in rows {
        guard let info = r.v2 else { continue }
        if notes[r.workload] == nil {
            notes[r.workload] = info.how
            order.append(r.workload)
        }
        var allocs = r.median == nil ? "" : "–"
        if let total = r.mallocs {
            let per = Double(total) / Double(max(r.allocDivisor, 1))
            allocs = per >= 0.1 || total == 0 ? fmtAllocs(per, total) + "/" + info.allocUnit
                : "\(fmt(per, 4))/\(info.allocUnit) (\(total) total)"
        }
        var ratio = "–"
        if !r.isOurs, let med = r.median, let (_, ref) = ours[key(r)], !ref.isNaN {
            ratio = fmt(med / ref, 2) + "×"
        }
        let seen = r.workload == "value-update" && r.median != nil ? fmt(r.receivedFraction * 100, 1) + " %" : "–"
        let med = r.median.map(fmtNs) ?? "n/a"
        let mn = r.min.map(fmtNs) ?? "n/a"
        let peer = r.error == nil ? r.peer : "\(r.peer) **WRONG: \(r.error!)**"
        print("| \(r.workload) | \(r.n) | \(peer) | \(info.unit) | \(med) | \(mn) | \(allocs) | \(seen) | \(ratio) |")
    }
    print("")
    print("Ours faster by = this peer's median / BroadcastValue's (value-*) or BroadcastPromise's (promise) median in the same cell: above 1, ours is faster.")
    print("Changes seen = median share of the K updates each subscriber saw (conflation; the initial value not counted).")
    print("N: subscribers (value-update), readers (value-read), waiting tasks W (promise).")
    for w in order {
        print("- \(w): \(notes[w]!)" + (w == "value-read" ? " (R = \(o.valueReads))" : w.hasPrefix("value-") ? " (K = \(o.valueUpdates))" : ""))
    }
}
