// amp.cu — mixed-precision training: multi-tensor unscale-and-check, fused master-weight optimizer steps.
//
//   unscale_and_check<T>  one launch over a LIST of tensors (all of dtype T): g <- g * inv_scale in place and
//                         found_inf <- 1 if any element was inf/NaN (Micikevicius et al., "Mixed Precision
//                         Training", ICLR 2018, sec. 3.2: loss scaling; the overflow check is what dynamic scaling
//                         acts on). The list is a device table of int64: [ptr_0..ptr_{k-1} | n_0..n_{k-1} |
//                         off_0..off_{k-1}] with off = exclusive prefix sum of n: thread `tid` of the grid visits
//                         the elements whose position in the virtual concatenation is congruent to tid modulo the
//                         grid size, so the work is balanced over the whole list, whatever the sizes.
//                         found_inf is written with a plain store of 1 (every writer writes the same value: benign).
//   sgd_momentum_step<G, M>  master (fp32) += SGD-momentum update of grad G * inv_scale (torch.optim.SGD
//                         semantics: weight decay added to the gradient, first step buf = g, dampening, Nesterov),
//                         momentum buffer (fp32) updated, low-precision model copy M written in the same pass.
//   adamw_step<G, M>      AdamW (Loshchilov & Hutter, "Decoupled Weight Decay Regularization", ICLR 2019; the
//                         torch.optim.AdamW update order) on fp32 master + fp32 moments, writes the model copy.
// Both optimizer steps read a device `skip` flag (may be null): when *skip != 0 the step is a no-op, so an
// overflowed step can be skipped without a host round trip. Traffic per element: SGD reads G+4+4, writes 4+4+M;
// AdamW reads G+4+4+4, writes 4+4+4+M bytes.
#include "cuflash/common.cuh"

using cuflash::i64;
using cuflash::to_float;
using cuflash::from_float;

template <typename T>
__global__ void unscale_and_check(const i64* __restrict__ table, int ntensors, float inv_scale, int write,
                                  int* __restrict__ found_inf) {
  const i64 stride = (i64)gridDim.x * blockDim.x;
  const i64 tid = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  bool bad = false;
  for (int t = 0; t < ntensors; ++t) {
    T* p = reinterpret_cast<T*>(table[t]);
    const i64 n = table[ntensors + t];
    const i64 off = table[2 * ntensors + t];
    i64 i = tid - off % stride;  // first i >= 0 with (off + i) % stride == tid
    if (i < 0) i += stride;
    for (; i + 3 * stride < n; i += 4 * stride) {  // four independent loads in flight
      T v[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) v[k] = p[i + k * stride];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float f = to_float(v[k]);
        bad |= !isfinite(f);
        if (write) p[i + k * stride] = from_float<T>(f * inv_scale);
      }
    }
    for (; i < n; i += stride) {
      const float f = to_float(p[i]);
      bad |= !isfinite(f);
      if (write) p[i] = from_float<T>(f * inv_scale);
    }
  }
  if (bad) *found_inf = 1;
}

template <typename G, typename M>
__global__ void sgd_momentum_step(const G* __restrict__ grad, float* __restrict__ master, float* __restrict__ buf,
                                  M* __restrict__ model, i64 n, float lr, float momentum, float dampening,
                                  float weight_decay, int nesterov, int first_step, float inv_scale,
                                  const int* __restrict__ skip) {
  if (skip != nullptr && *skip != 0) return;
  const i64 stride = (i64)gridDim.x * blockDim.x;
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    float g = to_float(grad[i]) * inv_scale;
    float p = master[i];
    g = fmaf(weight_decay, p, g);                                   // g + wd * p
    if (momentum != 0.f) {
      const float b = first_step ? g : fmaf(momentum, buf[i], (1.f - dampening) * g);
      buf[i] = b;
      g = nesterov ? fmaf(momentum, b, g) : b;
    }
    p = fmaf(-lr, g, p);                                            // p - lr * g
    master[i] = p;
    if (model != nullptr) model[i] = from_float<M>(p);
  }
}

template <typename G, typename M>
__global__ void adamw_step(const G* __restrict__ grad, float* __restrict__ master, float* __restrict__ exp_avg,
                           float* __restrict__ exp_avg_sq, M* __restrict__ model, i64 n, float lr, float beta1,
                           float beta2, float one_minus_beta1, float one_minus_beta2,  // 1-b from float64 on host
                           float eps, float weight_decay, float bias_correction1,
                           float bias_correction2_sqrt, float inv_scale, const int* __restrict__ skip) {
  if (skip != nullptr && *skip != 0) return;
  const float step_size = lr / bias_correction1;
  const float decay = 1.f - lr * weight_decay;
  const i64 stride = (i64)gridDim.x * blockDim.x;
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float g = to_float(grad[i]) * inv_scale;
    float p = master[i] * decay;                                    // decoupled weight decay first
    const float m = fmaf(beta1, exp_avg[i], one_minus_beta1 * g);
    const float v = fmaf(beta2, exp_avg_sq[i], one_minus_beta2 * g * g);  // 1.f-0.999f is 1.3e-5 off
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    const float denom = sqrtf(v) / bias_correction2_sqrt + eps;
    p = p - step_size * (m / denom);
    master[i] = p;
    if (model != nullptr) model[i] = from_float<M>(p);
  }
}
