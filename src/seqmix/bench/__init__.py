"""Benchmarks (``python -m seqmix bench <what>``).

``kernels``: the bare fused Triton ops against their references on a GPU
(``results/bench/*.csv``). ``throughput``: training tokens/s of every causal mixer's
language model beside softmax, on the machine at hand (``results/analysis/throughput.csv``,
read by the report's "cost in practice"). Unlike ``seqmix.analysis.complexity`` (one
mixer layer against L), these time what a user runs.
"""
