"""Su's sparsity of attention rows (REFERENCE.md §6): S(x) = E[x] / sqrt(E[x²]) of a row of
non-negative scores. S = 1 for a constant row and 1/sqrt(n) for a one-hot row of length n;
smaller is more concentrated. Measured here on trained models' attention rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

FIELDS = ["task", "arch", "seed", "kind", "layer", "head", "rows", "min_row_len",
          "S_mean", "S_std", "S_median", "S_onehot_mean", "row_len_mean"]


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


def row_stats(scores: torch.Tensor, causal: bool, min_row_len: int) -> list[dict]:
    """Per head: S of each attention row of (B, H, L, L) scores, rows of at least
    ``min_row_len`` visible keys only (short causal rows are trivially concentrated)."""
    B, H, L, _ = scores.shape
    if causal:
        mask = torch.ones(L, L, dtype=torch.bool, device=scores.device).tril()
        row_len = torch.arange(1, L + 1, device=scores.device)
    else:
        mask = torch.ones(L, L, dtype=torch.bool, device=scores.device)
        row_len = torch.full((L,), L, device=scores.device)
    S = su_sparsity(scores.double(), mask=mask.expand_as(scores))  # (B, H, L)
    keep = row_len >= min_row_len
    out = []
    for h in range(H):
        s = S[:, h, keep].reshape(-1)
        s = s[torch.isfinite(s)]
        n = row_len[keep].double()
        out.append({
            "head": h, "rows": int(s.numel()), "S_mean": s.mean().item(), "S_std": s.std().item(),
            "S_median": s.median().item(), "S_onehot_mean": (1 / n.sqrt()).mean().item(),
            "row_len_mean": n.mean().item(),
        })
    return out


def capture_mixer_inputs(model: torch.nn.Module, run: callable) -> list[torch.Tensor]:
    """The input each block's mixer received while ``run()`` executed, in layer order."""
    inputs: list[torch.Tensor] = []
    hooks = [block.mixer.register_forward_pre_hook(lambda _m, args: inputs.append(args[0].detach()))
             for block in model.blocks]
    try:
        with torch.no_grad():
            run()
    finally:
        for h in hooks:
            h.remove()
    return inputs


def measured_sparsity(run_dir: str | Path, split: str, num_sequences: int, min_row_len: int = 16) -> list[dict]:
    """S of the trained model's attention rows, per layer and head, on held-out sequences."""
    from seqmix.train.evaluate import load_run

    model, task, spec = load_run(run_dir)
    mixer_cls = type(model.blocks[0].mixer)
    if not mixer_cls.has_scores:
        return []
    if spec["task"] == "wikitext2":
        seqs = task.eval_blocks(split, None)[:num_sequences, :-1]
    else:
        seqs = task.split(split)[0][:num_sequences]
    inputs = capture_mixer_inputs(model, lambda: model(seqs))
    rows = []
    for layer, (block, h) in enumerate(zip(model.blocks, inputs)):
        with torch.no_grad():
            scores = block.mixer.scores(h)
        for r in row_stats(scores, block.mixer.causal, min(min_row_len, seqs.shape[1])):
            rows.append({"task": spec["task"], "arch": spec["arch"], "seed": spec["seed"],
                         "kind": "attention", "layer": layer, "min_row_len": min_row_len, **r})
    return rows
