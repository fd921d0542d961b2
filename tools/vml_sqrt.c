/* oneMKL's single-precision square root on its AVX2 branch (mkl_vml_kernel_sSqrt_L9HAynn, as
   `objdump -d` shows it in the PyTorch wheel's libtorch_cpu.so, oneMKL 2024.2), recomputed from
   three first approximations of 1/sqrt(x): this CPU's vrsqrtps (what oneMKL uses), AVX-512's
   vrsqrt14ps (another approximation within vrsqrtps's error bound, as another vendor's
   vrsqrtps is) and 1/sqrt(x) rounded to float. Prints, over every positive normal float, how
   many each rounds otherwise than the correctly rounded square root, and how many differ from
   the vrsqrtps one. Built and run by tools/numerics_probe.py (needs AVX-512F for vrsqrt14ps):
       cc -O2 -mavx2 -mfma -mavx512f tools/vml_sqrt.c -lm */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* The kernel's refinement: one Newton step on s = x*y and h = y/2, then s + h*(x - s*s). */
static inline __m256 refine(__m256 x, __m256 y) {
  const __m256 half = _mm256_set1_ps(0.5f);
  __m256 s = _mm256_mul_ps(x, y), h = _mm256_mul_ps(y, half);
  __m256 e = _mm256_fnmadd_ps(s, h, half);
  s = _mm256_fmadd_ps(s, e, s);
  h = _mm256_fmadd_ps(h, e, h);
  __m256 r = _mm256_fnmadd_ps(s, s, x);
  return _mm256_fmadd_ps(h, r, s);
}

int main(void) {
  long n = 0, wrong[3] = {0, 0, 0}, other[3] = {0, 0, 0};
  for (uint32_t b = 0x00800000u; b < 0x7F800000u; b += 8) {
    float x[8], exact[8], inverse[8], out[3][8];
    for (int i = 0; i < 8; ++i) {
      uint32_t bits = b + i;
      memcpy(&x[i], &bits, 4);
      exact[i] = (float)sqrt((double)x[i]);  /* correctly rounded: sqrt of a float is exact enough in double */
      inverse[i] = (float)(1.0 / sqrt((double)x[i]));
    }
    __m256 v = _mm256_loadu_ps(x);
    _mm256_storeu_ps(out[0], refine(v, _mm256_rsqrt_ps(v)));
    _mm256_storeu_ps(out[1], refine(v, _mm512_castps512_ps256(_mm512_rsqrt14_ps(_mm512_castps256_ps512(v)))));
    _mm256_storeu_ps(out[2], refine(v, _mm256_loadu_ps(inverse)));
    for (int i = 0; i < 8; ++i, ++n)
      for (int k = 0; k < 3; ++k) {
        wrong[k] += memcmp(&out[k][i], &exact[i], 4) != 0;
        other[k] += memcmp(&out[k][i], &out[0][i], 4) != 0;
      }
  }
  printf("{\"floats\": %ld, \"not_correctly_rounded\": {\"vrsqrtps\": %ld, \"vrsqrt14ps\": %ld, \"exact\": %ld}, "
         "\"differ_from_vrsqrtps\": {\"vrsqrt14ps\": %ld, \"exact\": %ld}}\n",
         n, wrong[0], wrong[1], wrong[2], other[1], other[2]);
  return 0;
}
