"""Fast paths beside the mixers' references, importable as ``seqmix.kernels`` (through the
link src/seqmix/kernels). Each is declared once, by the mixer module that runs it, with the
reference it equals and the test comparing them (``seqmix.mixers.base.kernel``);
``seqmix.mixers.declared_kernels()`` lists them all.

The forms: Triton kernels for CUDA tensors (each a ``torch.autograd.Function`` or
``torch.library`` op behind one function with its reference's signature; on a CPU they run
under ``TRITON_INTERPRET=1``, set before they are imported: slow, exact, and how
tests/kernels/test_kernels.py checks them), Mamba's fused C++ scan for CPU tensors, and vectorised
PyTorch forms: those with hand-written backwards (H3's, the scans) and GLA's chunked forms,
the Triton kernel's algorithm in PyTorch. Mixers reach them through
``seqmix.mixers.dispatch`` (Triton, C++) or call them (PyTorch).

This file holds nothing else: every module of the package imports it, so it is part of the
code of every run that takes a kernel (seqmix.sources), and triton is imported by the
submodules only, so that CPU-only users can ``import seqmix`` without it.
"""
