"""The claims notebook's numbers: the claims table (each claim, its source, the reported
value, ours, what it was measured on and the verdict) and the ``cl`` macros, from
``seqmix.report.claims.evaluate_claims``."""

from __future__ import annotations

import pandas as pd

from seqmix.report.latex import escape, table

VERDICT_TEX = {"agrees": "\\textcolor{agree}{agrees}", "disagrees": "\\textcolor{disagree}{disagrees}",
               "inconclusive": "\\textcolor{inconclusive}{inconclusive}",
               "not testable": "\\textcolor{untestable}{not testable}"}


def claims_table(claims: pd.DataFrame) -> str:
    """tab:claims, a longtable: the claims list grows with claims.yaml and may run over a page."""
    rows = [[f"\\textbf{{{escape(r.id)}}}: {escape(r.claim)} \\emph{{({escape(r.source)})}}",
             escape(r.reported), escape(r.ours), escape(r.measured_on), f"{VERDICT_TEX[r.verdict]}: {escape(r.why)}"]
            for r in claims.itertuples()]
    return table(
        ["Claim (source)", "Reported", "Ours ($\\pm$ 95\\% CI)", "Measured on", "Verdict"], rows,
        caption="Each numeric claim of the papers against this pipeline's measurement.",
        label="tab:claims", align="p{4.2cm}p{2.0cm}p{2.6cm}p{3.0cm}p{3.6cm}", size="\\scriptsize", long=True,
        note="Claims, their papers and agreement criteria live in \\texttt{paper/claims.yaml}. "
             "\\emph{agrees}/\\emph{disagrees}: the whole 95\\% interval meets/misses the criterion; "
             "\\emph{inconclusive}: the interval straddles it; "
             "\\emph{not testable}: the runs do not reach the scale the claim is about (the reason is given), "
             "and our value is shown regardless.")


def claims_macros(claims: pd.DataFrame) -> dict[str, str]:
    """The ``cl`` macros: the verdict counts, and each claim's value, verdict and reason."""
    counts = claims.verdict.value_counts()
    macros = {
        "numClaims": str(len(claims)),
        "numAgree": str(int(counts.get("agrees", 0))),
        "numDisagree": str(int(counts.get("disagrees", 0))),
        "numInconclusive": str(int(counts.get("inconclusive", 0))),
        "numUntestable": str(int(counts.get("not testable", 0))),
        # The abstract names every claim our numbers disagree with, and why: a loss is said
        # where a reader starts, not only in the table.
        "disagreeing": "; ".join(f"\\texttt{{{escape(r.id)}}} ({escape(r.why)})"
                                 for r in claims.itertuples() if r.verdict == "disagrees") or "none",
    }
    for r in claims.itertuples():
        macros[f"{r.id}-ours"] = escape(r.ours)
        macros[f"{r.id}-verdict"] = r.verdict
        macros[f"{r.id}-why"] = escape(r.why)
    return macros
