"""The geometry notebook's numbers: the Causal Grassmann layers' Plücker residuals, pair and
plane angles per layer (the table and ``geo`` macros), and the rows its figure pools, from
``geometry.csv`` (seqmix/analysis/geometry.py)."""

from __future__ import annotations

import pandas as pd

from seqmix.report.latex import table


def grassmann_rows(geo: pd.DataFrame) -> pd.DataFrame:
    """Plücker and plane quantities (Causal Grassmann layers)."""
    return geo[geo.quantity.str.startswith("plucker") | geo.quantity.str.contains("angle")]


def compression_rows(geo: pd.DataFrame) -> pd.DataFrame:
    """The variational compression term (ToST's TSSA layers)."""
    return geo[geo.quantity == "compression_term"]


def _select(rows: pd.DataFrame, quantity: str, s: str, offset: int | None) -> pd.DataFrame:
    return rows[(rows.quantity == quantity) & (rows.stat == s) & ((rows.offset == offset) if offset is not None else True)]


def pooled(rows: pd.DataFrame, quantity: str, s: str, offset: int | None = 0) -> pd.DataFrame:
    """Per layer: mean, min and max over seeds of one statistic (each seed's value the mean
    over the layer's rows) at ``offset`` (None: every offset)."""
    return _select(rows, quantity, s, offset).groupby(["seed", "layer"]).value.mean().groupby("layer").agg(["mean", "min", "max"])


def layer_max(rows: pd.DataFrame, quantity: str) -> pd.Series:
    """Per layer: the largest maximum of one quantity over offsets and seeds."""
    return _select(rows, quantity, "max", None).groupby("layer").value.max()


def stat(rows: pd.DataFrame, quantity: str, s: str, offset: int | None = 0) -> float:
    """One statistic of one quantity in a layer's rows (max of maxima, else the mean over seeds)."""
    v = _select(rows, quantity, s, offset).value
    return v.max() if s == "max" else v.mean()


def geometry_table(gr: pd.DataFrame) -> str:
    """tab:geometry: per layer, the Plücker residual and the median pair and plane angles."""
    rows = []
    for layer in sorted(gr.layer.unique()):
        g = gr[gr.layer == layer]
        rows.append([str(layer), f"{stat(g, 'plucker_residual_used', 'max', None):.1e}", f"{stat(g, 'pair_angle', 'q50'):.1f}",
                     f"{stat(g, 'plane_angle_1', 'q50'):.1f}", f"{stat(g, 'plane_angle_2', 'q50'):.1f}"])
    return table(
        ["Layer", "Plücker residual (max)", "pair angle", "plane angle 1", "plane angle 2"], rows,
        caption="Geometry of the trained Causal Grassmann layers on held-out text (medians in degrees, pooled over offsets and seeds).",
        label="tab:geometry", align="rrrrr",
        note="Residual of the Plücker relations of the averaged feature the layer feeds to its projection, relative to $\\|p\\|^2$; "
             "pair angle between $z_t$ and $z_{t-\\Delta}$; principal angles between consecutive planes "
             "$P_t=\\mathrm{span}(z_t,z_{t-\\Delta})$ and $P_{t+1}$.")


def geometry_macros(gr: pd.DataFrame) -> dict[str, str]:
    """The ``geo`` macros: each layer's median angles, the largest residual, the layer count."""
    macros = {}
    for layer in sorted(gr.layer.unique()):
        g = gr[gr.layer == layer]
        macros[f"layer{layer}-plane2"] = f"{stat(g, 'plane_angle_2', 'q50'):.1f}"
        macros[f"layer{layer}-pair"] = f"{stat(g, 'pair_angle', 'q50'):.1f}"
    macros["residualMax"] = f"{gr[gr.quantity.str.startswith('plucker') & (gr.stat == 'max')].value.max():.1e}" if len(gr) else "--"
    macros["numLayers"] = str(gr.layer.nunique())
    return macros
