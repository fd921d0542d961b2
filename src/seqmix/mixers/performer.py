"""Performer / FAVOR+ (Choromanski et al., ICLR 2021, arXiv:2009.14794).

Softmax attention's kernel exp(qᵀk/√d) is estimated with positive orthogonal random
features, then the attention is linear attention with those features (see linear.py):

    q' = d^(-1/4) q,  k' = d^(-1/4) k             (data normaliser: q'ᵀk' = qᵀk/√d)
    x_i(u) = ω_iᵀu − ‖u‖²/2,  i = 1..m             (the log of the i-th feature)
    φ(u)_i = m^(-1/2) · (exp(x_i(u) − c) + eps)    (E[φ(q)ᵀφ(k)] ∝ exp(q'ᵀk') when eps = 0)
    out_t  = Σ_j φ(q_t)ᵀφ(k_j) v_j / Σ_j φ(q_t)ᵀφ(k_j)

ω_1..ω_m are rows of blocks of Haar-orthogonal matrices (QR of Gaussian matrices, signs
fixed) rescaled by chi-distributed norms (performer-pytorch ``scaling=0``); m =
int(d_head · ln d_head) by default. They are a buffer drawn from a seeded generator, redrawn
every ``redraw_interval`` training forward calls (0 = never).

The stabiliser c and eps = 1e-4 are the reference code's (``softmax_kernel``): c is a max of
the projections ω_iᵀu' taken before the exp so that nothing overflows, and eps keeps every
feature positive. For queries c is the row's own max (it cancels between numerator and
denominator up to eps). For keys the reference takes one max over all positions, which
lets the last key change the first query's output; here:

- non-causal: the reference's max over all positions and features (per batch and head);
- causal: the running max over the keys seen so far, M_t = max_{j≤t, i} ω_iᵀk'_j. Key j seen
  from query t is φ_t(k_j)_i = m^(-1/2)(exp(x_i(k_j) − M_t) + eps), the causal analogue of
  the reference's global max: exact (M_t is a common factor of every key a query sees,
  so it cancels up to eps), causal (M_t depends on the past only) and equal to the recurrent
  form, which rescales its state whenever M grows (as online softmax does).

Because of that rescaling the causal prefix sum is its own chunked function
(``causal_favor_attention``) instead of ``linear.causal_linear_attention`` (whose features
do not depend on the query position); the non-causal form shares ``linear``'s core. The
causal forward computes the features of q and k in one pass (``favor_features``) and the
numerator and denominator together; it writes no (L, m)-sized tensor beyond the features
and loops over no chunks (on a GPU each small op is a kernel launch).
``favor_attention_reference`` is the dense form both fast paths must equal.
The stabilisers are not detached (the reference detaches them): with eps > 0 they change
the output slightly, so detaching them would make the gradient inexact by O(eps).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch
import torch.nn.functional as F

from seqmix.kernels.linear_scan import linear_scan
from seqmix.mixers.base import HeadProjections, Mixer, linear_flops
from seqmix.mixers.linear import noncausal_linear_attention


@dataclasses.dataclass
class PerformerOptions:
    n_heads: int = 4
    bias: bool = True
    # m; None = int(d_head · ln d_head) (reference default)
    nb_features: int | None = dataclasses.field(default=None, metadata={"ge": 1})
    # training forward calls between redraws; 0 = never
    redraw_interval: int = dataclasses.field(default=1000, metadata={"ge": 0})
    feature_seed: int | None = None  # None = drawn from torch's global RNG (the run's seed)
    eps: float = 1e-4  # the reference's feature floor
    chunk_size: int = dataclasses.field(default=64, metadata={"ge": 1})  # C of the chunked causal form (a speed knob, not a model choice)


def sub_seed(seed: int, index: int) -> int:
    """A 32-bit seed for draw ``index`` of a stream seeded ``seed`` (numpy's SeedSequence
    mixes both; torch's CPU generator keeps only 32 bits, so ``seed + index·2³²`` would
    repeat the same draw)."""
    return int(np.random.SeedSequence([seed, index]).generate_state(1)[0])


def default_nb_features(d_head: int) -> int:
    """m = int(d · ln d) (performer-pytorch's default), at least 1."""
    return max(1, int(d_head * math.log(d_head)))


def gaussian_orthogonal_random_matrix(
    nb_rows: int, nb_columns: int, generator: torch.Generator, scaling: int = 0
) -> torch.Tensor:
    """(nb_rows, nb_columns) ω: stacked orthogonal blocks with chi-distributed row norms.

    Each block is Q of the QR of a Gaussian matrix, with the signs of R's diagonal folded
    into Q so that Q is Haar-distributed (the reference omits that fix). scaling=0 gives the
    rows the norms of Gaussian vectors (chi with nb_columns degrees of freedom), scaling=1
    the constant √nb_columns. Drawn on the CPU in float64.
    """
    blocks = []
    for start in range(0, nb_rows, nb_columns):
        g = torch.randn(nb_columns, nb_columns, generator=generator, dtype=torch.float64)
        q, r = torch.linalg.qr(g)
        q = q * torch.sign(torch.diagonal(r))[None, :]
        blocks.append(q.T[: nb_rows - start])  # rows of Qᵀ: orthonormal
    w = torch.cat(blocks)
    if scaling == 0:
        norms = torch.randn(nb_rows, nb_columns, generator=generator, dtype=torch.float64).norm(dim=1)
    elif scaling == 1:
        norms = torch.full((nb_rows,), math.sqrt(nb_columns), dtype=torch.float64)
    else:
        raise ValueError(f"scaling must be 0 (chi norms) or 1 (sqrt(d)), got {scaling}")
    return norms[:, None] * w


def favor_projections(u: torch.Tensor, omega: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For u: (..., L, d) and ω: (m, d): the projections ω_iᵀu' and the log-features
    x_i(u) = ω_iᵀu' − ‖u'‖²/2, with u' = d^(-1/4) u. Both (..., L, m)."""
    u = u * u.shape[-1] ** -0.25
    proj = u @ omega.T
    return proj, proj - 0.5 * (u * u).sum(-1, keepdim=True)


def query_features(q: torch.Tensor, omega: torch.Tensor, eps: float) -> torch.Tensor:
    """φ(q) with the reference's per-row stabiliser: (..., L, m)."""
    proj, logf = favor_projections(q, omega)
    c = proj.amax(dim=-1, keepdim=True)
    return omega.shape[0] ** -0.5 * (torch.exp(logf - c) + eps)


def favor_attention_reference(
    phi_q: torch.Tensor, k_logf: torch.Tensor, k_proj: torch.Tensor, v: torch.Tensor,
    causal: bool, eps: float,
) -> torch.Tensor:
    """Dense form: key features built for every (query, key) pair; O(L²·m), tests only.

    phi_q: (B, H, L, m) query features; k_logf, k_proj: (B, H, L, m) the keys' log-features
    and projections (``favor_projections``); v: (B, H, L, Dv).
    """
    ratio = k_logf.shape[-1] ** -0.5
    if causal:  # M_t = max over j ≤ t and i
        c = k_proj.amax(dim=-1).cummax(dim=-1).values[..., :, None, None]  # (B, H, L, 1, 1)
    else:  # one max over all keys (the reference)
        c = k_proj.amax(dim=(-1, -2))[..., None, None, None]
    phi_k = ratio * (torch.exp(k_logf[..., None, :, :] - c) + eps)  # (B, H, Lq, Lk, m)
    A = (phi_q[..., :, None, :] * phi_k).sum(-1)  # (B, H, L, L)
    if causal:
        A = A.tril()
    return (A @ v) / A.sum(-1, keepdim=True)


def favor_features(q: torch.Tensor, k: torch.Tensor, omega: torch.Tensor, eps: float):
    """The fast path's features of q and k at once: φ(q) up to its factor m^(-1/2) (which
    cancels between numerator and denominator), and the keys' k̂ = exp(x(k) − μ) ≤ 1 with
    μ = max_i ω_iᵀk' (``causal_favor_attention``'s inputs). q and k are stacked so that the
    projection, the maxima and the exp are one op each for both, and the shifts
    ‖u'‖²/2 + max are added to the small (…, 1) tensors, not to the (…, m) projections.
    q, k: (B, H, L, d); ω: (m, d) -> φ(q)·m^(1/2), k̂: (B, H, L, m); μ: (B, H, L)."""
    scale = q.shape[-1] ** -0.25
    u = torch.stack([q, k])  # (2, B, H, L, d)
    proj = u @ (omega * scale).T  # ω_iᵀu'
    top = proj.amax(dim=-1, keepdim=True)  # c (queries) and μ (keys)
    # + (−shift), not − shift: the backward of a broadcast subtraction negates the full-size
    # gradient before reducing it; unbind, not indexing, whose backward zero-fills per part.
    q_feats, k_hat = torch.exp(proj + -(top + 0.5 * scale**2 * u.square().sum(-1, keepdim=True))).unbind(0)
    return q_feats + eps, k_hat, top.unbind(0)[1][..., 0]


def key_features(k: torch.Tensor, omega: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """k̂ = exp(x(k) − μ) and μ of the keys alone (``favor_features``)."""
    k_proj, k_logf = favor_projections(k, omega)
    mu = k_proj.amax(dim=-1)
    return torch.exp(k_logf - mu[..., None]), mu


def causal_favor_attention(
    phi_q: torch.Tensor, k_hat: torch.Tensor, mu: torch.Tensor, v: torch.Tensor,
    eps: float, chunk_size: int = 64,
) -> torch.Tensor:
    """Causal FAVOR+ with the running-max key stabiliser, chunked: O(L) time and memory.

    phi_q: (B, H, L, m) query features (any positive factor common to all of them cancels);
    k_hat = exp(x(k) − μ) ≤ 1: (B, H, L, m) and μ: (B, H, L) (``key_features``); v: (B, H,
    L, Dv). Equals ``favor_attention_reference`` on the same queries and keys. With
    M_t = max_{j≤t} μ_j, key j seen from query t is m^(-1/2)(k̂_j e^{μ_j − M_t} + eps): every
    exponent is ≤ 0 (no overflow). Numerator and denominator are computed together, as the
    two parts of [v, 1]. Within a chunk the C × C weights are formed directly; the states of
    the earlier chunks, Σ k̂_j e^{μ_j − M} [v_j, 1]ᵀ with M = the running max at their chunk's
    end, are added up for every chunk at once by one product with the (N × N) matrix of
    rescalings e^{M_end(j) − M_end(n−1)} ≤ 1 (no loop over chunks), and rescaled to each
    query's own M_t. The eps part of the features adds eps·Σ_i φ(q_t)_i · (Σ_{j≤t} v_j, t+1):
    prefix sums.
    """
    B, H, L, _ = phi_q.shape
    v1 = F.pad(v, (0, 1), value=1.0)  # [v, 1]: numerator, denominator
    C = min(chunk_size, L)
    pad = (-L) % C
    if pad:  # padded keys get weight e^{-inf} = 0; the padded queries are dropped at the end
        phi_q, k_hat, v1 = (F.pad(t, (0, 0, 0, pad)) for t in (phi_q, k_hat, v1))
        mu = F.pad(mu, (0, pad), value=-math.inf)
    N = (L + pad) // C
    M = mu.cummax(dim=-1).values  # (B, H, L')
    q_c, k_c, v_c = (t.reshape(B, H, N, C, t.shape[-1]) for t in (phi_q, k_hat, v1))
    mu_c, M_c = mu.reshape(B, H, N, C), M.reshape(B, H, N, C)

    # Within a chunk: W_tj = (φq_t · k̂_j) e^{μ_j − M_t} for j ≤ t (exponent ≤ 0 there).
    decay = torch.exp((mu_c[..., None, :] - M_c[..., :, None]).masked_fill(_above(C, 0, v.device), -math.inf))
    out = ((q_c @ k_c.transpose(-1, -2)) * decay) @ v_c  # (B, H, N, C, Dv + 1)
    if N > 1:  # one chunk (L ≤ C) has no earlier state to read
        out = out + _earlier_chunks(q_c, k_c, v_c, mu_c, M_c)

    # The eps floor of every key feature: eps·Σ_i φ(q_t)_i times (Σ_{j≤t} v_j, t+1).
    out = torch.addcmul(out.reshape(B, H, N * C, -1), eps * phi_q.sum(-1, keepdim=True), v1.cumsum(dim=-2))
    # Drop the padded queries before dividing (their 0/0 would poison the gradient). The
    # common factor m^(-1/2) of the key features cancels.
    num, den = out[:, :, :L].split([v.shape[-1], 1], dim=-1)  # split: its backward is one cat
    return num / den


def _above(n: int, diagonal: int, device: torch.device) -> torch.Tensor:
    """(n, n) bool: True above the ``diagonal``-th diagonal (the entries a causal product masks)."""
    return torch.ones(n, n, dtype=torch.bool, device=device).triu(diagonal + 1)


def _chunk_states(k_c: torch.Tensor, v_c: torch.Tensor, mu_c: torch.Tensor, M_c: torch.Tensor):
    """The state entering every chunk of ``causal_favor_attention``, S_n = Σ k̂_j e^{μ_j − M} [v_j, 1]ᵀ
    over the keys of chunks < n, stabilised by M = the running max at the end of chunk n−1,
    and ``carry`` = e^{M_{n−1,end} − M_t} that rescales it to each query's own M_t (0 for
    chunk 0): (B, H, N, m, Dv + 1) and (B, H, N, C, 1).

    The chunks' own sums are carried across chunks without a Python step per chunk (each a
    few kernel launches on a GPU): while there are at most C chunks, by one product with the
    (N × N) matrix of rescalings e^{M_end(j) − M_end(n−1)} ≤ 1, j < n (N² ≤ N·C: no more work
    than the sums themselves); beyond, by ``linear_scan`` (linear in N)."""
    M_end = M_c[..., -1]  # (B, H, N)
    w_end = torch.exp(mu_c - M_end[..., None])  # (B, H, N, C), ≤ 1
    kv = k_c.transpose(-1, -2) @ (v_c * w_end[..., None])  # each chunk's own sum: (B, H, N, m, Dv + 1)
    M_prev = F.pad(M_end[..., :-1], (1, 0), value=-math.inf)
    N, C = mu_c.shape[-2:]
    if N <= C:  # [n, j]: j < n
        rescale = torch.exp((M_end[..., None, :] - M_prev[..., :, None]).masked_fill(_above(N, -1, kv.device), -math.inf))
        S = (rescale @ kv.flatten(-2)).view_as(kv)
    else:  # S_after(n) = e^{M_end(n−1) − M_end(n)} S_after(n−1) + kv_n; S_n = S_after(n−1)
        decay = torch.exp(M_prev - M_end)[..., None, None].expand_as(kv)  # 0 at n = 0
        after = linear_scan(decay.permute(2, 0, 1, 3, 4), kv.permute(2, 0, 1, 3, 4), C).permute(1, 2, 0, 3, 4)
        S = F.pad(after[:, :, :-1], (0, 0, 0, 0, 1, 0))
    carry = torch.exp(M_prev[..., None] - M_c)[..., None]  # (B, H, N, C, 1), 0 for chunk 0
    return S, carry


def _earlier_chunks(q_c, k_c, v_c, mu_c, M_c) -> torch.Tensor:
    """What the keys of the earlier chunks add to [numerator, denominator]: (B, H, N, C, Dv + 1)."""
    S, carry = _chunk_states(k_c, v_c, mu_c, M_c)
    return carry * (q_c @ S)


class Performer(HeadProjections, Mixer):
    Options = PerformerOptions
    has_scores = True
    has_step = True
    packable = ("its feature redraws follow a per-model seed and call count kept in Python (_seed, _calls), which one vectorised model cannot hold per member")

    def __init__(self, d_model: int, options: PerformerOptions, *, causal=True, max_len=None):
        super().__init__(d_model, options, causal=causal, max_len=max_len)
        self.init_projections(d_model, options.n_heads, options.bias)
        self.nb_features = options.nb_features or default_nb_features(self.d_head)
        seed = options.feature_seed
        if seed is None:  # follow the run's seed; every layer gets its own features
            seed = int(torch.randint(0, 2**31 - 1, (), device="cpu").item())
        # Buffers, so that a checkpoint restores the features and the redraw schedule.
        # Python copies (``_seed``, ``_calls``) spare a device sync per forward.
        self.register_buffer("feature_seed", torch.tensor(seed, dtype=torch.long))
        self.register_buffer("calls", torch.tensor(0, dtype=torch.long))
        self._seed, self._calls = seed, 0
        self.register_buffer("omega", self._draw(0))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self._seed, self._calls = int(self.feature_seed), int(self.calls)

    def _draw(self, index: int) -> torch.Tensor:
        """The index-th feature draw: a function of (seed, index) only, so redraws after a
        resume from a checkpoint are the ones an uninterrupted run would have made."""
        g = torch.Generator().manual_seed(sub_seed(self._seed, index))
        return gaussian_orthogonal_random_matrix(self.nb_features, self.d_head, g).float()

    @torch.no_grad()
    def redraw_features(self, index: int) -> None:
        self.omega.copy_(self._draw(index))

    def _favor_inputs(self, x: torch.Tensor):
        """φ(q), the keys' log-features and projections, and v: (B, H, L, ·) each."""
        q, k, v = self._heads(x)
        omega = self.omega.to(x.dtype)
        k_proj, k_logf = favor_projections(k, omega)
        return query_features(q, omega, self.options.eps), k_logf, k_proj, v

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        o = self.options
        if self.training and o.redraw_interval:  # performer-pytorch's feature_redraw_interval
            if self._calls and self._calls % o.redraw_interval == 0:
                self.redraw_features(self._calls // o.redraw_interval)
            self._calls += 1
            self.calls.fill_(self._calls)
        B, L, D = x.shape
        if self.causal:
            q, k, v = self._heads(x)
            phi_q, k_hat, mu = favor_features(q, k, self.omega.to(x.dtype), o.eps)
            y = causal_favor_attention(phi_q, k_hat, mu, v, o.eps, o.chunk_size)
        else:
            phi_q, k_logf, k_proj, v = self._favor_inputs(x)
            c = k_proj.amax(dim=(-1, -2), keepdim=True)
            phi_k = self.nb_features**-0.5 * (torch.exp(k_logf - c) + o.eps)
            y = noncausal_linear_attention(phi_q, phi_k, v, eps=0.0)  # the reference adds none
        return self.out_proj(y.transpose(1, 2).reshape(B, L, D))

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        """φ(q_t)ᵀφ_t(k_j), the weights the forward normalises; zero above the diagonal
        when causal: (B, H, L, L)."""
        phi_q, k_logf, k_proj, _ = self._favor_inputs(x)
        eps, ratio = self.options.eps, self.nb_features**-0.5
        mu = k_proj.amax(dim=-1)  # (B, H, L)
        k_hat = torch.exp(k_logf - mu[..., None])
        if self.causal:
            L = x.shape[1]
            M = mu.cummax(dim=-1).values
            mask = torch.ones(L, L, dtype=torch.bool, device=x.device).tril()
            decay = torch.exp((mu[..., None, :] - M[..., :, None]).masked_fill(~mask, -math.inf))
        else:
            decay = torch.exp(mu - mu.amax(dim=-1, keepdim=True))[..., None, :]
        A = ratio * ((phi_q @ k_hat.transpose(-1, -2)) * decay + eps * phi_q.sum(-1, keepdim=True))
        return A.tril() if self.causal else A

    # Recurrent form: S = Σ_j e^{x(k_j) − M} v_jᵀ, z = Σ_j e^{x(k_j) − M}, rescaled when the
    # running max M grows, plus Σ_j v_j and the count for the eps floor.
    def init_state(self, batch, device, dtype):
        H, m, Dh = self.n_heads, self.nb_features, self.d_head
        return {
            "S": torch.zeros(batch, H, m, Dh, device=device, dtype=dtype),
            "z": torch.zeros(batch, H, m, device=device, dtype=dtype),
            "v_sum": torch.zeros(batch, H, Dh, device=device, dtype=dtype),
            "count": 0,
            "M": torch.full((batch, H), -math.inf, device=device, dtype=dtype),
        }

    def step(self, x_t: torch.Tensor, state):
        if not self.causal:
            raise ValueError("step() needs a causal mixer")
        eps = self.options.eps
        phi_q, k_logf, k_proj, v = (t[:, :, 0] for t in self._favor_inputs(x_t[:, None, :]))
        M = torch.maximum(state["M"], k_proj.amax(dim=-1))  # (B, H)
        rescale = torch.exp(state["M"] - M)  # 0 at the first token (M was -inf)
        w = torch.exp(k_logf - M[..., None])  # (B, H, m), ≤ 1
        S = state["S"] * rescale[..., None, None] + w[..., :, None] * v[..., None, :]
        z = state["z"] * rescale[..., None] + w
        v_sum = state["v_sum"] + v
        count = state["count"] + 1
        qsum = phi_q.sum(-1, keepdim=True)
        num = (phi_q[..., None, :] @ S)[..., 0, :] + eps * qsum * v_sum
        den = (phi_q * z).sum(-1, keepdim=True) + eps * qsum * count
        y = (num / den).reshape(x_t.shape[0], self.d_model)
        return self.out_proj(y), {"S": S, "z": z, "v_sum": v_sum, "count": count, "M": M}

    def flops(self, seq_len: int) -> float:
        L, d, Dh, m = seq_len, self.d_model, self.d_head, self.nb_features
        proj = 4 * linear_flops(L, d, d)
        # Per head and token: the feature projections of q and k (2·m·Dh each), k vᵀ into
        # the state and q·S out of it (2·m·Dh each), the normaliser (2·m). The causal
        # chunked form adds the masked intra-chunk q kᵀ and W v (2·C·m and 2·C·Dh, about
        # half of it masked).
        per_token = 8.0 * m * Dh + 2.0 * m
        if self.causal:
            per_token += min(self.options.chunk_size, L) * (m + Dh)
        return proj + L * self.n_heads * per_token
