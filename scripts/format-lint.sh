#!/usr/bin/env bash
# Checks Sources/ against the repository's swift-format configuration
# (.swift-format at the root: 4-space indentation, the house's line breaks
# kept, no line limit below the longest existing line, conditional
# compilation blocks not indented) with `swift format lint --strict`, so a
# warning fails too.
#
#   bash scripts/format-lint.sh            # lint; exit status 0 iff clean
#   bash scripts/format-lint.sh --fix      # reformat Sources/ in place first
#
# The toolchain's own `swift format` (Swift 6.x) is used; no package
# dependency.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ "${1:-}" == "--fix" ]]; then
    swift format format --configuration .swift-format --in-place --recursive --parallel Sources/
    shift
fi
if [[ $# -gt 0 ]]; then
    echo "usage: bash scripts/format-lint.sh [--fix]" >&2
    exit 2
fi
if swift format lint --configuration .swift-format --strict --recursive --parallel Sources/; then
    echo "format-lint: Sources/ is clean"
else
    echo "format-lint: FAILED (fix with: bash scripts/format-lint.sh --fix)" >&2
    exit 1
fi
