// Mamba's selective scan on the CPU, fused: one pass over time per sequence with the state
// h (N × D) held in a small buffer, instead of PyTorch ops on full (L, B, N, D) tensors.
// Built at first use by torch.utils.cpp_extension (kernels/selective_scan_cpu.py); the
// definition it must equal is seqmix.mixers.mamba.selective_scan_reference.
//
//   h_t = exp(Δ_t ⊙ A) ⊙ h_{t-1} + B_t x_tᵀ,   y_t = C_t · h_t          (h_{-1} = 0)
//
// Shapes (contiguous, one dtype): x, Δ, y: (Bt, L, D); B, C: (Bt, L, N); At = Aᵀ: (N, D).
// Inner loops run over d (contiguous), so the compiler vectorises them.
//
// Backward: the forward keeps only the state entering every block of K positions
// (checkpoints, (Bt, ceil(L/K), N, D)); the backward recomputes one block's states and
// decays at a time (K × N × D, cache-sized) and runs the adjoint through it in reverse:
//   λ_t = C_t gy_tᵀ + a_{t+1} ⊙ λ_{t+1},  ∂x_t = Σ_n B_tn λ_t,  ∂B_t = λ_t x_t,
//   ∂C_t = h_t gy_t,  q_t = λ_t ⊙ a_t ⊙ h_{t-1},  ∂Δ_t = Σ_n q_t ⊙ A,  ∂A = Σ_t q_t Δ_t.
#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <cmath>
#include <mutex>
#include <vector>

namespace {

template <typename T>
void advance(const T* __restrict At, const T* __restrict delta, const T* __restrict x,
             const T* __restrict Bt, T* __restrict h, T* __restrict a_out, int64_t N,
             int64_t D) {
  // h ← exp(Δ A) ⊙ h + B xᵀ for one position; the decays are written to a_out when given.
  for (int64_t n = 0; n < N; ++n) {
    const T b = Bt[n];
    T* __restrict hn = h + n * D;
    const T* __restrict an = At + n * D;
    if (a_out) {
      T* __restrict ao = a_out + n * D;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) {
        const T a = std::exp(delta[d] * an[d]);
        ao[d] = a;
        hn[d] = a * hn[d] + b * x[d];
      }
    } else {
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) hn[d] = std::exp(delta[d] * an[d]) * hn[d] + b * x[d];
    }
  }
}

template <typename T>
void forward_kernel(const T* x, const T* delta, const T* At, const T* B, const T* C, T* y,
                    T* ckpt, int64_t Bsz, int64_t L, int64_t D, int64_t N, int64_t K) {
  const int64_t n_blocks = (L + K - 1) / K;
  at::parallel_for(0, Bsz, 1, [&](int64_t b0, int64_t b1) {
    std::vector<T> h(N * D);
    for (int64_t b = b0; b < b1; ++b) {
      std::fill(h.begin(), h.end(), T(0));
      for (int64_t t = 0; t < L; ++t) {
        if (t % K == 0) std::copy(h.begin(), h.end(), ckpt + (b * n_blocks + t / K) * N * D);
        const int64_t row = b * L + t;
        advance(At, delta + row * D, x + row * D, B + row * N, h.data(), (T*)nullptr, N, D);
        T* __restrict yt = y + row * D;
        const T* __restrict Ct = C + row * N;
        std::fill(yt, yt + D, T(0));
        for (int64_t n = 0; n < N; ++n) {
          const T c = Ct[n];
          const T* __restrict hn = h.data() + n * D;
#pragma omp simd
          for (int64_t d = 0; d < D; ++d) yt[d] += c * hn[d];
        }
      }
    }
  });
}

template <typename T>
void backward_kernel(const T* gy, const T* x, const T* delta, const T* At, const T* B,
                     const T* C, const T* ckpt, T* dx, T* ddelta, T* dAt, T* dB, T* dC,
                     int64_t Bsz, int64_t L, int64_t D, int64_t N, int64_t K) {
  const int64_t n_blocks = (L + K - 1) / K, ND = N * D;
  std::mutex dAt_lock;
  at::parallel_for(0, Bsz, 1, [&](int64_t b0, int64_t b1) {
    // hs[0] is the state before the block, hs[i + 1] the state after its position i.
    std::vector<T> hs((K + 1) * ND), as(K * ND), r(ND), dAt_local(ND, T(0));
    for (int64_t b = b0; b < b1; ++b) {
      std::fill(r.begin(), r.end(), T(0));  // a_{t+1} ⊙ λ_{t+1}, zero past the end
      for (int64_t blk = n_blocks - 1; blk >= 0; --blk) {
        const int64_t t0 = blk * K, len = std::min(K, L - t0);
        std::copy(ckpt + (b * n_blocks + blk) * ND, ckpt + (b * n_blocks + blk + 1) * ND,
                  hs.begin());
        for (int64_t i = 0; i < len; ++i) {  // the block's states and decays again
          const int64_t row = b * L + t0 + i;
          std::copy(hs.begin() + i * ND, hs.begin() + (i + 1) * ND, hs.begin() + (i + 1) * ND);
          advance(At, delta + row * D, x + row * D, B + row * N, hs.data() + (i + 1) * ND,
                  as.data() + i * ND, N, D);
        }
        for (int64_t i = len - 1; i >= 0; --i) {
          const int64_t row = b * L + t0 + i;
          const T* __restrict g = gy + row * D;
          const T* __restrict xt = x + row * D;
          const T* __restrict dt = delta + row * D;
          T* __restrict dxt = dx + row * D;
          T* __restrict ddt = ddelta + row * D;
          std::fill(dxt, dxt + D, T(0));
          std::fill(ddt, ddt + D, T(0));
          for (int64_t n = 0; n < N; ++n) {
            const T c = C[row * N + n], bn = B[row * N + n];
            T* __restrict rn = r.data() + n * D;
            const T* __restrict an = as.data() + i * ND + n * D;
            const T* __restrict hn = hs.data() + (i + 1) * ND + n * D;
            const T* __restrict hp = hs.data() + i * ND + n * D;
            const T* __restrict Atn = At + n * D;
            T* __restrict dAtn = dAt_local.data() + n * D;
            T sum_dB = 0, sum_dC = 0;
#pragma omp simd reduction(+ : sum_dB, sum_dC)
            for (int64_t d = 0; d < D; ++d) {
              const T lam = rn[d] + c * g[d];
              dxt[d] += bn * lam;
              sum_dB += lam * xt[d];
              sum_dC += g[d] * hn[d];
              const T carried = an[d] * lam;
              const T q = carried * hp[d];
              ddt[d] += q * Atn[d];
              dAtn[d] += q * dt[d];
              rn[d] = carried;
            }
            dB[row * N + n] = sum_dB;
            dC[row * N + n] = sum_dC;
          }
        }
      }
    }
    std::lock_guard<std::mutex> guard(dAt_lock);
    for (int64_t k = 0; k < ND; ++k) dAt[k] += dAt_local[k];
  });
}

void check(const torch::Tensor& t, const char* name, int64_t dim) {
  TORCH_CHECK(t.device().is_cpu(), "selective_scan_cpu: ", name, " must be a CPU tensor");
  TORCH_CHECK(t.is_contiguous(), "selective_scan_cpu: ", name, " must be contiguous");
  TORCH_CHECK(t.dim() == dim, "selective_scan_cpu: ", name, " must have ", dim, " dims");
}

}  // namespace

std::vector<torch::Tensor> scan_forward(torch::Tensor x, torch::Tensor delta, torch::Tensor At,
                                        torch::Tensor B, torch::Tensor C, int64_t K) {
  check(x, "x", 3), check(delta, "delta", 3), check(At, "At", 2), check(B, "B", 3),
      check(C, "C", 3);
  TORCH_CHECK(K >= 1, "selective_scan_cpu: checkpoint block must be >= 1");
  const int64_t Bsz = x.size(0), L = x.size(1), D = x.size(2), N = At.size(0);
  auto y = torch::empty_like(x);
  auto ckpt = torch::empty({Bsz, (L + K - 1) / K, N, D}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "selective_scan_cpu_forward", [&] {
    forward_kernel<scalar_t>(x.data_ptr<scalar_t>(), delta.data_ptr<scalar_t>(),
                             At.data_ptr<scalar_t>(), B.data_ptr<scalar_t>(),
                             C.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(),
                             ckpt.data_ptr<scalar_t>(), Bsz, L, D, N, K);
  });
  return {y, ckpt};
}

std::vector<torch::Tensor> scan_backward(torch::Tensor gy, torch::Tensor x, torch::Tensor delta,
                                         torch::Tensor At, torch::Tensor B, torch::Tensor C,
                                         torch::Tensor ckpt, int64_t K) {
  check(gy, "gy", 3), check(ckpt, "checkpoints", 4);
  const int64_t Bsz = x.size(0), L = x.size(1), D = x.size(2), N = At.size(0);
  auto dx = torch::empty_like(x), ddelta = torch::empty_like(delta);
  auto dAt = torch::zeros_like(At), dB = torch::empty_like(B), dC = torch::empty_like(C);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "selective_scan_cpu_backward", [&] {
    backward_kernel<scalar_t>(
        gy.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(), delta.data_ptr<scalar_t>(),
        At.data_ptr<scalar_t>(), B.data_ptr<scalar_t>(), C.data_ptr<scalar_t>(),
        ckpt.data_ptr<scalar_t>(), dx.data_ptr<scalar_t>(), ddelta.data_ptr<scalar_t>(),
        dAt.data_ptr<scalar_t>(), dB.data_ptr<scalar_t>(), dC.data_ptr<scalar_t>(), Bsz, L, D,
        N, K);
  });
  return {dx, ddelta, dAt, dB, dC};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &scan_forward, "selective scan forward: y and block checkpoints");
  m.def("backward", &scan_backward, "selective scan backward from the checkpoints");
}
