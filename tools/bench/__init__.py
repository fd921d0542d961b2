"""The kernel and GPU checks (``python -m tools.bench <command>``, from the checkout's root).

``kernels``: the bare fused Triton ops against their references on a GPU
(``results/bench/<gpu>/kernels.csv``); ``gpu-check``: everything one GPU can tell in 8
minutes (``make gpu-check``); ``steps``: a paper-shape training step of this checkout beside
an earlier revision. The compile check (``python -m tools.bench.compile_check``, ``make
kernels-compile``) and the packing measurement (``python -m tools.bench.packing``,
scripts/gpu-headline.sh) have command lines of their own. The throughput of training, which
the report reads, is a pipeline step: ``seqmix.analysis.throughput``.
"""
