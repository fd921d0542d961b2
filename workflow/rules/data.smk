# Data: the tokenizer, then each task's prepared files with a manifest (sha256 + counts).
# The points of a sweep share their task's data (its "group").
rule data_tokenizer:
    input:
        code=JOBS.code("tokenizer"),
    output:
        JOBS.tokenizer_file("manifest.json"),
        JOBS.tokenizer_file("tokenizer.json"),
    params:
        spec=lambda w: JOBS.tokenizer_spec(),
    log:
        log_file("data_tokenizer"),
    benchmark:
        benchmark_file("data_tokenizer")
    resources:
        **resources_of("data"),
    conda:
        "../../envs/seqmix.yaml"
    shell:
        "python -m seqmix data tokenizer --spec {params.spec:q} > {log:q} 2>&1"


rule data_task:
    input:
        tokenizer=lambda w: [JOBS.tokenizer_file("manifest.json")] if JOBS.needs_tokenizer(w.group) else [],
        code=lambda w: JOBS.code("data", w.group),
    output:
        JOBS.data_file("manifest.json"),
    params:
        spec=lambda w: JOBS.data_spec(w.group),
    log:
        log_file("data_task", "{group}"),
    benchmark:
        benchmark_file("data_task", "{group}")
    resources:
        **resources_of("data"),
    conda:
        "../../envs/seqmix.yaml"
    shell:
        "python -m seqmix data {wildcards.group:q} --spec {params.spec:q} > {log:q} 2>&1"
