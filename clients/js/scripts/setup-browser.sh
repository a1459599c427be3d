#!/usr/bin/env bash
# npm run setup:browser — makes sure Debian's Chromium is there for `npm run test:browser`
# (playwright-core drives it; it downloads no browser of its own). Needs root for apt-get.
set -euo pipefail
if [[ -n "${CHROMIUM_PATH:-}" ]] || command -v chromium >/dev/null 2>&1; then
  exit 0
fi
echo "setup-browser: installing chromium (apt-get)" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq chromium >/dev/null
command -v chromium
