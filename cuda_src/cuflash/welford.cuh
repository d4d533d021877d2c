// cuflash/welford.cuh — running mean/variance states for the norms, merged with reduce.cuh's hierarchy.
//
//   Welford (1962): a running (count, mean, M2) updated one value at a time, M2 = sum (x - mean)^2.
//   Chan, Golub & LeVeque (1979), "Updating formulae and a pairwise algorithm for computing sample variances":
//   two states merge exactly,
//       n = na + nb,  d = mean_b - mean_a,  mean = mean_a + d * nb/n,  M2 = M2a + M2b + d^2 * na*nb/n,
//   which is what lanes, warps and blocks do here (the same thread -> warp -> block pattern as the online-softmax
//   state (m, l)). A 16-byte vector of values enters as one small state computed two-pass in registers (exact for
//   the vector) and is merged with Chan's formula: no per-element division. Never E[x^2] - E[x]^2: that cancels
//   catastrophically when |mean| >> std (the ln-large-mean case).
//   The count is a float: exact up to 2^24 values per row.
#pragma once
#include "cuflash/reduce.cuh"

namespace cuflash {

struct Welford {
  float n, mean, m2;
  __device__ __forceinline__ static Welford identity() { return {0.f, 0.f, 0.f}; }
};

// Chan et al.'s pairwise merge; an empty side returns the other unchanged (so padded lanes never count).
__device__ __forceinline__ Welford welford_merge(const Welford& a, const Welford& b) {
  if (b.n == 0.f) return a;
  if (a.n == 0.f) return b;
  const float n = a.n + b.n;
  const float fb = __fdividef(b.n, n);  // counts are small integers (< 2^24): the fast division is enough
  const float d = b.mean - a.mean;
  Welford r;
  r.n = n;
  r.mean = fmaf(d, fb, a.mean);
  r.m2 = a.m2 + b.m2 + d * d * a.n * fb;
  return r;
}

struct WelfordOp {
  __device__ __forceinline__ Welford operator()(const Welford& a, const Welford& b) const { return welford_merge(a, b); }
};

// Welford's one-value update.
__device__ __forceinline__ void welford_push(Welford& s, float x) {
  s.n += 1.f;
  const float d = x - s.mean;
  s.mean += d / s.n;
  s.m2 = fmaf(d, x - s.mean, s.m2);
}

// N values held in registers: their exact (N, mean, M2) two-pass, then merged into s.
template <int N> __device__ __forceinline__ void welford_push_vec(Welford& s, const float (&v)[N]) {
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < N; ++i) sum += v[i];
  const float m = sum * (1.f / N);
  float m2 = 0.f;
#pragma unroll
  for (int i = 0; i < N; ++i) { const float d = v[i] - m; m2 = fmaf(d, d, m2); }
  s = welford_merge(s, Welford{(float)N, m, m2});
}

// Plain float sums (RMSNorm's sum of squares; the backward's two row sums).
struct Sum1 {
  float a;
  __device__ __forceinline__ static Sum1 identity() { return {0.f}; }
};
struct Sum1Op {
  __device__ __forceinline__ Sum1 operator()(const Sum1& x, const Sum1& y) const { return {x.a + y.a}; }
};
struct Sum2 {
  float a, b;
  __device__ __forceinline__ static Sum2 identity() { return {0.f, 0.f}; }
};
struct Sum2Op {
  __device__ __forceinline__ Sum2 operator()(const Sum2& x, const Sum2& y) const { return {x.a + y.a, x.b + y.b}; }
};

}  // namespace cuflash
