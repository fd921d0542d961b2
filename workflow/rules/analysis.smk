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
    # All cores: timings are taken with nothing else running.
    threads: workflow.cores
    conda:
        "../../envs/seqmix.yaml"
    shell:
        "python -m seqmix complexity --config {params.cfg:q} --threads {threads} "
        "--out {output.csv} --fit-out {output.fit} > {log} 2>&1"


rule sparsity:
    input:
        lambda w: all_runs("model.pt", task=config["analysis"]["sparsity"]["task"]),
    output:
        f"{RESULTS}/analysis/sparsity.csv",
    params:
        cfg=lambda w: analysis_config("sparsity"),
    log:
        f"{RESULTS}/logs/analysis/sparsity.log",
    threads: 1
    conda:
        "../../envs/seqmix.yaml"
    shell:
        "python -m seqmix sparsity --config {params.cfg:q} --threads {threads} --out {output} > {log} 2>&1"


rule sparsity_analytic:
    output:
        f"{RESULTS}/analysis/sparsity_analytic.csv",
    params:
        cfg=lambda w: analysis_config("sparsity_analytic"),
    log:
        f"{RESULTS}/logs/analysis/sparsity_analytic.log",
    threads: 1
    conda:
        "../../envs/seqmix.yaml"
    shell:
        "python -m seqmix sparsity-analytic --config {params.cfg:q} --out {output} > {log} 2>&1"


rule geometry:
    # Every run of the task (the command keeps the Grassmann and TSSA ones), as for sparsity.
    input:
        lambda w: all_runs("model.pt", task=config["analysis"]["geometry"]["task"]),
    output:
        f"{RESULTS}/analysis/geometry.csv",
    params:
        cfg=lambda w: analysis_config("geometry"),
    log:
        f"{RESULTS}/logs/analysis/geometry.log",
    threads: 1
    conda:
        "../../envs/seqmix.yaml"
    shell:
        "python -m seqmix geometry --config {params.cfg:q} --threads {threads} --out {output} > {log} 2>&1"
