// cuflash/online_softmax.cuh — the online-softmax state (m, l) of Milakov & Gimelshein (2018).
//
//   m = max(x),  l = sum(exp(x - m))          (over any subset of a row)
//   merge(a, b): m = max(ma, mb),  l = la·e^(ma−m) + lb·e^(mb−m)
//
// The merge is associative and commutative (up to rounding), so a row can be cut into pieces held by threads,
// warps, blocks, devices or time steps and the pieces merged in any tree. The identity is the empty state
// (−inf, 0). Conventions at the edges, chosen so that lse = m + log(l) and the outputs follow scipy.special:
//   * the empty state stays empty under merges: no exp(−inf − −inf) is ever evaluated;
//   * an element x = −inf is the empty state (it contributes exp(−inf) = 0, never a 1);
//   * m = +inf: each +inf element counts 1 (exp(inf − inf) read as e^0), so l = number of +inf entries and
//     lse = +inf, as scipy.special.logsumexp gives;
//   * NaN propagates through max and through l (the max below is NaN-propagating, unlike fmaxf).
#pragma once
#include "cuflash/common.cuh"

#ifndef INFINITY  // NVRTC has no <math.h>
#define INFINITY __int_as_float(0x7f800000)
#endif
#ifndef NAN
#define NAN __int_as_float(0x7fffffff)
#endif

namespace cuflash {

__device__ __forceinline__ float exp_acc(float x) { return expf(x); }
__device__ __forceinline__ double exp_acc(double x) { return exp(x); }
// exp(d) for the per-element hot loops: d = x − m first (exact-ish), then the hardware 2^x on d·log2(e): an FMUL and
// one MUFU.EX2 instead of expf's ~8 instructions (the kernels are otherwise compute-bound on 16-bit rows).
// Relative error ~2^-22 plus |d|·2^-24 from the product: the same order as the rounding of d itself.
__device__ __forceinline__ float exp_fast(float d) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d * 1.4426950408889634f));
  return r;
}
__device__ __forceinline__ double exp_fast(double d) { return exp(d); }
__device__ __forceinline__ float log_acc(float x) { return logf(x); }
__device__ __forceinline__ double log_acc(double x) { return log(x); }
// 1/x without the IEEE division subroutine (its call spills registers): the hardware reciprocal (float: within
// 1 ulp), refined by two Newton steps for double. Used for 1/l with l >= 1 (or l = 0, where the output is NaN).
__device__ __forceinline__ float rcp_acc(float x) { return __fdividef(1.0f, x); }
__device__ __forceinline__ double rcp_acc(double x) {
  double r;
  asm("rcp.approx.ftz.f64 %0, %1;" : "=d"(r) : "d"(x));
  r = fma(r, fma(-x, r, 1.0), r);
  return fma(r, fma(-x, r, 1.0), r);
}

// max that propagates NaN from either side (fmaxf would drop it).
template <typename A> __device__ __forceinline__ A nan_max(A a, A b) { return (a > b || a != a) ? a : b; }

// exp(a − m) for a <= m with the edge conventions above: a = −inf gives 0 (also when m = −inf),
// a = m gives exactly 1 (also when both are +inf), NaN gives NaN.
template <typename A> __device__ __forceinline__ A rescale(A a, A m) {
  return a == m ? (a == -(A)INFINITY ? (A)0 : (A)1) : exp_acc(a - m);
}

template <typename A> struct SoftmaxState {
  A m, l;
  __device__ __forceinline__ static SoftmaxState identity() { return {-(A)INFINITY, (A)0}; }
  __device__ __forceinline__ static SoftmaxState of(A x) { return {x, x == -(A)INFINITY ? (A)0 : (A)1}; }
};

template <typename A> __device__ __forceinline__ SoftmaxState<A> merge(const SoftmaxState<A>& a,
                                                                        const SoftmaxState<A>& b) {
  const A m = nan_max(a.m, b.m);
  return {m, a.l * rescale(a.m, m) + b.l * rescale(b.m, m)};
}

struct MergeOp {
  template <typename S> __device__ __forceinline__ S operator()(const S& a, const S& b) const { return merge(a, b); }
};

// lse = m + log(l): finite m gives the log-sum-exp; (−inf, 0) gives −inf; (+inf, k) gives +inf; NaN stays NaN.
template <typename A> __device__ __forceinline__ A lse_of(const SoftmaxState<A>& s) { return s.m + log_acc(s.l); }

// softmax element exp(x − m)/l with scipy's values at the edges: m = ±inf or NaN make the whole row NaN
// (x − m is NaN at x = m = ±inf, and scipy's sum is NaN when a +inf is present).
template <typename A> __device__ __forceinline__ A softmax_scale(const SoftmaxState<A>& s) {
  return s.m == (A)INFINITY ? (A)NAN : rcp_acc(s.l);
}
template <typename A> __device__ __forceinline__ A softmax_of(A x, A m, A inv_l) { return exp_fast(x - m) * inv_l; }

// log_softmax element (x − m) − log(l) (scipy's tmp − log(s)): all −inf row -> NaN, +inf entries -> NaN,
// finite entries beside a +inf -> −inf.
template <typename A> __device__ __forceinline__ A log_softmax_of(A x, A m, A log_l) { return (x - m) - log_l; }

}  // namespace cuflash
