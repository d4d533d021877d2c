// cuflash/reduce.cuh — the hierarchical reduction shared by softmax and the norms:
//   thread state -> warp (shuffle butterfly) -> block (one slot per warp in shared memory) -> grid (second pass).
// A state type S only needs `S merge(const S&, const S&)` found by the functor Op and a shuffle: every field
// is moved with __shfl_xor_sync, so S must be a struct of 4- or 8-byte scalars.
#pragma once
#include "cuflash/common.cuh"

namespace cuflash {

template <typename S> __device__ __forceinline__ S shfl_xor_state(const S& s, int lane_mask) {
  static_assert(sizeof(S) % 4 == 0, "state must be a struct of 4-byte words");
  S out;
  const int* src = reinterpret_cast<const int*>(&s);
  int* dst = reinterpret_cast<int*>(&out);
#pragma unroll
  for (int i = 0; i < (int)(sizeof(S) / 4); ++i) dst[i] = __shfl_xor_sync(0xffffffffu, src[i], lane_mask);
  return out;
}

// All lanes of a group of WIDTH lanes (a power of two <= 32) end with the merged state.
template <int WIDTH = 32, typename S, typename Op>
__device__ __forceinline__ S warp_allreduce(S s, Op op) {
#pragma unroll
  for (int m = WIDTH / 2; m > 0; m >>= 1) s = op(s, shfl_xor_state(s, m));
  return s;
}

// All threads of the block end with the merged state. `smem` holds at least 32 states. Merge order is fixed
// (lanes by butterfly, then warps 0..W-1 by butterfly), so results are deterministic for a given launch shape.
template <typename S, typename Op>
__device__ __forceinline__ S block_allreduce(S s, Op op, S* smem) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
  s = warp_allreduce<32>(s, op);
  if (nwarps == 1) return s;
  __syncthreads();  // smem may still be read by a previous call
  if (lane == 0) smem[warp] = s;
  __syncthreads();
  S t = smem[lane < nwarps ? lane : 0];
  if (lane >= nwarps) t = S::identity();
  t = warp_allreduce<32>(t, op);
  return t;
}

}  // namespace cuflash
