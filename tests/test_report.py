"""The report: every figure and table it includes is produced by the DAG; the claims
evaluator gives the right verdicts on known results; LaTeX helpers."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest
import yaml

from seqmix.report.claims import ClaimsError, evaluate_claims, load_claims
from seqmix.report.latex import macro_name, table
from seqmix.report.summary import mean_ci

from .conftest import REPO

PAPER = REPO / "paper"


def tex_sources() -> list[Path]:
    return [PAPER / "report.tex", *sorted((PAPER / "sections").glob("*.tex"))]


def dag_outputs() -> set[str]:
    notebooks = yaml.safe_load((REPO / "notebooks" / "outputs.yaml").read_text())
    out = set()
    for name, nb in notebooks.items():
        assert (REPO / "notebooks" / f"{name}.ipynb").exists(), f"outputs.yaml names a missing notebook {name}"
        out |= {f"figures/{f}.pdf" for f in nb["figures"]} | {f"tables/{t}.tex" for t in nb["tables"]}
    return out


def included_files() -> set[str]:
    found = set()
    for tex in tex_sources():
        text = re.sub(r"(?<!\\)%.*", "", tex.read_text())  # drop comments
        for name in re.findall(r"\\includegraphics(?:\[[^\]]*\])?\{([^}]+)\}", text):
            found.add(f"figures/{Path(name).stem}.pdf")
        for name in re.findall(r"\\input\{(tables/[^}]+)\}", text):
            found.add(f"{name}.tex" if not name.endswith(".tex") else name)
    return found


def test_every_figure_and_table_in_the_report_is_a_dag_output():
    included = included_files()
    assert included, "the report includes no figure or table?"
    missing = sorted(included - dag_outputs())
    assert not missing, f"the report includes files no notebook produces: {missing}"


def test_every_dag_output_is_used_by_the_report():
    unused = sorted(dag_outputs() - included_files())
    assert not unused, f"notebooks produce files the report never includes: {unused}"


def test_the_report_has_every_section():
    text = (PAPER / "report.tex").read_text()
    for section in ("abstract", "question", "architectures", "setup", "results", "analyses", "claims",
                    "limitations", "provenance"):
        assert f"\\input{{sections/{section}}}" in text


def test_no_number_is_typed_in_the_results_prose():
    # Results and analyses prose takes its numbers from generated macros; the only digits
    # allowed are in references to the setting (e.g. "10--15", "95", "2-core").
    for name in ("results", "analyses", "abstract"):
        text = re.sub(r"\\(ref|label|cite)\{[^}]*\}", "", (PAPER / "sections" / f"{name}.tex").read_text())
        numbers = re.findall(r"(?<![\w\\{-])\d+\.\d+", text)
        assert not numbers, f"sections/{name}.tex types numbers by hand: {numbers}"


CLAIMS = REPO / "paper" / "claims.yaml"


def fake_results(root: Path, gap_ppl=(110.0, 110.0), params=13_000_000, steps=18_000, complete=True) -> Path:
    rows = []
    for seed, g in enumerate(gap_ppl):
        for arch, ppl in (("softmax", 100.0 + seed), ("grassmann", g + seed)):
            rows.append(dict(task="wikitext2", arch=arch, seed=seed, status="ok", eval_value=ppl, test_value=ppl,
                             params=params, steps_planned=steps, steps_completed=steps, train_complete=complete,
                             train_data="WikiText-2 raw train (complete, 36,718 lines)"))
    (root / "summary").mkdir(parents=True)
    pd.DataFrame(rows).to_csv(root / "summary" / "runs.csv", index=False)
    return root


def test_grassmann_gap_within_the_claim_agrees(tmp_path):
    res = evaluate_claims(CLAIMS, fake_results(tmp_path))
    row = res.set_index("id").loc["grassmann-wikitext-gap"]
    assert row.verdict == "agrees"
    assert row.value == pytest.approx(((110 / 100 - 1) + (111 / 101 - 1)) / 2 * 100)


def test_a_gap_whose_interval_straddles_the_claim_is_inconclusive(tmp_path):
    # Seeds at +10% and +20.8%: the mean is near the 15% bound and two seeds cannot tell.
    res = evaluate_claims(CLAIMS, fake_results(tmp_path, gap_ppl=(110.0, 120.0)))
    row = res.set_index("id").loc["grassmann-wikitext-gap"]
    assert row.verdict == "inconclusive" and "straddles" in row.why


def test_judge_uses_the_whole_interval():
    from seqmix.report.claims import judge

    band = {"min": 0.8, "max": 1.3}
    assert judge(1.0, 0.1, band) == "agrees"
    assert judge(1.0, 0.4, band) == "inconclusive"  # [0.6, 1.4] crosses both bounds
    assert judge(1.5, 0.1, band) == "disagrees"
    assert judge(1.25, 0.1, band) == "inconclusive"
    assert judge(1.0, float("nan"), band) == "agrees"  # one seed: the mean alone
    assert judge(0.5, 0.2, {"min": 0.0}) == "agrees"
    assert judge(-0.5, 0.2, {"min": 0.0}) == "disagrees"


def test_grassmann_gap_beyond_the_claim_disagrees(tmp_path):
    res = evaluate_claims(CLAIMS, fake_results(tmp_path, gap_ppl=(140.0, 141.0)))
    assert res.set_index("id").loc["grassmann-wikitext-gap"].verdict == "disagrees"


def test_small_runs_are_not_testable_and_say_why(tmp_path):
    res = evaluate_claims(CLAIMS, fake_results(tmp_path, params=400_000, steps=150, complete=False))
    row = res.set_index("id").loc["grassmann-wikitext-gap"]
    assert row.verdict == "not testable"
    assert "0.40M parameters" in row.why and "150 steps" in row.why and "not the full training split" in row.why
    assert row.ours != "--"  # the value is shown regardless


def test_claims_without_results_are_not_testable(tmp_path):
    res = evaluate_claims(CLAIMS, fake_results(tmp_path))
    assert (res.set_index("id").loc["softmax-quadratic"].verdict) == "not testable"
    assert set(res.verdict) <= {"agrees", "disagrees", "inconclusive", "not testable"}


def test_complexity_exponents_decide_the_cost_claims(tmp_path):
    root = fake_results(tmp_path)
    (root / "analysis").mkdir()
    fits = []
    for arch, slope in (("softmax", 1.9), ("grassmann", 1.05), ("tssa", 1.7)):
        for measure in ("fwdbwd_ms", "peak_fwdbwd_bytes"):
            fits.append(dict(arch=arch, device="cpu", measure=measure, min_len=2048, max_len=8192, slope=slope,
                             ci_low=slope - 0.05, ci_high=slope + 0.05))
    pd.DataFrame(fits).to_csv(root / "analysis" / "complexity_fit.csv", index=False)
    res = evaluate_claims(CLAIMS, root).set_index("id")
    assert res.loc["softmax-quadratic"].verdict == "agrees"
    assert res.loc["grassmann-linear"].verdict == "agrees"
    assert res.loc["tssa-linear"].verdict == "disagrees" and "1.70" in res.loc["tssa-linear"].why
    assert res.loc["performer-linear"].verdict == "not testable"


def test_a_malformed_claim_names_itself(tmp_path):
    bad = tmp_path / "claims.yaml"
    bad.write_text(yaml.safe_dump({"claims": [{"id": "x", "claim": "c", "source": "s", "reported": "r",
                                               "kind": "vibes", "unit": "u", "agree_if": {}, "requires": {}}]}))
    with pytest.raises(ClaimsError, match="'x' has kind 'vibes'"):
        load_claims(bad)


def test_shipped_claims_file_is_valid_and_sourced():
    claims = load_claims(CLAIMS)
    assert len({c["id"] for c in claims}) == len(claims)
    assert all(c["source"].strip() for c in claims)


def test_mean_ci_matches_the_t_interval():
    m, h, n = mean_ci([1.0, 2.0, 3.0])
    assert (m, n) == (2.0, 3) and h == pytest.approx(4.302653 * 1.0 / 3**0.5, rel=1e-6)
    assert mean_ci([5.0])[1] != mean_ci([5.0])[1]  # NaN half-width for one seed


def test_latex_helpers():
    assert macro_name("q", "wikitext2-softmax-test") == "qWikitextTwoSoftmaxTest"
    t = table(["A", "B"], [["1", "2"]], caption="c", label="tab:x", note="n", size="\\tiny")
    assert "\\toprule" in t and "\\label{tab:x}" in t and "1 & 2 \\\\" in t
    assert t.index("\\tiny") < t.index("\\begin{tabular}") and t.index("n}") < t.index("\\end{table}")
    long = table(["A", "B"], [["1", "2"]], caption="c", label="tab:y", long=True)
    assert "\\begin{longtable}" in long and "\\endhead" in long
