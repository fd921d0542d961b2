# Analyses: cost vs sequence length and Su's closed forms (need no training); Su's sparsity
# and the Grassmann/TSSA geometry of trained models. `snakemake --cores all analysis` builds
# every CSV; each module's docstring documents its CSV's columns.
rule analysis:
    input:
        f"{RESULTS}/analysis/complexity.csv",
        f"{RESULTS}/analysis/complexity_fit.csv",
        f"{RESULTS}/analysis/sparsity.csv",
        f"{RESULTS}/analysis/sparsity_analytic.csv",
        f"{RESULTS}/analysis/geometry.csv",


rule complexity:
    output:
        csv=f"{RESULTS}/analysis/complexity.csv",
        fit=f"{RESULTS}/analysis/complexity_fit.csv",
    params:
        cfg=lambda w: analysis_config("complexity"),
    log:
        f"{RESULTS}/logs/analysis/complexity.log",
    resources:
        **job_resources("complexity"),
    # All cores: timings are taken with nothing else running; first, so that it does not
    # wait for a moment when both cores are free at the end of the DAG.
    threads: workflow.cores
    priority: 100
    conda:
        "../../envs/seqmix.yaml"
    shell:
        "python -m seqmix complexity --config {params.cfg:q} --threads {threads} "
        "--out {output.csv:q} --fit-out {output.fit:q} > {log:q} 2>&1"


rule sparsity_run:
    # One job per trained run, so the Jacobians are computed while other runs still train.
    input:
        f"{RESULTS}/runs/{{task}}/{{arch}}/seed{{seed}}/model.pt",
    output:
        f"{RESULTS}/analysis/sparsity/{{task}}/{{arch}}/seed{{seed}}.csv",
    params:
        cfg=lambda w: analysis_config("sparsity"),
        run=lambda w: run_path(w.task, w.arch, w.seed, ""),
    log:
        f"{RESULTS}/logs/analysis/sparsity/{{task}}/{{arch}}/seed{{seed}}.log",
    resources:
        **job_resources("sparsity_run"),
    threads: 1
    conda:
        "../../envs/seqmix.yaml"
    shell:
        "python -m seqmix sparsity --config {params.cfg:q} --threads {threads} "
        "--run {params.run:q} --out {output:q} > {log:q} 2>&1"


rule sparsity:
    input:
        lambda w: [f"{RESULTS}/analysis/sparsity/{t}/{a}/seed{s}.csv" for t, a, s in sparsity_runs(STUDY)],
    output:
        f"{RESULTS}/analysis/sparsity.csv",
    log:
        f"{RESULTS}/logs/analysis/sparsity.log",
    resources:
        **job_resources("summary"),
    conda:
        "../../envs/seqmix.yaml"
    shell:
        "python -m seqmix concat {input:q} --out {output:q} > {log:q} 2>&1"


rule sparsity_analytic:
    output:
        f"{RESULTS}/analysis/sparsity_analytic.csv",
    params:
        cfg=lambda w: analysis_config("sparsity_analytic"),
    log:
        f"{RESULTS}/logs/analysis/sparsity_analytic.log",
    resources:
        **job_resources("summary"),
    threads: 1
    conda:
        "../../envs/seqmix.yaml"
    shell:
        "python -m seqmix sparsity-analytic --config {params.cfg:q} --out {output:q} > {log:q} 2>&1"


rule geometry:
    # Every run of the task (the command keeps those whose mixer has a geometry).
    input:
        lambda w: all_runs("model.pt", among=geometry_runs(STUDY)),
    output:
        f"{RESULTS}/analysis/geometry.csv",
    params:
        cfg=lambda w: analysis_config("geometry"),
    log:
        f"{RESULTS}/logs/analysis/geometry.log",
    resources:
        **job_resources("geometry"),
    threads: 1
    conda:
        "../../envs/seqmix.yaml"
    shell:
        "python -m seqmix geometry --config {params.cfg:q} --threads {threads} --out {output:q} > {log:q} 2>&1"
