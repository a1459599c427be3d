#!/usr/bin/env python3
"""CI check: `sam build` produces a bootstrap for every function of template.yaml.

    .venv/bin/python infra/check_sam_build.py [--arch x86_64|arm64] [--build-dir DIR] [--skip-build] [--quick]

Runs the deployment's own build (`sam build --language-extensions`, i.e. `cargo lambda build
--release` for each function's binary, README "Deploy") with the template's Architecture parameter
overridden, into its own build directory (default `.aws-sam/check-<arch>`, so an operator's
`.aws-sam/build` is left alone). Then every AWS::Serverless::Function must have
`<build dir>/<LogicalId>/bootstrap`: an executable ELF file for the architecture. Prints each
bootstrap's size and writes them, with the build time, to `<build dir>/bootstrap-sizes.json`.
Exit status 1 when a bootstrap is missing or wrong, or the build fails.

To save time on few cores, the binaries are first built by one `cargo lambda build` (with the
same flags SAM uses, all `--bin`s at once, so cargo links them in parallel); `sam build` then
finds them up to date and packages them. `--no-prebuild` leaves it all to `sam build`.

`--quick` (CI) builds with the release profile's link-time optimization off and 16 codegen units
per crate (CARGO_PROFILE_RELEASE_LTO, CARGO_PROFILE_RELEASE_CODEGEN_UNITS, for the prebuild and
`sam build` alike, so `sam build` still finds the binaries up to date): the same code, template and
packaging, in about 6 minutes instead of 14 on 2 cores; its bootstraps are about 12 % larger than
the deployed ones, and the size table says which profile made them.

CI builds x86_64: the arm64 Rust target (`rustup target add aarch64-unknown-linux-gnu`) is
downloaded from outside the package registries and cannot be installed offline. Needs `sam` and
`cargo-lambda` on PATH (infra/setup.sh puts both in .venv/bin; run via infra/check_sam_build.sh).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import create_resources  # noqa: E402  (the template loader the other infra scripts use)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FUNCTION = "AWS::Serverless::Function"
# ELF e_machine of each Lambda architecture.
ELF_MACHINE = {"x86_64": 0x3E, "arm64": 0xB7}
# `--quick`: what CI overrides of Cargo.toml's release profile (not what is deployed).
QUICK_PROFILE = {"CARGO_PROFILE_RELEASE_LTO": "false", "CARGO_PROFILE_RELEASE_CODEGEN_UNITS": "16"}
QUICK_LABEL = "no LTO, 16 codegen units: not the deployed sizes"


def functions(template_path: str) -> dict[str, str]:
    """Logical id -> BuildProperties.Binary of every function in the template."""
    template = create_resources.load_template(template_path)
    found = {}
    for name, res in (template.get("Resources") or {}).items():
        if (res or {}).get("Type") == FUNCTION:
            props = ((res.get("Metadata") or {}).get("BuildProperties") or {})
            found[name] = props.get("Binary", "?")
    return found


def elf_machine(path: str) -> int | None:
    with open(path, "rb") as f:
        header = f.read(20)
    if len(header) < 20 or header[:4] != b"\x7fELF":
        return None
    little_endian = header[5] == 1
    return int.from_bytes(header[18:20], "little" if little_endian else "big")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", choices=sorted(ELF_MACHINE), default="x86_64")
    parser.add_argument("--template", default=os.path.join(REPO, "template.yaml"))
    parser.add_argument("--build-dir", help="default: .aws-sam/check-<arch>")
    parser.add_argument("--skip-build", action="store_true", help="only check an existing build dir")
    parser.add_argument("--quick", action="store_true",
                        help="release profile without LTO, 16 codegen units (CI: same checks, larger binaries)")
    parser.add_argument("--no-prebuild", action="store_true",
                        help="let sam build compile each function itself, one after the other")
    args = parser.parse_args(argv)
    build_dir = os.path.abspath(args.build_dir or os.path.join(REPO, ".aws-sam", f"check-{args.arch}"))
    expected = functions(args.template)
    if not expected:
        print(f"check_sam_build: no {FUNCTION} in {args.template}", file=sys.stderr)
        return 1

    seconds = None
    if not args.skip_build:
        for tool in ("sam", "cargo-lambda"):
            if not shutil.which(tool):
                print(f"check_sam_build: {tool} is not on PATH (run infra/setup.sh, then "
                      f'export PATH="$PWD/.venv/bin:$PATH")', file=sys.stderr)
                return 1
        env = dict(os.environ, SAM_CLI_TELEMETRY="0")
        if args.quick:
            env.update(QUICK_PROFILE)
        env.setdefault("AWS_DEFAULT_REGION", "us-east-1")
        start = time.monotonic()
        if not args.no_prebuild:
            # What lambda-builders runs per function (`cargo lambda build --release [--arm64]
            # --bin <Binary>` in CodeUri, the workspace root), for all binaries in one go.
            # lambda-builders points CARGO_TARGET_DIR at the workspace's target directory.
            metadata = subprocess.run(["cargo", "metadata", "--no-deps", "--format-version", "1"],
                                      cwd=REPO, env=env, capture_output=True, text=True, check=True)
            env.setdefault("CARGO_TARGET_DIR", json.loads(metadata.stdout)["target_directory"])
            prebuild = ["cargo", "lambda", "build", "--release"]
            if args.arch == "arm64":
                prebuild.append("--arm64")
            for binary in sorted(set(expected.values())):
                prebuild += ["--bin", binary]
            print("check_sam_build: " + " ".join(prebuild), flush=True)
            if subprocess.run(prebuild, cwd=REPO, env=env).returncode != 0:
                return 1
            print(f"check_sam_build: prebuild took {time.monotonic() - start:.1f} s", flush=True)
        # --language-extensions: sam build expands the template's Fn::ForEach loops
        # (AWS::LanguageExtensions) itself; without it, it fails on them.
        command = ["sam", "build", "--language-extensions", "--template-file", args.template,
                   "--build-dir", build_dir, "--parameter-overrides", f"Architecture={args.arch}"]
        print("check_sam_build: " + " ".join(command), flush=True)
        result = subprocess.run(command, cwd=REPO, env=env)
        seconds = round(time.monotonic() - start, 1)
        print(f"check_sam_build: build took {seconds} s in all (exit {result.returncode})", flush=True)
        if result.returncode != 0:
            return 1

    problems = []
    sizes = {}
    for name, binary in sorted(expected.items()):
        path = os.path.join(build_dir, name, "bootstrap")
        if not os.path.isfile(path):
            problems.append(f"{name} ({binary}): {os.path.relpath(path, REPO)} is missing")
            continue
        machine = elf_machine(path)
        if machine != ELF_MACHINE[args.arch]:
            problems.append(f"{name} ({binary}): not an {args.arch} ELF executable (e_machine {machine})")
        if not os.access(path, os.X_OK):
            problems.append(f"{name} ({binary}): bootstrap is not executable")
        sizes[name] = {"binary": binary, "bytes": os.path.getsize(path)}

    profile = "release" + (", " + QUICK_LABEL if args.quick else "")
    width = max(len(n) for n in expected)
    print(f"\n{'function'.ljust(width)}  {'binary'.ljust(14)}  {'bootstrap':>10}  ({args.arch}, {profile})")
    for name, entry in sizes.items():
        print(f"{name.ljust(width)}  {entry['binary'].ljust(14)}  {entry['bytes'] / 2**20:7.2f} MiB")
    record = {"arch": args.arch, "profile": profile, "build_seconds": seconds, "functions": sizes}
    os.makedirs(build_dir, exist_ok=True)
    with open(os.path.join(build_dir, "bootstrap-sizes.json"), "w") as f:
        json.dump(record, f, indent=2)
        f.write("\n")
    print(f"recorded in {os.path.relpath(os.path.join(build_dir, 'bootstrap-sizes.json'), REPO)}")
    for p in problems:
        print(f"check_sam_build: {p}", file=sys.stderr)
    if problems:
        return 1
    print(f"check_sam_build: {len(sizes)} of {len(expected)} functions have an {args.arch} bootstrap")
    return 0


if __name__ == "__main__":
    sys.exit(main())
