#!/usr/bin/env bash
# Builds and runs the litmus runner (Sources/broadcast-litmus, rows in
# Sources/LitmusRows) in a weak-memory build: every row of the handshake
# table (Sources/AsyncBroadcast/Subscriber/Handshakes.md) checked
# exhaustively, with every ordering in place and with each ordering a row
# relies on taken away (which must be caught). Prints `N passed, N failed`
# last; exits non-zero on a failure.
#
#   scripts/litmus.sh            # every row
#   scripts/litmus.sh 2 4        # rows 2 and 4
#   scripts/litmus.sh --tests    # the same rows as Swift Testing tests (Tests/LitmusTests)
set -euo pipefail
cd "$(dirname "$0")/.."
export ASYNCBROADCAST_WEAK_MEMORY=1 ASYNCBROADCAST_INTERNAL_CHECKS=1
if [[ "${1:-}" == "--tests" ]]; then
    exec swift test --scratch-path .build-litmus --filter "^LitmusTests"
fi
swift build --scratch-path .build-litmus --product broadcast-litmus >&2
exec ./.build-litmus/debug/broadcast-litmus "$@"
