# Data: the tokenizer, then each task's prepared files with a manifest (sha256 + counts).


rule data_tokenizer:
    output:
        f"{DATA}/tokenizer/manifest.json",
        f"{DATA}/tokenizer/tokenizer.json",
    params:
        spec=lambda w: as_json(data_spec(config, "tokenizer")),
    log:
        f"{RESULTS}/logs/data/tokenizer.log",
    conda:
        "../../envs/seqmix.yaml"
    shell:
        "python -m seqmix data tokenizer --spec {params.spec:q} > {log} 2>&1"


def data_inputs(w):
    return [] if w.task == "mqar" else [f"{DATA}/tokenizer/manifest.json"]


rule data_task:
    input:
        data_inputs,
    output:
        f"{DATA}/{{task}}/manifest.json",
    params:
        spec=lambda w: as_json(data_spec(config, w.task)),
    log:
        f"{RESULTS}/logs/data/{{task}}.log",
    conda:
        "../../envs/seqmix.yaml"
    shell:
        "python -m seqmix data {wildcards.task} --spec {params.spec:q} > {log} 2>&1"
