#!/usr/bin/env bash
# The headline study on one GPU in one call, from a bare machine with the image's Python,
# torch and Triton and no package registry (docs/runbook/running.md; the exact device call
# is in docs/runbook/gpu-headline.md). It needs, beside the checkout: .gpu-wheels/ (make gpu-wheels),
# .gpu-data/ and data/paper-headline/ (make gpu-data).
#   1. the wheels into $PYTHON's environment, where they are not importable yet; seqmix is
#      this checkout's src/ (PYTHONPATH), as every job of the DAG runs it;
#   2. python -m tools.bench.packing: one run alone against several together, eager then
#      compiled steps (<= MEASURE_S); packing.csv and choice.json go to $OUT at once. Its
#      choice of step and seeds (and pack: false, as it timed one run per process) is
#      written into $HEADLINE only where one fits the time left:
#      where none fits, no run starts, and the script says so and exits with status 3;
#   3. make paper-headline-runs (the runs and their evaluations), stopped MARGIN_S before the
#      call's limit LIMIT_S, then the record of every run that finished (meta.json's
#      `unfinished` names the others);
#   4. into $OUT: headline.tar.gz (the applied config, the measurement, every run's small
#      files, logs and benchmarks, the recorded study; paths relative to the checkout) and
#      this script's log, gpu-headline.log.
# Every step is stamped with its second in the log. The CPU rehearsals (this script, no GPU)
# are in docs/runbook/gpu-headline.md and tests/tools/test_gpu_headline_script.py.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
t0=$(date +%s)
LIMIT_S=${LIMIT_S:-570}          # the device call's timeout_s: nothing of this script may outlive it
MARGIN_S=${MARGIN_S:-60}         # before LIMIT_S: the record and packing up (measured: docs/runbook/gpu-headline.md)
MEASURE_S=${MEASURE_S:-90}       # the measurement's own limit
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
SEQMIX_DATA_MIRROR=${SEQMIX_DATA_MIRROR:-$PWD/.gpu-data}
export PYTHONUNBUFFERED=1 SEQMIX_DATA_MIRROR
deadline=$(( t0 + LIMIT_S - MARGIN_S ))  # the runs stop here

stamp "start: $(uname -n), $($PYTHON --version 2>&1), $HEADLINE; runs stop at $(( LIMIT_S - MARGIN_S )) s"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
# Found, not imported (datasets' import alone takes seconds; the setup below imports what it needs).
if ! "$PYTHON" -c "import importlib.util as u, sys
sys.exit(any(u.find_spec(m) is None for m in ('pydantic', 'snakemake', 'jsonschema', 'datasets')))" 2>/dev/null; then
  ls "$WHEELS"/*.whl >/dev/null 2>&1 || { echo "no wheels in $WHEELS/: run make gpu-wheels where PyPI is reachable" >&2; exit 2; }
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir "$WHEELS"/*.whl || exit 2
fi
# snakemake's entry point, and `python` (the rules' interpreter) as $PYTHON where it is not
scripts_dir=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_path("scripts"))')
export PATH="$scripts_dir:$PATH"
if [ "$(python -c 'import sys; print(sys.executable)' 2>/dev/null)" != "$("$PYTHON" -c 'import sys; print(sys.executable)')" ]; then
  mkdir -p .gpu-bin && printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v "$PYTHON")" > .gpu-bin/python && chmod +x .gpu-bin/python
  export PATH="$PWD/.gpu-bin:$PATH"
fi
# One interpreter start (torch's import is the slow part): what is installed, and the study's folders.
setup=$("$PYTHON" -c "
import torch, triton, snakemake, pydantic, seqmix.kernels
from seqmix.device import device_slug
from seqmix.expansion.validate import load_study
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else ''
print('torch', torch.__version__, 'triton', triton.__version__, 'snakemake', snakemake.__version__, gpu or 'no GPU')
study = load_study('$HEADLINE')
print(study.results_dir); print(study.data.dir); print(device_slug(gpu) if gpu else 'cpu')") || exit 2
{ read -r versions; read -r results; read -r data; read -r slug; } <<< "$setup"
echo "$versions"
# Its own folder: `make gpu-check` empties results/bench/<gpu>/ of files, not of folders.
BENCH=${BENCH:-results/bench/$slug/headline}
mkdir -p "$BENCH"
# Carried data keep their order in time (tokenizer, then the splits): the DAG does not redo them.
if [ -d "$data/tokenizer" ]; then
  touch "$data"/tokenizer/*; sleep 1; touch "$data"/wikitext2/* 2>/dev/null
fi
stamp "installed"

# What comes back, small files only (no weights, no checkpoints): called at every exit.
pack_up() {
  local list
  list=$(mktemp)
  { echo "$HEADLINE"; find "$BENCH" -type f 2>/dev/null
    find "$results" -type f \( -name config.json -o -name metrics.json -o -name eval.json -o -name log.csv \
         -o -name provenance.json -o -path '*/logs/*' -o -path '*/benchmarks/*' \) 2>/dev/null
    find results/recorded -type f 2>/dev/null; find .snakemake/log -name '*.log' 2>/dev/null | sort | tail -1; } > "$list"
  tar -czf "$OUT/headline.tar.gz" --ignore-failed-read -T "$list" 2>/dev/null
  stamp "packed $(wc -l < "$list") files into $OUT/headline.tar.gz ($(du -h "$OUT/headline.tar.gz" | cut -f1))"
  rm -f "$list"
}

"$PYTHON" -m tools.bench.packing --config "$HEADLINE" --jobs "$PACK_JOBS" --modes "$PACK_MODES" \
  --steps "$PACK_STEPS" --window "$PACK_WINDOW" --measure-budget-s "$MEASURE_S" --deadline "$deadline" \
  --out "$BENCH/packing.csv" --choice "$BENCH/choice.json" --apply "$HEADLINE"
cp "$BENCH/packing.csv" "$BENCH/choice.json" "$OUT/" 2>/dev/null  # the measurement, whatever follows
fits=$("$PYTHON" -c "import json; c = json.load(open('$BENCH/choice.json')); print('yes' if c['fits'] else 'no')" 2>/dev/null || echo no)
if [ "$fits" != yes ]; then
  stamp "no option fits the $(( deadline - $(date +%s) )) s left (choice.json lists each option's predicted time): started no run"
  pack_up
  exit 3
fi
slots=$("$PYTHON" -c "import json; print(json.load(open('$BENCH/choice.json'))['slots_per_gpu'])")
stamp "measured; running $HEADLINE with $slots slots per GPU until $(( LIMIT_S - MARGIN_S )) s"

left=$(( deadline - $(date +%s) ))
timeout --signal=TERM --kill-after=10 "$(( left > 10 ? left - 10 : 1 ))" \
  make paper-headline-runs HEADLINE="$HEADLINE" SLOTS_PER_GPU="$slots" JOB_THREADS="$JOB_THREADS" PYTHON="$PYTHON"
status=$?
stamp "make paper-headline-runs: exit status $status"

# The record of what finished (all of it, or the finished runs with the others named).
left=$(( t0 + LIMIT_S - $(date +%s) - 15 ))
timeout --signal=KILL "$(( left > 5 ? left : 5 ))" "$PYTHON" -m seqmix record --config "$HEADLINE" --partial \
  --out results/recorded --made-by scripts/gpu-headline.sh ${SEQMIX_GIT_COMMIT:+--commit "$SEQMIX_GIT_COMMIT"}
recorded=$?
stamp "record: exit status $recorded"
pack_up
[ "$status" -eq 0 ] && [ "$recorded" -eq 0 ] && exit 0
exit $(( status != 0 ? status : recorded ))
