"""Su's sparsity (Su 2023, kexue.fm/archives/9889) of trained models on held-out inputs:
S = E[x]/sqrt(E[x²]) of a row of non-negative weights, 1 for a constant row and 1/√n for a
one-hot row of length n. Two kinds of row, so that attention-free mixers sit on the same
axis as attention: a mixer's own scores (``mixer.scores(h)``, where it has them) and the
Jacobian effective attention ‖∂y_t/∂x_s‖ of every mixer (analysis/jacobian.py). Mixers
with no causal form are measured on their SNLI encoder runs (``fallback_task``), on pairs
cropped to one length so that no row holds padding. Rows: ``SparsityRow``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypedDict

import torch

from seqmix.analysis.capture import capture_mixer_inputs
from seqmix.io import columns
from seqmix.study.settings import SparsitySettings


class SparsityRow(TypedDict):
    """One row of sparsity.csv: S over the rows of one (run, kind, layer, head), each row
    taken over its visible keys (s ≤ t when causal) and kept with at least min_row_len."""

    task: str  # the run's task (an encoder task for mixers with no causal form)
    arch: str
    seed: int  # training seed
    kind: str  # attention (the mixer's scores) | jacobian (effective attention ‖∂y_t/∂x_s‖)
    positions: str  # all: every row long enough | scored: the rows the task scores (MQAR: queries)
    layer: int  # block index, 0 = closest to the embedding
    head: int  # head index for kind=attention; -1 for kind=jacobian (the whole mixer)
    rows: int  # rows (query positions × sequences) averaged
    min_row_len: int  # shortest visible row kept (keys)
    S_mean: float  # Su's S over those rows
    S_std: float
    S_median: float
    S_onehot_mean: float  # mean 1/√(row length): S of one-hot rows, the most concentrated possible
    row_len_mean: float  # mean visible row length (keys)
    sequences: int  # held-out sequences the rows come from
    seq_len: int  # their length (tokens)


FIELDS = columns(SparsityRow)


def su_sparsity(x: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None) -> torch.Tensor:
    """S = E[x] / sqrt(E[x²]) along ``dim`` for non-negative x (|x| is taken).

    ``mask`` (same shape, bool) restricts the expectation to the True entries, e.g. the
    causal prefix of a row. A row of zeros has S = NaN.
    """
    x = x.abs()
    if mask is None:
        mean = x.mean(dim=dim)
        mean_sq = (x * x).mean(dim=dim)
    else:
        m = mask.to(x.dtype)
        n = m.sum(dim=dim)
        mean = (x * m).sum(dim=dim) / n
        mean_sq = (x * x * m).sum(dim=dim) / n
    return mean / mean_sq.sqrt()


def row_stats(scores: torch.Tensor, causal: bool, min_row_len: int, rows: torch.Tensor | None = None) -> list[dict]:
    """Per head: S of each attention row of (B, H, L, L) scores, rows of at least
    ``min_row_len`` visible keys only (short causal rows are trivially concentrated), and
    only where ``rows`` (B, L, bool) is True when it is given."""
    B, H, L, _ = scores.shape
    if causal:
        mask = torch.ones(L, L, dtype=torch.bool, device=scores.device).tril()
        row_len = torch.arange(1, L + 1, device=scores.device)
    else:
        mask = torch.ones(L, L, dtype=torch.bool, device=scores.device)
        row_len = torch.full((L,), L, device=scores.device)
    S = su_sparsity(scores.double(), mask=mask.expand_as(scores))  # (B, H, L)
    keep = (row_len >= min_row_len).expand(B, L)
    if rows is not None:
        keep = keep & rows.to(scores.device)
    out = []
    for h in range(H):
        s = S[:, h][keep]
        # Rows not computed (NaN, e.g. Jacobian rows left out) are left out of every statistic.
        finite = torch.isfinite(s)
        s = s[finite]
        n = row_len.double().expand(B, L)[keep][finite]
        out.append({
            "head": h, "rows": int(s.numel()), "S_mean": s.mean().item(), "S_std": s.std().item(),
            "S_median": s.median().item(), "S_onehot_mean": (1 / n.sqrt()).mean().item(),
            "row_len_mean": n.mean().item(),
        })
    return out


def jacobian_positions_of(rows_b: torch.Tensor | None, kept: list[int], count: int | None) -> list[int]:
    """The query positions whose Jacobian rows are computed for one sequence: the kept ones
    that are scored (``rows_b``), or ``count`` of them spread evenly over the sequence."""
    if rows_b is not None:
        scored = set(torch.nonzero(rows_b).flatten().tolist())
        return [t for t in kept if t in scored]
    if count is not None and count < len(kept):
        pick = torch.linspace(0, len(kept) - 1, count).round().long().unique()
        return [kept[i] for i in pick.tolist()]
    return kept


def jacobian_rows(mixer, h: torch.Tensor, rows: torch.Tensor | None, min_len: int, chunk: int,
                  count: int | None) -> torch.Tensor:
    """Effective attention (B, 1, L, L) of one layer on ``h``, NaN where not computed."""
    from seqmix.analysis.jacobian import effective_attention

    L = h.shape[1]
    # Only the rows row_stats keeps: t + 1 ≥ min_len visible keys when causal.
    kept = list(range(min_len - 1, L)) if mixer.causal else list(range(L))
    if rows is None:
        return effective_attention(mixer, h, positions=jacobian_positions_of(None, kept, count), chunk=chunk)[:, None]
    return torch.cat([effective_attention(mixer, h[b : b + 1], chunk=chunk,
                                          positions=jacobian_positions_of(rows[b], kept, None))
                      for b in range(len(h))])[:, None]


def model_sparsity(
    model: torch.nn.Module,
    seqs: tuple[torch.Tensor, ...],
    min_row_len: int = 16,
    jacobian_sequences: int = 2,
    chunk: int = 512,
    jacobian_positions: int | None = None,
    rows: torch.Tensor | None = None,
) -> list[dict]:
    """Rows of sparsity.csv (without the run columns) for a model reading ``seqs``: the
    tuple of the model's arguments (token ids (N, L) first).

    kind=attention per layer and head for mixers with scores; kind=jacobian per layer for
    every mixer, on the first ``jacobian_sequences`` sequences (L·d vector-Jacobian
    products each; 0 skips them), at every kept query position or at
    ``jacobian_positions`` of them spread evenly over the sequence (each row exact; fewer
    rows only trade coverage for time). With ``rows`` (N, L, bool), only those positions'
    rows are measured (positions = "scored"; MQAR: the queries).
    """
    model.eval()
    args = seqs if isinstance(seqs, tuple) else (seqs,)  # a bare (N, L) tensor of token ids too
    inputs = capture_mixer_inputs(model, lambda: model(*args))
    seq_len = args[0].shape[1]
    min_len = min(min_row_len, seq_len)
    common = {"min_row_len": min_len, "seq_len": seq_len, "positions": "all" if rows is None else "scored"}
    out = []
    for layer, (block, h) in enumerate(zip(model.blocks, inputs)):
        mixer = block.mixer
        if type(mixer).has_scores:
            with torch.no_grad():
                scores = mixer.scores(h)
            for r in row_stats(scores, mixer.causal, min_len, rows):
                out.append({**common, "kind": "attention", "layer": layer, "sequences": len(h), **r})
        if jacobian_sequences > 0:
            sub = None if rows is None else rows[:jacobian_sequences]
            eff = jacobian_rows(mixer, h[:jacobian_sequences], sub, min_len, chunk, jacobian_positions)
            for r in row_stats(eff, mixer.causal, min_len, sub):
                out.append({**common, "kind": "jacobian", "layer": layer, "sequences": len(eff), **r, "head": -1})
    return out


def measured_sparsity(run_dir: str | Path, spec: SparsitySettings) -> list[SparsityRow]:
    """SparsityRows of one trained run on ``spec.num_sequences`` held-out inputs of its
    task (an encoder task's are cropped to ``spec.crop_len`` tokens: no padding in a row)."""
    from seqmix.train.evaluate import load_run

    model, task, run = load_run(run_dir)
    seqs = task.heldout_inputs(spec.split, spec.num_sequences, spec.crop_len)
    scored = task.heldout_rows(spec.split, spec.num_sequences)
    ids = {"task": run.task, "arch": run.arch, "seed": run.seed}
    rows = model_sparsity(model, seqs, spec.min_row_len, spec.jacobian_sequences, spec.jacobian_chunk,
                          spec.jacobian_positions, rows=scored)
    return [{**ids, **r} for r in rows]


def write_sparsity(run_dirs: list[Path], spec: SparsitySettings, out: Path, threads: int | None = None) -> int:
    """sparsity.csv of the finished runs among ``run_dirs`` (a diverged run has no
    attention to measure: it contributes no rows); returns the row count."""
    from seqmix.io import read_json, write_rows

    if threads:
        torch.set_num_threads(threads)
    rows = []
    for d in run_dirs:
        if read_json(Path(d) / "metrics.json")["status"] == "ok":
            rows += measured_sparsity(d, spec)
    write_rows(out, rows, SparsityRow)
    return len(rows)
