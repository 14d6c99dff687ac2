@testable import FeedKit
import Testing

/// The `--send-timeout` sweeper's test reads the clock, then the pump's
/// stamps: a write that started or ended in between is younger than `now`.
@Suite struct ConnectionProgressTests {
    @Test func aWriteStampedAfterTheSweepersClockReadIsNotStalled() {
        let progress = ConnectionProgress(at: 0)
        let now = monotonicNanoseconds()
        progress.writing()  // stamped after `now`
        #expect(!progress.isStalled(now: now, limit: 1_000_000_000, writable: true),
                "a write that began after the sweeper read its clock counted as stalled (a wrapped age)")
    }

    @Test func anUnwritableChannelWhoseLastWriteCameAfterTheClockReadIsNotStalled() {
        let progress = ConnectionProgress(at: 0)
        let start = monotonicNanoseconds()
        _ = progress.isStalled(now: start, limit: 1, writable: false)  // unwritable from `start`
        let now = start + 10
        progress.wrote()  // stamped after `now`
        #expect(!progress.isStalled(now: now, limit: 1, writable: false),
                "a write completed after the sweeper read its clock counted as long ago")
    }

    @Test func aWriteOlderThanTheLimitIsStalled() {
        let progress = ConnectionProgress(at: 0)
        progress.writing()
        #expect(progress.isStalled(now: monotonicNanoseconds() + 2_000_000_000, limit: 1_000_000_000, writable: true))
    }
}
