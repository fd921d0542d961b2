#!/usr/bin/env bash
# `make gpu-check`: everything one GPU can tell this project in at most 8 minutes
# (python -m tools.bench gpu-check; tools/bench/gpucheck.py says what it runs), into
# results/bench/<gpu>/, its whole output in gpu-check.log there.
#
# Where seqmix and its dependencies are not importable (a bare GPU image: Python 3.12,
# torch, Triton, no package registry), it first installs them into $GPU_SITE (default
# .gpu-site/, in the checkout) with scripts/gpu-site.sh: the wheels scripts/gpu-wheels.sh
# gathered into .gpu-wheels/ and seqmix itself, the layout tests/project/test_install.py installs.
# Numerics: native (python -m tools.bench gpu-check's default: the GPU's own arithmetic, and
# no C compiler needed, which portable's oneMKL shim would need and a GPU image may lack).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
PYTHON=${PYTHON:-python3}
WHEELS=${WHEELS:-.gpu-wheels}
SITE=${GPU_SITE:-$PWD/.gpu-site}
start=$(date +%s)
if ! "$PYTHON" -c "import pydantic, seqmix.cli" 2>/dev/null; then
  if ! ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    echo "gpu-check: seqmix's dependencies are not importable and $WHEELS/ holds no wheels:" \
         "run scripts/gpu-wheels.sh (make gpu-wheels) where pip reaches PyPI, and bring $WHEELS/ along" >&2
    exit 2
  fi
  PYTHON="$PYTHON" WHEELS="$WHEELS" GPU_SITE="$SITE" bash scripts/gpu-site.sh || exit 2
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1
log=$(mktemp)
"$PYTHON" -m tools.bench gpu-check "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
echo "gpu-check: exit status $status, $(( $(date +%s) - start )) s in all (installation included)" | tee -a "$log"
out=$("$PYTHON" -c "import torch; from seqmix.device import device_slug; \
print('results/bench/' + device_slug(torch.cuda.get_device_name(0)))" 2>/dev/null)
if [ -n "$out" ] && [ -d "$out" ]; then
  cp "$log" "$out/gpu-check.log"
fi
rm -f "$log"
exit "$status"
