"""The cost plan (python -m seqmix plan) and the preflight checks run before the first job."""

from __future__ import annotations

import pytest
import torch

from seqmix import measure
from seqmix.config import validate_config
from seqmix.measure import GIB, Count, step_bytes
from seqmix.models.budget import BudgetError, solve_budget
from seqmix.models.lm import CausalLM, LMConfig
from seqmix.plan import README_BEGIN, README_END, measure_step, plan_rows, splice_between, totals
from seqmix.preflight import budget_problems, complexity_problems, precision_problems
from seqmix.study import run_spec, runs
from seqmix.tasks import task_class

from .conftest import tiny_config


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


def _study(tmp_path, **changes):
    raw = tiny_config(tmp_path, None, archs=("softmax", "mamba"))
    for key, value in changes.items():
        *sections, field = key.split(".")
        node = raw
        for part in sections:
            node = node.setdefault(part, {})
        node[field] = value
    return validate_config(raw)


def test_the_step_is_counted_on_the_real_model(tmp_path):
    """FLOPs of a softmax LM step: 2 FLOPs per multiply-add of every linear layer on every
    token, plus SDPA's QKᵀ and AV, forward; the backward pass twice that for the linear
    layers, and for SDPA its five products (the scores recomputed: 2.5 × its forward)."""
    study = _study(tmp_path, **{"tasks.mqar.model.d_ff_mult": 4.0, "tasks.mqar.train.batch_size": 4})
    spec = run_spec(study, "mqar", "softmax", 0)
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
    spec = run_spec(study, "mqar", arch, 0)
    task = task_class(spec.kind).without_data(spec)
    model = CausalLM(LMConfig(arch=arch, vocab_size=32, max_len=16, d_model=16, n_layers=1, d_ff_mult=4.0,
                              block=spec.model.block, mixer_options=spec.mixer_options)).eval()
    small = measure.small_steps(task, model)
    activations, peak = step_bytes(task, model, batch, small=small)
    with Count() as count:
        loss = task.loss(model, task.example_batch(batch, "cpu"))
        held = count.live
        loss.backward()
    assert (activations, peak) == (held, count.peak) and peak >= activations


def test_the_peak_is_extended_where_it_falls_at_the_batch(tmp_path):
    """A model whose gradients outweigh a small batch's activations: at batches 2 and 3 the
    peak falls at the end of the backward pass, at batch 256 early in it. Extending the small
    batches' peaks misses a third of it; extending every moment does not."""
    spec = run_spec(_study(tmp_path, **{"tasks.mqar.train.batch_size": 256}), "mqar", "softmax", 0)
    task = task_class(spec.kind).without_data(spec)
    model = CausalLM(LMConfig(arch="softmax", vocab_size=256, max_len=16, d_model=128, n_layers=2, d_ff_mult=0,
                              block="pre", mixer_options=spec.mixer_options)).eval()
    small = measure.small_steps(task, model)
    with Count() as count:
        task.loss(model, task.example_batch(256, "cpu")).backward()
    assert measure.extend_peak(small, 256) == count.peak
    assert measure.extend(small.peaks, 256) < 0.8 * count.peak


def test_a_training_step_beyond_the_machines_memory_is_refused(tmp_path, monkeypatch):
    from seqmix.train.loop import memory_problem

    spec = run_spec(_study(tmp_path), "mqar", "mamba", 0)
    task = task_class(spec.kind).without_data(spec)
    model = CausalLM(LMConfig(arch="mamba", vocab_size=32, max_len=16, d_model=16, n_layers=1, block="pre_rms"))
    assert memory_problem(task, model, 4, torch.device("cpu")) is None
    monkeypatch.setattr(measure, "available_memory", lambda device: 1000.0)
    problem = memory_problem(task, model, 4, torch.device("cpu"))
    assert problem.startswith("a training step of mqar/mamba/seed0 needs about") and "lower train.batch_size" in problem


def test_the_plan_adds_up_runs_tokens_and_flops(tmp_path):
    study = _study(tmp_path, seeds=[0, 1])
    rows = plan_rows(study, mfu=0.5, peak=1e12)
    assert {(r["task"], r["arch"]) for r in rows} == {("mqar", "softmax"), ("mqar", "mamba")}
    assert sum(r["runs"] for r in rows) == len(runs(study)) == 4
    spec = run_spec(study, "mqar", "softmax", 0)
    step = measure_step(spec)
    row = next(r for r in rows if r["arch"] == "softmax")
    evals = spec.train.steps // spec.train.eval_every
    flops = 2 * (spec.train.steps * step.train_flops + evals * spec.train.eval_batches * step.eval_flops)
    assert row["pflop"] == pytest.approx(flops / 1e15)
    assert row["tokens"] == 2 * spec.train.steps * spec.train.batch_size * 16
    assert row["h100_hours"] == pytest.approx(flops / (1e12 * 0.5) / 3600)
    assert totals(rows)["runs"] == 4


def test_a_budget_that_cannot_be_met_is_refused_before_any_job(tmp_path):
    """Mamba's block has no feed-forward to refine: a budget between two widths with a
    tolerance tighter than their gap is refused, naming the key and the counts."""
    budget = {"params": 17000, "tolerance": 0.01, "width_step": 16, "ffn_step": 1}
    study = _study(tmp_path, **{"tasks.mqar.model.budget": budget})
    problems = budget_problems(study)  # mamba: 11,520 at d 32, 22,080 at d 48
    assert len(problems) == 1 and problems[0].startswith("config key 'tasks.mqar.model.budget' (mamba)")
    assert "cannot be met" in problems[0] and "width_step" in problems[0]
    softmax = measure_step(run_spec(study, "mqar", "softmax", 0))  # its d_ff was refined
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
    (problem,) = precision_problems(study, has_gpu=False)
    assert problem.startswith("config key 'tasks.mqar.train.precision' is bf16") and "fp32" in problem
    assert precision_problems(study, has_gpu=True) == []


def test_a_complexity_length_beyond_the_machines_memory_is_refused(tmp_path):
    study = _study(tmp_path, **{"analysis.complexity.architectures": ["mamba"]})
    assert complexity_problems(study, available_bytes=64 * GIB) == []
    (problem,) = complexity_problems(study, available_bytes=1000)
    assert "analysis.complexity.lengths' reaches L = 32" in problem and "mamba" in problem


def test_the_readme_table_is_spliced_between_its_markers():
    readme = f"intro\n{README_BEGIN}\nold table\n{README_END}\nrest\n"
    out = splice_between(readme, README_BEGIN, README_END, "| new |\n")
    assert out == f"intro\n{README_BEGIN}\n| new |\n{README_END}\nrest\n"
    with pytest.raises(ValueError, match="no markers"):
        splice_between("no markers", README_BEGIN, README_END, "x")


def test_benchmark_files_are_summed_per_rule(tmp_path):
    """Snakemake's benchmark TSVs (s, max_rss in MB, cpu_time) per rule, the largest job named."""
    import os

    from seqmix.report.benchmarks import elapsed_s, markdown, read_benchmarks, summarise

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
    assert elapsed_s(rows) == 1200 - 900  # the first job started at 1000 - 100
    assert "| train | 2 | 150 | 100 | 270 | 1200 | wikitext2/softmax/seed0 |" in markdown(summarise(rows), 300)


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

    rules_dir = Path(__file__).resolve().parents[1] / "workflow" / "rules"
    missing, checked = [], []
    for smk in sorted(rules_dir.glob("*.smk")):
        for name, body in rules(smk.read_text()):
            if "shell:" not in body:
                continue  # a target rule (all, analysis): no job runs
            checked.append(name)
            for needed in ("mem_mb=", "runtime=", "benchmark:"):
                if needed not in body:
                    missing.append(f"{smk.name}: rule {name} has no {needed.rstrip('=:')}")
    assert {"train", "eval", "complexity", "throughput", "report", "(loop)"} <= set(checked)
    assert not missing, "\n".join(missing)
