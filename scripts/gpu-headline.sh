#!/usr/bin/env bash
# The headline study on one GPU in one call, from a bare machine with the image's Python,
# torch and Triton and no package registry (README, "GPU and kernels"; the exact device call
# is in docs/gpu-headline.md). It needs, beside the checkout: .gpu-wheels/ (make gpu-wheels),
# .gpu-data/ and data/paper-headline/ (make gpu-data).
#   1. the wheels into $PYTHON's environment, where they are not importable yet; seqmix is
#      this checkout's src/ (PYTHONPATH), as every job of the DAG runs it;
#   2. python -m tools.bench.packing: one run alone against six together, eager against
#      compiled steps (<= MEASURE_S); its choice of step and seeds is written into $HEADLINE,
#      its slots per GPU passed on;
#   3. make paper-headline (the runs, their evaluations, the recording), stopped at LIMIT_S;
#   4. into $OUT: headline.tar.gz (the applied config, the measurement, every run's small
#      files, logs and benchmarks, the recorded study; paths relative to the checkout) and
#      this script's log, gpu-headline.log.
# Every step is timed in the log. The CPU rehearsal (the same script, no GPU) is in
# docs/gpu-headline.md.
set -uo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
LIMIT_S=${LIMIT_S:-555}          # from the start, at most: the device call's timeout_s less packing up
MEASURE_S=${MEASURE_S:-150}      # the measurement's own limit
HEADLINE=${HEADLINE:-config/paper-headline.yaml}
PYTHON=${PYTHON:-python3}
WHEELS=${WHEELS:-.gpu-wheels}
OUT=${OUT:-$PWD/results/gpu-headline-out}
PACK_JOBS=${PACK_JOBS:-6}
PACK_MODES=${PACK_MODES:-eager,compiled}
PACK_STEPS=${PACK_STEPS:-30}
PACK_WINDOW=${PACK_WINDOW:-8}
JOB_THREADS=${JOB_THREADS:-2}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu-headline.log") 2>&1
stamp() { echo "== gpu-headline: $* ($(( $(date +%s) - t0 )) s)"; }
export PYTHONUNBUFFERED=1 SEQMIX_DATA_MIRROR=${SEQMIX_DATA_MIRROR:-$PWD/.gpu-data}

stamp "start: $(uname -n), $($PYTHON --version 2>&1), $HEADLINE"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
if ! "$PYTHON" -c "import pydantic, snakemake, jsonschema, datasets" 2>/dev/null; then
  ls "$WHEELS"/*.whl >/dev/null 2>&1 || { echo "no wheels in $WHEELS/: run make gpu-wheels where PyPI is reachable" >&2; exit 2; }
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir "$WHEELS"/*.whl || exit 2
fi
# snakemake's entry point, and `python` (the rules' interpreter) as $PYTHON where it is not
export PATH="$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):$PATH"
if [ "$(python -c 'import sys; print(sys.executable)' 2>/dev/null)" != "$("$PYTHON" -c 'import sys; print(sys.executable)')" ]; then
  mkdir -p .gpu-bin && printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v "$PYTHON")" > .gpu-bin/python && chmod +x .gpu-bin/python
  export PATH="$PWD/.gpu-bin:$PATH"
fi
"$PYTHON" -c "import torch, triton, snakemake, pydantic, seqmix.kernels; print('torch', torch.__version__, 'triton', triton.__version__, \
'snakemake', snakemake.__version__, 'cuda' if torch.cuda.is_available() else 'no GPU', \
torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')" || exit 2
results=$("$PYTHON" -c "from seqmix.expansion.validate import load_study; print(load_study('$HEADLINE').results_dir)") || exit 2
data=$("$PYTHON" -c "from seqmix.expansion.validate import load_study; print(load_study('$HEADLINE').data.dir)") || exit 2
# Its own folder: `make gpu-check` empties results/bench/<gpu>/ of files, not of folders.
BENCH=${BENCH:-results/bench/$("$PYTHON" -c "import torch; from seqmix.device import device_slug; \
print(device_slug(torch.cuda.get_device_name(0)) if torch.cuda.is_available() else 'cpu')")/headline}
mkdir -p "$BENCH"
# Carried data keep their order in time (tokenizer, then the splits): the DAG does not redo them.
if [ -d "$data/tokenizer" ]; then
  touch "$data"/tokenizer/*; sleep 1; touch "$data"/wikitext2/* 2>/dev/null
fi
stamp "installed"

"$PYTHON" -m tools.bench.packing --config "$HEADLINE" --jobs "$PACK_JOBS" --modes "$PACK_MODES" \
  --steps "$PACK_STEPS" --window "$PACK_WINDOW" --measure-budget-s "$MEASURE_S" --deadline $(( t0 + LIMIT_S )) \
  --out "$BENCH/packing.csv" --choice "$BENCH/choice.json" --apply "$HEADLINE"
slots=$("$PYTHON" -c "import json; print(json.load(open('$BENCH/choice.json'))['slots_per_gpu'])" 2>/dev/null || echo 6)
stamp "measured; running $HEADLINE with $slots slots per GPU"

left=$(( t0 + LIMIT_S - $(date +%s) ))
timeout --signal=TERM --kill-after=15 "$left" \
  make paper-headline HEADLINE="$HEADLINE" SLOTS_PER_GPU="$slots" JOB_THREADS="$JOB_THREADS" PYTHON="$PYTHON"
status=$?
stamp "make paper-headline: exit status $status"

# What comes back: small files only (no weights, no checkpoints).
list=$(mktemp)
{ echo "$HEADLINE"; find "$BENCH" -type f 2>/dev/null
  find "$results" -type f \( -name config.json -o -name metrics.json -o -name eval.json -o -name log.csv \
       -o -name provenance.json -o -path '*/logs/*' -o -path '*/benchmarks/*' \) 2>/dev/null
  find results/recorded -type f 2>/dev/null; ls -t .snakemake/log/*.log 2>/dev/null | head -1; } > "$list"
tar -czf "$OUT/headline.tar.gz" --ignore-failed-read -T "$list" 2>/dev/null
stamp "packed $(wc -l < "$list") files into $OUT/headline.tar.gz ($(du -h "$OUT/headline.tar.gz" | cut -f1))"
rm -f "$list"
exit "$status"
