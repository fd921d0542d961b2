# Training: one job per (task, architecture, seed); then its evaluation on held-out splits.
# The checkpoint (checkpoints/last.pt) is deliberately not an output: Snakemake removes
# the outputs of a killed job, and the rerun resumes from the checkpoint.
rule train:
    input:
        lambda w: f"{DATA}/{group_of(w.task)}/manifest.json",
    output:
        metrics=f"{RESULTS}/runs/{{task}}/{{arch}}/seed{{seed}}/metrics.json",
        model=f"{RESULTS}/runs/{{task}}/{{arch}}/seed{{seed}}/model.pt",
        log_csv=f"{RESULTS}/runs/{{task}}/{{arch}}/seed{{seed}}/log.csv",
        provenance=f"{RESULTS}/runs/{{task}}/{{arch}}/seed{{seed}}/provenance.json",
        config=f"{RESULTS}/runs/{{task}}/{{arch}}/seed{{seed}}/config.json",
    params:
        spec=lambda w: run_spec(STUDY, w.task, w.arch, int(w.seed)).model_dump_json(),
    log:
        f"{RESULTS}/logs/train/{{task}}/{{arch}}/seed{{seed}}.log",
    benchmark:
        benchmark_file("train", "{task}", "{arch}", "seed{seed}")
    resources:
        mem_mb=lambda w: task_resources("train")(w).mem_mb,
        runtime=lambda w: task_resources("train")(w).runtime,
    threads: train_threads
    conda:
        "../../envs/seqmix.yaml"
    shell:
        "python -m seqmix train --spec {params.spec:q} > {log:q} 2>&1"


rule eval:
    input:
        metrics=f"{RESULTS}/runs/{{task}}/{{arch}}/seed{{seed}}/metrics.json",
        model=f"{RESULTS}/runs/{{task}}/{{arch}}/seed{{seed}}/model.pt",
    output:
        f"{RESULTS}/runs/{{task}}/{{arch}}/seed{{seed}}/eval.json",
    params:
        run=lambda w: run_path(w.task, w.arch, w.seed, ""),
    log:
        f"{RESULTS}/logs/eval/{{task}}/{{arch}}/seed{{seed}}.log",
    benchmark:
        benchmark_file("eval", "{task}", "{arch}", "seed{seed}")
    resources:
        mem_mb=lambda w: task_resources("eval")(w).mem_mb,
        runtime=lambda w: task_resources("eval")(w).runtime,
    threads: train_threads
    conda:
        "../../envs/seqmix.yaml"
    shell:
        "python -m seqmix eval --run {params.run:q} > {log:q} 2>&1"


rule collect:
    input:
        all_runs("metrics.json") + all_runs("eval.json"),
    output:
        runs=f"{RESULTS}/summary/runs.csv",
        breakdown=f"{RESULTS}/summary/breakdown.csv",
    params:
        cfg=lambda w: study_config(),
    log:
        f"{RESULTS}/logs/collect.log",
    benchmark:
        benchmark_file("collect")
    resources:
        mem_mb=resources_of("small").mem_mb,
        runtime=resources_of("small").runtime,
    conda:
        "../../envs/seqmix.yaml"
    shell:
        "python -m seqmix collect --config {params.cfg:q} --out {output.runs:q} "
        "--breakdown-out {output.breakdown:q} > {log:q} 2>&1"
