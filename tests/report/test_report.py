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
from tests.conftest import REPO

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
    from seqmix.report.claims_file import AgreeIf

    band = AgreeIf(min=0.8, max=1.3)
    assert judge(1.0, 0.1, band) == "agrees"
    assert judge(1.0, 0.4, band) == "inconclusive"  # [0.6, 1.4] crosses both bounds
    assert judge(1.5, 0.1, band) == "disagrees"
    assert judge(1.25, 0.1, band) == "inconclusive"
    assert judge(1.0, float("nan"), band) == "agrees"  # one seed: the mean alone
    assert judge(0.5, 0.2, AgreeIf(min=0.0)) == "agrees"
    assert judge(-0.5, 0.2, AgreeIf(min=0.0)) == "disagrees"


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
    # WikiText-2 runs only: every claim but the gap, which reads them, lacks what it is
    # judged on, and says what that is.
    res = evaluate_claims(CLAIMS, fake_results(tmp_path)).set_index("id")
    others = res.drop(index="grassmann-wikitext-gap")
    assert len(others) == len(res) - 1 and (others.verdict == "not testable").all(), others.verdict
    assert res.loc["softmax-quadratic"].why == "no complexity measurement"
    assert all(why.strip() for why in others.why)
    assert res.loc["grassmann-wikitext-gap"].verdict == "agrees"


def _cost_fit(arch, measure, slope, local=None, kind="counted", **kw):
    low, high = local or (slope, slope)
    ci = (low, high) if kind == "timed" else (float("nan"), float("nan"))
    return dict(arch=arch, device="cpu", measure=measure, kind=kind, count_mode="fake", min_len=2048, max_len=8192,
                slope=slope, ci_low=ci[0], ci_high=ci[1], local_min=low, local_max=high, **kw)


def test_complexity_counts_decide_the_cost_claims_and_time_only_stands_beside(tmp_path):
    root = fake_results(tmp_path)
    (root / "analysis").mkdir()
    counted = ("flops_fwdbwd", "bytes_written_fwdbwd", "peak_fwdbwd_bytes")
    fits = [_cost_fit("softmax", "flops_fwdbwd", 1.97, (1.95, 1.99)), _cost_fit("softmax", "peak_fwdbwd_bytes", 1.0)]
    fits += [_cost_fit("grassmann", m, 1.0) for m in counted]
    fits += [_cost_fit("tssa", m, 1.7 if m == "bytes_written_fwdbwd" else 1.0) for m in counted]
    # Linear attention: counts linear, wall time superlinear (the cache): the counts decide.
    fits += [_cost_fit("linear", m, 1.0) for m in counted]
    fits += [_cost_fit("linear", "fwdbwd_ms", 1.9, (1.7, 2.1), kind="timed")]
    # Mamba's bytes converge from above: a doubling in the range is still outside the band.
    fits += [_cost_fit("mamba", m, 1.2, (1.1, 1.4) if m == "bytes_written_fwdbwd" else None) for m in counted]
    fits += [_cost_fit(a, m, 1.0) for a in ("gla", "h3") for m in counted]
    pd.DataFrame(fits).to_csv(root / "analysis" / "complexity_fit.csv", index=False)
    pd.DataFrame([dict(arch="linear", device="cpu", len_from=4096, len_to=8192, growth_fwdbwd_ms=2.6,
                       growth_flops_fwdbwd=2.0, growth_bytes_written_fwdbwd=2.0, growth_peak_fwdbwd_bytes=2.0)]
                 ).to_csv(root / "analysis" / "complexity_growth.csv", index=False)
    res = evaluate_claims(CLAIMS, root).set_index("id")
    assert res.loc["softmax-quadratic"].verdict == "agrees"
    assert res.loc["grassmann-linear"].verdict == "agrees"
    assert res.loc["tssa-linear"].verdict == "disagrees" and "tssa bytes written 1.70" in res.loc["tssa-linear"].why
    lin = res.loc["linear-attention-linear"]
    assert lin.verdict == "agrees" and "time ×2.60" in lin.measured_on and "FLOPs ×2.00" in lin.measured_on
    assert "linear time 1.90" in lin.measured_on and "not deciding" in lin.measured_on
    assert res.loc["recurrent-linear"].verdict == "inconclusive" and "[1.10, 1.40]" in res.loc["recurrent-linear"].why
    assert res.loc["performer-linear"].verdict == "not testable"


def test_a_malformed_claim_names_itself(tmp_path):
    bad = tmp_path / "claims.yaml"
    bad.write_text(yaml.safe_dump({"claims": [{"id": "x", "claim": "c", "source": "s", "reported": "r",
                                               "kind": "vibes", "unit": "u", "agree_if": {}, "requires": {}}]}))
    with pytest.raises(ClaimsError, match=r"claim 'x': key 'kind': 'vibes' is not one of the allowed values: relative_gap, "):
        load_claims(bad)
    width = {"id": "w", "claim": "c", "source": "s", "reported": "r", "kind": "width_to_reach", "task": "mqar",
             "per": "model.d_model", "arch": "h3", "baselines": ["gla"], "threshold": 0.9, "unit": "u",
             "agree_if": {"min": 1.0}, "requires": {}}
    bad.write_text(yaml.safe_dump({"claims": [{**width, "reached_by": "most"}]}))
    with pytest.raises(ClaimsError) as e:
        load_claims(bad)
    assert str(e.value) == f"{bad}: claim 'w': key 'reached_by': 'most' is not one of the allowed values: majority or every"
    # One line per problem, each naming the file, the claim and the key; a key a kind does not
    # take is refused with the keys it does.
    del width["threshold"]
    bad.write_text(yaml.safe_dump({"claims": [{**width, "requires": {"min_steps": 10}}]}))
    with pytest.raises(ClaimsError) as e:
        load_claims(bad)
    assert str(e.value).splitlines() == [f"{bad}: claim 'w': key 'threshold' is required",
                                         f"{bad}: claim 'w': unknown key(s) 'min_steps' under 'requires'"]


def test_shipped_claims_file_is_valid_and_sourced():
    claims = load_claims(CLAIMS)
    assert len({c.id for c in claims}) == len(claims)
    assert all(c.source.strip() for c in claims)


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
