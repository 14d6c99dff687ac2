// broadcast-demo: the library's three types, briefly.
//
// 1. BroadcastSequence (events): one producer fans events out to four
//    subscribers with different buffering policies.
// 2. BroadcastValue (state): a value followed by two subscribers, one that
//    keeps up and one that is busy and gets only the latest value.
// 3. BroadcastPromise (one result): several waiters of one result, one of
//    them cancelled.
//
//   swift run -c release broadcast-demo
//
// Every step waits for what it depends on (no sleeps), so the output is the
// same on every run.

print("== BroadcastSequence: events, each subscriber with its own policy")
try await sequenceDemo()

print()
print("== BroadcastValue: the current value, conflated")
await valueDemo()

print()
print("== BroadcastPromise: one result for many waiters")
await promiseDemo()
