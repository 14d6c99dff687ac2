#!/usr/bin/env bash
# The claims ledger: every guarantee the docs make has an id, and a test that
# would fail without it names that id.
#
#   bash scripts/claims.sh              # the ledger; exit 1 on any problem
#   bash scripts/claims.sh --self-test  # shows the checker catches its faults
#
# Where a claim is made (its definition), one per id (a tag in `code` or in
# a fenced code block is an example, not a tag):
#   - in the DocC articles (Sources/AsyncBroadcast/AsyncBroadcast.docc/*.md)
#     and in the `///` doc comments of Sources/AsyncBroadcast/Public/*.swift:
#     `<!-- claim: ID -->` at the end of the sentence. An HTML comment: DocC
#     does not render it, and it does not warn about it.
#   - `<!-- restates: ID -->` marks a sentence (usually a doc comment) that
#     says again what claim ID says; it must name a defined claim.
# Where it is shown: `// claims: ID, ID` (Swift) or `# claims: ID, ID`
# (shell) on or just above the test (a script may name the case first:
# `# FAULT_NAME claims: ID`), in Tests/, Fuzz/ (fault-check.sh and
# the targets), Sources/LitmusRows, Sources/broadcast-stress, and scripts/
# (release-traps.sh, stress-faults.sh, test-faults.sh, litmus.sh). A test
# names a claim only if it would fail were the claim false.
#
# Output: one block per claim (id, where it is made, the tests that name it,
# or UNTESTED), then any error, and as the last line
# `N claims, N tested, N untested`. Exit 1 on an untested claim, a test
# naming an id no doc defines, a restatement of an undefined id, a malformed
# id, or an id defined twice. CLAIMS_ROOT: the tree to check (default: this
# repository); --self-test runs on temporary copies.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
id_re='[A-Z][A-Z0-9]*(-[A-Z0-9]+)+'

# extract TAG: every `<!-- TAG: ID -->` in the articles and the public
# doc comments, as file:line:ID, in file order.
extract() {
    local tag=$1
    { find Sources/AsyncBroadcast/AsyncBroadcast.docc -name '*.md' | sort
      find Sources/AsyncBroadcast/Public -name '*.swift' | sort; } |
        xargs awk -v tag="$tag" '
            FNR == 1 { fenced = 0 }
            FILENAME ~ /\.swift$/ && $0 !~ /^[ \t]*\/\/\// { next }
            /^[ \t]*(\/\/\/)?[ \t]*```/ { fenced = !fenced; next }
            fenced { next }
            {
                # A tag inside `code` is an example, not a tag.
                s = $0; before = ""; re = "<!-- *" tag ": *[^ ]* *-->"
                while (match(s, re)) {
                    m = substr(s, RSTART, RLENGTH); before = before substr(s, 1, RSTART - 1)
                    s = substr(s, RSTART + RLENGTH)
                    ticks = gsub(/`/, "`", before)
                    before = before m
                    if (ticks % 2 == 1) continue
                    sub("^<!-- *" tag ": *", "", m); sub(" *-->$", "", m)
                    print FILENAME ":" FNR ":" m
                }
            }'
}

ledger() {
    local root=$1
    cd "$root"
    local defs refs restates
    defs=$(mktemp) refs=$(mktemp) restates=$(mktemp)
    # Definitions and restatements: file:line:ID (in Swift sources only on `///` lines).
    extract claim >"$defs"
    extract restates >"$restates"
    # References: file:line:ID:name, one line per id named; name is the
    # test function declared within the next lines (Swift), else empty.
    local scan=()
    local d
    for d in Tests Fuzz/Sources Sources/LitmusRows Sources/broadcast-stress; do [[ -d $d ]] && scan+=("$d"); done
    local f
    for f in Fuzz/fault-check.sh scripts/*.sh; do
        [[ -f $f && $f != scripts/claims.sh ]] && scan+=("$f")
    done
    # One awk pass: a tag line's name is its case name (`# NAME claims:`),
    # else the first `func NAME` within the 12 lines after it (Swift).
    { find "${scan[@]}" -type f \( -name '*.swift' -o -name '*.sh' \) -not -path '*/.build*' 2>/dev/null | sort |
        xargs awk '
            function flush(   k) { for (k = 1; k <= n; k++) print pend[k] ":" fname; n = 0 }
            FNR == 1 { flush() }
            n > 0 && match($0, /func [A-Za-z0-9_]+/) { fname = substr($0, RSTART + 5, RLENGTH - 5); flush() }
            n > 0 && FNR - tagline > 12 { fname = ""; flush() }
            /^[ \t]*(\/\/|#)[ \t]*([A-Za-z0-9_.-]+[ \t]+)?claims:/ {
                text = $0; name = ""
                if (match(text, /^[ \t]*(\/\/|#)[ \t]*[A-Za-z0-9_.-]+[ \t]+claims:/)) {
                    name = text; sub(/^[ \t]*(\/\/|#)[ \t]*/, "", name); sub(/[ \t]+claims:.*/, "", name)
                }
                sub(/^.*claims:/, "", text); gsub(/,/, " ", text)
                cnt = split(text, ids, /[ \t]+/)
                for (k = 1; k <= cnt; k++) {
                    if (ids[k] == "") continue
                    if (name != "" || FILENAME !~ /\.swift$/) print FILENAME ":" FNR ":" ids[k] ":" name
                    else { pend[++n] = FILENAME ":" FNR ":" ids[k]; tagline = FNR }
                }
            }
            END { fname = ""; flush() }'; } >"$refs"

    local errors=0 total=0 tested=0 untested=0
    local -a problems=()
    # Malformed ids.
    while IFS=: read -r file line id; do
        [[ -z $file ]] && continue
        if ! [[ $id =~ ^$id_re$ ]]; then problems+=("malformed claim id '$id' at $file:$line"); fi
    done <"$defs"
    while IFS=: read -r file line id _; do
        [[ -z $file ]] && continue
        if ! [[ $id =~ ^$id_re$ ]]; then problems+=("malformed claim id '$id' named at $file:$line"); fi
    done <"$refs"
    # Duplicates.
    local dup
    for dup in $(cut -d: -f3 "$defs" | sort | uniq -d); do
        problems+=("claim $dup is defined more than once: $(awk -F: -v id="$dup" '$3 == id { printf "%s:%s ", $1, $2 }' "$defs")")
    done
    # Names of undefined ids.
    local known
    known=$(cut -d: -f3 "$defs" | sort -u)
    while IFS=: read -r file line id name; do
        [[ -z $file ]] && continue
        if ! grep -qxF -- "$id" <<<"$known"; then
            problems+=("$file:$line${name:+ ($name)} names claim $id, which no doc defines")
        fi
    done <"$refs"
    while IFS=: read -r file line id; do
        [[ -z $file ]] && continue
        if ! grep -qxF -- "$id" <<<"$known"; then problems+=("$file:$line restates claim $id, which no doc defines"); fi
    done <"$restates"
    # The ledger.
    local -a untested_ids=()
    while IFS=: read -r file line id; do
        [[ -z $file ]] && continue
        total=$((total + 1))
        echo "$id  $file:$line"
        awk -F: -v id="$id" '$3 == id { printf "    restated at %s:%s\n", $1, $2 }' "$restates"
        local shown
        shown=$(awk -F: -v id="$id" '$3 == id { if ($4 != "") printf "    tested by %s:%s %s\n", $1, $2, $4; else printf "    tested by %s:%s\n", $1, $2 }' "$refs")
        if [[ -n $shown ]]; then
            tested=$((tested + 1))
            echo "$shown"
        else
            untested=$((untested + 1))
            untested_ids+=("$id")
            echo "    UNTESTED"
        fi
    done <"$defs"
    rm -f "$defs" "$refs" "$restates"
    if [[ ${#untested_ids[@]} -gt 0 ]]; then
        echo
        echo "untested claims (no test names them): ${untested_ids[*]}"
        errors=1
    fi
    if [[ ${#problems[@]} -gt 0 ]]; then
        echo
        printf 'error: %s\n' "${problems[@]}"
        errors=1
    fi
    echo "$total claims, $tested tested, $untested untested"
    return $errors
}

self_test() {
    local tmp failures=0
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' RETURN
    expect() {  # expect NAME STATUS PATTERN OUTPUT-FILE STATUS-GOT
        local name=$1 want=$2 pattern=$3 out=$4 got=$5
        if [[ $got -eq $want ]] && grep -qE -- "$pattern" "$out"; then
            echo "self-test PASS $name (exit $got; $(grep -m1 -E -- "$pattern" "$out"))"
        else
            echo "self-test FAIL $name: exit $got (wanted $want), pattern '$pattern' $(grep -qE -- "$pattern" "$out" && echo found || echo 'not found')"
            tail -n 5 "$out" | sed 's/^/    /'
            failures=$((failures + 1))
        fi
    }
    run() { local status=0; CLAIMS_ROOT=$1 bash "$here/scripts/claims.sh" >"$2" 2>&1 || status=$?; echo $status; }

    # 1. A clean tree: two claims, each named by a test: exit 0.
    local clean=$tmp/clean
    mkdir -p "$clean/Sources/AsyncBroadcast/AsyncBroadcast.docc" "$clean/Sources/AsyncBroadcast/Public" "$clean/Tests/T" "$clean/scripts"
    printf 'A send never waits. <!-- claim: SELF-SEND-NEVER-WAITS -->\n' >"$clean/Sources/AsyncBroadcast/AsyncBroadcast.docc/Semantics.md"
    printf '/// Never waits. <!-- restates: SELF-SEND-NEVER-WAITS -->\n/// Ends once. <!-- claim: SELF-ENDS-ONCE -->\npublic func f() {}\n' >"$clean/Sources/AsyncBroadcast/Public/F.swift"
    printf '// claims: SELF-SEND-NEVER-WAITS\n@Test func sendNeverWaits() {}\n' >"$clean/Tests/T/T.swift"
    printf '# claims: SELF-ENDS-ONCE\ncheck ends-once\n' >"$clean/scripts/traps.sh"
    # Examples of tags, in `code` and in a fenced block, are not tags.
    printf 'Write `<!-- claim: SELF-EXAMPLE -->` at its end.\n```\nx <!-- claim: SELF-FENCED -->\n```\n' \
        >"$clean/Sources/AsyncBroadcast/AsyncBroadcast.docc/Testing.md"
    expect "clean tree passes (examples in code are no claims)" 0 '^2 claims, 2 tested, 0 untested$' "$tmp/1.out" "$(run "$clean" "$tmp/1.out")"

    # The real tree, copied, is the base of the faults below.
    local real=$tmp/real
    mkdir -p "$real"
    (cd "$here" && tar --exclude='.build*' -cf - Sources/AsyncBroadcast/AsyncBroadcast.docc Sources/AsyncBroadcast/Public \
        Tests Fuzz/Sources Fuzz/fault-check.sh Sources/LitmusRows Sources/broadcast-stress scripts) | (cd "$real" && tar xf -)
    local base_untested
    base_untested=$(run "$real" "$tmp/base.out" >/dev/null; tail -1 "$tmp/base.out" | sed -E 's/.* ([0-9]+) untested$/\1/')

    # 2. Remove one test's tag: the claim it alone named becomes untested.
    local victim victim_file victim_line
    victim=$(awk 'function flush() { if (id != "" && n == 1) { print id, loc; found = 1; exit } }
                  /^[A-Z]/ { flush(); id = $1; n = 0; next }
                  /^    tested by / { n++; loc = $3 }
                  END { if (!found) flush() }' "$tmp/base.out")
    read -r victim victim_file <<<"$victim"
    victim_line=${victim_file##*:}; victim_file=${victim_file%:*}
    if [[ -z $victim ]]; then
        echo "self-test FAIL remove a tag: no claim is named by exactly one test"; failures=$((failures + 1))
    else
        sed -i -E "${victim_line}s/(claims:(.*[ ,])?)$victim([ ,]|\$)/\\1\\3/" "$real/$victim_file"
        local got; got=$(run "$real" "$tmp/2.out")
        expect "removing the tag at $victim_file:$victim_line makes $victim untested" 1 "^untested claims.* $victim( |$)" "$tmp/2.out" "$got"
        expect "  ... and the count says so" 1 " $((base_untested + 1)) untested$" "$tmp/2.out" "$got"
        (cd "$here" && cat "$victim_file") >"$real/$victim_file"
    fi

    # 3. A test naming an id no doc defines.
    printf '// claims: NO-SUCH-CLAIM-7\n@Test func orphan() {}\n' >"$real/Tests/Orphan.swift"
    expect "a test naming an undefined id" 1 "names claim NO-SUCH-CLAIM-7, which no doc defines" "$tmp/3.out" "$(run "$real" "$tmp/3.out")"
    rm "$real/Tests/Orphan.swift"

    # 4. An id defined twice.
    local first
    first=$(grep -m1 -ohE "<!-- claim: [A-Z0-9-]+ -->" "$real/Sources/AsyncBroadcast/AsyncBroadcast.docc/Semantics.md" | sed -E 's/<!-- claim: (.*) -->/\1/')
    printf '\nSaid twice. <!-- claim: %s -->\n' "$first" >>"$real/Sources/AsyncBroadcast/AsyncBroadcast.docc/Patterns.md"
    expect "an id defined twice ($first)" 1 "claim $first is defined more than once" "$tmp/4.out" "$(run "$real" "$tmp/4.out")"

    # 5. A malformed id.
    printf 'Lower case. <!-- claim: lower-case -->\n' >>"$clean/Sources/AsyncBroadcast/AsyncBroadcast.docc/Semantics.md"
    printf '// claims: lower-case\n@Test func lower() {}\n' >>"$clean/Tests/T/T.swift"
    expect "a malformed id" 1 "malformed claim id 'lower-case'" "$tmp/5.out" "$(run "$clean" "$tmp/5.out")"

    if [[ $failures -eq 0 ]]; then echo "self-test: every fault caught"; else echo "self-test: $failures FAILED"; fi
    return $((failures > 0))
}

if [[ ${1:-} == --self-test ]]; then
    self_test
else
    ledger "${CLAIMS_ROOT:-$here}"
fi
