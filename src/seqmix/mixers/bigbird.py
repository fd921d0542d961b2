"""BigBird block-sparse attention: window + global + random (Zaheer et al. 2020,
arXiv:2007.14062). The sequence is cut into blocks of b tokens; query block β attends, with
one softmax over the union, to the first g blocks (global), to blocks β−1, β, β+1 (window;
causal: β−1, β, with the token mask j ≤ i on top) and to r random blocks that are neither
(causal: only earlier ones); the global blocks' own queries attend to every key. The random
blocks of β are a function of (seed, β) only, so a block's causal pattern does not depend on
the sequence length. ``block_sparse_attention`` is the fast path; ``bigbird_reference``, the
dense masked softmax over ``bigbird_mask``, is what it must equal.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch
import torch.nn.functional as F

from seqmix.mixers.base import HeadProjections, Mixer, linear_flops


@dataclasses.dataclass
class BigBirdOptions:
    n_heads: int = 4
    bias: bool = True
    # b = 8, not the reference's 64: a query sees about g + 2 + r = 6 blocks, so b = 64 would be
    # dense at every L ≤ 384, i.e. at every length trained here; b = 8 is sparse from L = 64.
    block_size: int = dataclasses.field(default=8, metadata={"ge": 1})
    n_random: int = dataclasses.field(default=3, metadata={"ge": 0})  # r random key blocks per query block (reference 3)
    # g: the first block(s) are global in both variants (ITC's are the first and the last; a
    # causal model cannot have a global last block, and one rule keeps LM and encoder alike).
    n_global_blocks: int = dataclasses.field(default=1, metadata={"ge": 0})
    seed: int | None = None  # random-block seed; None = drawn from torch's global RNG


# Short sequences take the dense path: softmax attention through the fused SDPA kernel with
# the pattern as a boolean mask, exact like the gathered path. On a CPU (one thread) the
# fused kernel gets through a (query, key) pair about 4× faster than the gather, so dense
# wins while L ≤ 4 × the keys a gathered query block reads (K·b; at b = 8, r = 3, g = 1 the
# crossover lies between L = 128 and 512).
DENSE_FACTOR = 4


def sub_seed(seed: int, index: int) -> int:
    """A 32-bit seed for draw ``index`` of a stream seeded ``seed`` (numpy's SeedSequence
    mixes both; torch's CPU generator keeps only 32 bits, so ``seed + index·2³²`` would
    repeat the same draw)."""
    return int(np.random.SeedSequence([seed, index]).generate_state(1)[0])


def key_block_table(
    n_blocks: int, n_global: int, n_random: int, causal: bool, seed: int
) -> torch.Tensor:
    """(N, K) int64: the key blocks each query block attends to, -1 padded, no repeats.

    Order: global, window, random. Rows of global query blocks are listed too (they are
    replaced by dense rows). In the causal variant row β depends on (seed, β) only.
    """
    width = n_global + (2 if causal else 3) + n_random
    table = torch.full((n_blocks, width), -1, dtype=torch.long)
    for beta in range(n_blocks):
        window = [c for c in (beta - 1, beta, beta + 1) if 0 <= c < n_blocks and (c <= beta or not causal)]
        glob = [c for c in range(min(n_global, n_blocks)) if (c <= beta or not causal)]
        taken = set(window) | set(glob)
        limit = beta - 1 if causal else n_blocks
        candidates = [c for c in range(n_global, limit) if c not in taken]
        g = torch.Generator().manual_seed(sub_seed(seed, beta))
        pick = torch.randperm(len(candidates), generator=g)[:n_random].tolist()
        row = glob + [c for c in window if c not in glob] + sorted(candidates[p] for p in pick)
        table[beta, : len(row)] = torch.tensor(row, dtype=torch.long)
    return table


def bigbird_mask(L: int, block_size: int, table: torch.Tensor, n_global: int, causal: bool) -> torch.Tensor:
    """The pattern as a dense (L, L) bool matrix, from a key-block table of ⌈L/b⌉ rows."""
    N = table.shape[0]
    blocks = torch.zeros(N, N, dtype=torch.bool)
    rows = torch.arange(N)[:, None].expand_as(table)
    valid = table >= 0
    blocks[rows[valid], table[valid]] = True
    blocks[: min(n_global, N)] = True  # global query blocks see everything
    mask = blocks.repeat_interleave(block_size, 0).repeat_interleave(block_size, 1)[:L, :L]
    return mask.tril() if causal else mask


def bigbird_reference(q, k, v, mask: torch.Tensor) -> torch.Tensor:
    """Dense masked softmax; q, k, v: (B, H, L, Dh), mask (L, L). O(L²): tests only."""
    logits = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    return torch.softmax(logits.masked_fill(~mask.to(q.device), -math.inf), dim=-1) @ v


def block_sparse_attention(
    q, k, v, block_size: int, table: torch.Tensor, n_global: int, causal: bool
) -> torch.Tensor:
    """The pattern of ``bigbird_mask`` with gathered key blocks: O(L·K·b) time and memory.

    q, k, v: (B, H, L, Dh); table: (N, K) from ``key_block_table`` with N = ⌈L/b⌉.
    """
    B, H, L, Dh = q.shape
    bs, (N, K) = block_size, table.shape
    table = table.to(q.device)
    pad = N * bs - L
    q_b, k_b, v_b = (F.pad(t, (0, 0, 0, pad)).reshape(B, H, N, bs, Dh) for t in (q, k, v))
    idx = table.clamp(min=0)
    k_g = k_b[:, :, idx].reshape(B, H, N, K * bs, Dh)  # (B, H, N, K·b, Dh)
    v_g = v_b[:, :, idx].reshape(B, H, N, K * bs, Dh)

    qpos = torch.arange(N * bs, device=q.device).reshape(N, bs, 1)
    kpos = (idx[:, :, None] * bs + torch.arange(bs, device=q.device)).reshape(N, 1, K * bs)
    valid = (table >= 0).repeat_interleave(bs, dim=1)[:, None, :]  # (N, 1, K·b)
    mask = valid & (kpos < L)
    if causal:
        mask = mask & (kpos <= qpos)
    mask = mask | (qpos >= L)  # padded query rows: keep their softmax finite (dropped below)

    logits = (q_b @ k_g.transpose(-1, -2)) / math.sqrt(Dh)  # (B, H, N, b, K·b)
    p = torch.softmax(logits.masked_fill(~mask, -math.inf), dim=-1)
    y = (p @ v_g).reshape(B, H, N * bs, Dh)[:, :, :L]
    n_rows = min(n_global * bs, L)
    if n_rows == 0:
        return y
    # Global query blocks: dense rows over every key (every earlier key when causal).
    logits = q[:, :, :n_rows] @ k.transpose(-1, -2) / math.sqrt(Dh)  # (B, H, g·b, L)
    if causal:
        rows = torch.ones(n_rows, L, dtype=torch.bool, device=q.device).tril()
        logits = logits.masked_fill(~rows, -math.inf)
    return torch.cat([torch.softmax(logits, dim=-1) @ v, y[:, :, n_rows:]], dim=2)


class BigBirdAttention(HeadProjections, Mixer):
    Options = BigBirdOptions
    has_scores = True
    has_step = True
    packable = ("its random blocks are drawn from a per-model seed kept in Python (_seed), which one vectorised model cannot hold per member")

    def __init__(self, d_model: int, options: BigBirdOptions, *, causal=True, max_len=None):
        super().__init__(d_model, options, causal=causal, max_len=max_len)
        self.init_projections(d_model, options.n_heads, options.bias)
        seed = options.seed
        if seed is None:  # follow the run's seed; every layer gets its own pattern
            seed = int(torch.randint(0, 2**31 - 1, (), device="cpu").item())
        self.register_buffer("pattern_seed", torch.tensor(seed, dtype=torch.long))
        self._seed = seed
        self._tables: dict[int, torch.Tensor] = {}
        self._masks: dict[int, torch.Tensor] = {}

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self._seed = int(self.pattern_seed)  # a checkpoint brings its own random blocks
        self._tables.clear()
        self._masks.clear()

    def table(self, L: int) -> torch.Tensor:
        """The key-block table for a sequence of L tokens (cached per block count)."""
        N = -(-L // self.options.block_size)
        if N not in self._tables:
            o = self.options
            self._tables[N] = key_block_table(N, o.n_global_blocks, o.n_random, self.causal, self._seed)
        return self._tables[N]

    def mask(self, L: int) -> torch.Tensor:
        """The dense (L, L) pattern (cached per length)."""
        if L not in self._masks:
            o = self.options
            self._masks[L] = bigbird_mask(L, o.block_size, self.table(L), o.n_global_blocks, self.causal)
        return self._masks[L]

    def _out(self, y: torch.Tensor) -> torch.Tensor:
        B, H, L, Dh = y.shape
        return self.out_proj(y.transpose(1, 2).reshape(B, L, H * Dh))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        o = self.options
        q, k, v = self._heads(x)
        L = x.shape[1]
        table = self.table(L)
        if L <= DENSE_FACTOR * table.shape[1] * o.block_size:
            mask = self.mask(L).to(x.device)
            return self._out(F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
        return self._out(block_sparse_attention(q, k, v, o.block_size, table, o.n_global_blocks, self.causal))

    def forward_reference(self, x: torch.Tensor) -> torch.Tensor:
        """The same mixer through the dense masked softmax (tests compare the two)."""
        q, k, v = self._heads(x)
        return self._out(bigbird_reference(q, k, v, self.mask(x.shape[1])))

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        """exp(q·k/√d_head − row max) on the pattern, zero outside it: (B, H, L, L)."""
        q, k, _ = self._heads(x)
        logits = q @ k.transpose(-1, -2) / math.sqrt(self.d_head)
        logits = logits.masked_fill(~self.mask(x.shape[1]).to(x.device), -math.inf)
        return torch.exp(logits - logits.amax(dim=-1, keepdim=True))

    # Recurrent form: a key/value cache (random blocks reach back anywhere) and the row of
    # the pattern for the new query, read from the causal table.
    def init_state(self, batch, device, dtype):
        empty = torch.zeros(batch, self.n_heads, 0, self.d_head, device=device, dtype=dtype)
        return (empty, empty.clone())

    def step(self, x_t: torch.Tensor, state):
        if not self.causal:
            raise ValueError("step() needs a causal mixer")
        o = self.options
        k_cache, v_cache = state
        q, k, v = self._heads(x_t[:, None, :])  # (B, H, 1, Dh)
        k_cache = torch.cat([k_cache, k], dim=2)
        v_cache = torch.cat([v_cache, v], dim=2)
        t = k_cache.shape[2] - 1
        beta = t // o.block_size
        if beta < o.n_global_blocks:
            allowed = torch.ones(t + 1, dtype=torch.bool)
        else:
            row = self.table(t + 1)[beta]
            allowed = torch.isin(torch.arange(t + 1) // o.block_size, row[row >= 0])
        logits = q @ k_cache.transpose(-1, -2) / math.sqrt(self.d_head)  # (B, H, 1, t+1)
        logits = logits.masked_fill(~allowed.to(x_t.device), -math.inf)
        y = torch.softmax(logits, dim=-1) @ v_cache
        return self._out(y)[:, 0], (k_cache, v_cache)

    def pattern_pairs(self, L: int) -> int:
        """Number of (query, key) pairs of the pattern, from the block table in O(L/b · K)."""
        o, bs = self.options, self.options.block_size
        table = self.table(L)
        size = lambda c: min(bs, L - c * bs)  # noqa: E731  tokens in block c
        pairs = 0
        for beta in range(table.shape[0]):
            n_q = size(beta)
            if beta < o.n_global_blocks:
                start = beta * bs  # query i sees i + 1 keys (causal) or L
                pairs += n_q * (2 * start + n_q + 1) // 2 if self.causal else n_q * L
                continue
            for c in table[beta].tolist():
                if c < 0:
                    continue
                if self.causal and c == beta:
                    pairs += n_q * (n_q + 1) // 2
                else:
                    pairs += n_q * size(c)
        return pairs

    def flops(self, seq_len: int) -> float:
        proj = 4 * linear_flops(seq_len, self.d_model, self.d_model)
        return proj + 4.0 * self.d_model * self.pattern_pairs(seq_len)
