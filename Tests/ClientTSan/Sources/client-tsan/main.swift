// client-tsan: hammers AsyncBroadcast from a client package under
// ThreadSanitizer. See scripts/client-tsan.sh.
import Foundation
// Not for clients: imported here only to ask whether the library's TSan
// hooks are on (`cab_tsan_is_active`), which no public API tells.
import _CAtomics

// This tool is only ever built with ThreadSanitizer (`--sanitize=thread` or
// `-Xswiftc -sanitize=thread`). The library's hooks around its continuation
// resumes must then be on, whichever way TSan was turned on; without them a
// run reports a race only some of the time, so check it once, up front.
let tsanRuntimeLinked = dlopen(nil, RTLD_NOW).map { dlsym($0, "__tsan_init") != nil } ?? false
if !tsanRuntimeLinked {
    print("FAIL setup: this binary has no ThreadSanitizer runtime (build it through scripts/client-tsan.sh)")
    print("0 passed, 1 failed")
    exit(1)
}
if !cab_tsan_is_active() {
    print("FAIL setup: the ThreadSanitizer runtime is linked in, but AsyncBroadcast's TSan hooks are off")
    print("0 passed, 1 failed")
    exit(1)
}
print("client-tsan: ThreadSanitizer runtime linked in; AsyncBroadcast's TSan hooks on")

let failed = await runAll(Options.parse(CommandLine.arguments))
exit(failed == 0 ? 0 : 1)
