#!/usr/bin/env python3
"""Fails when a crate of the workspace declares a dependency its code never names.

    python3 infra/check_deps.py

For every workspace member, each entry of [dependencies], [dev-dependencies] and
[build-dependencies] must be referred to by its crate name (`-` as `_`, or the `package =` rename)
somewhere in the crate's Rust files, as `name::…`, `use name`, `name!` or `extern crate name`. A
dependency kept only for its features can say so with a `# used for features` comment on its line.
Exit status 1 lists the unused ones.

It also keeps the layering (README "Architecture"): a crate of `LAYERS` declares none of the
dependencies its layer may not have, e.g. the domain crate nothing AWS or Lambda.
"""
from __future__ import annotations

import fnmatch
import pathlib
import re
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent
SECTIONS = ("dependencies", "dev-dependencies", "build-dependencies")


# Per layer crate, the dependency names (fnmatch patterns) it may not declare in [dependencies].
LAYERS = {
    "crates/domain": ["aws-*", "aws_*", "lambda_*", "serde_dynamo", "hyper*", "chat-store", "chat-http", "chat-lambda"],
    "crates/store": ["lambda_*", "aws_lambda_events", "chat-http", "chat-lambda"],
    "crates/http": ["lambda_runtime", "aws_lambda_events", "chat-lambda"],
    "crates/lambda": ["lambda_http", "chat-http"],
}


def layering_breaks(crate: pathlib.Path) -> list[str]:
    forbidden = LAYERS.get(crate.relative_to(ROOT).as_posix(), [])
    deps = tomllib.loads((crate / "Cargo.toml").read_text()).get("dependencies", {})
    return [f"{crate.relative_to(ROOT)}: may not depend on {name}"
            for name in deps if any(fnmatch.fnmatchcase(name, p) for p in forbidden)]


def members() -> list[pathlib.Path]:
    workspace = tomllib.loads((ROOT / "Cargo.toml").read_text())["workspace"]
    return [ROOT / m for m in workspace["members"]]


def unused_in(crate: pathlib.Path) -> list[str]:
    manifest_text = (crate / "Cargo.toml").read_text()
    manifest = tomllib.loads(manifest_text)
    sources = "\n".join(p.read_text() for p in crate.rglob("*.rs") if "target" not in p.parts)
    unused = []
    for section in SECTIONS:
        for name in manifest.get(section, {}):
            line = next((l for l in manifest_text.splitlines() if re.match(rf"\s*{re.escape(name)}\s*[=.]", l)), "")
            if "used for features" in line:
                continue
            ident = name.replace("-", "_")
            pattern = rf"\b{ident}\s*::|\buse\s+{ident}\b|\b{ident}!|\bextern\s+crate\s+{ident}\b"
            if not re.search(pattern, sources):
                unused.append(f"{crate.relative_to(ROOT)}: [{section}] {name}")
    return unused


def main() -> int:
    unused = [u for crate in members() for u in unused_in(crate)]
    breaks = [b for crate in members() for b in layering_breaks(crate)]
    if unused or breaks:
        print("\n".join([f"unused dependency: {u}" for u in unused] + [f"layering: {b}" for b in breaks]))
        if unused:
            print("check_deps.py: remove them (or mark a features-only one `# used for features`)")
        return 1
    print(f"check_deps.py: every dependency of {len(members())} crates is used, and the layers keep theirs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
