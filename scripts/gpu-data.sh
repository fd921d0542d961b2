#!/usr/bin/env bash
# `make gpu-data`: what the headline study reads, for a GPU machine that has no data mirror and
# no package registry. Into .gpu-data/ (git-ignored), WikiText-2 raw from the data mirror in its
# layout (wikitext-2-raw/ and those files' SHA256SUMS lines), 13 MB; into
# data/paper-headline/ (the study's data.dir), the WordPiece tokenizer trained on it and the
# tokenised splits, 12 MB, made from that copy by the study's own data commands, so the DAG
# there finds its data prepared (scripts/gpu-headline.sh) and could make them again from
# .gpu-data/. Both folders travel with the checkout: name them in the device call's carry.
set -euo pipefail
cd "$(dirname "$0")/.."
MIRROR=${SEQMIX_DATA_MIRROR:-}  # the Makefile sets it (README, The data mirror)
CONFIG=${HEADLINE:-config/paper-headline.yaml}
if [ ! -f "$MIRROR/wikitext-2-raw/train.txt" ]; then
  echo "gpu-data: no WikiText-2 in the data mirror $MIRROR: set SEQMIX_DATA_MIRROR (README, The data mirror)" >&2
  exit 2
fi
rm -rf .gpu-data data/paper-headline
mkdir -p .gpu-data/wikitext-2-raw
cp "$MIRROR"/wikitext-2-raw/{train,valid,test}.txt .gpu-data/wikitext-2-raw/
grep ' wikitext-2-raw/' "$MIRROR/SHA256SUMS" > .gpu-data/SHA256SUMS
(cd .gpu-data && sha256sum -c --quiet SHA256SUMS)
export SEQMIX_DATA_MIRROR=$PWD/.gpu-data
python -m seqmix data tokenizer --config "$CONFIG"
python -m seqmix data wikitext2 --config "$CONFIG"
du -sh .gpu-data data/paper-headline
