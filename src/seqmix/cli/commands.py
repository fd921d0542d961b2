"""The commands of `python -m seqmix` (seqmix.cli), one function each: it takes its job spec
(``--spec``) or builds it from the study of ``--config`` (seqmix.cli.inputs), calls one library
function with it, and prints what it wrote; nothing here holds results in memory between
commands, reads the environment (seqmix.cli.environment) or imports torch at its top.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from seqmix.cli.environment import compiler, data_mirror
from seqmix.cli.inputs import expansion_of, job_of, parse_spec, profile_of, study_of
from seqmix.errors import ConfigError


def cmd_data(args) -> int:
    from seqmix.data.tokenizer import prepare_tokenizer
    from seqmix.expansion.table import Expansion
    from seqmix.io import exclusive_lock, remove_stale_temps
    from seqmix.study.jobs import DataJob, TokenizerJob
    from seqmix.tasks import task_class

    if args.name == "tokenizer":
        job = job_of(args, TokenizerJob, Expansion.tokenizer_job)
        prepare = prepare_tokenizer
    else:
        job = job_of(args, DataJob, lambda expansion: expansion.data_job(args.name))
        prepare = task_class(job.kind).prepare
    job = job.model_copy(update={"env_mirror": data_mirror()})
    out_dir = Path(job.out_dir)
    # One preparation per data directory at a time; what a killed one left is removed.
    with exclusive_lock(out_dir / ".prepare.lock", f"data directory {out_dir}"):
        remove_stale_temps(out_dir)
        info = prepare(job)
    print(json.dumps({k: v for k, v in info.items() if k != "files"}, indent=2, default=str))
    return 0


def cmd_train(args) -> int:
    from seqmix.study.jobs import TrainJob
    from seqmix.train.loop import train

    if args.spec:
        spec = parse_spec(TrainJob, args.spec)
    elif args.task is None or args.arch is None:
        raise ConfigError("train needs --task and --arch (or --spec)")
    else:
        spec = expansion_of(args).run_spec(args.task, args.arch, args.seed)
    metrics = train(spec, progress=not args.quiet, planned_code=args.code)
    print(json.dumps({k: metrics[k] for k in ("status", "params", "steps_completed", "best_eval")}, default=str))
    return 0


def cmd_train_pack(args) -> int:
    from seqmix.study.jobs import PackJob
    from seqmix.train.pack import train_pack

    if args.spec:
        job = parse_spec(PackJob, args.spec)
    elif args.task is None or args.arch is None:
        raise ConfigError("train-pack needs --task and --arch (or --spec)")
    else:
        job = expansion_of(args).pack_job(args.task, args.arch)
    every = train_pack(job.specs, progress=not args.quiet, planned_code=args.code)
    print(json.dumps([{"run": spec.run_name, **{k: metrics[k] for k in ("status", "params", "steps_completed",
                                                                         "best_eval")}}
                      for spec, metrics in zip(job.specs, every)], default=str))
    return 0


def cmd_eval(args) -> int:
    from seqmix.train.evaluate import evaluate_run

    print(json.dumps(evaluate_run(args.run, device=args.device), indent=2))
    return 0


def cmd_runs(args) -> int:
    expansion = expansion_of(args)
    for run in expansion.runs:
        print(expansion.run_dir(run))
    return 0


def cmd_where(args) -> int:
    expansion = expansion_of(args)
    print({"results": expansion.study.results_dir, "report": expansion.report_dir}[args.what])
    return 0


def cmd_jobs(args) -> int:
    from seqmix.expansion.table import made_table

    # The files the profile was read from are those of its one reading (profile_of).
    print(json.dumps(made_table(expansion_of(args), profile_of(args).files)))
    return 0


def cmd_collect(args) -> int:
    from seqmix.expansion.table import Expansion
    from seqmix.report.collect import collect
    from seqmix.report.recorded import recorded_runs
    from seqmix.study.jobs import CollectJob

    job = job_of(args, CollectJob, Expansion.collect_job)
    breakdown = Path(args.breakdown_out or Path(args.out).with_name("breakdown.csv"))
    recorded, accounts = recorded_runs(job.run_dirs, job.recordings)
    n = collect([Path(d) for d in job.run_dirs], Path(args.out), breakdown, recorded, accounts)
    print(f"wrote {n} runs to {args.out} and their breakdowns to {breakdown}")
    return 0


def cmd_complexity(args) -> int:
    from seqmix.analysis.complexity import write_complexity
    from seqmix.expansion.table import Expansion
    from seqmix.study.jobs import ComplexityJob

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
    from seqmix.expansion.table import Expansion
    from seqmix.study.jobs import SparsityJob

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
    from seqmix.expansion.table import Expansion, finished
    from seqmix.study.jobs import GeometryJob

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
    from seqmix.expansion.table import Expansion
    from seqmix.study.jobs import ThroughputJob

    job = job_of(args, ThroughputJob, Expansion.throughput_job)
    settings = job.throughput  # the study's throughput: section, with the command line's overrides
    if args.lengths:
        settings = settings.model_copy(update={"lengths": args.lengths})
    if args.threads:
        settings = settings.model_copy(update={"threads": args.threads})
    out = Path(args.out)
    rows = write_throughput(args.arch or job.architectures, settings, job.mixers, out,
                            progress=not args.quiet)
    print(format_table(rows))
    print(f"wrote {len(rows)} rows to {out}")
    return 0


def cmd_plan(args) -> int:
    from seqmix import plan, preflight
    from seqmix.io import write_csv, write_text

    expansion = expansion_of(args)
    specs, local = preflight.Specs.of_expansion(expansion), not args.no_local_checks
    # Limits the data decide and steps beyond memory first: nothing is counted at such shapes.
    if problems := preflight.shape_problems(specs, local=local):
        raise ConfigError("the study would fail at its shapes:\n" + "\n".join(f"  - {p}" for p in problems))
    problems = preflight.setup_problems(specs, local=local)
    for p in problems:
        print(f"problem: {p}", file=sys.stderr)
    progress = None if args.quiet else (lambda what: print(f"counting {what}", file=sys.stderr))
    source = str(plan.MEASURED_DIR) if args.measured is None else args.measured
    measured, notes = plan.read_step_times(source), []
    pack_counts = plan.read_pack_counts(str(plan.PACK_COUNTS) if args.pack_counts is None else args.pack_counts)
    rows = plan.plan_rows(expansion, mfu=args.mfu, peak=args.peak_tflops * 1e12, progress=progress, measured=measured,
                          notes=notes, pack_counts=pack_counts)
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

    command = f"python -m seqmix record --config {args.config} --out {args.out}" + (" --partial" if args.partial else "")
    dest = record(args.config, args.out, command, args.made_by, args.commit, partial=args.partial,
                  expansion=expansion_of(args))
    print(f"recorded {args.config}'s runs in {dest}")
    return 0


def cmd_verify(args) -> int:
    from seqmix.report.verify import verify_all

    recordings = args.recording or study_of(args).recordings
    if not recordings:
        raise ConfigError(f"no recording to verify: {args.config} names none (its key `recordings`); give one "
                          "(python -m seqmix verify results/recorded/<profile>/<device>-<date>)")
    return verify_all(recordings, args.run, args.budget, args.scratch, out=lambda line: print(line, flush=True))


def cmd_mixers(args) -> int:
    from seqmix.io import write_text
    from seqmix.report import mixer_table

    if args.blocks:
        print(mixer_table.blocks_markdown(), end="")
        if args.markdown:
            write_text(args.markdown, mixer_table.blocks_markdown())
        return 0
    options = study_of(args).mixers if args.config_options else {}
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
        found = fingerprint.measure(args.numerics, compiler())
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
    from seqmix.expansion.validate import config_schema
    from seqmix.io import write_text

    text = json.dumps(config_schema(), indent=2, sort_keys=True) + "\n"
    if args.out:
        write_text(args.out, text)
        print(f"wrote {args.out}")
    else:
        print(text, end="")
    return 0


