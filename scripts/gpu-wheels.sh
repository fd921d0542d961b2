#!/usr/bin/env bash
# Gathers, into .gpu-wheels/ (git-ignored), the wheels `make gpu-check` installs on a GPU
# machine that has Python 3.12, torch and Triton but no package registry (such an image also
# has numpy, pyyaml, tqdm, tokenizers, transformers and einops). What gpu-check's code paths
# import beyond those: pydantic (the version requirements.txt pins) and the packages it
# needs; and, for the kernel bench's GLA comparison, flash-linear-attention and fla-core
# (FLA_VERSION; FLA_VERSION= leaves them out). Every wheel for CPython 3.12 on x86-64 Linux,
# one version of each. Run it where pip reaches PyPI: `make gpu-wheels`. About 4 MiB.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${DEST:-.gpu-wheels}
PYTHON=${PYTHON:-python3}
FLA_VERSION=${FLA_VERSION-0.6.0}
PYDANTIC=$(grep -E '^pydantic==' requirements.txt)
TARGET=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
        --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
        --platform manylinux1_x86_64)
rm -rf "$DEST"
mkdir -p "$DEST"
# pydantic with its dependencies (pydantic-core, annotated-types, typing-inspection, typing-extensions)
"$PYTHON" -m pip download -q "${TARGET[@]}" -d "$DEST" "$PYDANTIC"
if [ -n "$FLA_VERSION" ]; then
  # without their dependencies: transformers and einops are in the image, torch and triton too
  "$PYTHON" -m pip download -q --no-deps "${TARGET[@]}" -d "$DEST" "fla-core==$FLA_VERSION" \
    "flash-linear-attention==$FLA_VERSION"
fi
ls -1 "$DEST"
du -sh "$DEST"
