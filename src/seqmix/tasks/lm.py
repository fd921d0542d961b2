"""What the language-model tasks (WikiText-2, MQAR) share: a causal LM at the run's size."""

from __future__ import annotations

from seqmix.models.lm import CausalLM, LMConfig
from seqmix.study.jobs import TrainJob


def causal_lm(spec: TrainJob, vocab_size: int, max_len: int, d_model: int, n_layers: int,
              d_ff_mult: float | None = None) -> CausalLM:
    m = spec.model
    return CausalLM(LMConfig(
        arch=spec.arch, vocab_size=vocab_size, max_len=max_len, d_model=d_model, n_layers=n_layers,
        d_ff_mult=m.d_ff_mult if d_ff_mult is None else d_ff_mult, dropout=m.dropout, block=m.block, tie_embeddings=m.tie_embeddings,
        positions=m.positions_for(spec.arch),
        mixer_options=dict(spec.mixer_options),
    ))
