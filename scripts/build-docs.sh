#!/usr/bin/env bash
# Builds the DocC documentation of the AsyncBroadcast module with the
# toolchain's own `docc` (no SwiftPM plugin, no package dependency) and fails
# on any documentation warning: a broken ``Symbol`` or <doc:Article> link, an
# unknown parameter name in a doc comment, a malformed topic group, and so on.
#
#   bash scripts/build-docs.sh
#
# 1. Compiles the AsyncBroadcast target with the compiler emitting its symbol
#    graph (-emit-symbol-graph), into the scratch path .build-docs.
# 2. Keeps only AsyncBroadcast's own graph files (AsyncBroadcast.symbols.json
#    and any AsyncBroadcast@<Module>.symbols.json extension graphs).
# 3. Runs `docc convert` on Sources/AsyncBroadcast/AsyncBroadcast.docc with
#    those graphs and --warnings-as-errors.
#
# Output: .build-docs/AsyncBroadcast.doccarchive (ignored by git, as is all of
# .build-docs). Exit status: non-zero if the build fails, if no symbol graph
# was produced, or if docc reports any warning or error.
set -euo pipefail
cd "$(dirname "$0")/.."

scratch=.build-docs
catalog=Sources/AsyncBroadcast/AsyncBroadcast.docc
raw_graphs="$PWD/$scratch/symbol-graphs-all"
graphs="$PWD/$scratch/symbol-graphs"
archive="$PWD/$scratch/AsyncBroadcast.doccarchive"

docc=$(command -v docc || true)
if [[ -z "$docc" ]] && command -v xcrun >/dev/null 2>&1; then docc=$(xcrun --find docc 2>/dev/null || true); fi
if [[ -z "$docc" ]]; then
    swift_bin=$(command -v swift || true)
    [[ -n "$swift_bin" ]] && docc="$(dirname "$(readlink -f "$swift_bin")")/docc"
fi
if [[ -z "$docc" || ! -x "$docc" ]]; then
    echo "build-docs: no docc found next to the Swift toolchain" >&2
    exit 1
fi

# The compiler writes the symbol graph when it emits the module. An
# up-to-date incremental build would skip that job and write nothing, so
# remove the module (only AsyncBroadcast's; nothing else is rebuilt) first.
rm -rf "$raw_graphs" "$graphs" "$archive"
mkdir -p "$raw_graphs" "$graphs"
if [[ -d "$scratch" ]]; then
    find "$scratch" -name 'AsyncBroadcast.swiftmodule' -prune -exec rm -rf {} +
fi

echo "build-docs: compiling AsyncBroadcast with -emit-symbol-graph"
swift build --target AsyncBroadcast --scratch-path "$scratch" \
    -Xswiftc -emit-symbol-graph \
    -Xswiftc -emit-symbol-graph-dir -Xswiftc "$raw_graphs"

shopt -s nullglob
module_graphs=("$raw_graphs"/AsyncBroadcast.symbols.json "$raw_graphs"/AsyncBroadcast@*.symbols.json)
shopt -u nullglob
if [[ ! -f "$raw_graphs/AsyncBroadcast.symbols.json" ]]; then
    echo "build-docs: the build wrote no AsyncBroadcast.symbols.json into $raw_graphs" >&2
    exit 1
fi
cp "${module_graphs[@]}" "$graphs"/
echo "build-docs: symbol graphs: $(cd "$graphs" && echo *)"

echo "build-docs: docc convert $catalog (--warnings-as-errors)"
"$docc" convert "$catalog" \
    --additional-symbol-graph-dir "$graphs" \
    --fallback-display-name AsyncBroadcast \
    --fallback-bundle-identifier AsyncBroadcast \
    --output-path "$archive" \
    --warnings-as-errors

echo "build-docs: OK: $scratch/AsyncBroadcast.doccarchive"
