# Training: one job per (task, architecture, seed); then its evaluation on held-out splits.
# The checkpoint (checkpoints/last.pt) is deliberately not an output: Snakemake removes
# the outputs of a killed job, and the rerun resumes from the checkpoint.
# Each training and evaluation job holds one GPU slot (gpu_slots=1; `make` passes
# --resources gpu_slots=<GPUs x SLOTS_PER_GPU>): seqmix.slots pins it to one of the
# machine's GPUs, several jobs to each; on a machine without a GPU it runs the job as is.


# Every run of the study trained and evaluated, and nothing else (no analysis, notebook
# or report): `make paper-headline`'s target, `snakemake runs` for any study.
rule runs:
    localrule: True
    input:
        metrics=JOBS.run_files("metrics.json"),
        evaluations=JOBS.run_files("eval.json"),


rule train:
    input:
        data=lambda w: JOBS.data_file("manifest.json", JOBS.group_of(w.task)),
    output:
        metrics=run_file("metrics.json"),
        model=run_file("model.pt"),
        log_csv=run_file("log.csv"),
        provenance=run_file("provenance.json"),
        config=run_file("config.json"),
        hashes=run_file("hashes.json"),
    params:
        spec=lambda w: JOBS.run_spec(w.task, w.arch, w.seed),
        # The digest of the code that trains it (its mixer's and task's modules, the training
        # loop, what they import): an edit reruns exactly the runs it trains, and what reads
        # them. The command receives it: the run is identified by it, so that a checkpoint made
        # by other code is never resumed (seqmix.train.loop.run_identity).
        code=lambda w: JOBS.code_digest("train", w.task, w.arch),
    log:
        log_file("train", RUN),
    benchmark:
        benchmark_file("train", RUN)
    resources:
        **resources_of("train"),
        gpu_slots=1,
    threads: train_threads
    conda:
        "../../envs/seqmix.yaml"
    shell:
        "python -m seqmix.slots python -m seqmix train --spec {params.spec:q} --code {params.code} > {log:q} 2>&1"


# Seed packs (a task's `train.pack`, seqmix.train.pack): the seeds of one (task, arch) in one
# job, whose outputs are exactly its members' `train` outputs, so that `eval` and everything
# downstream read them unchanged. One rule per members' seeds (a rule's outputs are fixed
# patterns): `train_pack`, or `train_pack_seeds<seeds>` where a study's packs differ in seeds.
# Where a run is a pack's member, its pack's rule makes its files, not `train` (ruleorder). A
# killed pack's outputs are removed; its members' checkpoints are not, and the rerun resumes.
PACKS = JOBS.pack_groups()
for _seeds, _packs in PACKS.items():
    _name = "train_pack" if len(PACKS) == 1 else "train_pack_seeds" + "-".join(map(str, _seeds))
    _members = "pack" + "-".join(map(str, _seeds))

    rule:
        name:
            _name
        input:
            data=lambda w: JOBS.data_file("manifest.json", JOBS.group_of(JOBS.pack(w.pack)["task"])),
        output:
            [JOBS.pack_file(f, s) for s in _seeds
             for f in ("metrics.json", "model.pt", "log.csv", "provenance.json", "config.json", "hashes.json")],
        wildcard_constraints:
            pack=_alternatives(_packs),
        params:
            spec=lambda w: JOBS.pack(w.pack)["spec"],
            # as `train`'s: the pack's code (its runs' and seqmix.train.pack) identifies its members
            code=lambda w: JOBS.code_digest("train_pack", JOBS.pack(w.pack)["task"], JOBS.pack(w.pack)["arch"]),
        log:
            log_file("train_pack", f"{{pack}}/{_members}"),
        benchmark:
            benchmark_file("train_pack", f"{{pack}}/{_members}")
        resources:
            **resources_of("train_pack"),
            gpu_slots=1,
        threads: lambda w: JOBS.threads(JOBS.pack(w.pack)["task"]) or workflow.cores
        conda:
            "../../envs/seqmix.yaml"
        shell:
            "python -m seqmix.slots python -m seqmix train-pack --spec {params.spec:q} --code {params.code} > {log:q} 2>&1"

    workflow.ruleorder(_name, "train")


rule eval:
    input:
        metrics=run_file("metrics.json"),
        model=run_file("model.pt"),
    output:
        run_file("eval.json"),
    params:
        run=lambda w: run_file("", w.task, w.arch, w.seed),  # the run directory
        code=lambda w: JOBS.code_digest("eval", w.task, w.arch),
    log:
        log_file("eval", RUN),
    benchmark:
        benchmark_file("eval", RUN)
    resources:
        **resources_of("eval"),
        gpu_slots=1,
    threads: train_threads
    conda:
        "../../envs/seqmix.yaml"
    shell:
        "python -m seqmix.slots python -m seqmix eval --run {params.run:q} > {log:q} 2>&1"


rule collect:
    input:
        runs=JOBS.run_files("metrics.json") + JOBS.run_files("eval.json"),
        recorded=JOBS.recorded_files(),  # of the studies `recordings` names: their runs are rows too
    output:
        runs=f"{RESULTS}/summary/runs.csv",
        breakdown=f"{RESULTS}/summary/breakdown.csv",
        recordings=f"{RESULTS}/summary/recordings.json",
    params:
        spec=lambda w: JOBS.spec("collect"),
        code=JOBS.code_digest("collect"),  # the code that makes the rows: a column added there rewrites runs.csv
    log:
        log_file("collect"),
    benchmark:
        benchmark_file("collect")
    resources:
        **resources_of("small"),
    conda:
        "../../envs/seqmix.yaml"
    shell:
        "python -m seqmix collect --spec {params.spec:q} --out {output.runs:q} "
        "--breakdown-out {output.breakdown:q} > {log:q} 2>&1"
