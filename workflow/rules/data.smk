# Data: the tokenizer, then each task's prepared files with a manifest (sha256 + counts).
# The points of a sweep share their task's data (its "group").
rule data_tokenizer:
    output:
        f"{DATA}/tokenizer/manifest.json",
        f"{DATA}/tokenizer/tokenizer.json",
    params:
        spec=lambda w: tokenizer_job(STUDY).model_dump_json(),
    log:
        f"{RESULTS}/logs/data/tokenizer.log",
    benchmark:
        benchmark_file("data_tokenizer")
    resources:
        mem_mb=resources_of("data").mem_mb,
        runtime=resources_of("data").runtime,
    conda:
        "../../envs/seqmix.yaml"
    shell:
        "python -m seqmix data tokenizer --spec {params.spec:q} > {log:q} 2>&1"


rule data_task:
    input:
        data_inputs,
    output:
        f"{DATA}/{{group}}/manifest.json",
    params:
        spec=lambda w: data_job(STUDY, w.group).model_dump_json(),
    log:
        f"{RESULTS}/logs/data/{{group}}.log",
    benchmark:
        benchmark_file("data_task", "{group}")
    resources:
        mem_mb=resources_of("data").mem_mb,
        runtime=resources_of("data").runtime,
    conda:
        "../../envs/seqmix.yaml"
    shell:
        "python -m seqmix data {wildcards.group:q} --spec {params.spec:q} > {log:q} 2>&1"
