"""Seed packs (seqmix.train.pack, issue 48 item 1): the seeds of one run configuration trained
as one vectorised model. A packed seed equals its single run within fp32 rounding over its
first steps (dropout 0: with dropout a packed seed draws other masks, by design), for several
mixers and Grassmann's Triton kernel under the interpreter; each member writes a single run's
files; members that end at different steps leave the pack unchanged from then on; and a pack
stopped at any event of its checkpoint commits (between two members' writes included) resumes
to the bytes of an uninterrupted pack. Kills are events, never moments: an exception raised
in this process at a chosen write, with what a killed writer leaves behind (tests/faults/).

MQAR (synthetic): no mirror needed. About a minute on a 2-core CPU."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from seqmix.expansion.table import expand
from seqmix.expansion.validate import validate_study
from seqmix.mixers import dispatch
from seqmix.tasks import task_class
from seqmix.train import checkpoint, loop, pack
from tests.conftest import tiny_config
from tests.helpers import assert_same_run, digest, log_rows, run_spec_in, without_time

SEEDS = (0, 1, 2)
SHORT = dict(steps=6, checkpoint_every=3, eval_every=3, log_every=1)
KILL = dict(steps=10, checkpoint_every=3, eval_every=4, log_every=2)
FILES = ["checkpoints", "checkpoints/final.pt", "config.json", "hashes.json", "log.csv", "metrics.json", "model.pt",
         "provenance.json", "train.lock"]


class Interrupt(BaseException):
    """A kill in process: not an Exception, so nothing on its way out handles it."""


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("packs")
    cfg = tiny_config(root, None, archs=("softmax", "grassmann", "linear", "mamba", "h3"), seeds=SEEDS)
    job = expand(validate_study(cfg)).data_job("mqar")
    task_class(job.kind).prepare(job)
    return cfg


def specs_in(cfg: dict, where: Path, arch: str, dropout: float = 0.0, **train) -> list:
    cfg = {**cfg, "tasks": {"mqar": {**cfg["tasks"]["mqar"], "model": {**cfg["tasks"]["mqar"]["model"],
                                                                          "dropout": dropout}}}}
    return [run_spec_in(cfg, where, arch=arch, seed=s, **train) for s in SEEDS]


def losses(run_dir: str) -> list[float]:
    with open(Path(run_dir) / "log.csv") as f:
        return [float(r["loss"]) for r in csv.DictReader(f)]


def largest_difference(packed: str, single: str) -> tuple[float, float]:
    """(largest |loss difference| over the log's rows, largest |weight difference| at the end)."""
    a, b = losses(packed), losses(single)
    assert len(a) == len(b)
    wa, wb = (checkpoint.load(Path(d) / "model.pt")["model"] for d in (packed, single))
    return max(abs(x - y) for x, y in zip(a, b)), max(float((wa[k] - wb[k]).abs().max()) for k in wa)


# ------------------------------------------------------------------------------------------
# A packed seed against its single run.
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch,implementation", [("softmax", "auto"), ("grassmann", "auto"), ("grassmann", "triton"),
                                                 ("linear", "auto"), ("mamba", "auto")])
def test_a_packed_seed_equals_its_single_run_within_fp32_rounding(study, tmp_path, arch, implementation):
    """Dropout 0 (a packed seed draws other dropout masks: module docstring of seqmix.train.pack).
    ``triton``: Grassmann's fused kernel (a torch.library op with a vmap rule) under the
    interpreter, in the pack and in the single runs alike."""
    steps = dict(SHORT, steps=3) if implementation == "triton" else SHORT  # the interpreter is slow
    packed, single = specs_in(study, tmp_path / "packed", arch, **steps), specs_in(study, tmp_path / "single", arch, **steps)
    with dispatch.using(implementation):
        metrics = pack.train_pack(packed, progress=False)
        for spec in single:
            loop.train(spec, progress=False)
    report = {}
    for p, s, m in zip(packed, single, metrics):
        loss_diff, weight_diff = largest_difference(p.run_dir, s.run_dir)
        report[p.seed] = (loss_diff, weight_diff)
        assert loss_diff < 1e-5 and weight_diff < 1e-5, (p.seed, loss_diff, weight_diff)
        assert m == json.loads((Path(p.run_dir) / "metrics.json").read_text())
        mine, theirs = without_time(m), without_time(json.loads((Path(s.run_dir) / "metrics.json").read_text()))
        for key in ("last_eval", "best_eval", "train_loss_last"):  # float rounding apart, the same run
            mine.pop(key), theirs.pop(key)
        assert mine == theirs
        prov = json.loads((Path(p.run_dir) / "provenance.json").read_text())
        assert prov["pack"]["seeds"] == list(SEEDS) and prov["pack"]["member"] == SEEDS.index(p.seed)
        if implementation == "triton":
            assert prov["implementation"]["paths"] == {"grassmann": "triton"}
    print(f"{arch} ({implementation}): largest |loss diff|, |weight diff| per seed over {steps['steps']} steps: {report}")


def test_each_member_writes_a_single_runs_files_which_evaluation_reads(study, tmp_path):
    from seqmix.train.evaluate import evaluate_run

    packed, single = specs_in(study, tmp_path / "packed", "softmax", **SHORT), specs_in(study, tmp_path / "single", "softmax", **SHORT)
    pack.train_pack(packed, progress=False)
    loop.train(single[1], progress=False)
    for spec in packed:
        d = Path(spec.run_dir)
        assert sorted(str(p.relative_to(d)) for p in d.rglob("*")) == FILES
        config = json.loads((d / "config.json").read_text())
        assert config["spec_hash"] == loop.spec_hash(spec)  # the spec as it is: evaluation and recording read it
        assert evaluate_run(d)["status"] == "ok"
    a, b = (json.loads((Path(s.run_dir) / "config.json").read_text()) for s in (packed[1], single[1]))
    assert {k for k in a if a[k] != b[k]} == {"run_dir", "spec_hash"}  # where it writes, and so its hash
    assert list(json.loads((Path(packed[1].run_dir) / "metrics.json").read_text())) == list(
        json.loads((Path(single[1].run_dir) / "metrics.json").read_text()))


def test_a_pack_with_dropout_trains_and_is_another_run_than_its_single_run(study, tmp_path):
    """With dropout a packed seed is its own run: its identity names the pack, so that neither
    resumes the other's checkpoints."""
    packed = specs_in(study, tmp_path / "packed", "softmax", dropout=0.1, **SHORT)
    pack.train_pack(packed, progress=False)
    code = pack.pack_code(packed[0])
    assert pack.pack_identity(packed[0], packed, code) != loop.run_identity(packed[0], code)
    assert pack.pack_identity(packed[0], packed, code) != pack.pack_identity(packed[0], packed[:2], code)
    assert all(json.loads((Path(s.run_dir) / "metrics.json").read_text())["status"] == "ok" for s in packed)


def test_specs_that_are_not_one_configurations_seeds_are_refused(study, tmp_path):
    specs = specs_in(study, tmp_path, "softmax", **SHORT)
    other = run_spec_in(study, tmp_path / "other", arch="softmax", seed=3, steps=7)
    with pytest.raises(pack.PackError, match="differ in train"):
        pack.train_pack([*specs, other], progress=False)
    with pytest.raises(pack.PackError, match="distinct"):
        pack.train_pack([specs[0], specs[0]], progress=False)
    with pytest.raises(pack.PackError, match="h3 cannot train in a pack: .*setup_context"):
        pack.train_pack(specs_in(study, tmp_path / "h3", "h3", **SHORT), progress=False)


# ------------------------------------------------------------------------------------------
# Members that end at different steps.
# ------------------------------------------------------------------------------------------


def solved_at(monkeypatch, seed: int, step: int) -> None:
    """The run of ``seed`` reaches its early stop at its evaluation of ``step`` (in a pack and
    alone alike), as MQAR's 0.99 accuracy would."""
    real = loop.reached_early_stop

    def reached(run):
        return (run.spec.seed == seed and run.state.step == step) or real(run)

    monkeypatch.setattr(loop, "reached_early_stop", reached)


def test_a_member_that_ends_early_stops_changing_while_the_others_go_on(study, tmp_path, monkeypatch):
    solved_at(monkeypatch, seed=1, step=4)
    packed, single = specs_in(study, tmp_path / "packed", "grassmann", **KILL), specs_in(study, tmp_path / "single", "grassmann", **KILL)
    metrics = pack.train_pack(packed, progress=False)
    for spec in single:
        loop.train(spec, progress=False)
    assert [m["steps_completed"] for m in metrics] == [10, 4, 10]
    assert [m["ended"] for m in metrics] == ["budget", "solved", "budget"]
    for p, s in zip(packed, single):
        loss_diff, weight_diff = largest_difference(p.run_dir, s.run_dir)
        assert loss_diff < 1e-5 and weight_diff < 1e-5, (p.seed, loss_diff, weight_diff)


def test_a_member_whose_loss_is_not_finite_is_recorded_diverged_and_the_others_go_on(study, tmp_path, monkeypatch):
    """Seed 2's weights poisoned after its 5th step (in the pack and alone): it diverges at
    step 5 and the others' runs equal their single runs."""
    real_advance, real_step = pack.advance, loop.train_step

    def poison_pack(p, run, *args):
        ended = real_advance(p, run, *args)
        if run.spec.seed == 2 and run.state.step == 5:
            with torch.no_grad():
                p.params["tok_emb.weight"][p.members.index(run)].fill_(float("nan"))
        return ended

    def poison_single(run):
        out = real_step(run)
        if run.spec.seed == 2 and run.state.step == 5:
            with torch.no_grad():
                run.model.tok_emb.weight.fill_(float("nan"))
        return out

    monkeypatch.setattr(pack, "advance", poison_pack)
    monkeypatch.setattr(loop, "train_step", poison_single)
    packed, single = specs_in(study, tmp_path / "packed", "softmax", **KILL), specs_in(study, tmp_path / "single", "softmax", **KILL)
    metrics = pack.train_pack(packed, progress=False)
    for spec in single:
        loop.train(spec, progress=False)
    assert [(m["status"], m["diverged_at_step"]) for m in metrics] == [("ok", None), ("ok", None), ("diverged", 5)]
    for p, s in zip(packed[:2], single[:2]):
        loss_diff, weight_diff = largest_difference(p.run_dir, s.run_dir)
        assert loss_diff < 1e-5 and weight_diff < 1e-5
    assert log_rows(Path(packed[2].run_dir))[-1]["step"] == "4"


# ------------------------------------------------------------------------------------------
# A pack stopped at any event resumes to the bytes of an uninterrupted pack.
# ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def uninterrupted(study, tmp_path_factory) -> list[str]:
    """The pack of KILL (dropout on: the pack's dropout stream must resume too), seed 1 solved
    at step 8, trained in one go."""
    with pytest.MonkeyPatch.context() as m:
        solved_at(m, seed=1, step=8)
        specs = specs_in(study, tmp_path_factory.mktemp("uninterrupted"), "grassmann", dropout=0.1, **KILL)
        pack.train_pack(specs, progress=False)
    return [s.run_dir for s in specs]


def stops_at_write(monkeypatch, name: str, nth: int) -> None:
    """The ``nth`` checkpoint file named ``name`` that the pack writes (all members' counted
    in order) dies half written (a killed writer's temporary file beside it), and the pack
    stops there."""
    from seqmix import io as seqmix_io

    real, seen = checkpoint.save_atomic, []

    def save(obj, path):
        if Path(path).name == name:
            seen.append(path)
            if len(seen) == nth:
                seqmix_io.new_temp(Path(path)).write_bytes(b"half a file")
                raise Interrupt
        real(obj, path)

    monkeypatch.setattr(checkpoint, "save_atomic", save)


def stops_after_member_write(monkeypatch, nth: int) -> None:
    """The pack stops once it has written its ``nth`` member checkpoint (between two members'
    writes of one commit unless nth is a multiple of the members)."""
    real, seen = pack.save_member, []

    def save(*args):
        real(*args)
        seen.append(1)
        if len(seen) == nth:
            raise Interrupt

    monkeypatch.setattr(pack, "save_member", save)


# KILL: commits at steps 3, 6 (checkpoints), 8 (seed 1 solved), 9, 10 (the end); the members'
# checkpoint writes in order: 1-3 at step 3, 4-6 at step 6, 7-9 at step 8, 10-11 at step 9, ...
# Each stop, and the steps the rerun resumes its members from (seeds 0, 1, 2; [] a fresh start).
STOPS = {
    "between two members' checkpoints at step 3": (lambda mp: stops_after_member_write(mp, 2), [[], [], []]),
    "between two members' checkpoints at step 6": (lambda mp: stops_after_member_write(mp, 5), [[3], [3], [3]]),
    "after every member's checkpoint at step 6": (lambda mp: stops_after_member_write(mp, 6), [[6], [6], [6]]),
    "while writing seed 2's checkpoint at step 8, seed 1 solved there": (lambda mp: stops_at_write(mp, "last.pt", 9),
                                                                         [[6], [6], [6]]),
    "after the commit at step 8, before seed 1's results": (lambda mp: stops_at_write(mp, "final.pt", 1), [[8], [8], [8]]),
    "while writing seed 0's final checkpoint at the end": (lambda mp: stops_at_write(mp, "final.pt", 2), [[10], [8], [10]]),
}


@pytest.mark.parametrize("where", list(STOPS))
def test_a_pack_stopped_anywhere_resumes_to_the_bytes_of_an_uninterrupted_pack(study, tmp_path, uninterrupted,
                                                                              monkeypatch, where):
    solved_at(monkeypatch, seed=1, step=8)
    specs = specs_in(study, tmp_path, "grassmann", dropout=0.1, **KILL)
    stop, resumed_from = STOPS[where]
    with monkeypatch.context() as m:
        stop(m)
        with pytest.raises(Interrupt):
            pack.train_pack(specs, progress=False)
    metrics = pack.train_pack(specs, progress=False)
    assert [m["resumed_from_steps"] for m in metrics] == resumed_from
    for spec, reference in zip(specs, uninterrupted):
        assert_same_run(Path(spec.run_dir), Path(reference))
        assert not list(Path(spec.run_dir).rglob("*.tmp")) and not (Path(spec.run_dir) / pack.PREVIOUS).exists()
    assert digest(Path(specs[0].run_dir) / "model.pt") != digest(Path(specs[2].run_dir) / "model.pt")
