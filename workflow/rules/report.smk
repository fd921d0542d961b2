# Report: each notebook (papermill) writes its figures and tables; latexmk builds the PDF.
# Any figure or table is a target of its own: `snakemake --cores all paper/figures/<name>.pdf`.
import shlex

import yaml

with open(SRC / "notebooks" / "outputs.yaml") as _f:
    NOTEBOOKS = yaml.safe_load(_f)


def notebook_outputs(name):
    nb = NOTEBOOKS[name]
    return [f"paper/figures/{f}.pdf" for f in nb["figures"]] + [f"paper/tables/{t}.tex" for t in nb["tables"]]


def notebook_outputs_for_report(name):
    # The same files, figures flagged for `snakemake --report` (the HTML beside the PDF).
    # (`report` cannot start a line here: the Snakemake parser reads it as a keyword.)
    caption = str(SRC / "workflow" / "report" / "figure.rst")
    flagged = [report(f, caption=caption, category=name) for f in notebook_outputs(name) if f.endswith(".pdf")]
    return flagged + [f for f in notebook_outputs(name) if not f.endswith(".pdf")]


def notebook_inputs(name):
    files = []
    for item in NOTEBOOKS[name]["inputs"]:
        if item.startswith("runs:"):
            files += all_runs(item.removeprefix("runs:"))
        elif item.startswith("src:"):
            files.append(str(SRC / item.removeprefix("src:")))
        elif item.startswith("bench:"):
            # Committed GPU benchmark CSVs (results/bench/), read when present.
            files += sorted(str(p) for p in (SRC / "results" / "bench").glob(item.removeprefix("bench:")))
        else:
            files.append(f"{RESULTS}/{item}")
    return files


def notebook_params(name):
    params = {"results_dir": RESULTS, "paper_dir": "paper"}
    for key, value in NOTEBOOKS[name].get("params", {}).items():
        params[key] = str(SRC / value.removeprefix("src:")) if value.startswith("src:") else value
    return " ".join(f"-p {k} {shlex.quote(v)}" for k, v in params.items())


for _name in NOTEBOOKS:

    rule:
        name:
            f"notebook_{_name}"
        input:
            notebook=str(SRC / "notebooks" / f"{_name}.ipynb"),
            results=notebook_inputs(_name),
        output:
            outputs=notebook_outputs_for_report(_name),
            executed=f"{RESULTS}/notebooks/{_name}.ipynb",
        params:
            papermill=notebook_params(_name),
        log:
            f"{RESULTS}/logs/notebooks/{_name}.log",
        conda:
            "../../envs/seqmix.yaml"
        shell:
            "papermill --log-output -k python3 {input.notebook} {output.executed} "
            "{params.papermill} > {log} 2>&1"


REPORT_SOURCES = [str(p) for p in sorted((SRC / "paper").glob("*.tex"))] + [
    str(p) for p in sorted((SRC / "paper" / "sections").glob("*.tex"))
]


rule report:
    input:
        sources=REPORT_SOURCES,
        generated=[f for name in NOTEBOOKS for f in notebook_outputs(name)],
    output:
        report("paper/report.pdf", caption=str(SRC / "workflow" / "report" / "report.rst"), category="report"),
    params:
        src=str(SRC / "paper"),
    log:
        f"{RESULTS}/logs/report.log",
    shell:
        # TEXINPUTS lets the sources in the repository find the generated figures and
        # tables in this working directory's paper/ (the same folder in a normal run).
        "LOG=$(realpath -m {log}); mkdir -p paper && cd paper && TEXINPUTS=.:{params.src}//: "
        "latexmk -g -pdf -interaction=nonstopmode -halt-on-error -file-line-error -outdir=. "
        "{params.src}/report.tex > $LOG 2>&1 "
        "&& ! grep -E 'There were undefined references|Reference .* undefined|Citation .* undefined' report.log"
