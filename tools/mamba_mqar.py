"""Why Mamba does not learn the default MQAR cell: an independent minimal Mamba beside
seqmix's, trained on the same cell, batches and steps (docs/investigations/mamba-mqar.md has the results).

The independent model is written from the paper alone (Gu & Dao 2023, arXiv:2312.00752):
the selective SSM of §3.2 and Algorithm 2 (B, C and Δ functions of the input, Δ through a
softplus, A diagonal and real), discretised as in §2 (Ā = exp(ΔA); B̄ = ΔB, the simplification
of the zero-order hold the paper's §3.5 / its footnote uses for B, or the exact zero-order
hold with ``--zoh``), run as a plain sequential scan, one PyTorch step per token; the Mamba
block of Figure 3 (an expanding projection, a causal depthwise convolution, SiLU, the SSM,
the SiLU gate, a projection back); and a language model of residual blocks x + Block(RMSNorm(x)),
a final RMSNorm and a head tied to the embedding (§4.2's LM). Its initialisation is its
own: PyTorch's default for every projection, embedding N(0, 0.02), A = -(1..N) (S4D-real,
§3.6), Δ's bias so that softplus(bias) ~ LogUniform[1e-3, 1e-1] (§3.6), D = 1. Nothing of
seqmix's model code is imported; the data, its batches and the evaluation's definition are
seqmix's, so that the two models see the same sequences in the same order.

    python tools/mamba_mqar.py --data data/mqar/V64-L48-kv8 --model independent --out ind.csv
    python tools/mamba_mqar.py --data ... --model seqmix --steps 12000 --no-early-stop --out long.csv

``--model seqmix`` trains this project's CausalLM with its Mamba mixer and block
(seqmix.models.lm) in this script's loop; ``--model independent`` the model below. The loop
is the quick profile's MQAR recipe (AdamW, betas 0.9 / 0.95, weight decay 0.1 on matrices,
warm-up 100 steps, cosine to 0.1x at the step cap, gradient clipping at 1, batch 128,
evaluation every 100 steps on the whole validation split) without the plateau rule; it
prints one row per evaluation and writes them to ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

# ------------------------------------------------------------------------------------------
# The independent Mamba.
# ------------------------------------------------------------------------------------------


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


class RMSNorm(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return rms_norm(x, self.weight)


def selective_scan(x, delta, A, B, C, D, zoh: bool = False):
    """Algorithm 2's SSM, one step per token. x, Δ: (b, L, E); A: (E, N); B, C: (b, L, N);
    D: (E,). h_t = Ā_t h_{t-1} + B̄_t x_t, y_t = C_t h_t + D x_t, with Ā = exp(ΔA) and
    B̄ = ΔB, or with ``zoh`` B̄ = (ΔA)⁻¹(exp(ΔA) − 1)ΔB (diagonal A: elementwise)."""
    dA = delta[..., None] * A  # (b, L, E, N)
    A_bar = torch.exp(dA)
    scale = delta[..., None] if not zoh else torch.expm1(dA) / A  # (ΔA)⁻¹(e^{ΔA} − 1)Δ = (e^{ΔA} − 1)/A
    Bx = scale * B[:, :, None, :] * x[..., None]  # (b, L, E, N)
    h = x.new_zeros(x.shape[0], A.shape[0], A.shape[1])
    ys = []
    # unbind, not indexing: the backward of L slices would write L full-size gradients
    for a_t, b_t, c_t in zip(A_bar.unbind(1), Bx.unbind(1), C.unbind(1)):
        h = a_t * h + b_t
        ys.append(torch.einsum("ben,bn->be", h, c_t))
    return torch.stack(ys, dim=1) + D * x


class MambaBlockIndependent(nn.Module):
    """Figure 3's block: in_proj to 2E, causal depthwise conv (kernel 4) + SiLU on one half,
    the selective SSM, times SiLU of the other half, out_proj back to d."""

    def __init__(self, d: int, d_state: int = 16, expand: int = 2, d_conv: int = 4, dt_rank: int | None = None,
                 zoh: bool = False):
        super().__init__()
        E = expand * d
        self.E, self.N, self.zoh = E, d_state, zoh
        self.R = dt_rank or math.ceil(d / 16)  # Δ's projection rank (§3.6: low-rank s_Δ)
        self.in_proj = nn.Linear(d, 2 * E, bias=False)
        self.conv = nn.Conv1d(E, E, d_conv, groups=E, padding=d_conv - 1)
        self.x_proj = nn.Linear(E, self.R + 2 * d_state, bias=False)  # s_Δ (rank R), s_B, s_C
        self.dt_proj = nn.Linear(self.R, E)  # Broadcast to E, plus Δ's parameter (the bias)
        self.A_log = nn.Parameter(torch.log(torch.arange(1, d_state + 1, dtype=torch.float32)).repeat(E, 1))
        self.D = nn.Parameter(torch.ones(E))
        self.out_proj = nn.Linear(E, d, bias=False)
        with torch.no_grad():  # softplus(bias) ~ LogUniform[1e-3, 1e-1]: bias = softplus⁻¹(Δ₀)
            dt = torch.exp(torch.rand(E) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
            self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))

    def forward(self, u):
        L = u.shape[1]
        x, z = self.in_proj(u).chunk(2, dim=-1)
        x = F.silu(self.conv(x.transpose(1, 2))[..., :L].transpose(1, 2))
        dt, B, C = self.x_proj(x).split([self.R, self.N, self.N], dim=-1)
        delta = F.softplus(self.dt_proj(dt))
        y = selective_scan(x, delta, -torch.exp(self.A_log), B, C, self.D, self.zoh)
        return self.out_proj(y * F.silu(z))


class MambaLMIndependent(nn.Module):
    def __init__(self, vocab: int, d: int, n_layers: int = 2, **block):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        nn.init.normal_(self.emb.weight, std=0.02)
        self.norms = nn.ModuleList(RMSNorm(d) for _ in range(n_layers))
        self.layers = nn.ModuleList(MambaBlockIndependent(d, **block) for _ in range(n_layers))
        self.norm_f = RMSNorm(d)

    def forward(self, idx):
        h = self.emb(idx)
        for norm, layer in zip(self.norms, self.layers):
            h = h + layer(norm(h))
        return self.norm_f(h) @ self.emb.weight.t()  # head tied to the embedding

    def no_weight_decay(self) -> set[str]:
        return {n for n, _ in self.named_parameters() if n.endswith(("A_log", ".D"))}

    def names(self) -> dict[str, str]:
        """{name here: name in a seqmix CausalLM with Mamba blocks} of every weight."""
        names = {"emb.weight": "tok_emb.weight", "norm_f.weight": "norm_f.weight"}
        for i in range(len(self.layers)):
            names[f"norms.{i}.weight"] = f"blocks.{i}.norm1.weight"
            for name in ("in_proj.weight", "x_proj.weight", "dt_proj.weight", "dt_proj.bias", "A_log", "D",
                         "out_proj.weight"):
                names[f"layers.{i}.{name}"] = f"blocks.{i}.mixer.{name}"
            for name in ("weight", "bias"):
                names[f"layers.{i}.conv.{name}"] = f"blocks.{i}.mixer.conv1d.{name}"
        return names

    def load_seqmix(self, state: dict) -> None:
        """Take the weights of a seqmix CausalLM with Mamba blocks: how
        tests/tools/test_mamba_independent.py holds the two models' outputs equal."""
        self.load_state_dict({mine: state[theirs] for mine, theirs in self.names().items()})

    def seqmix_state(self) -> dict:
        """These weights under seqmix's names (``--through-seqmix``)."""
        state = self.state_dict()
        out = {theirs: state[mine] for mine, theirs in self.names().items()}
        out["head.weight"] = out["tok_emb.weight"]  # tied
        return out


# ------------------------------------------------------------------------------------------
# The models and the loop.
# ------------------------------------------------------------------------------------------


def build(kind: str, vocab: int, seq_len: int, d: int, d_state: int, zoh: bool, seed: int,
          through_seqmix: bool = False) -> nn.Module:
    """The model to train. ``through_seqmix``: the independent model's initial weights in
    seqmix's model, which computes the same function (tests/tools/test_mamba_independent.py) with
    its fused scan, ~10x faster than the sequential one here: the independent
    initialisation and this loop at seqmix's speed."""
    torch.manual_seed(seed)
    if kind == "independent" and not through_seqmix:
        return MambaLMIndependent(vocab, d, d_state=d_state, zoh=zoh)
    from seqmix.models.lm import CausalLM, LMConfig

    independent = MambaLMIndependent(vocab, d, d_state=d_state) if kind == "independent" else None
    model = CausalLM(LMConfig(arch="mamba", vocab_size=vocab, max_len=seq_len, d_model=d, n_layers=2, d_ff_mult=0.0,
                              dropout=0.0, block="pre_rms", positions="none", mixer_options={"d_state": d_state}))
    if independent is not None:
        model.load_state_dict(independent.seqmix_state())
    return model


def zoology_init(model: nn.Module, n_layers: int = 2) -> None:
    """The initialisation Zoology's MQAR models train from (Arora et al. 2024; zoology/model.py
    ``_init_weights``, which its LanguageModel applies to every module, the Mamba mixer's own
    projections included): every nn.Linear N(0, 0.02) with a zero bias, so Δ's bias is 0
    (softplus(0) = 0.69, where mamba_ssm draws Δ from [0.001, 0.1]); embeddings N(0, 0.02);
    out_proj N(0, 0.02 / √(2 n_layers)). A, D and the convolution keep mamba_ssm's init."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, std=0.02)
        for name, p in model.named_parameters():
            if name.endswith("out_proj.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * n_layers))


def logits_of(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x)


def optimizer(model: nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW, decaying the matrices only (the recipe's rule: dim >= 2, not A_log or D)."""
    skip = set()
    for prefix, module in model.named_modules():
        if hasattr(module, "no_weight_decay"):
            skip |= {f"{prefix}.{n}" if prefix else n for n in module.no_weight_decay()}
    params = dict(model.named_parameters())
    decay = [p for n, p in params.items() if p.dim() >= 2 and n not in skip]
    other = [p for n, p in params.items() if not (p.dim() >= 2 and n not in skip)]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay}, {"params": other, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95))


def schedule(step: int, lr: float, warmup: int, total: int, floor: float = 0.1) -> float:
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def batch(train: tuple[torch.Tensor, torch.Tensor], seed: int, step: int, size: int):
    """The batch seqmix's MQAR task draws at this step for this seed (the same sequences)."""
    from seqmix.tasks.base import batch_generator

    idx = torch.randint(0, len(train[0]), (size,), generator=batch_generator(seed, step))
    return train[0][idx], train[1][idx]


def loss_of(model, x, y) -> torch.Tensor:
    logits = logits_of(model, x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=-100)


@torch.no_grad()
def evaluate(model, split: tuple[torch.Tensor, torch.Tensor], size: int = 128) -> tuple[float, float]:
    """(loss, accuracy) at the query positions of the whole split."""
    model.eval()
    total, correct, count = 0.0, 0, 0
    for i in range(0, len(split[0]), size):
        x, y = split[0][i:i + size], split[1][i:i + size]
        mask = y != -100
        logits = logits_of(model, x)[mask]
        total += F.cross_entropy(logits, y[mask], reduction="sum").item()
        correct += int((logits.argmax(-1) == y[mask]).sum())
        count += int(mask.sum())
    model.train()
    return total / count, correct / count


def load(data: Path, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    z = np.load(data / f"{split}.npz")
    return torch.from_numpy(z["inputs"]), torch.from_numpy(z["labels"])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, required=True, help="a prepared MQAR data directory (python -m seqmix data)")
    p.add_argument("--model", choices=("independent", "seqmix"), required=True)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--d-state", type=int, default=16)
    p.add_argument("--zoh", action="store_true", help="the independent model's B̄ by the exact zero-order hold")
    p.add_argument("--zoology-init", action="store_true",
                   help="seqmix's model with the initialisation Zoology trains from (zoology_init)")
    p.add_argument("--through-seqmix", action="store_true",
                   help="train the independent model's initial weights in seqmix's model (the same function, faster)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=4000, help="the step cap (the cosine ends there)")
    p.add_argument("--stop-at", type=int, default=None, help="stop at this step of that schedule (default: the cap)")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--no-early-stop", action="store_true", help="train to the cap even after 0.99 accuracy")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, required=True, help="CSV of the evaluations")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    made = json.loads((a.data / "manifest.json").read_text())["generator"]
    vocab, seq_len = made["vocab_size"], made["seq_len"]
    train, valid = load(a.data, "train"), load(a.data, "validation")
    if a.through_seqmix and (a.model != "independent" or a.zoh):
        p.error("--through-seqmix takes --model independent without --zoh (seqmix's scan uses B̄ = ΔB)")
    model = build(a.model, vocab, seq_len, a.d_model, a.d_state, a.zoh, a.seed, a.through_seqmix)
    if a.zoology_init:
        if a.model != "seqmix":
            p.error("--zoology-init takes --model seqmix")
        zoology_init(model)
    opt = optimizer(model, a.lr, a.weight_decay)
    rows, started, window = [], time.time(), []
    with open(a.out, "w", newline="") as f:
        out = csv.DictWriter(f, ["model", "init", "d_model", "d_state", "lr", "seed", "step", "train_loss", "val_loss",
                                 "val_accuracy", "grad_norm", "elapsed_s"])
        out.writeheader()
        for step in range(a.stop_at or a.steps):
            for g in opt.param_groups:
                g["lr"] = schedule(step, a.lr, 100, a.steps)
            x, y = batch(train, a.seed, step, a.batch_size)
            loss = loss_of(model, x, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
            opt.step()
            window = (window + [loss.item()])[-a.eval_every:]
            if (step + 1) % a.eval_every == 0:
                val_loss, acc = evaluate(model, valid)
                row = {"model": "seqmix" if a.through_seqmix else a.model, "init": "zoology" if a.zoology_init else a.model, "d_model": a.d_model, "d_state": a.d_state, "lr": a.lr, "seed": a.seed,
                       "step": step + 1, "train_loss": round(sum(window) / len(window), 4), "val_loss": round(val_loss, 4),
                       "val_accuracy": round(acc, 4), "grad_norm": round(norm, 3),
                       "elapsed_s": round(time.time() - started, 1)}
                out.writerow(row)
                f.flush()
                rows.append(row)
                print(" ".join(f"{k} {v}" for k, v in row.items()), file=sys.stderr, flush=True)
                if acc >= 0.99 and not a.no_early_stop:
                    break
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
