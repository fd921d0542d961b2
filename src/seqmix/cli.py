"""`python -m seqmix <command>`: the one command line every Snakemake rule calls.

Each command takes ``--config`` (a YAML file, or the JSON the Snakefile passes), validates
it against the schema, and writes files; nothing here holds results in memory between
commands. Run ``python -m seqmix <command> --help`` for each command's options.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

from seqmix.config import (
    ConfigError,
    data_spec,
    load_config,
    run_dir,
    run_spec,
    runs,
    sparsity_runs,
)

DEFAULT_CONFIG = "config/config.yaml"


def _write_csv(path: Path, rows: list[dict], fields: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    tmp.replace(path)


def cmd_data(args) -> int:
    from seqmix.data.prepare import prepare

    spec = json.loads(args.spec) if args.spec else data_spec(load_config(args.config), args.task)
    info = prepare(args.task, spec)
    print(json.dumps({k: v for k, v in info.items() if k != "files"}, indent=2))
    return 0


def cmd_train(args) -> int:
    from seqmix.train.loop import train

    if args.spec:
        spec = json.loads(args.spec)
    else:
        if args.task is None or args.arch is None:
            raise ConfigError("train needs --task and --arch (or --spec)")
        spec = run_spec(load_config(args.config), args.task, args.arch, args.seed)
    metrics = train(spec, progress=not args.quiet)
    print(json.dumps({k: metrics[k] for k in ("status", "params", "steps_completed", "best_eval")}, default=str))
    return 0


def cmd_eval(args) -> int:
    from seqmix.train.evaluate import evaluate_run

    out = evaluate_run(args.run, device=args.device)
    print(json.dumps(out, indent=2))
    return 0


def cmd_runs(args) -> int:
    cfg = load_config(args.config)
    for task, arch, seed in runs(cfg):
        print(run_dir(cfg, task, arch, seed))
    return 0


def cmd_collect(args) -> int:
    from seqmix.report.collect import collect

    cfg = load_config(args.config)
    dirs = [run_dir(cfg, t, a, s) for t, a, s in runs(cfg)]
    n = collect(dirs, Path(args.out))
    print(f"wrote {n} runs to {args.out}")
    return 0


def cmd_complexity(args) -> int:
    import torch

    from seqmix import mixers
    from seqmix.analysis.complexity import FIELDS, FIT_FIELDS, fit_table, run_complexity
    from seqmix.train.loop import resolve_device

    cfg = load_config(args.config)
    ccfg = cfg["analysis"]["complexity"]
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device or ccfg["device"])
    # --arch, else analysis.complexity.architectures ("all" = every registered mixer), else
    # the architectures the config trains.
    chosen = ccfg.get("architectures")
    archs = args.arch or (mixers.names() if chosen == "all" else chosen) or cfg["architectures"]
    rows = run_complexity(archs, ccfg, device, cfg.get("mixers", {}), progress=not args.quiet)
    _write_csv(Path(args.out), rows, FIELDS)
    fits = fit_table(rows, longest=ccfg.get("fit_longest", 3))
    fit_out = Path(args.fit_out or Path(args.out).with_name(Path(args.out).stem + "_fit.csv"))
    _write_csv(fit_out, fits, FIT_FIELDS)
    print(f"wrote {len(rows)} rows to {args.out} and {len(fits)} fits to {fit_out}")
    return 0


def finished_runs(cfg: dict, task: str | None, keep=lambda arch: True, among=None) -> list[Path]:
    """Run directories of ``task`` (None: any) whose training finished (status ok), for
    analyses; ``among`` narrows the runs of the config to a list of (task, arch, seed)."""
    out = []
    for t, arch, seed in runs(cfg) if among is None else among:
        d = run_dir(cfg, t, arch, seed)
        if task in (None, t) and keep(arch) and json.loads((d / "metrics.json").read_text())["status"] == "ok":
            out.append(d)
    return out


def cmd_sparsity(args) -> int:
    import torch

    from seqmix.analysis.sparsity import FIELDS, measured_sparsity

    cfg = load_config(args.config)
    scfg = cfg["analysis"]["sparsity"]
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.run:
        ok = json.loads((Path(args.run) / "metrics.json").read_text())["status"] == "ok"
        dirs = [Path(args.run)] if ok else []  # a diverged run has no attention to measure
    else:
        dirs = finished_runs(cfg, None, among=sparsity_runs(cfg))
    rows = []
    for d in dirs:
        rows.extend(measured_sparsity(d, scfg["split"], scfg["num_sequences"], scfg["min_row_len"],
                                      scfg["jacobian_sequences"], scfg["jacobian_chunk"],
                                      scfg["jacobian_positions"], scfg["snli_seq_len"]))
    _write_csv(Path(args.out), rows, FIELDS)
    print(f"wrote {len(rows)} rows to {args.out}")
    return 0


def cmd_concat(args) -> int:
    """Concatenate CSVs with one header (per-run analysis tables into one)."""
    import pandas as pd

    frames = [pd.read_csv(p) for p in args.inputs]
    header = list(frames[0].columns)
    for p, f in zip(args.inputs, frames):
        if list(f.columns) != header:
            raise ValueError(f"{p} has columns {list(f.columns)}, expected {header}")
    pd.concat(frames, ignore_index=True).to_csv(args.out, index=False)
    print(f"wrote {sum(len(f) for f in frames)} rows from {len(frames)} files to {args.out}")
    return 0


def cmd_sparsity_analytic(args) -> int:
    from seqmix.analysis.su import FIELDS, analytic_curves

    cfg = load_config(args.config)
    rows = analytic_curves(cfg["analysis"]["sparsity_analytic"])
    _write_csv(Path(args.out), rows, FIELDS)
    print(f"wrote {len(rows)} rows to {args.out}")
    return 0


def cmd_geometry(args) -> int:
    import torch

    from seqmix import mixers
    from seqmix.analysis.geometry import FIELDS, has_geometry, run_geometry

    cfg = load_config(args.config)
    gcfg = cfg["analysis"]["geometry"]
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = []
    for d in finished_runs(cfg, gcfg["task"], lambda arch: has_geometry(mixers.mixer_class(arch))):
        rows.extend(run_geometry(d, gcfg["split"], gcfg["num_sequences"], gcfg["max_quadruples"],
                                 gcfg["tssa_eps"], gcfg["seed"]))
    _write_csv(Path(args.out), rows, FIELDS)
    print(f"wrote {len(rows)} rows to {args.out}")
    return 0


def cmd_bench(args) -> int:
    from seqmix.bench import kernels

    # what == "kernels" (the only benchmark so far); without a GPU: interpreter smoke, exit 0
    return kernels.run(args.lengths, Path(args.out) if args.out else None, args.batch, args.dtype,
                       args.op)


def cmd_mixers(args) -> int:
    """Every registered mixer with its flags and parameter count at one width."""
    import dataclasses

    import torch

    from seqmix import mixers
    from seqmix.models.budget import count_params

    cfg_options = load_config(args.config).get("mixers", {}) if args.config_options else {}
    print(f"{'mixer':<16}{'params':>10}  {'causal':<7}{'non-causal':<11}{'scores':<7}{'step':<5}options")
    for name in mixers.names():
        cls = mixers.mixer_class(name)
        options = cfg_options.get(name, {})
        with torch.device("meta"):
            m = mixers.build(name, args.d_model, causal=cls.supports_causal, max_len=args.max_len, **options)
        shown = {f.name: getattr(m.options, f.name) for f in dataclasses.fields(m.options)}
        yes = lambda flag: "yes" if flag else "-"  # noqa: E731
        print(f"{name:<16}{count_params(m):>10,}  {yes(cls.supports_causal):<7}{yes(cls.supports_noncausal):<11}"
              f"{yes(cls.has_scores):<7}{yes(cls.has_step):<5}{shown}")
    print(f"(one mixer layer at d_model={args.d_model}, max_len={args.max_len}; block norms and "
          "feed-forward not included)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m seqmix", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    def add(name, func, help_):
        sp = sub.add_parser(name, help=help_, description=help_)
        sp.add_argument("--config", default=DEFAULT_CONFIG, help="YAML config file, or a JSON object")
        sp.set_defaults(func=func)
        return sp

    from seqmix.data.prepare import DATA_TASKS

    sp = add("data", cmd_data, "prepare one task's data (tokenizer, wikitext2, snli, mqar)")
    sp.add_argument("task", choices=DATA_TASKS)
    sp.add_argument("--spec", help="a data spec as JSON (what the Snakefile passes)")

    sp = add("train", cmd_train, "train one (task, architecture, seed); resumes from its checkpoint")
    sp.add_argument("--task")
    sp.add_argument("--arch")
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--spec", help="a complete run spec as JSON (what the Snakefile passes)")
    sp.add_argument("--quiet", action="store_true", help="no progress bar")

    sp = add("eval", cmd_eval, "score a finished run on its evaluation and test splits (eval.json)")
    sp.add_argument("--run", required=True, help="run directory, results/runs/<task>/<arch>/seed<k>")
    sp.add_argument("--device", default="auto")

    add("runs", cmd_runs, "list the run directories the config trains")

    sp = add("mixers", cmd_mixers, "list every registered mixer with its parameter count at one width")
    sp.add_argument("--d-model", type=int, default=256)
    sp.add_argument("--max-len", type=int, default=128)
    sp.add_argument("--config-options", action="store_true", help="use the mixer options of --config")

    sp = sub.add_parser("concat", help="concatenate CSVs with the same columns", description="concatenate CSVs with the same columns")
    sp.add_argument("inputs", nargs="+")
    sp.add_argument("--out", required=True)
    sp.set_defaults(func=cmd_concat)

    sp = add("collect", cmd_collect, "gather every run's metrics into one CSV")
    sp.add_argument("--out", default="results/summary/runs.csv")

    sp = add("complexity", cmd_complexity, "time and peak memory of each mixer vs sequence length")
    sp.add_argument("--out", default="results/analysis/complexity.csv")
    sp.add_argument("--fit-out", default=None)
    sp.add_argument("--arch", action="append", help="measure only this architecture (repeatable)")
    sp.add_argument("--device", choices=["auto", "cpu", "cuda"], default=None,
                    help="override analysis.complexity.device (e.g. cuda with --out results/bench/complexity-<gpu>.csv)")
    sp.add_argument("--threads", type=int, default=None)
    sp.add_argument("--quiet", action="store_true")

    sp = add("sparsity", cmd_sparsity, "Su's sparsity of trained models' attention rows and Jacobians")
    sp.add_argument("--run", help="one run directory (default: every finished run of the analysis task)")
    sp.add_argument("--out", default="results/analysis/sparsity.csv")
    sp.add_argument("--threads", type=int, default=None)

    sp = add("sparsity-analytic", cmd_sparsity_analytic, "Su's sparsity closed forms as curves (no training)")
    sp.add_argument("--out", default="results/analysis/sparsity_analytic.csv")

    sp = add("geometry", cmd_geometry, "Plücker and plane geometry of Grassmann runs, TSSA compression term")
    sp.add_argument("--out", default="results/analysis/geometry.csv")
    sp.add_argument("--threads", type=int, default=None)

    sp = add("bench", cmd_bench, "time Triton kernels vs references, SDPA and fla (GPU; CPU: smoke only)")
    sp.add_argument("what", choices=["kernels"])
    sp.add_argument("--lengths", type=int, nargs="+", default=None, help="L values (default 256..65536)")
    sp.add_argument("--out", default=None, help="CSV path (default results/bench/kernels-<gpu>.csv)")
    sp.add_argument("--batch", type=int, default=4)
    sp.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16")
    sp.add_argument("--op", action="append", choices=["grassmann", "gla", "tssa", "attention"],
                    help="benchmark only this op (repeatable)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        from seqmix.data.manifest import DataError

        if isinstance(e, DataError):
            print(f"error: {e}", file=sys.stderr)
            return 3
        raise
