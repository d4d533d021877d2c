// cuflash/sm90_tiles.cuh — the tile pieces the Hopper attention kernels share (sm_90a): a cp.async copy of rows
// into the 128-byte-swizzled layout wgmma reads, the two wgmma products of a K/V tile step in the forward's
// naming (S = A B^T with both operands K-major in shared memory; O += P V with P in registers and V MN-major),
// and the float accumulator -> register A operand conversion. Layout and descriptor conventions: wgmma.cuh.
//   load_tile_sw128<T, HEAD_DIM, ROWS, NT, BLK_ROWS>(dst, src, ld, row0, nrows, tid)
//   issue_qk<T, HEAD_DIM, BR, Bc>(s, sA, sB)      s (m64 x n Bc) = A rows (tile of BR rows) . B^T (tile of Bc rows)
//   issue_pv<T, HEAD_DIM, Bc, PVN>(o, pa, sV)     o (m64 x HEAD_DIM) += P (m64 x k Bc, registers) . V (Bc rows)
//   pack_p<T, Bc>(pa, s)                          accumulator (m64 x n Bc) -> A operand (k Bc)
#pragma once
#include "cuflash/common.cuh"
#include "cuflash/mma.cuh"
#include "cuflash/wgmma.cuh"

namespace cuflash {

// Copy ROWS rows (row0.. of a matrix with row stride ld, HEAD_DIM columns) into a swizzled tile at byte address
// dst whose 64-column blocks are BLK_ROWS rows apart; rows >= nrows are zero-filled. NT threads, thread index
// tid; consecutive threads take consecutive 16-byte chunks of a row (coalesced).
template <typename T, int HEAD_DIM, int ROWS, int NT, int BLK_ROWS = ROWS>
__device__ __forceinline__ void load_tile_sw128(unsigned dst, const T* src, i64 ld, int row0, int nrows, int tid) {
  constexpr int CH = HEAD_DIM / 8;  // chunks per row
#pragma unroll 4
  for (int c = tid; c < ROWS * CH; c += NT) {
    const int r = c / CH, ch = c % CH;
    const bool ok = row0 + r < nrows;
    const unsigned off = (ch >> 3) * (BLK_ROWS * 128) + r * 128 + (((ch & 7) ^ (r & 7)) << 4);
    cp_async_16(dst + off, ok ? src + (i64)(row0 + r) * ld + ch * 8 : src, ok);
  }
}

// ---- wgmma steps (called by all 128 threads of a warpgroup) -----------------------------------------------
// S = Q_w K^T: KSTEPS wgmmas (Q rows of this warpgroup at sQw, 64-column blocks BR rows apart; K tile at cK).
template <typename T, int HEAD_DIM, int BR, int Bc>
__device__ __forceinline__ void issue_qk(float (&s)[Bc / 2], unsigned sQw, unsigned cK) {
  const unsigned long long da0 = wgmma_desc(sQw, 16, 1024), db0 = wgmma_desc(cK, 16, 1024);
#pragma unroll
  for (int kk = 0; kk < HEAD_DIM / 16; ++kk) {
    const unsigned blk = kk >> 2, in = (kk & 3) * 32;  // 64-column block, 32-byte k16 step inside the row
    const unsigned long long da = wgmma_desc_advance(da0, blk * (BR * 128) + in);
    const unsigned long long db = wgmma_desc_advance(db0, blk * (Bc * 128) + in);
    WgmmaSS<T, Bc>::run(s, da, db, kk > 0 ? 1 : 0);
  }
}

// O += P V: P (registers) x V tile at cV (MN-major: keys are rows, head_dim columns in 64-wide blocks).
template <typename T, int HEAD_DIM, int Bc, int PVN>
__device__ __forceinline__ void issue_pv(float (&o)[HEAD_DIM / PVN][PVN / 2], const unsigned (&pa)[Bc / 16][4],
                                         unsigned cV) {
  // keys 16kk..16kk+15: two 8-row groups (SBO = 1024); columns n*PVN..: 64-wide blocks Bc*128 bytes apart
  // (LBO; with PVN = 64 one wgmma stays inside one block, LBO unused, so 1024 is passed as well).
  const unsigned long long d0 = wgmma_desc(cV, PVN == 64 ? 1024 : Bc * 128, 1024);
#pragma unroll
  for (int kk = 0; kk < Bc / 16; ++kk) {
#pragma unroll
    for (int n = 0; n < HEAD_DIM / PVN; ++n) {
      const unsigned long long db = wgmma_desc_advance(d0, n * (PVN / 64) * (Bc * 128) + kk * 16 * 128);
      WgmmaRS<T, PVN>::run(o[n], pa[kk], db, 1);
    }
  }
}

// P (float accumulator of S, key step kk = n8 blocks 2kk, 2kk+1) -> the register A operand of O += P V.
template <typename T, int Bc>
__device__ __forceinline__ void pack_p(unsigned (&pa)[Bc / 16][4], const float (&s)[Bc / 2]) {
#pragma unroll
  for (int kk = 0; kk < Bc / 16; ++kk) {
    pa[kk][0] = pack2<T>(s[8 * kk + 0], s[8 * kk + 1]);
    pa[kk][1] = pack2<T>(s[8 * kk + 2], s[8 * kk + 3]);
    pa[kk][2] = pack2<T>(s[8 * kk + 4], s[8 * kk + 5]);
    pa[kk][3] = pack2<T>(s[8 * kk + 6], s[8 * kk + 7]);
  }
}

}  // namespace cuflash
