"""The complexity notebook's numbers: the cost-exponent table, the Triton kernel table and
the ``cx`` macros, from ``complexity.csv``, ``complexity_fit.csv`` and ``complexity_growth.csv``
(row types: ``ComplexityRow``, ``FitRow``, ``GrowthRow`` in seqmix.analysis) and any GPU's
``<gpu>/kernels.csv`` benchmark (``make gpu-check``, ``python -m tools.bench kernels``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd

from seqmix import catalogue
from seqmix.report.latex import escape, table
from seqmix.report.style import arch_title, ordered

STATED = {"L": "$L$", "L log L": "$L \\log L$", "L^2": "$L^2$"}  # catalogue cost_in_L as LaTeX
KERNEL_LENGTHS = (1024, 4096, 16384, 65536)  # the lengths the kernel table shows


@dataclasses.dataclass
class Complexity:
    """The complexity analysis's three CSVs, read once, and what the figures and tables share."""

    cx: pd.DataFrame
    fits: pd.DataFrame
    growth: pd.DataFrame

    @classmethod
    def read(cls, results_dir: str | Path) -> Complexity:
        analysis = Path(results_dir) / "analysis"
        return cls(*(pd.read_csv(analysis / f"{name}.csv") for name in ("complexity", "complexity_fit", "complexity_growth")))

    @property
    def counted(self) -> pd.DataFrame:
        return self.cx[self.cx.status.isin(["ok", "counted"])]

    @property
    def timed(self) -> pd.DataFrame:
        return self.cx[self.cx.status == "ok"]

    @property
    def device_name(self) -> str:
        return self.counted.device_name.dropna().iloc[0]

    @property
    def d_model(self) -> int:
        return int(self.counted.d_model.iloc[0])

    @property
    def batch(self) -> int:
        return int(self.counted.batch.iloc[0])

    @property
    def count_modes(self) -> str:
        """The tensor kinds the counts ran on ("fake and real" ...), as prose."""
        return " and ".join(sorted(self.counted.count_mode.dropna().unique()))

    @property
    def repeats(self) -> int:
        timed = self.timed
        return int(timed.groupby(["arch", "seq_len"]).size().max()) if len(timed) else 0

    def per_length(self) -> pd.DataFrame:
        """One row per (arch, L): the fastest call (min of the repeats) and the counts (exact)."""
        return self.counted.groupby(["arch", "seq_len"], as_index=False).agg(
            fwdbwd_ms=("fwdbwd_ms", "min"), flops=("flops_fwdbwd", "first"), written=("bytes_written_fwdbwd", "first"),
            peak=("peak_fwdbwd_bytes", "first"))

    def fit(self, measure: str) -> pd.DataFrame | None:
        """The fit rows of one measure, by arch (None when the measure was not fitted)."""
        f = self.fits[self.fits.measure == measure]
        return f.set_index("arch") if len(f) else None

    def exponent(self, arch: str, measure: str) -> str:
        """A counted exponent: its range over the doublings of the fit (what a claim is judged on)."""
        f = self.fit(measure)
        if f is None or arch not in f.index:
            return "--"
        lo, hi = f.loc[arch, "local_min"], f.loc[arch, "local_max"]
        return f"{lo:.2f}" if round(lo, 2) == round(hi, 2) else f"{lo:.2f}--{hi:.2f}"

    def time_fit(self, arch: str) -> pd.Series | None:
        f = self.fit("fwdbwd_ms")
        return f.loc[arch] if f is not None and arch in f.index else None

    def last_timed_doubling(self, arch: str) -> pd.Series | None:
        g = self.growth[(self.growth.arch == arch) & self.growth.growth_fwdbwd_ms.notna()]
        return g.iloc[-1] if len(g) else None

    @property
    def count_range(self) -> str:
        counted_fit = self.fits[self.fits.kind == "counted"]
        return f"{int(counted_fit.min_len.min())}--{int(counted_fit.max_len.max())}"


def complexity_table(c: Complexity) -> str:
    """The exponent table (tab:complexity): stated cost, counted exponents, time fit, last doubling."""
    cost_in_L = {m.name: m.cost_in_L for m in catalogue.MIXERS}
    rows = []
    for arch in ordered(c.fits.arch):
        t, last = c.time_fit(arch), c.last_timed_doubling(arch)
        rows.append([escape(arch_title(arch)), STATED.get(cost_in_L.get(arch), "--"),
                     c.exponent(arch, "flops_fwdbwd"), c.exponent(arch, "bytes_written_fwdbwd"),
                     c.exponent(arch, "peak_fwdbwd_bytes"),
                     f"{t.slope:.2f} [{t.ci_low:.2f}, {t.ci_high:.2f}]" if t is not None else "--",
                     f"{int(t.min_len)}--{int(t.max_len)}" if t is not None else "--",
                     (f"{int(last.len_from)}$\\to${int(last.len_to)}: $\\times${last.growth_fwdbwd_ms:.2f} / "
                      f"$\\times${last.growth_bytes_written_fwdbwd:.2f}") if last is not None else "--"])
    return table(
        ["Architecture", "stated", "FLOPs", "bytes", "memory", "time exp. [95\\% CI]", "time $L$", "last doubling: time / bytes"],
        rows, caption=f"Cost exponents of one mixer layer (forward+backward, $d={c.d_model}$): counted over $L$ = {c.count_range}, "
                      f"wall time on {escape(c.device_name)}.",
        label="tab:complexity", align="llrrrrrr", size="\\footnotesize",
        note="FLOPs, bytes (written by every op) and memory (peak live tensors) are counted, exactly, on "
             f"{c.count_modes} CPU tensors; each cell is the exponent between consecutive lengths of the fit "
             "range (the longest lengths, where the leading term dominates), a range when it changes. 1 means linear, "
             "2 quadratic. ``stated'': the cost the catalogue states. Time: OLS slope of the log of the fastest of "
             f"{c.repeats} calls on log $L$ over its longest timed lengths, with its 95\\% interval; last doubling: "
             "growth per doubling of time and of bytes written at the longest timed pair of lengths.")


def read_kernel_benchmarks(bench_dir: str | Path) -> tuple[pd.DataFrame | None, int]:
    """The ok rows of every ``<gpu>/kernels.csv`` in ``bench_dir`` (None without one), and the number of files."""
    files = sorted(Path(bench_dir).glob("*/kernels.csv"))
    if not files:
        return None, 0
    bench = pd.concat([pd.read_csv(f) for f in files], ignore_index=True)
    return bench[bench.status == "ok"], len(files)


def kernels_table(bench: pd.DataFrame | None) -> str:
    """The Triton kernel table (tab:kernels), or a paragraph saying no GPU benchmark was committed."""
    if bench is None:
        return ("% Generated by a seqmix notebook from results files; do not edit.\n"
                "\\paragraph{Triton kernels.}\\label{tab:kernels} No GPU benchmark was committed to "
                "\\texttt{results/bench/}: the Triton kernels were verified only under \\texttt{TRITON\\_INTERPRET=1} "
                "on the CPU (forward and backward against the references). Run \\texttt{python -m tools.bench kernels} "
                "on a GPU (or \\texttt{make gpu-check}) and commit \\texttt{results/bench/<gpu>/kernels.csv} to fill a table here.\n")
    # SDPA is benchmarked as its own op ("attention"): every kernel is compared with it at the
    # same device, length and pass; an op without a Triton kernel is not a row of its own.
    sdpa = bench[bench.impl == "sdpa"].set_index(["device", "L", "pass"]).time_ms
    rows = []
    for (device, op), g in bench.groupby(["device", "op"]):
        t = g.pivot_table(index=["L", "pass"], columns="impl", values="time_ms")
        for (L, pass_), r in t.iterrows():
            kernel = r.get("triton")
            if L not in KERNEL_LENGTHS or pd.isna(kernel):
                continue
            others = [r.get("reference"), sdpa.get((device, L, pass_)), r.get("fla")]
            cells = [escape(device), escape(op), f"{int(L):,}", pass_, f"{kernel:.3f}"]
            cells += [f"{v / kernel:.2f}$\\times$" if pd.notna(v) else "--" for v in others]
            roof = g[(g.L == L) & (g["pass"] == pass_) & (g.impl == "triton")].roofline_frac
            cells.append(f"{roof.iloc[0]:.1%}".replace("%", "\\%") if len(roof) and pd.notna(roof.iloc[0]) else "--")
            rows.append(cells)
    return table(
        ["Device", "Op", "$L$", "Pass", "Triton (ms)", "vs reference", "vs SDPA", "vs fla", "HBM roofline"], rows,
        caption="Triton kernels against their PyTorch references, SDPA attention and flash-linear-attention.",
        label="tab:kernels", align="llrlrrrrr", size="\\scriptsize",
        note="Speed-ups are other/kernel time (above 1: the kernel is faster). "
             "Produced by \\texttt{python -m tools.bench kernels}.")


def spread(values, digits: int = 2) -> str:
    """Values as "lo--hi" (one number when they agree to ``digits``), "--" without any."""
    values = [v for v in values if pd.notna(v)]
    if not values:
        return "--"
    lo, hi = min(values), max(values)
    return f"{lo:.{digits}f}" if round(lo, digits) == round(hi, digits) else f"{lo:.{digits}f}--{hi:.{digits}f}"


def complexity_macros(c: Complexity, num_bench: int) -> dict[str, str]:
    """The ``cx`` macros: the setting, and each mixer's exponents; the regime change at each
    linear-cost mixer's longest timed doubling (time against the counts)."""
    cost_in_L = {m.name: m.cost_in_L for m in catalogue.MIXERS}
    linear = [a for a in ordered(c.growth.arch) if cost_in_L.get(a) == "L"]
    lasts = [last for a in linear if (last := c.last_timed_doubling(a)) is not None]
    timed = c.timed
    macros = {"device": escape(c.device_name), "dModel": str(c.d_model), "batch": str(c.batch), "repeats": str(c.repeats),
              "countMode": escape(c.count_modes), "countRange": c.count_range,
              "maxLen": f"{int(c.counted.seq_len.max()):,}".replace(",", "{,}"),
              "maxTimedLen": f"{int(timed.seq_len.max()) if len(timed) else 0:,}".replace(",", "{,}"),
              "numBench": str(num_bench),
              "growthLens": spread([x.len_to for x in lasts], 0),
              "timeGrowth": spread([x.growth_fwdbwd_ms for x in lasts]),
              "flopsGrowth": spread([x.growth_flops_fwdbwd for x in lasts]),
              "bytesGrowth": spread([x.growth_bytes_written_fwdbwd for x in lasts]),
              "memGrowth": spread([x.growth_peak_fwdbwd_bytes for x in lasts])}
    for arch in c.fits.arch.unique():
        macros[f"{arch}-flops-exp"] = c.exponent(arch, "flops_fwdbwd")
        macros[f"{arch}-bytes-exp"] = c.exponent(arch, "bytes_written_fwdbwd")
        macros[f"{arch}-mem-exp"] = c.exponent(arch, "peak_fwdbwd_bytes")
        t = c.time_fit(arch)
        if t is not None:
            macros[f"{arch}-time-exp"] = f"{t.slope:.2f}"
            macros[f"{arch}-time-ci"] = f"[{t.ci_low:.2f}, {t.ci_high:.2f}]"
            macros[f"{arch}-time-range"] = f"{int(t.min_len)}--{int(t.max_len)}"
    return macros
