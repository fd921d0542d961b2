"""The cost plan (python -m seqmix plan) and the preflight checks run before the first job."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from seqmix import measure
from seqmix.expansion.table import expand
from seqmix.expansion.validate import validate_study
from seqmix.measure import GIB, Count, step_bytes
from seqmix.models.budget import BudgetError, solve_budget
from seqmix.models.lm import CausalLM, LMConfig
from seqmix.plan import measure_step, plan_rows, totals
from seqmix.preflight import Specs, budget_problems, complexity_problems, precision_problems
from seqmix.tasks import task_class
from tests.conftest import REPO, tiny_config


def test_live_bytes_count_allocations_until_they_are_freed():
    with Count() as count:
        a = torch.ones(1000)  # 4,000 bytes
        b = a * 2  # 8,000 live
        del a
        c = b + 1  # 8,000 again: a was freed
        v = c.view(10, 100)  # a view is no new memory
        c.add_(1)  # nor is an in-place result
        assert count.live == 8000
    assert count.peak == 8000 and v.shape == (10, 100)


def specs_of(study) -> Specs:
    """What the preflight reads of a study: its jobs' specs, from its expansion."""
    return Specs.of_expansion(expand(study))


def _study(tmp_path, **changes):
    raw = tiny_config(tmp_path, None, archs=("softmax", "mamba"))
    for key, value in changes.items():
        *sections, field = key.split(".")
        node = raw
        for part in sections:
            node = node.setdefault(part, {})
        node[field] = value
    return validate_study(raw)


def test_the_step_is_counted_on_the_real_model(tmp_path):
    """FLOPs of a softmax LM step: 2 FLOPs per multiply-add of every linear layer on every
    token, plus SDPA's QKᵀ and AV, forward; the backward pass twice that for the linear
    layers, and for SDPA its five products (the scores recomputed: 2.5 × its forward)."""
    study = _study(tmp_path, **{"tasks.mqar.model.d_ff_mult": 4.0, "tasks.mqar.train.batch_size": 4})
    spec = expand(study).run_spec("mqar", "softmax", 0)
    step = measure_step(spec)
    d, L, B, V = 16, 16, 4, 32
    linear = 4 * d * d + 2 * d * 4 * d  # q, k, v, o and the MLP, one layer
    queries = spec.train.batch_size * spec.settings["num_kv_pairs"]  # the head runs at the queries only
    attention = 2 * 2 * B * L * L * d  # QKᵀ and AV (SDPA counts the full L × L)
    forward = 2 * B * L * linear + attention + 2 * queries * d * V
    assert step.eval_flops == forward
    assert step.train_flops == 3 * (forward - attention) + 3.5 * attention
    assert step.tokens == B * L and step.params > 0
    # the batch-1/2 extension equals a count at the batch itself
    model = CausalLM(LMConfig(arch="softmax", vocab_size=V, max_len=L, d_model=d, n_layers=1, dropout=0.0,
                              mixer_options=spec.mixer_options))
    task = task_class(spec.kind).without_data(spec)
    with torch.no_grad(), Count() as count:
        task.loss(model.eval(), task.example_batch(B, "cpu"))
    assert count.flops == step.eval_flops


@pytest.mark.parametrize("arch", ["mamba", "softmax", "h3"])
@pytest.mark.parametrize("batch", [8, 64])
def test_step_memory_extended_from_two_small_batches_matches_the_batch(tmp_path, arch, batch):
    """Activations and the forward+backward peak at the batch, extended from batches 2 and 3,
    equal the same step counted at the batch. The peak is extended moment by moment: at
    batch 64 it falls earlier in the backward pass than at batch 2 or 3 (the activations
    outweigh the gradients), where extending the small batches' peaks falls short."""
    study = _study(tmp_path, **{"architectures": [arch], "tasks.mqar.train.batch_size": batch})
    spec = expand(study).run_spec("mqar", arch, 0)
    task = task_class(spec.kind).without_data(spec)
    model = CausalLM(LMConfig(arch=arch, vocab_size=32, max_len=16, d_model=16, n_layers=1, d_ff_mult=4.0,
                              block=spec.model.block, mixer_options=spec.mixer_options)).eval()
    small = measure.small_steps(lambda b: task.loss(model, task.example_batch(b, "cpu")), model)
    activations, peak = step_bytes(small, batch)
    with Count() as count:
        loss = task.loss(model, task.example_batch(batch, "cpu"))
        held = count.live
        loss.backward()
    assert (activations, peak) == (held, count.peak) and peak >= activations


def test_the_peak_is_extended_where_it_falls_at_the_batch(tmp_path):
    """A model whose gradients outweigh a small batch's activations: at batches 2 and 3 the
    peak falls at the end of the backward pass, at batch 256 early in it. Extending the small
    batches' peaks misses a third of it; extending every moment does not."""
    spec = expand(_study(tmp_path, **{"tasks.mqar.train.batch_size": 256})).run_spec("mqar", "softmax", 0)
    task = task_class(spec.kind).without_data(spec)
    model = CausalLM(LMConfig(arch="softmax", vocab_size=256, max_len=16, d_model=128, n_layers=2, d_ff_mult=0,
                              block="pre", mixer_options=spec.mixer_options)).eval()
    small = measure.small_steps(lambda b: task.loss(model, task.example_batch(b, "cpu")), model)
    with Count() as count:
        task.loss(model, task.example_batch(256, "cpu")).backward()
    assert measure.extend_peak(small, 256) == count.peak
    assert measure.extend(small.peaks, 256) < 0.8 * count.peak


def test_a_training_step_beyond_the_machines_memory_is_refused(tmp_path, monkeypatch):
    from seqmix.train.loop import memory_problem

    spec = expand(_study(tmp_path)).run_spec("mqar", "mamba", 0)
    task = task_class(spec.kind).without_data(spec)
    model = CausalLM(LMConfig(arch="mamba", vocab_size=32, max_len=16, d_model=16, n_layers=1, block="pre_rms"))
    assert memory_problem(task, model, 4, torch.device("cpu")) is None
    monkeypatch.setattr(measure, "available_memory", lambda device: 1000.0)
    problem = memory_problem(task, model, 4, torch.device("cpu"))
    assert problem.startswith("a training step of mqar/mamba/seed0 needs about") and "lower train.batch_size" in problem


def test_the_plan_adds_up_runs_tokens_and_flops(tmp_path):
    study = _study(tmp_path, seeds=[0, 1])
    rows = plan_rows(expand(study), mfu=0.5, peak=1e12)
    assert {(r["task"], r["arch"]) for r in rows} == {("mqar", "softmax"), ("mqar", "mamba")}
    assert sum(r["runs"] for r in rows) == len(expand(study).runs) == 4
    spec = expand(study).run_spec("mqar", "softmax", 0)
    step = measure_step(spec)
    row = next(r for r in rows if r["arch"] == "softmax")
    evals = spec.train.steps // spec.train.eval_every
    flops = 2 * (spec.train.steps * step.train_flops + evals * spec.train.eval_batches * step.eval_flops)
    assert row["pflop"] == pytest.approx(flops / 1e15)
    assert row["tokens"] == 2 * spec.train.steps * spec.train.batch_size * 16
    assert row["h100_hours"] == pytest.approx(flops / (1e12 * 0.5) / 3600)
    assert totals(rows)["runs"] == 4


def test_the_plan_uses_measured_step_times_and_extrapolates_by_flops_elsewhere(tmp_path):
    """A measured step time costs its point's runs (and the other learning rates of its sweep:
    the same step); the unmeasured width of that architecture is extrapolated at the measured
    point's MFU; a measurement of another model is not used (and said so); an architecture
    with none takes the assumed MFU."""
    from seqmix.plan import markdown, study_points
    study = _study(tmp_path, seeds=[0, 1], architectures=["softmax", "grassmann", "mamba"],
                   **{"tasks.mqar.sweep": {"model.d_model": [16, 32], "train.lr": [1e-3, 3e-3]}})
    small, large = list(expand(study).tasks)[0], list(expand(study).tasks)[-1]
    steps = {(p.name, p.spec.arch): p for p in study_points(expand(study))}
    soft = steps[small, "softmax"]
    measured = [{"task": small, "arch": "softmax", "status": "ok", "params": str(soft.step.params), "batch": "4",
                 "precision": "fp32", "step_ms": "10.0"},
                {"task": small, "arch": "grassmann", "status": "ok", "params": "1", "batch": "4", "precision": "fp32",
                 "step_ms": "10.0"},
                {"task": small, "arch": "mamba", "status": "failed: RuntimeError: x"}]
    peak, notes = 1e12, []
    rows = {r["arch"]: r for r in plan_rows(expand(study), mfu=0.5, peak=peak, measured=measured, notes=notes)}
    spec, step = soft.spec, soft.step
    mfu = step.train_flops / 0.010 / peak  # what the measured step time gives
    evals = spec.train.steps // spec.train.eval_every
    measured_hours = (spec.train.steps * 0.010 + evals * spec.train.eval_batches * step.eval_flops / (peak * mfu)) / 3600
    big = steps[large, "softmax"]
    big_flops = big.spec.train.steps * big.step.train_flops + evals * big.spec.train.eval_batches * big.step.eval_flops
    # 2 learning rates x 2 seeds measured, the same at the other width extrapolated at that MFU
    assert rows["softmax"]["h100_hours"] == pytest.approx(4 * measured_hours + 4 * big_flops / (peak * mfu) / 3600)
    ratio = big.step.train_flops / step.train_flops
    assert rows["softmax"]["basis"] == f"4 measured; 4 from {small} ({mfu:.1%} MFU, {ratio:.2g}x its FLOPs)"
    for arch in ("grassmann", "mamba"):
        assert rows[arch]["basis"] == "8 assumed 50% MFU"
        assert rows[arch]["h100_hours"] == pytest.approx(rows[arch]["assumed_mfu_hours"])
        assert rows[arch]["assumed_mfu_hours"] == pytest.approx(rows[arch]["pflop"] * 1e15 / (peak * 0.5) / 3600)
    (note,) = notes
    assert note.startswith(f"measured but not the model planned, so not used: {small} grassmann: measured 1 parameters")
    text = markdown(list(rows.values()), 0.5, peak, "results/bench/x", notes)
    assert "step times measured on an H100 (results/bench/x/train_probe.csv" in text and note in text
    hours = [sum(r[k] for r in rows.values()) for k in ("h100_hours", "assumed_mfu_hours")]
    assert f"| mqar | {hours[0]:.1f} | {hours[1]:.1f} |" in text and hours[0] > 0


def test_plan_costs_the_runs_from_the_step_times_in_its_measured_directory(tmp_path, capsys):
    """`python -m seqmix plan --measured DIR` reads DIR/train_probe.csv: the measured run costs
    its steps x the measured step time (not its FLOPs at the assumed MFU), and the table says so."""
    import csv

    from seqmix.cli import main
    from seqmix.plan import STEP_TIMES

    raw = tiny_config(tmp_path, None, archs=("softmax", "mamba"))
    config = tmp_path / "plan.yaml"
    config.write_text(yaml.safe_dump(raw))
    study = validate_study(raw)
    spec = expand(study).run_spec("mqar", "softmax", 0)
    step = measure_step(spec)
    measured = tmp_path / "bench"
    measured.mkdir()
    row = {"task": "mqar", "arch": "softmax", "status": "ok", "params": step.params,
           "batch": spec.train.batch_size, "precision": spec.train.precision, "step_ms": 250.0}
    with open(measured / STEP_TIMES, "w", newline="") as f:
        writer = csv.DictWriter(f, list(row))
        writer.writeheader()
        writer.writerow(row)
    out = tmp_path / "plan.csv"
    assert main(["plan", "--config", str(config), "--no-local-checks", "--quiet", "--measured", str(measured),
                 "--out", str(out), "--mfu", "0.5"]) == 0
    rows = {r["arch"]: r for r in csv.DictReader(open(out))}
    assert rows["softmax"]["basis"] == "measured" and rows["mamba"]["basis"] == "1 assumed 50% MFU"
    evals = spec.train.steps // spec.train.eval_every
    mfu = step.train_flops / 0.25 / 1e12 / 989.4
    hours = (spec.train.steps * 0.25 + evals * spec.train.eval_batches * step.eval_flops / (989.4e12 * mfu)) / 3600
    assert float(rows["softmax"]["h100_hours"]) == pytest.approx(hours, rel=1e-3)
    assert f"{measured}/{STEP_TIMES}" in capsys.readouterr().out


def test_the_committed_h100_step_times_are_the_paper_profiles_models():
    """`make plan` costs the paper profile from results/bench/<H100>/train_probe.csv only where
    a row's model is the one planned (parameters, batch, precision): every measured row must
    still be, or the plan would silently fall back to the assumed MFU for it."""
    from seqmix.expansion.validate import load_study
    from seqmix.plan import MEASURED_DIR, read_step_times
    from seqmix.preflight import solved_size

    rows = [r for r in read_step_times(REPO / MEASURED_DIR) if r["status"] == "ok"]
    assert len(rows) >= 11, f"{REPO / MEASURED_DIR} holds the H100's measured step times"
    expansion = expand(load_study(str(REPO / "config" / "paper.yaml")))
    for r in rows:
        spec = expansion.run_spec(r["task"], r["arch"], 0)
        planned = (solved_size(spec).params, spec.train.batch_size, spec.train.precision)
        assert (int(r["params"]), int(r["batch"]), r["precision"]) == planned, (r["task"], r["arch"])


def test_a_budget_that_cannot_be_met_is_refused_before_any_job(tmp_path):
    """Mamba's block has no feed-forward to refine: a budget between two widths with a
    tolerance tighter than their gap is refused, naming the key and the counts."""
    budget = {"params": 17000, "tolerance": 0.01, "width_step": 16, "ffn_step": 1}
    study = _study(tmp_path, **{"tasks.mqar.model.budget": budget})
    problems = budget_problems(specs_of(study))  # mamba: 11,520 at d 32, 22,080 at d 48
    assert len(problems) == 1 and problems[0].startswith("config key 'tasks.mqar.model.budget' (mamba)")
    assert "cannot be met" in problems[0] and "width_step" in problems[0]
    softmax = measure_step(expand(study).run_spec("mqar", "softmax", 0))  # its d_ff was refined
    assert abs(softmax.params / 17000 - 1) <= 0.01


def test_the_feed_forward_refinement_lands_within_tolerance():
    def build(d, n, f):
        return CausalLM(LMConfig(arch="softmax", vocab_size=30522, max_len=128, d_model=d, n_layers=n, d_ff_mult=f))

    closest = solve_budget(build, d_model=256, n_layers=6, d_ff_mult=4.0, params=13_000_000, width_step=16)
    assert abs(closest.params / 13e6 - 1) > 0.01  # the paper's widths alone miss ±1 %
    within = solve_budget(build, d_model=256, n_layers=6, d_ff_mult=4.0, params=13_000_000, width_step=16,
                          tolerance=0.01)
    assert abs(within.params / 13e6 - 1) <= 0.01 and within.d_model == closest.d_model
    assert within.d_ff_mult != 4.0 and round(within.d_ff_mult * within.d_model) % 8 == 0
    with pytest.raises(BudgetError, match="cannot be met"):
        solve_budget(build, d_model=256, n_layers=6, d_ff_mult=4.0, params=13_000_000, width_step=16,
                     tolerance=1e-7)


def test_bf16_without_a_gpu_is_refused(tmp_path):
    study = _study(tmp_path, **{"tasks.mqar.train.precision": "bf16"})
    (problem,) = precision_problems(specs_of(study), has_gpu=False)
    assert problem.startswith("config key 'tasks.mqar.train.precision' is bf16") and "fp32" in problem
    assert precision_problems(specs_of(study), has_gpu=True) == []


def test_a_complexity_length_beyond_the_machines_memory_is_refused(tmp_path):
    study = _study(tmp_path, **{"analysis.complexity.architectures": ["mamba"]})
    assert complexity_problems(specs_of(study), available_bytes=64 * GIB) == []
    (problem,) = complexity_problems(specs_of(study), available_bytes=1000)
    assert "analysis.complexity.lengths' reaches L = 32" in problem and "mamba" in problem


def test_a_table_is_spliced_into_its_page_between_its_markers():
    """tools.docs replaces a page's generated block, whole, and nothing else; a page without
    exactly one block is refused."""
    from tools.docs import BEGIN, END, generated, splice

    page = f"# Title\nprose\n{BEGIN} `make x` -->\nold table\nold line\n{END}\nmore prose\n"
    out = splice(page, "| new |")
    assert out == f"# Title\nprose\n{BEGIN} `make x` -->\n| new |\n{END}\nmore prose\n"
    assert generated(out) == "| new |\n"
    for bad in ("no markers", page + page, f"{END}\n{BEGIN} -->\n"):
        with pytest.raises(ValueError, match="needs one line"):
            splice(bad, "x")


def test_benchmark_files_are_summed_per_rule(tmp_path):
    """Snakemake's benchmark TSVs (s, max_rss in MB, cpu_time) per rule, the largest job named."""
    import os

    from seqmix.io import columns
    from seqmix.report.benchmarks import RuleCost, elapsed_s, markdown, read_benchmarks, summarise

    head = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"
    files = {"train/wikitext2/mamba/seed0.tsv": (100.0, 900.0, 180.0, 1000),
             "train/wikitext2/softmax/seed0.tsv": (50.0, 1200.0, 90.0, 1100),
             "report.tsv": (10.0, "NA", 5.0, 1200)}
    for name, (s, rss, cpu, end) in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(head + f"{s}\t0:00:00\t{rss}\t0\t0\t0\t0\t0\t0\t{cpu}\n")
        os.utime(path, (end, end))
    rows = read_benchmarks(tmp_path)
    (train, report) = summarise(rows)
    assert train == {"rule": "train", "jobs": 2, "wall_s": 150.0, "max_wall_s": 100.0, "cpu_s": 270.0,
                     "max_rss_mb": 1200.0, "worst": "wikitext2/softmax/seed0"}
    assert report["rule"] == "report" and report["max_rss_mb"] == 0.0 and report["worst"] == "-"
    assert list(train) == columns(RuleCost)  # the CSV's columns, in order
    assert elapsed_s(rows) == 1200 - 900  # the first job started at 1000 - 100
    assert "| train | 2 | 150 | 100 | 270 | 1200 | wikitext2/softmax/seed0 |" in markdown(summarise(rows), 300)


def test_the_job_time_table_names_the_commits_and_machines_its_runs_recorded(tmp_path):
    """The README's measured times are generated: headed by what the runs' provenance says."""
    import json

    from seqmix.report.benchmarks import markdown, measured_on

    assert measured_on(tmp_path).startswith("No run under")
    runs = {"a": ({"commit": "0123456789ab", "dirty": False}, {"name": "AMD EPYC 7B13", "cpus": 2}),
            "b": ({"commit": "fedcba987654", "dirty": True}, {"name": "AMD EPYC 7B13", "cpus": 2})}
    for name, (git, device) in runs.items():
        path = tmp_path / "runs" / "mqar" / name / "seed0" / "provenance.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({"git": git, "device": device}))
    line = measured_on(tmp_path)
    assert line == "Measured at commit 0123456, fedcba9 + edits on AMD EPYC 7B13, 2 CPUs."
    assert markdown([], 60.0, line).splitlines()[0] == line


def test_every_rule_that_runs_a_command_declares_its_memory_runtime_and_benchmark():
    """The scheduler packs jobs by their declared mem_mb (a rule without one counts 0 and may
    start beside a job that needs most of the machine), and benchmarks.md sums every job's
    benchmark file: each rule with a shell command declares all three."""
    import re
    from pathlib import Path

    def rules(text: str):
        """(name, body) of every rule, named (``rule x:``) or in a loop (``rule:`` + ``name:``)."""
        lines = text.splitlines()
        for i, line in enumerate(lines):
            head = re.match(r"(\s*)rule( \w+)?:", line)
            if head:
                body = []
                for nxt in lines[i + 1:]:
                    if nxt.strip() and len(nxt) - len(nxt.lstrip()) <= len(head[1]):
                        break
                    body.append(nxt)
                yield (head[2] or "(loop)").strip(), "\n".join(body)

    rules_dir = Path(__file__).resolve().parents[2] / "workflow" / "rules"
    missing, checked = [], []
    for smk in sorted(rules_dir.glob("*.smk")):
        for name, body in rules(smk.read_text()):
            if "shell:" not in body:
                continue  # a target rule (all, analysis): no job runs
            checked.append(name)
            # Sizes come from the config's `resources` through seqmix.study.dag.Jobs.resources, which
            # gives both keys for every rule (checked below), or are written out.
            sized = "resources_of(" in body or ("mem_mb=" in body and "runtime=" in body)
            for needed, present in (("mem_mb and runtime", sized), ("benchmark", "benchmark:" in body)):
                if not present:
                    missing.append(f"{smk.name}: rule {name} has no {needed}")
    assert {"train", "eval", "complexity", "throughput", "report", "(loop)"} <= set(checked)
    assert not missing, "\n".join(missing)


def test_every_rule_size_the_dag_hands_out_has_memory_and_runtime(tmp_path):
    """What resources_of gives a rule: both keys, for every size the config names."""
    from seqmix.expansion.table import expand, job_table
    from seqmix.expansion.validate import validate_study
    from seqmix.study.dag import Jobs
    from tests.conftest import tiny_config

    jobs = Jobs(job_table(expand(validate_study(tiny_config(tmp_path, None)))))
    for rule in jobs.table["resources"]:
        assert set(jobs.resources(rule)) == {"mem_mb", "runtime"}, rule


# ------------------------------------------------------------------------------------------
# Limits the data or the shapes decide, refused before the first job (issue 27).
# ------------------------------------------------------------------------------------------


def _prepared_wikitext(data: Path, tokens: dict[str, int]) -> None:
    """A tokenizer and a WikiText-2 directory prepared with it, with token streams of the
    given lengths (the preflight reads only the manifest)."""
    from seqmix.data.manifest import write_manifest
    from seqmix.io import sha256_file

    (data / "tokenizer").mkdir(parents=True)
    (data / "tokenizer" / "tokenizer.json").write_text("{}")
    (data / "wikitext2").mkdir()
    for split, n in tokens.items():
        np.save(data / "wikitext2" / f"{split}.npy", np.arange(n, dtype=np.int32) % 64)
    record = {"vocab_size": 64, "sha256": sha256_file(data / "tokenizer" / "tokenizer.json")}
    write_manifest(data / "wikitext2", {f"{s}.npy": {"tokens": n} for s, n in tokens.items()},
                   {"dataset": "fake", "source": "test", "tokenizer": record,
                    "splits": {s: {"tokens": n} for s, n in tokens.items()}})


def _wikitext_study(tmp_path, mirror, block: int, **analysis):
    cfg = tiny_config(tmp_path, mirror, archs=("softmax",))
    cfg["tasks"] = {"wikitext2": {"block_size": block, **{k: cfg["tasks"]["mqar"][k] for k in ("model", "train")}}}
    cfg["analysis"]["sparsity"]["tasks"] = ["wikitext2"]
    cfg["analysis"].update(analysis)
    return cfg


def test_a_block_longer_than_a_prepared_split_is_refused_with_the_train_jobs_message(tmp_path):
    from seqmix.data.manifest import DataError
    from seqmix.preflight import shape_problems
    from seqmix.tasks import make_task

    _prepared_wikitext(tmp_path / "data", {"train": 50, "validation": 10, "test": 30})
    study = validate_study(_wikitext_study(tmp_path, None, 16))
    manifest = tmp_path / "data" / "wikitext2" / "manifest.json"
    expected = (f"config key 'tasks.wikitext2.block_size' (16) is too long for the validation split (eval_split): "
                f"it has 10 tokens ({manifest}) and needs at least 17; set block_size <= 9, or choose a longer "
                "split for 'eval_split'")
    assert shape_problems(specs_of(study), local=False) == [expected]
    with pytest.raises(DataError) as e:  # the train job's own check, should the data change after
        make_task(expand(study).run_spec("wikitext2", "softmax", 0))
    assert str(e.value) == expected
    assert shape_problems(specs_of(validate_study(_wikitext_study(tmp_path, None, 9))), local=False) == []


def test_a_block_longer_than_the_raw_files_is_refused_before_the_data_are_prepared(tmp_path, mirror):
    from seqmix.preflight import shape_problems

    study = validate_study(_wikitext_study(tmp_path, mirror, 3_000_000))
    problems = shape_problems(specs_of(study), local=False)
    valid, test = (mirror / "wikitext-2-raw" / f"{s}.txt" for s in ("valid", "test"))
    assert [p.split(":")[0] for p in problems] == ["config key 'tasks.wikitext2.block_size' (3000000) is too long "
                                                   f"for the {s} split ({k}_split)" for s, k in
                                                   (("validation", "eval"), ("test", "test"))]
    size = valid.stat().st_size
    assert (f"it has at most {size:,} tokens (a WordPiece token covers at least one byte of {valid}, {size:,} "
            f"bytes; the data are not prepared yet) and needs at least 3,000,001; set block_size <= {size - 1} at "
            "the very most") in problems[0]
    assert str(test) in problems[1]
    assert shape_problems(specs_of(validate_study(_wikitext_study(tmp_path, mirror, 1_000_000))), local=False) == []


def test_the_raw_files_bound_the_prepared_token_counts(prepared):
    """The bound the preflight uses before the data exist holds for the data once prepared
    (here with the test tokenizer's 256-token vocabulary: the most tokens per byte)."""
    from seqmix.data.wikitext import _raw_bounds, split_tokens

    study = validate_study(prepared)
    spec = expand(study).run_spec("wikitext2", "softmax", 0)
    exact = split_tokens(spec.data_dir, spec.data, spec.tokenizer_dir)
    bounds = _raw_bounds(spec.data)
    assert set(exact) == set(bounds) == {"train", "validation", "test"}
    for split, count in exact.items():
        assert count.exact and not bounds[split].exact
        assert 0 < count.tokens <= bounds[split].tokens


def test_plan_refuses_an_impossible_block_before_counting_anything(tmp_path, mirror, monkeypatch, capsys):
    import yaml

    from seqmix.cli import main

    def counted(*args, **kwargs):
        raise AssertionError("a model was counted at an impossible size")

    monkeypatch.setattr(measure, "small_steps", counted)
    (tmp_path / "big.yaml").write_text(yaml.safe_dump(_wikitext_study(tmp_path, mirror, 3_000_000)))
    assert main(["plan", "--config", str(tmp_path / "big.yaml"), "--no-local-checks", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: the study would fail at its shapes:\n  - config key 'tasks.wikitext2.block_size' "
                          "(3000000) is too long for the validation split")


def test_a_step_whose_activations_alone_exceed_the_memory_is_refused_from_its_shapes(tmp_path, monkeypatch):
    from seqmix.errors import ConfigError
    from seqmix.preflight import shape_problems

    study = _study(tmp_path)
    # batch 4 x 16 tokens x d 16 x 2 layer outputs (embedding, one block) x 4 bytes = 8,192 bytes
    monkeypatch.setattr(measure, "available_memory", lambda device: 8_192.0)
    assert shape_problems(specs_of(study)) == []
    monkeypatch.setattr(measure, "available_memory", lambda device: 8_191.0)
    problems = shape_problems(specs_of(study))
    assert len(problems) == 2 and problems[0].startswith(
        "a training step of mqar/softmax keeps at least 0.0 GiB of activations (batch 4 x 16 tokens x d_model 16 "
        "x 2 layer outputs, 4 bytes each) and this machine has 0.0 GiB: lower config key 'tasks.mqar.seq_len' or "
        "'tasks.mqar.train.batch_size'")
    assert shape_problems(specs_of(study), local=False) == []  # jobs elsewhere: not this machine's memory
    # The plan counts the step here at batches up to 3: 6,144 bytes of activations at least.
    monkeypatch.setattr(measure, "available_memory", lambda device: 6_143.0)
    with pytest.raises(ConfigError, match="cannot count it: a training step of mqar/softmax keeps at least"):
        measure_step(expand(study).run_spec("mqar", "softmax", 0))  # the plan counts here: refused before building


@pytest.mark.parametrize("arch", ["softmax", "grassmann", "linear", "performer", "sliding_window", "bigbird", "gla",
                                  "h3", "mamba", "tssa", "crate"])
def test_the_activation_floor_is_below_what_a_step_keeps(tmp_path, arch):
    """The floor the preflight refuses on is a lower bound: every block leaves a fresh
    (B, L, d) tensor that the backward pass reads."""
    spec = expand(_study(tmp_path, **{"architectures": [arch], "tasks.mqar.model.n_layers": 2})).run_spec("mqar", arch, 0)
    task = task_class(spec.kind).without_data(spec)
    model = task.build_model(spec.model.d_model, spec.model.n_layers)
    small = measure.small_steps(lambda b: task.loss(model, task.example_batch(b, "cpu")), model)
    activations, _ = step_bytes(small, spec.train.batch_size)
    floor = measure.activation_floor(spec.train.batch_size, task.sequence_length, spec.model.d_model,
                                     spec.model.n_layers)
    assert floor <= activations


def test_a_sparsity_crop_longer_than_an_encoder_tasks_inputs_is_refused(tmp_path):
    from seqmix.preflight import shape_problems

    cfg = tiny_config(tmp_path, None, archs=("softmax", "linformer"))
    cfg["tasks"]["snli"] = {"train_file": "train_head_1024", "max_sentence_tokens": 8,
                            **{k: cfg["tasks"]["mqar"][k] for k in ("model", "train")}}
    cfg["analysis"]["sparsity"].update(tasks=["mqar"], crop_len=20)  # linformer's runs are SNLI's
    (problem,) = shape_problems(specs_of(validate_study(cfg)), local=False)
    assert problem == ("config key 'analysis.sparsity.crop_len' (20) is longer than every input of task 'snli' "
                       "(at most 19 tokens): the sparsity analysis would find no held-out input to crop; set "
                       "crop_len <= 19")
    cfg["analysis"]["sparsity"]["crop_len"] = 19
    assert shape_problems(specs_of(validate_study(cfg)), local=False) == []


def test_an_evaluation_cap_below_one_block_is_refused_at_validation(tmp_path):
    from seqmix.errors import ConfigError

    cfg = _wikitext_study(tmp_path, None, 64)
    cfg["tasks"]["wikitext2"]["eval_max_tokens"] = 32
    with pytest.raises(ConfigError, match=r"tasks.wikitext2': eval_max_tokens \(32\) is below block_size \(64\)"):
        validate_study(cfg)


def test_snakemake_refuses_an_impossible_block_before_its_first_job(tmp_path, mirror):
    """The Snakefile's onstart runs the preflight: no job starts (no data, no results)."""
    import os
    import subprocess
    import sys

    import yaml

    (tmp_path / "big.yaml").write_text(yaml.safe_dump(_wikitext_study(tmp_path, mirror, 3_000_000)))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--directory",
                           str(tmp_path), "--cores", "1", "--configfile", str(tmp_path / "big.yaml")],
                          capture_output=True, text=True, env=env, cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert ("error: the study would fail at its shapes:\n  - config key 'tasks.wikitext2.block_size' (3000000) is "
            "too long for the validation split (eval_split)") in out
    assert not (tmp_path / "results").exists() and not (tmp_path / "data").exists()


def test_the_snakefiles_preflight_reads_the_job_table_and_validates_nothing_again(tmp_path, monkeypatch):
    """The onstart checks the specs the `jobs` command put in the table: the same as the
    expansion's (first seeds, sweep points, sparsity jobs and all), with no second validation
    or expansion of the study in the Snakefile's process."""
    import json

    from seqmix.expansion import table as expansion_table
    from seqmix.expansion import validate
    from seqmix.expansion.table import job_table
    from seqmix.preflight import preflight
    from seqmix.study.settings import Study

    cfg = tiny_config(tmp_path, None, archs=("softmax", "mamba", "linformer"), seeds=(2, 1))
    cfg["tasks"]["mqar"]["sweep"] = {"train.lr": [1e-3, 3e-3]}
    cfg["tasks"]["mqar"]["train"]["precision"] = "bf16"
    expansion = expand(validate_study(cfg))
    table = json.loads(json.dumps(job_table(expansion)))  # as the Snakefile reads it
    expected = Specs.of_expansion(expansion)
    assert [(s.task, s.arch, s.seed) for s in expected.runs] == [  # linformer has no causal form: no MQAR run
        (f"mqar/lr{lr}", arch, 2) for lr in ("0.001", "0.003") for arch in ("softmax", "mamba")]
    assert len(expected.sparsity) == len(expansion.sparsity_runs) > 0

    def again(*args, **kwargs):
        raise AssertionError("the study was validated or expanded again")

    for module, name in ((validate, "validate_study"), (validate, "validate_profile"), (expansion_table, "expand")):
        monkeypatch.setattr(module, name, again)
    monkeypatch.setattr(Study, "model_validate", classmethod(again))
    assert Specs.of_table(table) == expected
    problems = preflight(Specs.of_table(table), local=False)
    assert problems == preflight(expected, local=False) == []
    assert precision_problems(Specs.of_table(table), has_gpu=False)[0].startswith(
        "config key 'tasks.mqar.train.precision' is bf16")
    assert "preflight(Specs.of_table(JOBS.table), local=workflow.local_exec)" in (REPO / "Snakefile").read_text()
