#!/usr/bin/env bash
# Gathers, into .gpu-wheels/ (git-ignored), the wheels that `make gpu-check` and
# scripts/gpu-headline.sh install on a GPU machine that has Python 3.12, torch and Triton but
# no package registry: what the project runs there (Snakemake and its plugins' interfaces,
# pydantic, jsonschema, datasets: the versions requirements.txt pins) with every dependency
# the image lacks (scripts/gpu-image.txt lists what it has), and, for the kernel bench's GLA
# comparison, flash-linear-attention and fla-core (FLA_VERSION; FLA_VERSION= leaves them out).
# One version of each, for CPython $PY_VERSION on x86-64 Linux; a dependency published only
# as source (connection_pool) is built here into a pure-Python wheel. Prints the set and its
# size. Run it where pip reaches PyPI: `make gpu-wheels`. PY_VERSION=3.11 DEST=... gathers
# the same set for this machine's Python (the stand-in for a machine without a package
# registry: docs/runbook/running.md).
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${DEST:-.gpu-wheels}
PYTHON=${PYTHON:-python3}
PY_VERSION=${PY_VERSION:-3.12}
FLA_VERSION=${FLA_VERSION-0.6.0}
mapfile -t ROOTS < <(grep -E '^(snakemake|pydantic|jsonschema|datasets)==' requirements.txt)
ROOTS+=(typing-extensions)
PLATFORM=(--python-version "$PY_VERSION" --implementation cp --platform manylinux_2_28_x86_64
          --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
          --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rm -rf "$DEST"
mkdir -p "$DEST" "$work/built"
# Source-only dependencies, built once as pure-Python wheels the resolver below can take.
"$PYTHON" -m pip wheel -q --no-deps -w "$work/built" connection_pool==0.0.3
# The whole resolution for the target interpreter, then the part of it the image lacks: the
# dependency graph walked from the roots, stopping at the image's packages.
"$PYTHON" -m pip install -q --dry-run --ignore-installed --only-binary=:all: "${PLATFORM[@]}" \
  --find-links "$work/built" --target "$work/none" --report "$work/report.json" "${ROOTS[@]}"
"$PYTHON" - "$work/report.json" scripts/gpu-image.txt "$PY_VERSION" "${ROOTS[@]}" > "$work/pins.txt" <<'EOF'
import json, re, sys
from packaging.requirements import Requirement

report, image_file, py, roots = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
image = {norm(l.strip()) for l in open(image_file) if l.strip() and not l.startswith("#")}
env = {"python_version": py, "python_full_version": py + ".0", "sys_platform": "linux", "platform_system": "Linux",
       "os_name": "posix", "platform_machine": "x86_64", "implementation_name": "cpython",
       "platform_python_implementation": "CPython", "extra": ""}
found = {norm(i["metadata"]["name"]): i["metadata"] for i in json.load(open(report))["install"]}
todo, keep = [norm(Requirement(r).name) for r in roots], set()
while todo:
    name = todo.pop()
    if name in keep or name in image:
        continue
    keep.add(name)
    for dep in found[name].get("requires_dist", []):
        req = Requirement(dep)
        if req.marker is None or req.marker.evaluate(env):
            todo.append(norm(req.name))
print("\n".join(sorted(f"{found[n]['name']}=={found[n]['version']}" for n in keep)))
EOF
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: "${PLATFORM[@]}" --find-links "$work/built" \
  -d "$DEST" -r "$work/pins.txt"
if [ -n "$FLA_VERSION" ]; then
  # without their dependencies: transformers and einops are in the image, torch and triton too
  "$PYTHON" -m pip download -q --no-deps --only-binary=:all: "${PLATFORM[@]}" -d "$DEST" \
    "fla-core==$FLA_VERSION" "flash-linear-attention==$FLA_VERSION"
fi
ls -1 "$DEST"
echo "$(find "$DEST" -maxdepth 1 -type f | wc -l) wheels, $(du -sh "$DEST" | cut -f1) in $DEST (CPython $PY_VERSION, x86-64 Linux)"
