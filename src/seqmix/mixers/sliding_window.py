"""Sliding-window + global attention (Longformer, Beltagy et al. 2020, arXiv:2004.05150):
softmax attention restricted to a pattern P, w = ``window``, g = ``n_global``:

    causal:     j ∈ P(i)  ⇔  j ≤ i and (i − j < w  or  j < g  or  i < g)
    non-causal: j ∈ P(i)  ⇔  |i − j| ≤ w // 2  or  j < g  or  i < g

The global tokens are the first g positions. ``banded_attention`` computes it in
O(L·(w + g)) time and memory; ``sliding_window_reference`` is the dense masked softmax it
must equal.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

from seqmix.mixers.base import HeadProjections, Mixer, linear_flops


@dataclasses.dataclass
class SlidingWindowOptions:
    n_heads: int = 4
    bias: bool = True
    # w: keys per query in the causal window, itself included. 32 is a half and a quarter of
    # the 64- and 128-token contexts trained (Zhang 2025, arXiv:2512.19428, §4.1): sparse where
    # it matters, a useful neighbourhood still (Longformer's LM also starts from small windows).
    window: int = dataclasses.field(default=32, metadata={"ge": 1})
    # g: global tokens, the first positions; 1 is the smallest Longformer pattern (the LM's
    # first token is an anchor every query can read; SNLI's [CLS], Longformer's global token).
    n_global: int = dataclasses.field(default=1, metadata={"ge": 0})
    # Longformer's second set of projections, Q_g, K_g, V_g, for the global tokens' own rows;
    # every other row, its attention to the global keys included, uses Q, K, V.
    global_projections: bool = False


# Short sequences take the dense path: softmax attention through the fused SDPA kernel with
# the pattern as a boolean mask, exact like the banded path. On a CPU (one thread) the fused
# kernel gets through a (query, key) pair about 4× faster than the banded gather, so dense
# wins while L ≤ 4 × the keys a banded query reads (2w + g; at w = 32, g = 1 the crossover
# lies between L = 256 and 512).
DENSE_FACTOR = 4


def sliding_window_mask(L: int, window: int, n_global: int, causal: bool, device=None) -> torch.Tensor:
    """The pattern P as a dense (L, L) bool matrix, True where query i attends key j."""
    i = torch.arange(L, device=device)[:, None]
    j = torch.arange(L, device=device)[None, :]
    if causal:
        local = (i - j >= 0) & (i - j < window)
    else:
        local = (i - j).abs() <= window // 2
    glob = (j < n_global) | (i < n_global)
    return (local | glob) & (j <= i) if causal else local | glob


def sliding_window_reference(q, k, v, window: int, n_global: int, causal: bool) -> torch.Tensor:
    """Dense masked softmax over the pattern; q, k, v: (B, H, L, Dh). O(L²): tests only."""
    L = q.shape[-2]
    logits = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    mask = sliding_window_mask(L, window, n_global, causal, q.device)
    return torch.softmax(logits.masked_fill(~mask, -math.inf), dim=-1) @ v


def dense_rows(q_rows, k, v, causal: bool) -> torch.Tensor:
    """The rows of the first queries (q_rows: (B, H, g, Dh)) attending to every key, or to
    every earlier key when causal: (B, H, g, Dh)."""
    g, L = q_rows.shape[-2], k.shape[-2]
    logits = q_rows @ k.transpose(-1, -2) / math.sqrt(q_rows.shape[-1])
    if causal:
        mask = torch.arange(L, device=k.device)[None, :] <= torch.arange(g, device=k.device)[:, None]
        logits = logits.masked_fill(~mask, -math.inf)
    return torch.softmax(logits, dim=-1) @ v


def banded_attention(q, k, v, window: int, n_global: int, causal: bool) -> torch.Tensor:
    """The pattern of ``sliding_window_mask`` in O(L·(w + g)) time and memory.

    q, k, v: (B, H, L, Dh). Queries are cut into N chunks of C tokens, C = the window's reach
    (w − 1 causal, w // 2 non-causal, at least 1), so that chunk n's window lies in key chunks
    n−1..n (causal) or n−1..n+1; the global keys are a separate segment of the same softmax,
    and the local segment skips them so that no key counts twice.
    """
    B, H, L, Dh = q.shape
    g = min(n_global, L)
    reach = window - 1 if causal else window // 2
    C = max(reach, 1)
    n_side = 1 if causal else 2  # key chunks besides the query's own
    N = -(-L // C)
    pad_end = N * C - L + (0 if causal else C)
    # Keys padded with one chunk in front (chunk -1) and up to one behind (chunk N).
    k_pad = F.pad(k, (0, 0, C, pad_end))
    v_pad = F.pad(v, (0, 0, C, pad_end))
    width = (n_side + 1) * C
    k_win = k_pad.unfold(2, width, C).transpose(-1, -2)  # (B, H, N, width, Dh)
    v_win = v_pad.unfold(2, width, C).transpose(-1, -2)
    q_c = F.pad(q, (0, 0, 0, N * C - L)).reshape(B, H, N, C, Dh)

    qpos = torch.arange(N * C, device=q.device).reshape(N, C, 1)
    kpos = (torch.arange(N, device=q.device)[:, None] * C - C + torch.arange(width, device=q.device))[:, None, :]
    offset = qpos - kpos  # (N, C, width): i − j
    band = (offset >= 0) & (offset < window) if causal else offset.abs() <= window // 2
    local_mask = band & (kpos >= g) & (kpos < L)  # (N, C, width)
    global_mask = torch.ones(N, C, g, dtype=torch.bool, device=q.device)
    if causal:
        global_mask = torch.arange(g, device=q.device) <= qpos  # (N, C, g)
    mask = torch.cat([local_mask, global_mask.expand(N, C, g)], dim=-1)
    # Padded query rows (i ≥ L) may have no key left; let them see everything so that their
    # softmax stays finite (they are dropped, and a NaN there would poison the gradient).
    mask = mask | (qpos >= L)

    scale = 1.0 / math.sqrt(Dh)
    logits_local = (q_c @ k_win.transpose(-1, -2)) * scale  # (B, H, N, C, width)
    logits_global = (q_c @ k[:, :, None, :g].transpose(-1, -2)) * scale  # (B, H, N, C, g)
    logits = torch.cat([logits_local, logits_global], dim=-1).masked_fill(~mask, -math.inf)
    p = torch.softmax(logits, dim=-1)
    y = p[..., :width] @ v_win + p[..., width:] @ v[:, :, None, :g]  # (B, H, N, C, Dh)
    y = y.reshape(B, H, N * C, Dh)[:, :, :L]
    if g == 0:
        return y
    return torch.cat([dense_rows(q[:, :, :g], k, v, causal), y[:, :, g:]], dim=2)


def pattern_row_counts(L: int, window: int, n_global: int, causal: bool) -> torch.Tensor:
    """|P(i)| for every query i, in O(L) (the FLOP count uses it; a test holds it equal to
    the dense mask's row sums)."""
    i = torch.arange(L)
    g = min(n_global, L)
    if causal:
        local = torch.clamp(i + 1, max=window)
        extra = torch.clamp(i - window + 1, min=0).clamp(max=g)  # global keys before the window
        return torch.where(i < g, i + 1, local + extra)
    r = window // 2
    local = torch.clamp(i, max=r) + torch.clamp(L - 1 - i, max=r) + 1
    extra = torch.clamp(i - r, min=0).clamp(max=g)
    return torch.where(i < g, torch.full_like(i, L), local + extra)


class SlidingWindowAttention(HeadProjections, Mixer):
    Options = SlidingWindowOptions
    has_scores = True
    has_step = True

    def __init__(self, d_model: int, options: SlidingWindowOptions, *, causal=True, max_len=None):
        super().__init__(d_model, options, causal=causal, max_len=max_len)
        self.init_projections(d_model, options.n_heads, options.bias)
        self._masks: dict = {}
        if options.global_projections:
            self.q_global = nn.Linear(d_model, d_model, bias=options.bias)
            self.k_global = nn.Linear(d_model, d_model, bias=options.bias)
            self.v_global = nn.Linear(d_model, d_model, bias=options.bias)

    def _global_rows(self, x: torch.Tensor) -> torch.Tensor:
        """The g global tokens' rows with Q_g, K_g, V_g: (B, H, g, Dh)."""
        g = min(self.options.n_global, x.shape[1])
        q = self._split(self.q_global(x[:, :g]))
        return dense_rows(q, self._split(self.k_global(x)), self._split(self.v_global(x)), self.causal)

    def _merge(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        B, L, D = x.shape
        if self.options.global_projections and self.options.n_global:
            g = min(self.options.n_global, L)
            y = torch.cat([self._global_rows(x), y[:, :, g:]], dim=2)
        return self.out_proj(y.transpose(1, 2).reshape(B, L, D))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        o = self.options
        q, k, v = self._heads(x)
        L = x.shape[1]
        if L <= DENSE_FACTOR * (2 * o.window + o.n_global):
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=self._dense_mask(L, x.device, x))
        else:
            y = banded_attention(q, k, v, o.window, o.n_global, self.causal)
        return self._merge(y, x)

    def _dense_mask(self, L: int, device, like: torch.Tensor) -> torch.Tensor:
        o = self.options
        if isinstance(like, FakeTensor):  # cost counting: a cached real mask cannot mix with fake tensors
            return sliding_window_mask(L, o.window, o.n_global, self.causal, device)
        key = (L, str(device))
        if key not in self._masks:  # one (L, L) bool mask per length, shared by every batch
            o = self.options
            self._masks[key] = sliding_window_mask(L, o.window, o.n_global, self.causal, device)
        return self._masks[key]

    def forward_reference(self, x: torch.Tensor) -> torch.Tensor:
        """The same mixer through the dense masked softmax (tests compare the two)."""
        o = self.options
        q, k, v = self._heads(x)
        return self._merge(sliding_window_reference(q, k, v, o.window, o.n_global, self.causal), x)

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        """exp(q·k/√d_head − row max) on the pattern, zero outside it: (B, H, L, L)."""
        o = self.options
        L = x.shape[1]
        q, k, _ = self._heads(x)
        logits = q @ k.transpose(-1, -2) / math.sqrt(self.d_head)
        if o.global_projections and o.n_global:
            g = min(o.n_global, L)
            qg = self._split(self.q_global(x[:, :g]))
            logits_g = qg @ self._split(self.k_global(x)).transpose(-1, -2) / math.sqrt(self.d_head)
            logits = torch.cat([logits_g, logits[:, :, g:]], dim=2)
        mask = sliding_window_mask(L, o.window, o.n_global, self.causal, x.device)
        logits = logits.masked_fill(~mask, -math.inf)
        return torch.exp(logits - logits.amax(dim=-1, keepdim=True))

    # Recurrent form: the last w keys/values, the g global ones, and the position t.
    def init_state(self, batch, device, dtype):
        empty = torch.zeros(batch, self.n_heads, 0, self.d_head, device=device, dtype=dtype)
        return {"t": 0, "k_win": empty, "v_win": empty, "k_glob": empty, "v_glob": empty,
                "kg_glob": empty, "vg_glob": empty}

    def step(self, x_t: torch.Tensor, state):
        if not self.causal:
            raise ValueError("step() needs a causal mixer")
        o, t = self.options, state["t"]
        x1 = x_t[:, None, :]
        q, k, v = self._heads(x1)  # (B, H, 1, Dh)
        k_win = torch.cat([state["k_win"], k], dim=2)[:, :, -o.window :]
        v_win = torch.cat([state["v_win"], v], dim=2)[:, :, -o.window :]
        new = dict(state, t=t + 1, k_win=k_win, v_win=v_win)
        if t < o.n_global:  # a global token: keep its key/value for good
            new["k_glob"] = torch.cat([state["k_glob"], k], dim=2)
            new["v_glob"] = torch.cat([state["v_glob"], v], dim=2)
            if o.global_projections:
                new["kg_glob"] = torch.cat([state["kg_glob"], self._split(self.k_global(x1))], dim=2)
                new["vg_glob"] = torch.cat([state["vg_glob"], self._split(self.v_global(x1))], dim=2)
                q = self._split(self.q_global(x1))
                y = dense_rows(q, new["kg_glob"], new["vg_glob"], causal=False)
            else:  # its past is the global tokens 0..t
                y = dense_rows(q, new["k_glob"], new["v_glob"], causal=False)
        else:
            start = t - k_win.shape[2] + 1  # position of the window's first key
            n_before = max(0, min(o.n_global, start))  # global keys not in the window
            keys = torch.cat([state["k_glob"][:, :, :n_before], k_win], dim=2)
            values = torch.cat([state["v_glob"][:, :, :n_before], v_win], dim=2)
            y = dense_rows(q, keys, values, causal=False)
        y = y[:, :, 0].reshape(x_t.shape[0], self.d_model)
        return self.out_proj(y), new

    def flops(self, seq_len: int) -> float:
        o, L, d = self.options, seq_len, self.d_model
        pairs = float(pattern_row_counts(L, o.window, o.n_global, self.causal).sum())
        proj = 4 * linear_flops(L, d, d)
        if o.global_projections and o.n_global:
            g = min(o.n_global, L)
            proj += linear_flops(g, d, d) + 2 * linear_flops(L, d, d)
        return proj + 4.0 * d * pairs  # q·k and p·v: 2·Dh each per pair and head
