"""`python -m seqmix <command>`: the one command line every Snakemake rule calls.

Each command reads its job spec (``--spec``: the JSON the Snakefile passes, what that job
reads and nothing else) or builds it from a study config (``--config``: a YAML file, or a
JSON object), calls one library function with it, and writes files; nothing here holds
results in memory between commands. Run
``python -m seqmix <command> --help`` for each command's options.

The command line reads the environment here, once (``read_environment`` and the data
mirror of ``data``), and turns each variable into an explicit setting or argument before the
command runs. It also sets some: the study's numerics (``pin_numerics``, seqmix.numerics),
before torch is imported, so nothing at this module's top imports torch (a test keeps that
so). The other two modules that read the environment are entry points of their own:
seqmix.slots (the GPUs it spreads jobs over) and seqmix.study.dag (the Snakefile's: its cache
key, and the environment of the ``jobs`` command it runs); tests/test_dispatch.py keeps it so.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from seqmix import mkl_shim, numerics
from seqmix.errors import ConfigError, problem_lines
from seqmix.study.settings import DEFAULT_CONFIG, MIRROR_ENV

REFERENCE_ENV = "SEQMIX_REFERENCE_MIXERS"  # 1: plain PyTorch mixers everywhere (dispatch setting "reference")
SYSTEM_MALLOC_ENV = "SEQMIX_SYSTEM_MALLOC"  # 1: glibc's malloc defaults (seqmix.allocator not applied)
COMMIT_ENV = "SEQMIX_GIT_COMMIT"  # the commit a copy of the checkout without .git came from (provenance)
# seqmix.slots.SLOT_ENV, SEQMIX_GPU_SLOT: the GPU slot a training or evaluation job holds (provenance)
# MIRROR_ENV, SEQMIX_DATA_MIRROR: the raw-data mirror when data.mirror is null, given to data jobs


def load_study(config, overrides=None):
    """seqmix.study.load.load_study, imported when a command needs it (validating imports
    every mixer, and so torch, which must come after ``pin_numerics``)."""
    from seqmix.study.load import load_study as load

    return load(config, overrides)


def numerics_of(args) -> tuple[str, str | None]:
    """The numerics a command runs under and where they were read (None: the default): its job
    spec's (``--spec``), its run's (``eval --run``), else its study config's (``--config``, with
    ``--overrides``)."""
    spec, run, config = (getattr(args, k, None) for k in ("spec", "run", "config"))
    if asked := getattr(args, "asked_numerics", None):
        return asked, "--numerics"
    try:
        if spec:  # a job without numerics (a data job) computes nothing with torch: nothing to pin
            return numerics.mode_in_spec(spec) or "native", "--spec"
        if run and (mode := numerics.mode_in_run(run)):
            return mode, f"{run}/config.json"
        if config:
            from seqmix.study.dag import config_files

            overrides = json.loads(args.overrides) if getattr(args, "overrides", None) else None
            try:
                files = [] if str(config).lstrip().startswith("{") else config_files(config)
            except Exception:  # noqa: BLE001 - not YAML: loading the config names what is wrong
                files = []
            if mode := numerics.mode_in_config(str(config), files, overrides):
                return mode, str(config)
    except ValueError as e:
        raise ConfigError(f"{e} (fix the key 'numerics')") from None
    return numerics.DEFAULT, None


def pin_numerics(args) -> None:
    """Set the variables of the command's numerics (seqmix.numerics) and, for portable, load
    oneMKL's shim (seqmix.mkl_shim) before torch is imported, or refuse a host that cannot run
    them; ``args.numerics`` records the mode. In a process that imported torch before (a call
    from within Python: a test, a notebook) it is too late to pin the libraries, and nothing is
    set: provenance records the code paths that ran (seqmix.train.provenance.numerics_record),
    and the report flags runs that were not pinned."""
    mode, where = numerics_of(args)
    args.numerics = mode
    mkl_shim.configure(os.environ.get(mkl_shim.CACHE_ENV))
    if problem := numerics.host_problem(mode) or numerics.shim_problem(mode):
        raise ConfigError(problem + (f" (the numerics of {where})" if where else ""))
    if "torch" not in sys.modules:
        os.environ.update(numerics.environment(mode))
        if mode == "portable":
            mkl_shim.load()  # built by shim_problem; before libtorch binds oneMKL's functions


def keep_freed_memory_unless_asked() -> bool:
    """seqmix.allocator's setting unless SEQMIX_SYSTEM_MALLOC=1; True when it took effect."""
    from seqmix.allocator import keep_freed_memory

    return os.environ.get(SYSTEM_MALLOC_ENV) != "1" and keep_freed_memory()


def read_environment(args) -> None:
    """Turn the environment into settings, once, before the command runs."""
    from seqmix.mixers import dispatch

    keep_freed_memory_unless_asked()  # every step's large tensors reuse memory instead of page-faulting
    dispatch.configure("reference" if os.environ.get(REFERENCE_ENV) == "1" else "auto")
    from seqmix.slots import SLOT_ENV
    from seqmix.train import provenance

    provenance.configure(gpu_slot=os.environ.get(SLOT_ENV), commit=os.environ.get(COMMIT_ENV),
                         numerics=getattr(args, "numerics", None),
                         environment={k: os.environ[k] for k in numerics.VARIABLES if k in os.environ})


def parse_spec(model, text: str):
    """A job spec given as JSON (``--spec``), validated: ConfigError naming every bad key."""
    from pydantic import ValidationError

    try:
        return model.model_validate_json(text)
    except ValidationError as e:
        lines = problem_lines(e.errors(), what="key")
        problems = "; ".join(lines[:8]) + (f"; and {len(lines) - 8} more" if len(lines) > 8 else "")
        raise ConfigError(
            f"--spec is not a valid {model.__name__} ({problems}); pass the JSON the Snakefile writes "
            "(`snakemake -n -p` prints it), or use --config instead") from None


def cmd_data(args) -> int:
    from seqmix.data.tokenizer import prepare_tokenizer
    from seqmix.io import exclusive_lock, remove_stale_temps
    from seqmix.study.jobs import DataJob, TokenizerJob
    from seqmix.study.table import Expansion
    from seqmix.tasks import task_class

    if args.name == "tokenizer":
        job = job_of(args, TokenizerJob, Expansion.tokenizer_job)
        prepare = prepare_tokenizer
    else:
        job = job_of(args, DataJob, lambda expansion: expansion.data_job(args.name))
        prepare = task_class(job.kind).prepare
    job = job.model_copy(update={"env_mirror": os.environ.get(MIRROR_ENV) or None})
    out_dir = Path(job.out_dir)
    # One preparation per data directory at a time; what a killed one left is removed.
    with exclusive_lock(out_dir / ".prepare.lock", f"data directory {out_dir}"):
        remove_stale_temps(out_dir)
        info = prepare(job)
    print(json.dumps({k: v for k, v in info.items() if k != "files"}, indent=2, default=str))
    return 0


def cmd_train(args) -> int:
    from seqmix.study.jobs import TrainJob
    from seqmix.study.table import expand
    from seqmix.train.loop import train

    if args.spec:
        spec = parse_spec(TrainJob, args.spec)
    elif args.task is None or args.arch is None:
        raise ConfigError("train needs --task and --arch (or --spec)")
    else:
        spec = expand(load_study(args.config)).run_spec(args.task, args.arch, args.seed)
    metrics = train(spec, progress=not args.quiet, planned_code=args.code)
    print(json.dumps({k: metrics[k] for k in ("status", "params", "steps_completed", "best_eval")}, default=str))
    return 0


def cmd_eval(args) -> int:
    from seqmix.train.evaluate import evaluate_run

    print(json.dumps(evaluate_run(args.run, device=args.device), indent=2))
    return 0


def cmd_runs(args) -> int:
    from seqmix.study.table import expand

    expansion = expand(load_study(args.config))
    for run in expansion.runs:
        print(expansion.run_dir(run))
    return 0


def cmd_where(args) -> int:
    from seqmix.study.table import expand

    expansion = expand(load_study(args.config))
    print({"results": expansion.study.results_dir, "report": expansion.report_dir}[args.what])
    return 0


def job_of(args, model, build):
    """The job's spec: ``--spec`` as given, else built by ``build`` from the study of
    ``--config``, expanded (seqmix.study.table.Expansion)."""
    from seqmix.study.table import expand

    return parse_spec(model, args.spec) if args.spec else build(expand(load_study(args.config)))


def cmd_jobs(args) -> int:
    from seqmix import REPO_ROOT
    from seqmix.study.dag import config_files, imported_sources, sha256_of
    from seqmix.study.table import NOTEBOOKS_GLOB, expand, job_table

    table = job_table(expand(load_study(args.config, json.loads(args.overrides) if args.overrides else None)))
    # The files this table was made from, with digests: seqmix.study.dag reuses it while they
    # hold. Every file of every job's code is one: the table holds their digests.
    code = [f for per in table["code"].values() for c in ([per] if "files" in per else per.values()) for f in c["files"]]
    read = sorted({str(p) for p in [*config_files(args.config), *imported_sources(), *code]})
    # And the folders whose listing it read: a notebook added is a new job's code.
    listed = {NOTEBOOKS_GLOB: sorted(str(p) for p in REPO_ROOT.glob(NOTEBOOKS_GLOB))}
    print(json.dumps({"jobs": table, "read": {p: sha256_of(p) for p in read}, "listed": listed}))
    return 0


def cmd_collect(args) -> int:
    from seqmix.report.collect import collect
    from seqmix.study.jobs import CollectJob
    from seqmix.study.table import Expansion

    job = job_of(args, CollectJob, Expansion.collect_job)
    breakdown = Path(args.breakdown_out or Path(args.out).with_name("breakdown.csv"))
    n = collect([Path(d) for d in job.run_dirs], Path(args.out), breakdown)
    print(f"wrote {n} runs to {args.out} and their breakdowns to {breakdown}")
    return 0


def cmd_complexity(args) -> int:
    from seqmix.analysis.complexity import write_complexity
    from seqmix.study.jobs import ComplexityJob
    from seqmix.study.table import Expansion

    job = job_of(args, ComplexityJob, Expansion.complexity_job)
    archs = args.arch or job.architectures
    beside = lambda suffix: Path(args.out).with_name(Path(args.out).stem + suffix)  # noqa: E731
    fit_out = Path(args.fit_out or beside("_fit.csv"))
    growth_out = Path(args.growth_out or beside("_growth.csv"))
    n_rows, n_fits = write_complexity(archs, job.complexity, job.mixers, Path(args.out), fit_out,
                                      growth_out, device=args.device, threads=args.threads, progress=not args.quiet)
    print(f"wrote {n_rows} rows to {args.out}, {n_fits} fits to {fit_out} and growth per doubling to {growth_out}")
    return 0


def cmd_sparsity(args) -> int:
    from seqmix.analysis.sparsity import write_sparsity
    from seqmix.study.jobs import SparsityJob
    from seqmix.study.table import Expansion

    job = job_of(args, SparsityJob, Expansion.sparsity_job)
    dirs = [Path(d) for d in ([args.run] if args.run else job.run_dirs)]
    n = write_sparsity(dirs, job.sparsity, Path(args.out), threads=args.threads)
    print(f"wrote {n} rows to {args.out}")
    return 0


def cmd_concat(args) -> int:
    """Concatenate CSVs with one header (per-run analysis tables into one)."""
    from seqmix.io import concat_csvs

    rows = concat_csvs(args.inputs, args.out)
    print(f"wrote {rows} rows from {len(args.inputs)} files to {args.out}")
    return 0


def cmd_sparsity_analytic(args) -> int:
    from seqmix.analysis.su import SparsityAnalyticRow, analytic_curves
    from seqmix.io import write_rows
    from seqmix.study.settings import SparsityAnalyticSettings

    rows = analytic_curves(job_of(args, SparsityAnalyticSettings,
                                  lambda expansion: expansion.study.analysis.sparsity_analytic))
    write_rows(args.out, rows, SparsityAnalyticRow)
    print(f"wrote {len(rows)} rows to {args.out}")
    return 0


def cmd_geometry(args) -> int:
    from seqmix.analysis.geometry import write_geometry
    from seqmix.study.jobs import GeometryJob
    from seqmix.study.table import Expansion, finished

    job = job_of(args, GeometryJob, Expansion.geometry_job)
    n = write_geometry(finished(job.run_dirs), job.geometry, Path(args.out), threads=args.threads)
    print(f"wrote {n} rows to {args.out}")
    return 0


def cmd_copy_probe(args) -> int:
    from seqmix.analysis.copy_probe import write_copy_probe
    from seqmix.study.jobs import CopyProbeJob
    def build(expansion):
        job = expansion.copy_probe_job()
        if job is None:
            raise ConfigError(f"{args.config}: the copy probe takes its models from a recall (MQAR) task and this "
                              "study has none, or config key 'analysis.copy_probe.task' is null; add an MQAR task "
                              "or name one there")
        return job

    job = job_of(args, CopyProbeJob, build)
    n = write_copy_probe(job, Path(args.out), threads=args.threads, progress=not args.quiet)
    print(f"wrote {n} rows to {args.out}")
    return 0


def cmd_throughput(args) -> int:
    from seqmix.analysis.throughput import format_table, write_throughput
    from seqmix.study.jobs import ThroughputJob
    from seqmix.study.table import Expansion

    job = job_of(args, ThroughputJob, Expansion.throughput_job)
    spec = job.throughput
    if args.lengths:
        spec = spec.model_copy(update={"lengths": args.lengths})
    if args.threads:
        spec = spec.model_copy(update={"threads": args.threads})
    out = Path(args.out)
    rows = write_throughput(args.arch or job.architectures, spec, job.mixers, out,
                            progress=not args.quiet)
    print(format_table(rows))
    print(f"wrote {len(rows)} rows to {out}")
    return 0


def cmd_plan(args) -> int:
    from seqmix import plan, preflight
    from seqmix.io import write_csv, write_text
    from seqmix.study.table import expand

    expansion = expand(load_study(args.config))
    local = not args.no_local_checks
    # Limits the data decide and steps beyond memory first: nothing is counted at such shapes.
    if problems := preflight.shape_problems(expansion, local=local):
        raise ConfigError("the study would fail at its shapes:\n" + "\n".join(f"  - {p}" for p in problems))
    problems = preflight.setup_problems(expansion, local=local)
    for p in problems:
        print(f"problem: {p}", file=sys.stderr)
    progress = None if args.quiet else (lambda what: print(f"counting {what}", file=sys.stderr))
    source = str(plan.MEASURED_DIR) if args.measured is None else args.measured
    measured, notes = plan.read_step_times(source), []
    rows = plan.plan_rows(expansion, mfu=args.mfu, peak=args.peak_tflops * 1e12, progress=progress, measured=measured,
                          notes=notes)
    table = plan.markdown(rows, args.mfu, args.peak_tflops * 1e12, source if measured else None, notes)
    print(table, end="")
    if args.out:
        write_csv(args.out, [*rows, plan.totals(rows)], plan.FIELDS)
    if args.markdown:
        write_text(args.markdown, table)
    return 4 if problems else 0


def cmd_benchmarks(args) -> int:
    from seqmix.io import write_rows, write_text
    from seqmix.report import benchmarks

    rows = benchmarks.read_benchmarks(args.dir)
    summary = benchmarks.summarise(rows)
    source = benchmarks.measured_on(Path(args.dir).parent)
    table = benchmarks.markdown(summary, benchmarks.elapsed_s(rows), source)
    print(table, end="")
    if args.out:
        write_rows(args.out, summary, benchmarks.RuleCost)
    if args.markdown:
        write_text(args.markdown, table)
    return 0


def cmd_record(args) -> int:
    from seqmix.report.recorded import record

    command = f"python -m seqmix record --config {args.config} --out {args.out}"
    dest = record(args.config, args.out, command, args.made_by, args.commit)
    print(f"recorded {args.config}'s runs in {dest}")
    return 0


def cmd_mixers(args) -> int:
    from seqmix.io import write_text
    from seqmix.report import mixer_table

    if args.blocks:
        print(mixer_table.blocks_markdown(), end="")
        if args.markdown:
            write_text(args.markdown, mixer_table.blocks_markdown())
        return 0
    options = load_study(args.config).mixers if args.config_options else {}
    mixer_table.print_mixers(args.d_model, args.max_len, options)
    return 0


def cmd_fingerprint(args) -> int:
    from seqmix import fingerprint
    from seqmix.io import read_json, write_json

    if args.from_file:  # another host's --out: nothing trained here
        if args.out:
            raise ConfigError("--from reads another host's fingerprint, --out writes this host's: give one of them")
        found = read_json(args.from_file, fix="give the JSON `python -m seqmix fingerprint --out FILE` wrote")
        entry = fingerprint.entry_of(found, args.from_file)
    else:
        found = fingerprint.measure(args.numerics)
        entry, state = fingerprint.entry_of(found), found["numerics"]
        print(f"# numerics {args.numerics}: ATen {state['aten_capability']}, oneMKL {state['mkl_branch']}, oneDNN "
              f"cap {state['onednn_max_isa'] or 'none'}, threads {state['threads']}; {state['cpu']} "
              f"({state['vector_isa']})", file=sys.stderr)
    print("\n".join(fingerprint.lines(found["digests"])))
    if args.out:
        write_json(args.out, found)
    if args.record:
        fingerprint.record(args.record, entry, fingerprint.HOSTS_NOTES)
        print(f"recorded {fingerprint.host_name(entry)} in {args.record}", file=sys.stderr)
    return 0


def cmd_schema(args) -> int:
    from seqmix.io import write_text
    from seqmix.study.load import config_schema

    text = json.dumps(config_schema(), indent=2, sort_keys=True) + "\n"
    if args.out:
        write_text(args.out, text)
        print(f"wrote {args.out}")
    else:
        print(text, end="")
    return 0


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
              "can each mixer copy the previous token? a fresh model per architecture, built as the MQAR task builds its own",
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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m seqmix", description=__doc__.splitlines()[0])
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
    _add_analyses(sub)
    _add_copy_probe(sub)
    return p


def _add_summaries(sub) -> None:
    """The commands that plan, summarise or describe a study rather than run its jobs."""
    sp = _add(sub, "plan", cmd_plan, "what the study costs (runs, tokens, FLOPs, memory, H100 hours) and what "
              "would fail at its shapes")
    sp.add_argument("--mfu", type=float, default=0.05, help="assumed model FLOP utilisation (default 0.05)")
    sp.add_argument("--peak-tflops", type=float, default=989.4, help="peak FLOP/s in TFLOP/s (default: H100 SXM dense BF16)")
    sp.add_argument("--measured", default=None,
                    help="a directory with gpu-check's train_probe.csv: measured step times for the points it has, "
                         "extrapolated by FLOPs for the others (default: results/bench/nvidia-h100-80gb-hbm3, the "
                         "H100's; '' for none)")
    sp.add_argument("--out", help="also write the table as CSV here")
    sp.add_argument("--markdown", help="also write the Markdown table here")
    sp.add_argument("--no-local-checks", action="store_true", help="skip the checks of this machine (GPU, memory)")
    sp.add_argument("--quiet", action="store_true")

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
    sp.add_argument("--markdown", help="with --blocks, also write that table here (docs/blocks.md: make docs-blocks)")

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

    sp = _add(sub, "fingerprint", cmd_fingerprint,
              "a few training steps of every catalogued mixer on one thread under the study's numerics: the hash "
              "of each one's weights and of all (README, Numerics)")
    sp.add_argument("--numerics", dest="asked_numerics", choices=numerics.MODES, default=None,
                    help="these numerics instead of the study's (--config)")
    sp.add_argument("--out", help="also write the digests, the host and the numerics in effect here (JSON)")
    sp.add_argument("--record", help="add this host's entry to a hosts file (docs/hosts.md), in place of its own "
                    "earlier one; a portable fingerprint that differs from a recorded one of the same torch version "
                    "is refused, naming the mixers")
    sp.add_argument("--from", dest="from_file", metavar="FILE",
                    help="record the fingerprint another host wrote with --out FILE instead of measuring this one's")

    sp = _add(sub, "schema", cmd_schema, "the JSON schema of a config file (every task kind and mixer)", config=False)
    sp.add_argument("--out", help="write it here (workflow/schemas/config.schema.json) instead of stdout")


def main(argv: list[str] | None = None) -> int:
    """Run one command; a known failure (bad config or spec, bad data, a file that cannot be
    read or written, a run directory in use) prints one line naming the cause and the fix."""
    return run_command(build_parser().parse_args(argv))


def run_command(args) -> int:
    """Run a parsed command (this parser's, or ``python -m tools.bench``'s) after
    ``read_environment``; a known failure is one line and its exit status."""
    try:
        pin_numerics(args)  # before anything imports torch
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from seqmix.data.manifest import DataError
    from seqmix.io import FileError, write_failure

    read_environment(args)

    try:
        return args.func(args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 3
    except FileError as e:
        print(f"error: {e}", file=sys.stderr)
        return 4
    except Exception as e:
        # A write outside seqmix.io's writers (mkdir, a library's own file), its errno also
        # where torch or pandas wrapped it in another exception.
        clear = write_failure(e)
        if clear is None:
            raise
        print(f"error: {clear}", file=sys.stderr)
        return 4
