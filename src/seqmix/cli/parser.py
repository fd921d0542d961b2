"""The options of `python -m seqmix`: one subcommand per function of seqmix.cli.commands."""

from __future__ import annotations

import argparse

from seqmix import numerics
from seqmix.cli.commands import (
    cmd_benchmarks,
    cmd_collect,
    cmd_complexity,
    cmd_concat,
    cmd_copy_probe,
    cmd_data,
    cmd_eval,
    cmd_fingerprint,
    cmd_geometry,
    cmd_jobs,
    cmd_mixers,
    cmd_plan,
    cmd_record,
    cmd_runs,
    cmd_schema,
    cmd_sparsity,
    cmd_sparsity_analytic,
    cmd_throughput,
    cmd_train,
    cmd_train_pack,
    cmd_verify,
    cmd_where,
)
from seqmix.study.profile import DEFAULT_CONFIG

DESCRIPTION = "`python -m seqmix <command>`: the one command line every Snakemake rule calls."

JOB_SPEC = "the job spec"  # what --spec is for most commands: exactly what that job reads


def _add(sub, name, func, help_, config=True, spec: str | None = None):
    """A command; ``spec`` names what its ``--spec`` JSON is (None: it takes no spec)."""
    sp = sub.add_parser(name, help=help_, description=help_)
    if config:
        sp.add_argument("--config", default=str(DEFAULT_CONFIG), help="YAML config file, or a JSON object")
    if spec:
        sp.add_argument("--spec", help=f"{spec} as JSON, what the Snakefile passes (instead of --config)")
    sp.set_defaults(func=func)
    return sp


def _add_copy_probe(sub) -> None:
    sp = _add(sub, "copy-probe", cmd_copy_probe,
              "can each mixer copy the previous token (and, where its reach is finite, the token each other lag back)? "
              "a fresh model per architecture and lag, built as the MQAR task builds its own",
              spec=JOB_SPEC)
    sp.add_argument("--out", default="results/analysis/copy_probe.csv")
    sp.add_argument("--threads", type=int, default=None)
    sp.add_argument("--quiet", action="store_true")


def _add_analyses(sub) -> None:
    sp = _add(sub, "complexity", cmd_complexity,
              "counted FLOPs, bytes written, peak memory and wall time of each mixer vs sequence length",
              spec=JOB_SPEC)
    sp.add_argument("--out", default="results/analysis/complexity.csv")
    sp.add_argument("--fit-out", default=None, help="default: <out stem>_fit.csv beside --out")
    sp.add_argument("--growth-out", default=None, help="default: <out stem>_growth.csv beside --out")
    sp.add_argument("--arch", action="append", help="measure only this architecture (repeatable)")
    sp.add_argument("--device", choices=["auto", "cpu", "cuda"], default=None,
                    help="override analysis.complexity.device (e.g. cuda with --out results/bench/<gpu>/complexity.csv)")
    sp.add_argument("--threads", type=int, default=None)
    sp.add_argument("--quiet", action="store_true")

    sp = _add(sub, "sparsity", cmd_sparsity, "Su's sparsity of trained models' attention rows and Jacobians",
              spec=JOB_SPEC)
    sp.add_argument("--run", help="one run directory (default: every finished run the analysis measures)")
    sp.add_argument("--out", default="results/analysis/sparsity.csv")
    sp.add_argument("--threads", type=int, default=None)

    sp = _add(sub, "sparsity-analytic", cmd_sparsity_analytic, "Su's sparsity closed forms as curves (no training)",
              spec="analysis.sparsity_analytic")
    sp.add_argument("--out", default="results/analysis/sparsity_analytic.csv")

    sp = _add(sub, "geometry", cmd_geometry, "Plücker and plane geometry of Grassmann runs, TSSA compression term",
              spec=JOB_SPEC)
    sp.add_argument("--out", default="results/analysis/geometry.csv")
    sp.add_argument("--threads", type=int, default=None)

    sp = _add(sub, "throughput", cmd_throughput,
              "training tokens/s of every causal mixer's LM beside softmax (analysis.throughput)",
              spec=JOB_SPEC)
    sp.add_argument("--lengths", type=int, nargs="+", default=None, help="L values (default: analysis.throughput.lengths)")
    sp.add_argument("--out", default="results/analysis/throughput.csv")
    sp.add_argument("--arch", action="append", help="time only this architecture (repeatable; softmax is added)")
    sp.add_argument("--threads", type=int, default=None, help="override analysis.throughput.threads")
    sp.add_argument("--quiet", action="store_true")


def _add_verify(sub) -> None:
    sp = _add(sub, "verify", cmd_verify, "train recorded runs again on this host and compare their weights' hash, "
              "log.csv and eval.json byte for byte with the recorded ones (portable recordings only)")
    sp.add_argument("recording", nargs="*", help="a recording: its directory, <profile>/<device>-<date> under "
                    "results/recorded, or a profile (its newest recording); default: each recording --config's "
                    "`recordings` names")
    sp.add_argument("--run", help="only this run, <task>/<arch>/seed<k>")
    sp.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                    help="a sample of the runs whose recorded times fit in SECONDS (all recordings together), "
                    "least verified first")
    sp.add_argument("--scratch", default=None, help="where to train them (default: the system's temporary folder)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m seqmix", description=DESCRIPTION)
    sub = p.add_subparsers(dest="command", required=True)

    sp = _add(sub, "data", cmd_data, "prepare the tokenizer or one task's data (a task of the config, e.g. mqar)",
              spec=JOB_SPEC)
    sp.add_argument("name", help="'tokenizer', or a task of the config (its group: the name before any sweep point)")

    sp = _add(sub, "train", cmd_train, "train one (task, architecture, seed); resumes from its checkpoint",
              spec="a complete run spec")
    sp.add_argument("--task", help="a task of --config (a sweep point by its full name, e.g. mqar/L64-kv4/d64-lr0.001)")
    sp.add_argument("--arch", help="an architecture (python -m seqmix mixers lists them)")
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--quiet", action="store_true", help="no progress bar")
    sp.add_argument("--code", help="the digest of the run's code the workflow planned it with (it fails if the "
                    "checkout's differs); default: this checkout's")

    _add_train_pack(sub)

    sp = _add(sub, "eval", cmd_eval, "score a finished run on its evaluation and test splits (eval.json)", config=False)
    sp.add_argument("--run", required=True, help="run directory, results/runs/<task>/<arch>/seed<k>")
    sp.add_argument("--device", default="auto")

    _add(sub, "runs", cmd_runs, "list the run directories the config trains")

    sp = _add(sub, "where", cmd_where, "the study's results folder, or its report folder (figures/, tables/, "
              "report.pdf, report.html)")
    sp.add_argument("what", choices=["results", "report"])

    sp = _add(sub, "jobs", cmd_jobs, "the validated study and every job's spec as JSON, with the files read to "
              "make it (what the Snakefile builds its rules from; seqmix.study.dag caches it)")
    sp.add_argument("--overrides", help="config keys over the file's, as a JSON object (snakemake's --config)")

    _add_summaries(sub)
    _add_verify(sub)
    _add_analyses(sub)
    _add_copy_probe(sub)
    return p


def _add_train_pack(sub) -> None:
    sp = _add(sub, "train-pack", cmd_train_pack, "train the seeds of one (task, architecture) as one seed pack "
              "(a task's train.pack); each seed writes its single run's files and resumes from its checkpoint",
              spec="the seed pack's spec (its members' run specs)")
    sp.add_argument("--task", help="a task of --config whose train.pack holds for --arch")
    sp.add_argument("--arch", help="an architecture of that task")
    sp.add_argument("--quiet", action="store_true", help="no progress bar")
    sp.add_argument("--code", help="the digest of the pack's code the workflow planned it with (it fails if the "
                    "checkout's differs); default: this checkout's")


def _add_plan(sub) -> None:
    sp = _add(sub, "plan", cmd_plan, "what the study costs (runs, tokens, FLOPs, memory, H100 hours) and what "
              "would fail at its shapes")
    sp.add_argument("--mfu", type=float, default=0.05, help="assumed model FLOP utilisation (default 0.05)")
    sp.add_argument("--peak-tflops", type=float, default=989.4, help="peak FLOP/s in TFLOP/s (default: H100 SXM dense BF16)")
    sp.add_argument("--measured", default=None,
                    help="a directory with gpu-check's train_probe.csv: measured step times for the points it has, "
                         "extrapolated by FLOPs for the others (default: results/bench/nvidia-h100-80gb-hbm3, the "
                         "H100's; '' for none)")
    sp.add_argument("--pack-counts", default=None,
                    help="the time model's launch counts, from which a seed pack's step time is predicted (default: "
                         "results/bench/time_model/counts.json; '' for none: packs cost their runs' unpacked time)")
    sp.add_argument("--out", help="also write the table as CSV here")
    sp.add_argument("--markdown", help="also write the Markdown table here")
    sp.add_argument("--no-local-checks", action="store_true", help="skip the checks of this machine (GPU, memory)")
    sp.add_argument("--quiet", action="store_true")


def _add_summaries(sub) -> None:
    """The commands that plan, summarise or describe a study rather than run its jobs."""
    _add_plan(sub)

    sp = _add(sub, "benchmarks", cmd_benchmarks, "time and peak memory of every job of a DAG run, per rule "
              "(Snakemake's benchmark files)", config=False)
    sp.add_argument("dir", help="<results_dir>/benchmarks")
    sp.add_argument("--out", help="also write the summary as CSV here")
    sp.add_argument("--markdown", help="also write the Markdown table here")

    sp = _add(sub, "mixers", cmd_mixers, "list every catalogued mixer with its parameter count at one width")
    sp.add_argument("--d-model", type=int, default=256)
    sp.add_argument("--max-len", type=int, default=128)
    sp.add_argument("--config-options", action="store_true", help="use the mixer options of --config")
    sp.add_argument("--blocks", action="store_true", help="instead, the table of each mixer's residual block and why")
    sp.add_argument("--markdown", help="with --blocks, also write that table here (docs/reference/blocks.md: make docs-blocks)")

    sp = _add(sub, "concat", cmd_concat, "concatenate CSVs with the same columns", config=False)
    sp.add_argument("inputs", nargs="+")
    sp.add_argument("--out", required=True)

    sp = _add(sub, "collect", cmd_collect, "gather every run's metrics into one CSV (and breakdowns into another)",
              spec=JOB_SPEC)
    sp.add_argument("--out", default="results/summary/runs.csv")
    sp.add_argument("--breakdown-out", default=None, help="default: breakdown.csv beside --out")

    sp = _add(sub, "record", cmd_record, "copy a finished study's small outputs of every run (config, metrics, "
              "evaluation, log, provenance; no weights) into <out>/<profile>/<device>-<date>/ with a meta.json, "
              "for every report to read (committed)")
    sp.add_argument("--out", default="results/recorded")
    sp.add_argument("--made-by", default=None, help="the command that ran the study, for meta.json (e.g. 'make paper-headline')")
    sp.add_argument("--commit", default=None, help="the commit the runs were made at, where their provenance has none "
                    "(a checkout copied without .git); never overrides theirs")
    sp.add_argument("--partial", action="store_true", help="record the runs that finished and name the others in "
                    "meta.json's unfinished (a GPU call that ran out of time); refused only when none finished")

    sp = _add(sub, "fingerprint", cmd_fingerprint,
              "a few training steps of every catalogued mixer on one thread under the study's numerics: the hash "
              "of each one's weights and of all (docs/reference/numerics.md)")
    sp.add_argument("--numerics", dest="asked_numerics", choices=numerics.MODES, default=None,
                    help="these numerics instead of the study's (--config)")
    sp.add_argument("--out", help="also write the digests, the host and the numerics in effect here (JSON)")
    sp.add_argument("--record", help="add this host's entry to a hosts file (docs/reference/hosts.md), in place of its own "
                    "earlier one; a portable fingerprint that differs from a recorded one of the same torch version "
                    "is refused, naming the mixers")
    sp.add_argument("--from", dest="from_file", metavar="FILE",
                    help="record the fingerprint another host wrote with --out FILE instead of measuring this one's")

    sp = _add(sub, "schema", cmd_schema, "the JSON schema of a config file (every task kind and mixer)", config=False)
    sp.add_argument("--out", help="write it here (workflow/schemas/config.schema.json) instead of stdout")
