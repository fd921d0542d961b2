# Analyses: cost vs sequence length (needs no training) and Su's sparsity of trained models.


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
