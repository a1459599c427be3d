#!/usr/bin/env bash
# Builds the TypeScript SDK and the demo page (clients/js, `npm ci` + `npm run build`) with the
# machine's Node.js (20 or newer). Idempotent; quick when nothing changed since the last build.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo/clients/js"

if ! command -v npm >/dev/null 2>&1; then
  echo "setup-clients.sh: Node.js 20+ and npm are needed for the SDK and the demo page" >&2
  exit 1
fi
stamp="node_modules/.setup-clients.stamp"
want="$(cat package-lock.json | sha256sum | cut -d' ' -f1)"
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
  echo "setup-clients.sh: installing the SDK's build and test tools (npm ci)" >&2
  npm ci --no-audit --no-fund --loglevel=error
  echo "$want" > "$stamp"
fi
newest_source="$(find src ../demo/src ../demo/index.html ../demo/style.css scripts -newer ../demo/dist/index.html 2>/dev/null | head -1 || true)"
if [[ ! -f ../demo/dist/index.html || -n "$newest_source" ]]; then
  npm run --silent build
fi
