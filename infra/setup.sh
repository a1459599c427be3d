#!/usr/bin/env bash
# Creates <repo>/.venv with the emulator's Python packages (infra/requirements.txt) and
# cargo-lambda. Idempotent; silent and fast when the venv already matches the requirements.
set -euo pipefail

CARGO_LAMBDA_VERSION=1.9.2

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$repo/.venv"
req="$repo/infra/requirements.txt"
stamp="$venv/.infra-requirements.stamp"

if [[ ! -x "$venv/bin/python" ]]; then
  echo "setup.sh: creating $venv" >&2
  python3 -m venv "$venv"
fi

# The stamp records what was last installed: the requirements file, the cargo-lambda pin and
# the interpreter version. pip runs only when one of them changed.
want="$( (cat "$req"; echo "cargo-lambda==$CARGO_LAMBDA_VERSION"; "$venv/bin/python" -V) | sha256sum | cut -d' ' -f1)"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  exit 0
fi

echo "setup.sh: installing Python packages into $venv" >&2
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
  -r "$req" "cargo-lambda==$CARGO_LAMBDA_VERSION"
echo "$want" > "$stamp"
