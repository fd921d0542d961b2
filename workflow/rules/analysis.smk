# Analyses: cost vs sequence length and Su's closed forms (need no training); Su's sparsity
# and the Grassmann/TSSA geometry of trained models. `snakemake --cores all analysis` builds
# every CSV; each module's docstring documents its CSV's columns.
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


rule complexity:
    output:
        csv=f"{RESULTS}/analysis/complexity.csv",
        fit=f"{RESULTS}/analysis/complexity_fit.csv",
        growth=f"{RESULTS}/analysis/complexity_growth.csv",
    params:
        cfg=lambda w: analysis_config("complexity"),
    log:
        f"{RESULTS}/logs/analysis/complexity.log",
    benchmark:
        benchmark_file("complexity")
    resources:
        mem_mb=resources_of("complexity").mem_mb,
        runtime=resources_of("complexity").runtime,
    # All cores: timings are taken with nothing else running; first, so that it does not
    # wait for a moment when both cores are free at the end of the DAG. The claims are
    # decided on the counts (deterministic); the timings are supporting evidence.
    # One core: counting FLOPs and bytes is Python-bound (fake tensors), so it runs beside
    # a training job; its wall times are shown beside the counts and decide nothing.
    threads: 1
    priority: 100
    conda:
        "../../envs/seqmix.yaml"
    shell:
        "python -m seqmix complexity --config {params.cfg:q} --threads {threads} "
        "--out {output.csv:q} --fit-out {output.fit:q} --growth-out {output.growth:q} > {log:q} 2>&1"


rule throughput:
    # Training tokens/s of every causal mixer's LM beside softmax (seqmix/bench/throughput.py).
    output:
        f"{RESULTS}/analysis/throughput.csv",
    params:
        cfg=lambda w: analysis_config("throughput"),
    log:
        f"{RESULTS}/logs/analysis/throughput.log",
    benchmark:
        benchmark_file("throughput")
    resources:
        mem_mb=resources_of("throughput").mem_mb,
        runtime=resources_of("throughput").runtime,
    # One thread (analysis.throughput.threads, 1 by default): the table is tokens/s per core.
    # Whatever runs on the other cores loads every architecture alike, because the rounds
    # interleave them and the ratios to softmax are taken within a round.
    threads: 1
    conda:
        "../../envs/seqmix.yaml"
    shell:
        "python -m seqmix bench throughput --config {params.cfg:q} --quiet --out {output:q} > {log:q} 2>&1"


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
    benchmark:
        benchmark_file("sparsity_run", "{task}", "{arch}", "seed{seed}")
    resources:
        mem_mb=resources_of("sparsity_run").mem_mb,
        runtime=resources_of("sparsity_run").runtime,
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
    benchmark:
        benchmark_file("sparsity")
    resources:
        mem_mb=resources_of("small").mem_mb,
        runtime=resources_of("small").runtime,
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
    benchmark:
        benchmark_file("sparsity_analytic")
    resources:
        mem_mb=resources_of("small").mem_mb,
        runtime=resources_of("small").runtime,
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
    benchmark:
        benchmark_file("geometry")
    resources:
        mem_mb=resources_of("geometry").mem_mb,
        runtime=resources_of("geometry").runtime,
    threads: 1
    conda:
        "../../envs/seqmix.yaml"
    shell:
        "python -m seqmix geometry --config {params.cfg:q} --threads {threads} --out {output:q} > {log:q} 2>&1"
