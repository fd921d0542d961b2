# Analyses: cost vs sequence length and Su's closed forms (need no training); Su's sparsity
# and the Grassmann/TSSA geometry of trained models; the copy probe (its own small models,
# where the study has an MQAR task). `snakemake --cores all analysis` builds every CSV; each
# module's docstring documents its CSV's columns.
rule analysis:
    localrule: True
    input:
        f"{RESULTS}/analysis/complexity.csv",
        f"{RESULTS}/analysis/complexity_fit.csv",
        f"{RESULTS}/analysis/complexity_growth.csv",
        f"{RESULTS}/analysis/sparsity.csv",
        f"{RESULTS}/analysis/sparsity_analytic.csv",
        f"{RESULTS}/analysis/geometry.csv",
        f"{RESULTS}/analysis/throughput.csv",
        [f"{RESULTS}/analysis/copy_probe.csv"] if JOBS.has_analysis("copy_probe") else [],


rule complexity:
    output:
        csv=f"{RESULTS}/analysis/complexity.csv",
        fit=f"{RESULTS}/analysis/complexity_fit.csv",
        growth=f"{RESULTS}/analysis/complexity_growth.csv",
    params:
        spec=lambda w: JOBS.spec("complexity"),
        code=JOBS.code_digest("complexity"),
    log:
        log_file("complexity"),
    benchmark:
        benchmark_file("complexity")
    resources:
        **resources_of("complexity"),
    # One core, and first: counting FLOPs and bytes is Python-bound (fake tensors), so it
    # runs beside the training jobs from the start instead of after them. The claims are
    # decided on the counts (deterministic); its wall times are shown and decide nothing.
    threads: 1
    priority: 100
    conda:
        "../../envs/seqmix.yaml"
    shell:
        "python -m seqmix complexity --spec {params.spec:q} --threads {threads} "
        "--out {output.csv:q} --fit-out {output.fit:q} --growth-out {output.growth:q} > {log:q} 2>&1"


rule throughput:
    # Training tokens/s of every causal mixer's LM beside softmax (seqmix/analysis/throughput.py).
    output:
        f"{RESULTS}/analysis/throughput.csv",
    params:
        spec=lambda w: JOBS.spec("throughput"),
        code=JOBS.code_digest("throughput"),
    log:
        log_file("throughput"),
    benchmark:
        benchmark_file("throughput")
    resources:
        **resources_of("throughput"),
    # One thread (analysis.throughput.threads, 1 by default): the table is tokens/s per core.
    # Whatever runs on the other cores loads every architecture alike, because the rounds
    # interleave them and the ratios to softmax are taken within a round.
    threads: 1
    conda:
        "../../envs/seqmix.yaml"
    shell:
        "python -m seqmix throughput --spec {params.spec:q} --quiet --out {output:q} > {log:q} 2>&1"


SPARSITY_RUN = f"{RESULTS}/analysis/sparsity/{RUN}.csv"


rule sparsity_run:
    # One job per trained run, so the Jacobians are computed while other runs still train.
    input:
        model=run_file("model.pt"),
    output:
        SPARSITY_RUN,
    params:
        spec=lambda w: JOBS.sparsity_spec(w.task, w.arch, w.seed),
        code=JOBS.code_digest("sparsity_run"),
    log:
        log_file("sparsity_run", RUN),
    benchmark:
        benchmark_file("sparsity_run", RUN)
    resources:
        **resources_of("sparsity_run"),
    threads: 1
    conda:
        "../../envs/seqmix.yaml"
    shell:
        "python -m seqmix sparsity --spec {params.spec:q} --threads {threads} --out {output:q} > {log:q} 2>&1"


rule sparsity:
    input:
        [SPARSITY_RUN.format(task=t, arch=a, seed=s) for t, a, s in JOBS.sparsity_runs()],
    output:
        f"{RESULTS}/analysis/sparsity.csv",
    params:
        code=JOBS.code_digest("concat"),
    log:
        log_file("sparsity"),
    benchmark:
        benchmark_file("sparsity")
    resources:
        **resources_of("small"),
    conda:
        "../../envs/seqmix.yaml"
    shell:
        "python -m seqmix concat {input:q} --out {output:q} > {log:q} 2>&1"


rule sparsity_analytic:
    output:
        f"{RESULTS}/analysis/sparsity_analytic.csv",
    params:
        spec=lambda w: JOBS.spec("sparsity_analytic"),
        code=JOBS.code_digest("sparsity_analytic"),
    log:
        log_file("sparsity_analytic"),
    benchmark:
        benchmark_file("sparsity_analytic")
    resources:
        **resources_of("small"),
    threads: 1
    conda:
        "../../envs/seqmix.yaml"
    shell:
        "python -m seqmix sparsity-analytic --spec {params.spec:q} --out {output:q} > {log:q} 2>&1"


rule geometry:
    # Every run of the task (the command keeps those whose mixer has a geometry).
    input:
        models=JOBS.run_files("model.pt", JOBS.geometry_runs()),
    output:
        f"{RESULTS}/analysis/geometry.csv",
    params:
        spec=lambda w: JOBS.spec("geometry"),
        code=JOBS.code_digest("geometry"),
    log:
        log_file("geometry"),
    benchmark:
        benchmark_file("geometry")
    resources:
        **resources_of("geometry"),
    threads: 1
    conda:
        "../../envs/seqmix.yaml"
    shell:
        "python -m seqmix geometry --spec {params.spec:q} --threads {threads} --out {output:q} > {log:q} 2>&1"


if JOBS.has_analysis("copy_probe"):

    rule copy_probe:
        # Can each mixer copy the previous token? Fresh models built as the MQAR task builds
        # its own, trained on random tokens (seqmix/analysis/copy_probe.py); no run needed.
        output:
            f"{RESULTS}/analysis/copy_probe.csv",
        params:
            spec=lambda w: JOBS.spec("copy_probe"),
            code=JOBS.code_digest("copy_probe"),
        log:
            log_file("copy_probe"),
        benchmark:
            benchmark_file("copy_probe")
        resources:
            **resources_of("copy_probe"),
        threads: 1
        conda:
            "../../envs/seqmix.yaml"
        shell:
            "python -m seqmix copy-probe --spec {params.spec:q} --threads {threads} --out {output:q} > {log:q} 2>&1"
