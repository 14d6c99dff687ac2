#!/usr/bin/env bash
# Builds and runs the litmus runner (Sources/litmus): every row of the
# handshake table (Sources/AsyncBroadcast/Subscriber/Handshakes.md) checked
# exhaustively under the weak-memory model, with every ordering in place and
# with each ordering a row relies on taken away (which must be caught).
# Prints `N passed, N failed` last; exits non-zero on a failure.
#
#   Fuzz/litmus.sh            # every row
#   Fuzz/litmus.sh 2 4        # rows 2 and 4
set -euo pipefail
cd "$(dirname "$0")"
export ASYNCBROADCAST_WEAK_MEMORY=1 ASYNCBROADCAST_INTERNAL_CHECKS=1
swift build --scratch-path .build-litmus --product litmus >&2
exec ./.build-litmus/debug/litmus "$@"
