// client-tsan: hammers AsyncBroadcast from a client package under
// ThreadSanitizer. See scripts/client-tsan.sh.
import Foundation

let failed = await runAll(Options.parse(CommandLine.arguments))
exit(failed == 0 ? 0 : 1)
