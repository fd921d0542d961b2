"""Su's sparsity of attention rows (REFERENCE.md §6): S(x) = E[x] / sqrt(E[x²]) of a row of
non-negative scores. S = 1 for a constant row and 1/sqrt(n) for a one-hot row of length n;
smaller is more concentrated. Measured here on trained models, on held-out sequences, in
two ways (the ``kind`` column):

- ``attention``: the rows of ``mixer.scores(h)`` for mixers with a score matrix
  (``has_scores``), per layer and head.
- ``jacobian``: the rows of the effective attention a_{t,s} = ‖∂y_t/∂x_s‖_F of the layer's
  mixer (analysis/jacobian.py), for every mixer, so that attention-free mixers sit on the
  same axis. Not the attention matrix even for softmax; both kinds are reported for the
  mixers that have scores, softmax being the calibration.

Architectures with no run on the configured language-model task (non-causal-only mixers
such as Linformer, trained only as the SNLI encoder) are measured on their SNLI runs
(``fallback_task``), on held-out sentence pairs cropped to a common length so that no row
holds padding; the ``task`` column says which.

In both, h is the hidden state each block's mixer actually received (captured with a
forward pre-hook while the model reads the sequences), and S is taken over each row's
visible part (s ≤ t for causal mixers), rows with at least ``min_row_len`` visible keys.

``results/analysis/sparsity.csv`` (``python -m seqmix sparsity``), one row per
(run, kind, layer, head); columns:

    task, arch, seed   the trained run (seed = training seed)
    kind               attention | jacobian (see above)
    layer              block index, 0 = closest to the embedding
    head               head index for kind=attention; -1 for kind=jacobian (whole mixer)
    rows               number of rows (query positions × sequences) averaged
    min_row_len        shortest visible row kept (keys)
    S_mean, S_std, S_median   Su's S over those rows (dimensionless)
    S_onehot_mean      mean of 1/sqrt(row length) over the same rows: S of one-hot rows,
                       the most concentrated value possible
    row_len_mean       mean visible row length (keys)
    sequences          held-out sequences the rows come from
    seq_len            their length (tokens)
"""

from __future__ import annotations

from pathlib import Path

import torch

FIELDS = ["task", "arch", "seed", "kind", "layer", "head", "rows", "min_row_len",
          "S_mean", "S_std", "S_median", "S_onehot_mean", "row_len_mean", "sequences", "seq_len"]


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
        # Rows not computed (NaN, e.g. Jacobian rows left out) are left out of every statistic.
        finite = torch.isfinite(s)
        s = s[finite]
        n = row_len[keep].double().expand(B, -1).reshape(-1)[finite]
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


def heldout_sequences(task, spec: dict, split: str, num_sequences: int) -> torch.Tensor:
    """The first ``num_sequences`` input sequences of a held-out split: (N, L) token ids."""
    if spec["task"] == "wikitext2":
        return task.eval_blocks(split, None)[:num_sequences, :-1]
    if spec["task"] == "mqar":
        return task.split(split)[0][:num_sequences]
    raise ValueError(f"sparsity and geometry read language-model tasks (wikitext2, mqar), not {spec['task']!r}")


def heldout_pairs(task, split: str, num_sequences: int, seq_len: int) -> tuple[torch.Tensor, ...]:
    """(ids, segments, mask) of the first ``num_sequences`` held-out SNLI pairs whose
    [CLS] premise [SEP] hypothesis [SEP] row has at least ``seq_len`` tokens, cropped to
    ``seq_len``: no padding, so every row of the effective attention is over real tokens."""
    import numpy as np

    a = task.split(split)
    lengths = np.diff(a["premise_offsets"]) + np.diff(a["hypothesis_offsets"]) + 3
    pick = np.flatnonzero(lengths >= seq_len)[:num_sequences]
    if len(pick) == 0:
        raise ValueError(f"no held-out SNLI pair in split {split!r} has {seq_len} tokens; lower snli_seq_len")
    ids, seg, mask, _ = task.collate(split, pick, "cpu")
    return ids[:, :seq_len], seg[:, :seq_len], mask[:, :seq_len]


def model_sparsity(
    model: torch.nn.Module,
    seqs: torch.Tensor | tuple[torch.Tensor, ...],
    min_row_len: int = 16,
    jacobian_sequences: int = 2,
    chunk: int = 512,
    jacobian_positions: int | None = None,
) -> list[dict]:
    """Rows of sparsity.csv (without the run columns) for a model reading ``seqs``: (N, L)
    token ids for a language model, or the tuple of arguments of a pair classifier.

    kind=attention per layer and head for mixers with scores; kind=jacobian per layer for
    every mixer, on the first ``jacobian_sequences`` sequences (L·d vector-Jacobian
    products each; 0 skips them), at every kept query position or at
    ``jacobian_positions`` of them spread evenly over the sequence (each row exact; fewer
    rows only trade coverage for time).
    """
    from seqmix.analysis.jacobian import effective_attention

    model.eval()
    args = seqs if isinstance(seqs, tuple) else (seqs,)
    inputs = capture_mixer_inputs(model, lambda: model(*args))
    seq_len = args[0].shape[1]
    min_len = min(min_row_len, seq_len)
    common = {"min_row_len": min_len, "seq_len": seq_len}
    rows = []
    for layer, (block, h) in enumerate(zip(model.blocks, inputs)):
        mixer = block.mixer
        if type(mixer).has_scores:
            with torch.no_grad():
                scores = mixer.scores(h)
            for r in row_stats(scores, mixer.causal, min_len):
                rows.append({**common, "kind": "attention", "layer": layer, "sequences": len(h), **r})
        if jacobian_sequences > 0:
            h_jac = h[:jacobian_sequences]
            L = h_jac.shape[1]
            # Only the rows row_stats keeps: t + 1 ≥ min_len visible keys when causal.
            kept = list(range(min_len - 1, L)) if mixer.causal else list(range(L))
            if jacobian_positions is not None and jacobian_positions < len(kept):
                pick = torch.linspace(0, len(kept) - 1, jacobian_positions).round().long().unique()
                kept = [kept[i] for i in pick.tolist()]
            eff = effective_attention(mixer, h_jac, positions=kept, chunk=chunk)[:, None]  # (B, 1, L, L)
            for r in row_stats(eff, mixer.causal, min_len):
                rows.append({**common, "kind": "jacobian", "layer": layer, "sequences": len(h_jac),
                             **r, "head": -1})
    return rows


def measured_sparsity(
    run_dir: str | Path,
    split: str,
    num_sequences: int,
    min_row_len: int = 16,
    jacobian_sequences: int = 2,
    chunk: int = 512,
    jacobian_positions: int | None = None,
    snli_seq_len: int = 32,
) -> list[dict]:
    """sparsity.csv rows of one trained run on ``num_sequences`` held-out sequences (for an
    SNLI encoder: pairs cropped to ``snli_seq_len`` tokens)."""
    from seqmix.train.evaluate import load_run

    model, task, spec = load_run(run_dir)
    if spec["task"] == "snli":
        seqs = heldout_pairs(task, split, num_sequences, snli_seq_len)
    else:
        seqs = heldout_sequences(task, spec, split, num_sequences)
    run = {"task": spec["task"], "arch": spec["arch"], "seed": spec["seed"]}
    rows = model_sparsity(model, seqs, min_row_len, jacobian_sequences, chunk, jacobian_positions)
    return [{**run, **r} for r in rows]
