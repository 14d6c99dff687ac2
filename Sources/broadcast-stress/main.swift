// broadcast-stress: randomized, seed-replayable stress test of AsyncBroadcast.
//
//   swift run -c release broadcast-stress --seconds 60
//   TSAN_OPTIONS=halt_on_error=1 swift run --sanitize=thread broadcast-stress --seconds 60
//
// Each round races 1-8 producers (send/emit, tasks and raw threads) against
// the witness and 1-64 subscribers of every buffering policy, which join and
// leave during sending; finish() and finish(throwing:) race the senders, or
// the last reference is dropped while consumers wait. See InvariantChecker
// for what is checked and when. Other round kinds (`--kinds`) stress
// BroadcastValue (ValueRound), BroadcastPromise (PromiseRound) and sharing
// an upstream or a listener across starts and stops (SharingRound,
// SharingChecker), BroadcastTopics whose topics come and go
// (TopicsRound), and BroadcastTopics' v5 surface: events, eviction,
// cancelled subscribes, finish(topic:) racing subscribes, listeners
// (LifecycleRound, LifecycleChecker). Exit status: 0 if every round passed.
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

let options: Options
do {
    options = try Options.parse(Array(CommandLine.arguments.dropFirst()))
} catch {
    say(error.description)
    exit(2)
}
let status = await StressRunner(options: options).run()
exit(status)
