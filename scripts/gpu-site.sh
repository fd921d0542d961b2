#!/usr/bin/env bash
# seqmix and its dependencies where a bare GPU image lacks them (Python 3.12, torch, Triton, no
# package registry): the wheels scripts/gpu-wheels.sh gathered into $WHEELS (when there are
# any) and seqmix itself, non-editable, no dependencies, no build isolation, into $SITE
# (default .gpu-site/), which must sit directly in the checkout: seqmix finds config/ as the
# parent of its installed package's folder. scripts/gpu-check.sh runs it; tests/project/test_install.py
# runs it into a copy of the checkout and imports every module from there.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
PYTHON=${PYTHON:-python3}
WHEELS=${WHEELS:-.gpu-wheels}
SITE=${GPU_SITE:-$PWD/.gpu-site}
if [ "$(dirname "$(realpath -m "$SITE")")" != "$PWD" ]; then
  echo "gpu-site: $SITE is not directly in the checkout $PWD: seqmix would not find config/ from there" >&2
  exit 2
fi
mapfile -t wheels < <(find "$WHEELS" -maxdepth 1 -name '*.whl' 2>/dev/null | sort)
if [ "${#wheels[@]}" -gt 0 ]; then
  echo "gpu-site: installing ${#wheels[@]} wheels into $SITE"
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    "${wheels[@]}" || exit 2
fi
echo "gpu-site: installing seqmix into $SITE"
"$PYTHON" -m pip install -q --no-deps --no-build-isolation --no-compile --no-cache-dir --upgrade --target "$SITE" . \
  || exit 2
