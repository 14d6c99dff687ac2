#!/usr/bin/env bash
# Creates Examples/.venv (if missing) and installs the Python clients' pinned
# packages (websockets, selenium) from requirements.txt. Idempotent and quiet.
#
#   Examples/clients/setup.sh && Examples/.venv/bin/python Examples/clients/ws_check.py --help
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
VENV=${FEED_VENV:-$HERE/../.venv}
PYTHON=${PYTHON:-python3}
REQ=$HERE/requirements.txt

STAMP=$VENV/.feed-requirements
if [[ ! -x $VENV/bin/python ]] || ! "$VENV/bin/python" -c '' 2>/dev/null; then
    rm -f "$STAMP"
    timeout 120 "$PYTHON" -m venv --clear "$VENV"
fi
# Skip pip when the installed set already matches the pins and imports.
if [[ -f $STAMP ]] && cmp -s "$STAMP" "$REQ" && "$VENV/bin/python" -c 'import websockets, selenium' 2>/dev/null; then
    exit 0
fi
timeout 600 "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$REQ"
"$VENV/bin/python" -c 'import websockets, selenium' 
cp "$REQ" "$STAMP"
echo "setup: $("$VENV/bin/python" -c 'import websockets, selenium; print("websockets", websockets.__version__, "selenium", selenium.__version__)') in $(cd "$VENV" && pwd)" >&2
