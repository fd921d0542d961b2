"""Micro-benchmarks (``python -m seqmix bench <what>``): kernels against their references.

Unlike ``seqmix.analysis.complexity`` (whole mixers, CPU or GPU, feeding the report), these
time the bare fused ops on a GPU and write ``results/bench/*.csv``.
"""
