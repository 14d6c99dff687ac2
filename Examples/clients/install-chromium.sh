#!/usr/bin/env bash
# Installs Debian's headless Chromium and its WebDriver (for browser_check.py),
# only if /usr/bin/chromium or /usr/bin/chromedriver is missing.
set -euo pipefail

if [[ -x /usr/bin/chromium && -x /usr/bin/chromedriver ]]; then
    echo "install-chromium: chromium and chromedriver already installed" >&2
    exit 0
fi

if [[ $(id -u) -ne 0 ]]; then
    echo "install-chromium: must run as root (apt-get install chromium chromium-driver)" >&2
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive
echo "install-chromium: installing chromium and chromium-driver with apt-get" >&2
timeout 600 apt-get update -qq
timeout 1200 apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
/usr/bin/chromium --version >&2
/usr/bin/chromedriver --version >&2
