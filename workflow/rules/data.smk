# Data: the tokenizer, then each task's prepared files with a manifest (sha256 + counts).
# The points of a sweep share their task's data (its "group").
rule data_tokenizer:
    output:
        JOBS.tokenizer_file("manifest.json"),
        JOBS.tokenizer_file("tokenizer.json"),
    params:
        spec=lambda w: JOBS.tokenizer_spec(),
        code=JOBS.code_digest("tokenizer"),  # the digest of its code: see Jobs.code_digest
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
    output:
        JOBS.data_file("manifest.json"),
    params:
        spec=lambda w: JOBS.data_spec(w.group),
        code=lambda w: JOBS.code_digest("data", w.group),
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
