// reduce_study.cu — one reduction, many partitions: the summation-order experiment (a study kernel, not a fast one).
//
// Floating-point addition is not associative, so a parallel sum depends on how the row is split and merged
// (Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., ch. 4: |error| <= gamma_{n-1} sum|x_i|
// for any order, gamma_k = k u / (1 - k u)). This kernel makes every choice of the split a run-time parameter:
//   blocks_per_row  a row is cut into that many contiguous segments, one block each (stage 1);
//   threads         threads per block (the launch's block size);
//   ept             elements per thread: thread t accumulates chunks of `ept` consecutive elements at
//                   segment offsets (k * threads + t) * ept, k = 0, 1, ..., sequentially, in float;
//   tree            how partial states are merged, in the block and across blocks (stage 2):
//                   0 = sequential (left to right), 1 = butterfly (shuffle-xor in warps, then warps; pairwise
//                   tree across blocks).
// OP 0 is a sum, OP 1 a logsumexp through the online-softmax state (m, l) (Milakov & Gimelshein 2018), merged
// with m = max(ma, mb), l = la e^(ma-m) + lb e^(mb-m) and guarded for m = -inf.
// Stage 1 writes one state per (row, block) into `ws` (rows * blocks_per_row states); stage 2 (one thread per
// row) merges them and writes the float result.
#include "cuflash/reduce.cuh"

using cuflash::i64;
using cuflash::to_float;

#define RS_NEG_INF (-__int_as_float(0x7f800000))

struct SumS {
  float s;
  __device__ static SumS identity() { return {0.f}; }
};
struct LseS {
  float m, l;
  __device__ static LseS identity() { return {RS_NEG_INF, 0.f}; }
};

struct SumOp {
  __device__ SumS operator()(const SumS& a, const SumS& b) const { return {a.s + b.s}; }
  __device__ static SumS add(SumS a, float x) { return {a.s + x}; }
  __device__ static float finish(const SumS& a) { return a.s; }
};
struct LseOp {
  __device__ LseS operator()(const LseS& a, const LseS& b) const {
    const float m = fmaxf(a.m, b.m);
    if (m == RS_NEG_INF) return {m, 0.f};  // both empty: exp(-inf - -inf) would be NaN
    return {m, a.l * expf(a.m - m) + b.l * expf(b.m - m)};
  }
  __device__ static LseS add(LseS a, float x) {
    const float m = fmaxf(a.m, x);
    if (m == RS_NEG_INF) return a;
    return {m, a.l * expf(a.m - m) + expf(x - m)};
  }
  __device__ static float finish(const LseS& a) { return a.m == RS_NEG_INF ? RS_NEG_INF : a.m + logf(a.l); }
};

template <int OP> struct Pick;
template <> struct Pick<0> { typedef SumS S; typedef SumOp Op; };
template <> struct Pick<1> { typedef LseS S; typedef LseOp Op; };

// grid = rows * blocks_per_row, block = threads (<= 1024).
template <typename T, int OP>
__global__ void partial_reduce(const T* __restrict__ x, i64 n_cols, i64 row_stride, int blocks_per_row, int ept,
                               int tree, typename Pick<OP>::S* __restrict__ ws) {
  typedef typename Pick<OP>::S S;
  typedef typename Pick<OP>::Op Op;
  __shared__ S sbuf[1024];
  const i64 row = blockIdx.x / blocks_per_row;
  const int b = blockIdx.x % blocks_per_row;
  const i64 seg = (n_cols + blocks_per_row - 1) / blocks_per_row;
  const i64 start = (i64)b * seg;
  const i64 end = start + seg < n_cols ? start + seg : n_cols;
  const T* xr = x + row * row_stride;
  S s = S::identity();
  for (i64 base = start + (i64)threadIdx.x * ept; base < end; base += (i64)blockDim.x * ept)
    for (int k = 0; k < ept && base + k < end; ++k) s = Op::add(s, to_float(xr[base + k]));
  if (tree == 1) {
    s = cuflash::block_allreduce(s, Op(), sbuf);
  } else {
    sbuf[threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.x == 0)
      for (int t = 1; t < (int)blockDim.x; ++t) s = Op()(s, sbuf[t]);
  }
  if (threadIdx.x == 0) ws[blockIdx.x] = s;
}

// One thread per row merges its blocks_per_row states (sequentially or by a pairwise tree, in place in ws).
template <int OP>
__global__ void merge_partials(typename Pick<OP>::S* __restrict__ ws, i64 rows, int blocks_per_row, int tree,
                               float* __restrict__ out) {
  typedef typename Pick<OP>::S S;
  typedef typename Pick<OP>::Op Op;
  const i64 row = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= rows) return;
  S* w = ws + row * blocks_per_row;
  S s;
  if (tree == 1) {
    for (int h = 1; h < blocks_per_row; h *= 2)
      for (int b = 0; b + h < blocks_per_row; b += 2 * h) w[b] = Op()(w[b], w[b + h]);
    s = w[0];
  } else {
    s = w[0];
    for (int b = 1; b < blocks_per_row; ++b) s = Op()(s, w[b]);
  }
  out[row] = Op::finish(s);
}
