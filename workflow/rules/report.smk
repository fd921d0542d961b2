# Report: each notebook (papermill) writes its figures and tables; latexmk builds the PDF.
# All of it lives in the study's own folder, REPORT (<results_dir>/report), so that another
# study's report is never taken for this one's. Any figure or table is a target of its own:
# `snakemake --cores all results/report/figures/<name>.pdf` (the quick study's).
# The notebooks' rules come from notebooks/outputs.yaml (NOTEBOOKS: seqmix.study.dag.Notebook).
for _name, _nb in NOTEBOOKS.items():

    rule:
        name:
            f"notebook_{_name}"
        input:
            _nb.inputs,
        output:
            outputs=flagged_for_report(_nb),
            executed=f"{RESULTS}/notebooks/{_name}.ipynb",
        params:
            notebook=str(REPO / "notebooks" / f"{_name}.ipynb"),
            papermill=_nb.papermill_args(),
            # The digest of its code: its cells and the modules they import, transitively
            # (seqmix.sources); an edit to any (a comment included) reruns it.
            code=_nb.code,
        log:
            log_file("notebook", _name),
        benchmark:
            benchmark_file("notebook", _name)
        resources:
            **resources_of("notebook"),
        conda:
            "../../envs/seqmix.yaml"
        # papermill waits 60 s for the kernel to answer by default; on a loaded machine (two
        # jobs and a test session on 2 cores) a kernel took longer, and the job failed with
        # "Kernel didn't respond in 60 seconds". It waits up to the job's runtime (minutes) instead.
        shell:
            "papermill --log-output --start-timeout $(({resources.runtime} * 60)) -k python3 "
            "{params.notebook:q} {output.executed:q} "
            "{params.papermill} > {log:q} 2>&1"


REPORT_TEX = [str(p) for p in sorted((REPO / "paper").glob("*.tex"))] + [
    str(p) for p in sorted((REPO / "paper" / "sections").glob("*.tex"))
]


rule report:
    input:
        main=str(REPO / "paper" / "report.tex"),
        tex=REPORT_TEX,
        generated=[f for nb in NOTEBOOKS.values() for f in nb.outputs],
    output:
        report(f"{REPORT}/report.pdf", caption=str(REPO / "workflow" / "report" / "report.rst"), category="report"),
    params:
        # The LaTeX files' folder; with // TeX searches its subfolders (sections/) too.
        texinputs=lambda w, input: str(Path(input.main).parent) + "//",
        folder=lambda w, output: str(Path(output[0]).parent),
    log:
        log_file("report"),
    benchmark:
        benchmark_file("report")
    resources:
        **resources_of("report"),
    # The Python side of the environment; latexmk and TeX Live come from the system (the
    # Makefile installs Debian's packages), in a conda run too.
    conda:
        "../../envs/seqmix.yaml"
    shell:
        # Built in the study's report folder, where the notebooks wrote figures/ and tables/;
        # TEXINPUTS lets it find the LaTeX files in the repository's paper/.
        "LOG=$(realpath -m {log:q}); cd {params.folder:q} && TEXINPUTS=.:{params.texinputs:q}: "
        "latexmk -g -pdf -interaction=nonstopmode -halt-on-error -file-line-error -outdir=. "
        "{input.main:q} > \"$LOG\" 2>&1 "
        "&& ! grep -E 'There were undefined references|Reference .* undefined|Citation .* undefined' report.log"


rule latest_report:
    # paper/report.pdf: a copy of the report of the last study run to its end (rule all).
    # The copied file's path is a parameter so that switching studies copies again even where
    # the other study's report is older than the copy (Snakemake reruns a job whose params
    # changed).
    localrule: True
    input:
        f"{REPORT}/report.pdf",
    output:
        "paper/report.pdf",
    params:
        of=lambda w, input: input[0],
    log:
        log_file("latest_report"),
    benchmark:
        benchmark_file("latest_report")
    # A file copy: fixed sizes, not the config's (no study needs to size it).
    resources:
        mem_mb=100,
        runtime=1,
    conda:
        "../../envs/seqmix.yaml"
    shell:
        "cp {params.of:q} {output:q} > {log:q} 2>&1"
