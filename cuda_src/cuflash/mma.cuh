// cuflash/mma.cuh — inline-PTX wrappers for tensor-core attention (sm_80+): cp.async, ldmatrix, mma.sync.
//
// All of these are warp-level except cp.async (per thread). 16-bit element types only (__half, __nv_bfloat16).
// Shared-memory addresses are 32-bit shared-window addresses: use smem_u32(ptr).
//
// ---- mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32  (D = A·B + C) -------------------------
// Notation: lane = threadIdx.x % 32, g = lane >> 2 ("group", 0..7), t = lane & 3 ("thread in group", 0..3).
// Each uint32_t register packs two 16-bit elements, the lower column/k index in the low half.
//   A (16x16, row-major, M x K), 4 regs:  a[0] = A[g   ][2t, 2t+1]     a[1] = A[g+8][2t, 2t+1]
//                                         a[2] = A[g   ][2t+8, 2t+9]   a[3] = A[g+8][2t+8, 2t+9]
//   B (16x8, K x N, "col"), 2 regs:       b[0] = B[2t, 2t+1][g]        b[1] = B[2t+8, 2t+9][g]
//   C/D (16x8, float), 4 floats:          c[0], c[1] = C[g][2t], C[g][2t+1]
//                                         c[2], c[3] = C[g+8][2t], C[g+8][2t+1]
// Consequence used by attention (P kept in registers): the C fragments of two adjacent n8 tiles (columns
// 16kk..16kk+7 and 16kk+8..16kk+15) converted to 16 bits ARE the A fragment of the m16k16 tile kk:
//   a[0] = pack(cL[0], cL[1]), a[1] = pack(cL[2], cL[3]), a[2] = pack(cR[0], cR[1]), a[3] = pack(cR[2], cR[3]).
//
// ---- ldmatrix.sync.aligned.m8n8.x{1,2,4}[.trans].shared.b16 -----------------------------------------------
// Loads up to four 8x8 matrices of 16-bit elements. Lanes 8i..8i+7 give the (16-byte aligned) addresses of the
// 8 rows of matrix i (x1: lanes 0-7 only; x2: lanes 0-15; other lanes' addresses are ignored but must be valid).
//   non-trans: r[i] of lane = M_i[g][2t, 2t+1]           (row g of matrix i, two adjacent columns)
//   .trans:    r[i] of lane = M_i[2t][g], M_i[2t+1][g]   (the transpose: two adjacent rows, column g)
// Recipes (smem rows padded so that 8 consecutive rows fall in distinct 16-byte bank groups):
//   A from row-major X[m][k] (16x16 at (m0,k0)): lane address X[m0 + (lane & 15)][k0 + (lane >> 4) * 8], x4
//       -> r[0..3] = a[0..3].
//   B for S = Q·K^T from row-major K[n][k] (two n8 tiles n0, n0+8, one k16 step at k0), x4, non-trans:
//       lane address K[n0 + (lane >> 4) * 8 + (lane & 7)][k0 + ((lane >> 3) & 1) * 8]
//       -> {r[0], r[1]} = b of n-tile n0, {r[2], r[3]} = b of n-tile n0 + 8.
//   B for O = P·V from row-major V[n][d] (k = n; two d8 tiles d0, d0+8, one k16 step at n0), x4, .trans:
//       lane address V[n0 + ((lane >> 3) & 1) * 8 + (lane & 7)][d0 + (lane >> 4) * 8]
//       -> {r[0], r[1]} = b of d-tile d0, {r[2], r[3]} = b of d-tile d0 + 8.
//
// ---- cp.async.cg.shared.global (16 bytes, L2 only) ------------------------------------------------------------
// cp_async_16(dst, src, pred): copies 16 bytes when pred, otherwise writes 16 zero bytes (src-size 0: nothing
// is read, src must still be a valid-looking address; pass a base pointer). Group them with cp_async_commit();
// cp_async_wait<N>() waits until at most N committed groups are still in flight (then __syncthreads() before
// other threads read the data).
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include "cuflash/async_copy.cuh"  // smem_u32, cp.async

namespace cuflash {

// ---- ldmatrix ----
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t (&r)[2], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}

// ---- mma m16n8k16, float accumulators: c += a * b ----
template <typename T> __device__ __forceinline__ void mma_m16n8k16(float (&c)[4], const uint32_t (&a)[4],
                                                                   const uint32_t (&b)[2]);
template <> __device__ __forceinline__ void mma_m16n8k16<__half>(float (&c)[4], const uint32_t (&a)[4],
                                                                 const uint32_t (&b)[2]) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
               "{%8, %9}, {%0, %1, %2, %3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <> __device__ __forceinline__ void mma_m16n8k16<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4],
                                                                        const uint32_t (&b)[2]) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
               "{%8, %9}, {%0, %1, %2, %3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Two floats -> one register of two 16-bit values (lo in the low half), round to nearest even.
template <typename T> __device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

}  // namespace cuflash
