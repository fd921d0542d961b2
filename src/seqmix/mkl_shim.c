/* oneMKL's shim: the small library every process of `numerics: portable` loads before torch,
   so that oneMKL computes the same bits on any vendor's x86-64 CPU. seqmix/mkl_shim.py builds
   it with the machine's C compiler, checks it and loads it. This comment is the one place that
   says what it answers and why; the other pages point here.

   oneMKL's vendor check, answered as on an Intel CPU. oneMKL picks its code from the CPU's
   instruction sets and from its vendor: its conditional numerical reproducibility (CNR)
   branches other than AUTO and COMPATIBLE exist on Intel CPUs only, and elsewhere
   MKL_CBWR=AVX2 silently runs AUTO (oneMKL developer guide, "Getting Started with Conditional
   Numerical Reproducibility"). The vendor comes from three functions of oneMKL's service
   layer, which the PyTorch wheel's statically linked oneMKL exports and calls through the
   dynamic linker; this library answers them as on an Intel CPU (where that is the true
   answer), so that the AVX2 branch runs on any vendor's CPU. They are oneMKL's internals, not
   an interface Intel supports: a oneMKL that renamed them would ignore the answer. Nothing
   fails then, but the process reports oneMKL's branch AUTO
   (seqmix.train.provenance.numerics_record), its runs are recorded as not pinned, the report
   flags them, and tests/core/test_numerics.py fails on such a host.

   oneMKL's square root, made IEEE's. torch.sqrt is IEEE's square root; ATen computes it with
   oneMKL's vector math (vmsSqrt), whose AVX2 kernel refines the CPU's approximate vrsqrtps.
   That instruction's results differ between vendors, and the refined square root is not
   correctly rounded for some inputs below 2^-102, which ones depending on the approximation
   (docs/investigations/numerics-probe.md). AdamW takes the square root of every parameter's second moment at
   every step: one that small would round otherwise on another vendor's CPU. Here vmsSqrt is
   the correctly rounded one, which every x86-64 CPU computes alike.

   Both take effect because a library that defines these functions and sits in the process's
   global scope before torch loads libtorch_cpu is found first (the global scope is searched
   before a library's own definitions). */

int mkl_serv_intel_cpu_true(void) { return 1; }
int mkl_serv_intel_cpu(void) { return 1; }
int mkl_serv_cpuiszen(void) { return 0; }

/* tools/numerics_probe.py builds the vendor answer alone (oneMKL's own square root on its
   AVX2 branch), with SEQMIX_VENDOR_CHECK_ONLY defined. */
#ifndef SEQMIX_VENDOR_CHECK_ONLY
#include <math.h>

/* n: MKL_INT of the LP64 interface, as ATen calls it for torch.sqrt. */
void vmsSqrt(int n, const float *a, float *r, long long mode) {
  (void)mode;
  for (int i = 0; i < n; ++i) r[i] = sqrtf(a[i]);
}
#endif
