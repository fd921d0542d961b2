"""The maintainer's tools: what checks the kernels, the GPUs and the study's costs, kept out
of the library (src/seqmix: what the pipeline and a user's commands run). Run from the
checkout's root, which puts ``tools`` on the path: ``python -m tools.bench <command>``, or
a script such as ``python tools/mamba_mqar.py``."""
