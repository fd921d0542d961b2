"""The sparsity notebook's numbers: the analytic curves it draws (closed forms, their Monte
Carlo check, linear attention with decay), the trained models' table and the ``sp`` macros,
from ``sparsity_analytic.csv`` and ``sparsity.csv`` (seqmix/analysis/su.py, sparsity.py)."""

from __future__ import annotations

import dataclasses

import pandas as pd

from seqmix.catalogue import title as task_title
from seqmix.report.latex import escape, pm, table
from seqmix.report.style import arch_title, ordered
from seqmix.report.summary import mean_ci

# The score functions of the closed forms (analysis.su; their files' `kernel` column), as the
# figure titles them, and their colours.
SCORE_TITLES = {"exp": "exp (softmax)", "relu2": "relu$^2$", "identity": "plain linear", "elu1": "elu+1 (non-negative linear)"}
SCORE_COLOURS = dict(zip(SCORE_TITLES, ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"]))
MEASURES = ("attention", "jacobian")  # the row kinds of sparsity.csv


@dataclasses.dataclass
class Analytic:
    """sparsity_analytic.csv split as the figure draws it."""

    closed: pd.DataFrame  # closed forms (n -> infinity)
    monte_carlo: pd.DataFrame
    decay: pd.DataFrame  # linear attention with decay, S against n
    beta0: float  # the key bias closest to 0: the first panel's slice
    gamma1: float  # the query scale closest to 1: the second panel's slice

    @classmethod
    def of(cls, an: pd.DataFrame) -> Analytic:
        closed = an[an.method == "closed_form"]
        beta0 = closed.loc[(closed.beta.abs() == closed.beta.abs().min()), "beta"].iloc[0]
        gamma1 = closed.loc[(closed.gamma - 1).abs() == (closed.gamma - 1).abs().min(), "gamma"].iloc[0]
        return cls(closed, an[an.method == "monte_carlo"], an[an.kernel == "decay"], beta0, gamma1)


def measured_tasks(sp: pd.DataFrame) -> tuple[str | None, dict[str, str]]:
    """The task most rows are measured on, and each arch's task: non-causal-only mixers (no
    language-model run) are measured on their encoder task's runs."""
    main = sp.task.mode().iloc[0] if len(sp) else None
    return main, sp.groupby("arch").task.first().to_dict()


def measured_title(sp: pd.DataFrame, arch: str) -> str:
    """A mixer's legend title, with its task where that is not the main one."""
    main, arch_task = measured_tasks(sp)
    t = arch_task.get(arch, main)
    return arch_title(arch) + ("" if t == main else f" ({task_title(t)})")


def per_layer(sp: pd.DataFrame, kind: str) -> pd.DataFrame:
    """Per (arch, seed, layer): the mean S over heads and rows of one row kind."""
    return sp[sp.kind == kind].groupby(["arch", "seed", "layer"], as_index=False).S_mean.mean()


def sparsity_table(sp: pd.DataFrame) -> str:
    """tab:sparsity: each mixer's attention-row and Jacobian S (mean ± 95% CI over seeds)."""
    _, arch_task = measured_tasks(sp)
    rows = []
    for arch in ordered(sp.arch):
        a = sp[sp.arch == arch]
        cells = [escape(arch_title(arch)), escape(task_title(arch_task[arch]))]
        cells += [pm(*seed_mean(a, kind), 3) for kind in MEASURES]
        cells.append(f"{a.S_onehot_mean.mean():.3f}")
        rows.append(cells)
    return table(
        ["Architecture", "held-out text", "attention rows $S$", "Jacobian $S$", "one-hot $S$"], rows,
        caption="Su's sparsity of trained models on held-out text (mean over layers, heads and rows).",
        label="tab:sparsity", align="llrrr",
        note=f"Rows with at least {int(sp.min_row_len.min()) if len(sp) else 0} visible keys of held-out sequences "
             f"({', '.join(f'{escape(task_title(t))}: {int(n)} tokens' for t, n in sp.groupby('task').seq_len.max().items())}); "
             "mean $\\pm$ 95\\% interval across seeds. "
             "Architectures with no causal form are trained only as encoders and measured on held-out inputs of their encoder task "
             "(cropped so that no row holds padding; their rows see every position). "
             "Attention rows exist only for mixers with an explicit score matrix; the Jacobian rows "
             "$\\|\\partial y_t/\\partial x_s\\|_F$ put every mixer on one axis (for softmax they differ from its attention rows).")


def seed_mean(rows: pd.DataFrame, kind: str) -> tuple[float, float]:
    """Mean and 95% half-width across seeds of the per-seed mean S of one row kind."""
    m, h, _ = mean_ci(rows[rows.kind == kind].groupby("seed").S_mean.mean())
    return m, h


def sparsity_macros(sp: pd.DataFrame, analytic: Analytic) -> dict[str, str]:
    """The ``sp`` macros: each mixer's measured S, and the closed forms' landmarks."""
    macros = {f"{arch}-{kind}": pm(*seed_mean(sp[sp.arch == arch], kind), 3) for arch in ordered(sp.arch) for kind in MEASURES}
    closed, mc = analytic.closed, analytic.monte_carlo
    macros.update({
        "identityFloor": f"{closed[closed.kernel == 'identity'].S.min():.3f}",
        "expMin": f"{closed[closed.kernel == 'exp'].S.min():.3f}",
        "gammaMax": f"{closed.gamma.max():g}",
        "mcN": f"{int(mc.n.max()):,}".replace(",", "{,}"),
        "relu2AtZero": f"{closed[(closed.kernel == 'relu2') & (closed.beta == analytic.beta0)].S.mean():.3f}",
    })
    return macros
