# Report: each notebook (papermill) writes its figures and tables; latexmk builds the PDF.
# Any figure or table is a target of its own: `snakemake --cores all paper/figures/<name>.pdf`.
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
        benchmark:
            benchmark_file("notebook", _name)
        resources:
            mem_mb=resources_of("notebook").mem_mb,
            runtime=resources_of("notebook").runtime,
        conda:
            "../../envs/seqmix.yaml"
        shell:
            "papermill --log-output -k python3 {input.notebook:q} {output.executed:q} "
            "{params.papermill} > {log:q} 2>&1"


REPORT_SOURCES = [str(p) for p in sorted((SRC / "paper").glob("*.tex"))] + [
    str(p) for p in sorted((SRC / "paper" / "sections").glob("*.tex"))
]


rule report:
    input:
        main=str(SRC / "paper" / "report.tex"),
        sources=REPORT_SOURCES,
        generated=[f for name in NOTEBOOKS for f in notebook_outputs(name)],
    output:
        report("paper/report.pdf", caption=str(SRC / "workflow" / "report" / "report.rst"), category="report"),
    params:
        # The sources' folder; with // TeX searches its subfolders (sections/) too.
        texinputs=lambda w, input: str(Path(input.main).parent) + "//",
    log:
        f"{RESULTS}/logs/report.log",
    benchmark:
        benchmark_file("report")
    resources:
        mem_mb=resources_of("report").mem_mb,
        runtime=resources_of("report").runtime,
    # The Python side of the environment; latexmk and TeX Live come from the system (the
    # Makefile installs Debian's packages), in a conda run too.
    conda:
        "../../envs/seqmix.yaml"
    shell:
        # TEXINPUTS lets the sources in the repository find the generated figures and
        # tables in this working directory's paper/ (the same folder in a normal run).
        "LOG=$(realpath -m {log:q}); mkdir -p paper && cd paper && TEXINPUTS=.:{params.texinputs:q}: "
        "latexmk -g -pdf -interaction=nonstopmode -halt-on-error -file-line-error -outdir=. "
        "{input.main:q} > \"$LOG\" 2>&1 "
        "&& ! grep -E 'There were undefined references|Reference .* undefined|Citation .* undefined' report.log"
