"""The throughput notebook's numbers: the setting the benchmark ran in and the throughput
table, from ``throughput.csv`` (seqmix/analysis/throughput.py)."""

from __future__ import annotations

import pandas as pd

from seqmix.report.latex import escape, table
from seqmix.report.style import arch_title, ordered


def setting(tp: pd.DataFrame) -> str:
    """Where and at which model size the benchmark ran, as LaTeX prose (the table's caption)."""
    first = tp.iloc[0]
    threads = int(first.threads)
    return (f"{escape(first.device_name)}, {threads} thread{'s' if threads > 1 else ''}; "
            f"$d={int(first.d_model)}$, {int(first.n_layers)} layers, "
            + (f"GELU MLP of {first.d_ff_mult:g}$d$" if first.d_ff_mult else "no feed-forward")
            + f", vocabulary {int(first.vocab_size):,}")


def throughput_table(tp: pd.DataFrame) -> str:
    """tab:throughput: tokens/s and the ratio to softmax of each mixer at each length."""
    lengths = sorted(tp.seq_len.unique())
    by = tp.set_index(["arch", "seq_len"])
    rows = []
    for arch in ordered(tp.arch.unique()):
        cells = [escape(arch_title(arch))]
        for L in lengths:
            if (arch, L) in by.index:
                r = by.loc[(arch, L)]
                cells += [f"{r.tokens_per_s:,.0f}", f"{r.ratio_to_softmax:.2f}"]
            else:
                cells += ["--", "--"]
        rows.append(cells)
    header = ["Architecture"]
    for L in lengths:
        batch = int(tp[tp.seq_len == L].batch.iloc[0])
        header += [f"tokens/s, $L={L:,}$ ($B={batch}$)", "$\\times$ softmax"]
    first = tp.iloc[0]
    return table(
        header, rows, label="tab:throughput", align="l" + "rr" * len(lengths),
        caption=f"Training throughput of each causal mixer's language model on {setting(tp)}.",
        note=(f"Tokens per second of whole training steps (forward, backward, AdamW) on random tokens, "
              f"median of {int(first.repeats)} rounds of {int(first.steps)} steps; every round times every "
              "architecture in turn, and the ratio to softmax is taken within a round (median over rounds), "
              "so the load of the machine affects all alike. Above 1: faster than softmax. "
              "Produced by \\texttt{python -m seqmix throughput}."))
