"""The catalogued mixers as tables: ``python -m seqmix mixers`` (each mixer's forms,
capabilities, block, options and parameters at one width) and the table of blocks in
docs/reference/blocks.md, generated from the catalogue (``python -m seqmix mixers --blocks``)."""

from __future__ import annotations

import dataclasses

from seqmix import catalogue


def blocks_markdown() -> str:
    """The table of blocks: each mixer's title, native block and why (catalogue.MIXERS)."""
    rows = [f"| {m.title} | {m.block} | {m.block_reason} |" for m in catalogue.MIXERS]
    return "\n".join(["| architecture | block | why |", "|---|---|---|", *rows]) + "\n"


def print_mixers(d_model: int, max_len: int, options: dict[str, dict]) -> None:
    """One line per mixer: parameters of one layer at ``d_model``, its flags, its options."""
    import torch

    from seqmix import mixers
    from seqmix.models.budget import count_params

    print(f"{'mixer':<16}{'params':>10}  {'causal':<7}{'non-causal':<11}{'scores':<7}{'step':<5}{'block':<15}options")
    for name in mixers.names():
        cls = mixers.mixer_class(name)
        with torch.device("meta"):
            m = mixers.build(name, d_model, causal=cls.supports_causal, max_len=max_len, **options.get(name, {}))
        shown = {f.name: getattr(m.options, f.name) for f in dataclasses.fields(m.options)}
        flags = ["yes" if flag else "-" for flag in (cls.supports_causal, cls.supports_noncausal, cls.has_scores, cls.has_step)]
        block = catalogue.mixer_entry(name).block
        print(f"{name:<16}{count_params(m):>10,}  {flags[0]:<7}{flags[1]:<11}{flags[2]:<7}{flags[3]:<5}{block:<15}{shown}")
    print(f"(one mixer layer at d_model={d_model}, max_len={max_len}; block norms and feed-forward not included)")
