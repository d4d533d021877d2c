// attention_bwd_sm90.cu — the dK/dV pass of the attention backward on Hopper (sm_90a): warpgroup MMA
// (wgmma.mma_async) for all five products. The default on compute capability 9.0 at head_dim 64 / 128
// (cuflash.attention_bwd.SM90_DKDV).
//
// The same algorithm and interface as bwd_dkdv in attention_bwd.cu (FlashAttention-2, Dao 2023, Alg. 2; the
// Hopper mapping after FlashAttention-3, Shah et al. 2024, arXiv:2407.08608, Sec. 3 and App. B): the block owns
// Bc = 128 keys K_j, V_j and loops over the query heads of its GQA group and the Q tiles (Br = 64 queries) that
// see them. Two warpgroups; warpgroup w owns keys [64w, 64w + 64) of the tile. Per Q tile, in each warpgroup:
//   S^T  = K_w Q_i^T            wgmma m64n64, A = K rows, B = Q tile, both K-major in shared memory
//   dP^T = V_w dO_i^T           wgmma m64n64, A = V rows, B = dO tile
//   P^T  = exp2(S^T * scale * log2e - lse * log2e), masked entries 0;  dS^T = P^T o (dP^T - Delta)
//   dV_w += P^T dO_i            wgmma m64n{HD}, A = P^T rounded to T in registers, B = dO tile MN-major
//   dK_w += dS^T Q_i            wgmma m64n{HD}, A = dS^T in registers, B = Q tile MN-major
//   (atomic dQ) dS^T to shared memory; warpgroup w: dQ_i[:, Nw .. Nw + N) = dS K[:, Nw ..] by wgmma m64nN,
//   N = head_dim / 2, with both operands MN-major (dS^T and K are stored key by key), added to the float32
//   accumulator: dq_mode 1 by atomicAdd (float2) into rows of head_dim floats; dq_mode 2 (the default) staged in
//   shared memory and added by the copy engine, one bulk reduction (cp.reduce.async.bulk .add.f32) per warpgroup
//   and Q tile, into a layout where each warpgroup's N columns are a plane of their own (rows of N floats, the
//   8-float groups of row i XOR-permuted by i % (N / 8)), so its tile is one contiguous range (FlashAttention-3
//   adds dQ by TMA likewise). dq_mode 0: no dQ here.
// dK, dV stay in float32 registers for the whole loop (64 + 64 per thread at head_dim 128). Loads: cp.async by
// all 256 threads into the 128-byte-swizzled layout (K, V once; Q, dO, lse, Delta per Q tile). STAGES = 1: one
// buffer, the next tile's loads issued while this one's dQ is computed; 2: two buffers, the tile after next
// issued there, so its loads have a whole iteration. Tails: rows past seqlen are zero-filled (P = 0 there).
// Head_dim 128 or 64: dQ split over the two warpgroups by columns (64 or 32 each).
#include "cuflash/common.cuh"
#include "cuflash/mma.cuh"
#include "cuflash/wgmma.cuh"
#include "cuflash/sm90_tiles.cuh"
#include "cuflash/attn_bwd_mask.cuh"
#include "cuflash/tma.cuh"

#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
// With one buffer (STAGES = 1), 0: lse and Delta by plain loads of the first 64 threads after the barrier, lse
// scaled by log2e on the way (cuflash.attention_bwd compiles this, its default); 1 (study, SM90_LSE_ASYNC): by
// cp.async with Q and dO, 0.6-2 % slower on the H200. With two buffers always by cp.async.
#ifndef CUFLASH_BWD_LSE_ASYNC
#define CUFLASH_BWD_LSE_ASYNC 1
#endif
// -1: the dQ mode is the kernel argument dq_mode; 0, 1 or 2 (study, SM90_DQ_FIXED): compiled for that mode alone
// (the argument must match; cuflash.attention_bwd launches such a kernel only for its mode)
#ifndef CUFLASH_BWD_DQ_MODE
#define CUFLASH_BWD_DQ_MODE -1
#endif

namespace cuflash {
namespace attn_bwd {

constexpr int BR = 64, BC = 128, NT = 256;

// dQ (m64 queries x N columns) = dS (queries x BC keys) . K[:, cols]: A = dS^T at sdS (BC key rows of 64
// queries, one 128-byte-swizzled block), B = N columns of the K tile's 64-column block from cKb (BC key rows;
// N = 32 starts 64 bytes into the swizzled rows, the swizzle being a function of the address); both MN-major,
// k16 steps down the key rows (SBO = 1024 bytes per 8 rows; one 64-wide block each, LBO unused).
template <typename T, int N>
__device__ __forceinline__ void issue_dq(float (&dq)[N / 2], unsigned sdS, unsigned cKb) {
#pragma unroll
  for (int kk = 0; kk < BC / 16; ++kk) {
    const unsigned long long da = wgmma_desc(sdS + kk * 16 * 128, 1024, 1024);
    const unsigned long long db = wgmma_desc(cKb + kk * 16 * 128, 1024, 1024);
    WgmmaSSt<T, N>::run(dq, da, db, kk > 0 ? 1 : 0);
  }
}

template <typename T, int HD, int STAGES, bool OVL>
__global__ void __launch_bounds__(NT, 1) bwd_dkdv_sm90(
    const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, const T* __restrict__ dout,
    const float* __restrict__ lse_safe, const float* __restrict__ delta, float* __restrict__ dq_accum,
    T* __restrict__ dk, T* __restrict__ dv,
    i64 q_sb, i64 q_sh, i64 q_ss, i64 k_sb, i64 k_sh, i64 k_ss, i64 v_sb, i64 v_sh, i64 v_ss,
    i64 do_sb, i64 do_sh, i64 do_ss, i64 dk_sb, i64 dk_sh, i64 dk_ss, i64 dv_sb, i64 dv_sh, i64 dv_ss,
    int Hq, int Hkv, int Sq, int Sk, int Dout, int left, int right, float scale, int dq_mode) {
  static_assert(HD == 64 || HD == 128, "head_dim 64 or 128 (dQ: head_dim / 2 columns per warpgroup)");
  static_assert(STAGES == 1 || STAGES == 2, "Q/dO/lse/Delta buffers: 1 or 2");
  constexpr int KV_BYTES = BC * HD * 2, Q_BYTES = BR * HD * 2, DS_BYTES = BC * BR * 2;
  constexpr int PVN = 64, NPV = HD / PVN;  // dK, dV: NPV wgmmas of n64 per k16 step, 32 floats each
  constexpr int DQN = HD / 2;              // dQ columns per warpgroup (each warpgroup computes half)
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const unsigned sbase = (smem_u32(smem_raw) + 1023u) & ~1023u;
  // K, V | STAGES x (Q, dO) | dS^T | STAGES x (lse, Delta) | dQ staging (dq_mode 2): BR rows x DQN floats a warpgroup
  const unsigned sK = sbase, sV = sK + KV_BYTES, sQ0 = sV + KV_BYTES, sdS = sQ0 + STAGES * 2 * Q_BYTES;
  float* const sLse0 = reinterpret_cast<float*>(smem_raw + (sdS + DS_BYTES - smem_u32(smem_raw)));
  const unsigned sdQ = sdS + DS_BYTES + STAGES * 2 * BR * 4;
#if CUFLASH_BWD_DQ_MODE >= 0
  dq_mode = CUFLASH_BWD_DQ_MODE;
#endif
  const bool use_atomic_dq = dq_mode != 0;

  const int tid = threadIdx.x, wg = tid >> 7;
  const int warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int j0 = blockIdx.x * BC;
  const int hk = blockIdx.y, b = blockIdx.z;
  const int group = Hq / Hkv;
  const int shift = Sk - Sq;
  const float scale_log2 = scale * LOG2E;
  const int dhi = right < 0 ? 0x7fffffff : shift + right, dlo = left < 0 ? -0x7fffffff - 1 : shift - left;  // j - i bounds
  const int kr = 64 * wg + 16 * warp + g;  // this thread's key rows kr, kr + 8 of the tile

  // Query rows that see at least one key of [j0, j1).
  const int j1 = min(j0 + BC, Sk);
  int it0, ntiles;
  query_tiles(j0, j1, Sq, shift, left, right, BR, it0, ntiles);
  const int niter = ntiles * group;

  load_tile_sw128<T, HD, BC, NT>(sK, k + (i64)b * k_sb + (i64)hk * k_sh, k_ss, j0, Sk, tid);
  load_tile_sw128<T, HD, BC, NT>(sV, v + (i64)b * v_sb + (i64)hk * v_sh, v_ss, j0, Sk, tid);

  // The loads of iteration (query head qh of the group, Q tile qt) into buffer st: Q_i, dO_i, lse and Delta by
  // cp.async (raw lse, 0 past seqlen_q, where the per-entry mask zeroes P: such a tile is never full); or, with
  // LSE_ASYNC off, lse (scaled by log2e, +inf past seqlen_q: P = 0) and Delta by plain loads.
  constexpr bool LSE_ASYNC = STAGES == 2 || CUFLASH_BWD_LSE_ASYNC;
  const T* const qg = q + (i64)b * q_sb + (i64)hk * group * q_sh;  // query head 0 of the group
  const T* const dog = dout + (i64)b * do_sb + (i64)hk * group * do_sh;
  const i64 rb0 = ((i64)b * Hq + (i64)hk * group) * Sq;
  auto issue = [&](int qh, int qt, int st) {
    const int i0 = it0 + qt * BR;
    const unsigned sQ = sQ0 + st * 2 * Q_BYTES;
    load_tile_sw128<T, HD, BR, NT>(sQ, qg + (i64)qh * q_sh, q_ss, i0, Sq, tid);
    load_tile_sw128<T, HD, BR, NT>(sQ + Q_BYTES, dog + (i64)qh * do_sh, do_ss, i0, Sq, tid);
    const i64 rb = rb0 + (i64)qh * Sq;
    float* const sLse = sLse0 + st * 2 * BR;
    if constexpr (!LSE_ASYNC) {  // (these warps wait for the data here, before their dQ work)
      if (tid < BR) {
        const int i = i0 + tid;
        sLse[tid] = i < Sq ? lse_safe[rb + i] * LOG2E : INFINITY;
        sLse[BR + tid] = i < Sq ? delta[rb + i] : 0.f;
      }
    } else if (tid < 2 * BR) {
      const int r = tid & (BR - 1), i = i0 + r;
      const float* src = tid < BR ? lse_safe : delta;
      cp_async_4(smem_u32(sLse + tid), i < Sq ? src + rb + i : src, i < Sq);
    }
  };
  if (niter > 0) issue(0, 0, 0);
  cp_async_commit();
  if constexpr (STAGES == 2) {  // iteration 1: the next Q tile, or the next query head's first
    if (niter > 1) issue(ntiles > 1 ? 0 : 1, ntiles > 1 ? 1 : 0, 1);
    cp_async_commit();
  }

  float dk_acc[NPV][32], dv_acc[NPV][32];
#pragma unroll
  for (int n = 0; n < NPV; ++n)
#pragma unroll
    for (int e = 0; e < 32; ++e) dk_acc[n][e] = dv_acc[n][e] = 0.f;

  for (int it = 0, qh = 0, qt = 0; it < niter; ++it) {
    const int i0 = it0 + qt * BR;
    const int h = hk * group + qh;
    const bool last_tile = qt + 1 == ntiles;  // of this query head
    const int st = STAGES == 2 ? it & 1 : 0;
    const unsigned sQ = sQ0 + st * 2 * Q_BYTES, sdO = sQ + Q_BYTES;
    const float* const sLse = sLse0 + st * 2 * BR;
    const float* const sDelta = sLse + BR;
    cp_async_wait<STAGES - 1>();  // this iteration's group (two buffers: the next one's may be in flight)
    fence_proxy_async();  // the cp.async data (generic proxy) -> wgmma (async proxy)
    __syncthreads();

    // S^T = K_w Q^T and dP^T = V_w dO^T (64 keys x 64 queries each). Entry e of n8 block i: key kr + (e>>1)*8,
    // query 8i + 2t + (e&1).
    float s[32], dp[32];
    const bool full = tile_visible(i0, BR, j0, BC, Sq, Sk, shift, left, right);
    // P^T = exp2(S^T scale log2e - lse log2e), masked (in place of S^T)
    auto softmax_p = [&]() {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        float2 l2 = *reinterpret_cast<const float2*>(sLse + 8 * i + 2 * t);
        if constexpr (LSE_ASYNC) l2 = make_float2(l2.x * LOG2E, l2.y * LOG2E);  // raw lse in shared memory
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int x = 4 * i + e;
          float p = exp2f(fmaf(s[x], scale_log2, -((e & 1) ? l2.y : l2.x)));
          if (!full) {  // visible(i, j): i < Sq, j < Sk, dlo <= j - i <= dhi
            const int qi = i0 + 8 * i + 2 * t + (e & 1), kj = j0 + kr + (e >> 1) * 8;
            if (qi >= Sq || kj >= Sk || kj - qi > dhi || kj - qi < dlo) p = 0.f;
          }
          s[x] = p;
        }
      }
    };
    // dS^T = P^T o (dP^T - Delta) (in place of dP^T)
    auto softmax_ds = [&]() {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float2 d2 = *reinterpret_cast<const float2*>(sDelta + 8 * i + 2 * t);
#pragma unroll
        for (int e = 0; e < 4; ++e) dp[4 * i + e] = s[4 * i + e] * (dp[4 * i + e] - ((e & 1) ? d2.y : d2.x));
      }
    };
    // dS^T [key][query] in the swizzled layout: this thread's pairs (queries 8i + 2t, +1) of rows kr, kr + 8.
    auto store_ds = [&](const unsigned (&dsa)[BR / 16][4]) {
      unsigned char* const dsg = smem_raw + (sdS - smem_u32(smem_raw));
#pragma unroll
      for (int kk = 0; kk < BR / 16; ++kk) {
        const int c = 16 * kk + 2 * t;
        *reinterpret_cast<unsigned*>(dsg + sw128_offset<BC>(kr, c)) = dsa[kk][0];
        *reinterpret_cast<unsigned*>(dsg + sw128_offset<BC>(kr + 8, c)) = dsa[kk][1];
        *reinterpret_cast<unsigned*>(dsg + sw128_offset<BC>(kr, c + 8)) = dsa[kk][2];
        *reinterpret_cast<unsigned*>(dsg + sw128_offset<BC>(kr + 8, c + 8)) = dsa[kk][3];
      }
      fence_proxy_async();
    };
    unsigned pa[BR / 16][4], dsa[BR / 16][4];
    if constexpr (!OVL) {
      wgmma_fence();
      issue_qk<T, HD, BC, BR>(s, sK + 64 * wg * 128, sQ);
      issue_qk<T, HD, BC, BR>(dp, sV + 64 * wg * 128, sdO);
      wgmma_commit();
      wgmma_wait<0>();
      fence_regs(s);
      fence_regs(dp);
      softmax_p();
      softmax_ds();
      pack_p<T, BR>(pa, s);
      pack_p<T, BR>(dsa, dp);
      if (use_atomic_dq) store_ds(dsa);

      // dV_w += P^T dO, dK_w += dS^T Q. (The A operands' registers are not touched until the wait: the dS^T
      // stores above come first.)
      fence_regs(dk_acc);
      fence_regs(dv_acc);
      fence_regs(pa);
      fence_regs(dsa);
      wgmma_fence();
      issue_pv<T, HD, BR, PVN>(dv_acc, pa, sdO);
      issue_pv<T, HD, BR, PVN>(dk_acc, dsa, sQ);
      wgmma_commit();
      wgmma_wait<0>();
    } else {
      // Overlapped: S^T and dP^T in two groups; P^T while dP^T runs, then dV += P^T dO issued; dS^T while that
      // runs, then dK += dS^T Q. The waits are placed by the data they release (S^T for P^T; fence_regs(dp) for
      // dS^T) and each issue needs the values computed before it.
      wgmma_fence();
      issue_qk<T, HD, BC, BR>(s, sK + 64 * wg * 128, sQ);
      wgmma_commit();
      issue_qk<T, HD, BC, BR>(dp, sV + 64 * wg * 128, sdO);
      wgmma_commit();
      wgmma_wait<1>();  // S^T
      fence_regs(s);
      softmax_p();
      pack_p<T, BR>(pa, s);
      fence_regs(dv_acc);
      fence_regs(pa);
      wgmma_fence();
      issue_pv<T, HD, BR, PVN>(dv_acc, pa, sdO);
      wgmma_commit();
      wgmma_wait<1>();  // dP^T (dV may run on)
      fence_regs(dp);
      softmax_ds();
      pack_p<T, BR>(dsa, dp);
      if (use_atomic_dq) store_ds(dsa);
      fence_regs(dk_acc);
      fence_regs(dsa);
      wgmma_fence();
      issue_pv<T, HD, BR, PVN>(dk_acc, dsa, sQ);
      wgmma_commit();
      wgmma_wait<0>();
    }
    fence_regs(dk_acc);
    fence_regs(dv_acc);
    fence_regs(pa);  // the A operands stay live (unchanged) until the wgmmas read them
    fence_regs(dsa);
    // dq_mode 2: the previous Q tile's bulk reduction has read this warpgroup's dQ staging (long done: issued
    // before this tile's products), so it may be rewritten after the barrier
    if (dq_mode == 2 && (tid & 127) == 0) bulk_wait_read<0>();
    __syncthreads();  // sQ, sdO, sLse, sDelta free (every wgmma reading them is complete); sdS complete
    if (it + STAGES < niter) {  // iteration it + STAGES, into the buffer just read
      if constexpr (STAGES == 1) {
        issue(last_tile ? qh + 1 : qh, last_tile ? 0 : qt + 1, 0);
      } else {
        const int qt2 = qt + 2, wrap = qt2 >= ntiles ? (qt2 >= 2 * ntiles ? 2 : 1) : 0;  // ntiles may be 1
        issue(qh + wrap, qt2 - wrap * ntiles, st);
      }
    }
    cp_async_commit();

    if (use_atomic_dq) {  // warpgroup wg: dQ columns [DQN wg, DQN wg + DQN)
      float dq[DQN / 2];
      wgmma_fence();
      // head_dim 128: the wg-th 64-column block of K; 64: 32 columns of the one block, 64 bytes apart
      issue_dq<T, DQN>(dq, sdS, sK + (HD == 128 ? wg * (BC * 128) : wg * 64));
      wgmma_commit();
      wgmma_wait<0>();
      fence_regs(dq);
      // entry e of n8 block i: query 16 warp + g + (e>>1)*8, column DQN wg + 8i + 2t + (e&1)
      if (dq_mode == 2) {
        // rows of DQN floats in shared memory, then warpgroup wg's plane of the accumulator, rows i0 .. (the
        // tile's rows past seqlen_q are not sent). The 8-float groups of row r are stored XOR-permuted, group i at
        // i ^ (r % NG): the 8 rows of one store then fall on different banks (the copy engine keeps the layout;
        // bwd_dq_convert undoes it).
        constexpr int NG = DQN / 8;
        float* const sq = reinterpret_cast<float*>(smem_raw + (sdQ - smem_u32(smem_raw))) + wg * BR * DQN;
        const int r = 16 * warp + g, sw = r & (NG - 1);  // rows r and r + 8 permute alike (NG divides 8)
        float* const ra = sq + r * DQN + 2 * t;
#pragma unroll
        for (int i = 0; i < NG; ++i) {
          const int c = 8 * (i ^ sw);
          *reinterpret_cast<float2*>(ra + c) = make_float2(dq[4 * i], dq[4 * i + 1]);
          *reinterpret_cast<float2*>(ra + 8 * DQN + c) = make_float2(dq[4 * i + 2], dq[4 * i + 3]);
        }
        fence_proxy_async();  // the stores (generic proxy) -> the bulk reduction (async proxy)
        named_bar_sync(1 + wg, 128);
        if ((tid & 127) == 0) {
          const int nrows = min(BR, Sq - i0);
          float* const plane = dq_accum + (((i64)b * Hq + h) * 2 + wg) * Sq * DQN;
          bulk_reduce_add_f32(plane + (i64)i0 * DQN, sdQ + wg * BR * DQN * 4, nrows * DQN * 4);
          bulk_commit();
        }
      } else {
        const int ia = i0 + 16 * warp + g;
        float* pa0 = dq_accum + (((i64)b * Hq + h) * Sq + ia) * HD + DQN * wg + 2 * t;
        float* pb0 = pa0 + 8 * HD;
        if (ia + 8 < Sq) {
#pragma unroll
          for (int i = 0; i < DQN / 8; ++i) {
            atomicAdd(reinterpret_cast<float2*>(pa0 + 8 * i), make_float2(dq[4 * i], dq[4 * i + 1]));
            atomicAdd(reinterpret_cast<float2*>(pb0 + 8 * i), make_float2(dq[4 * i + 2], dq[4 * i + 3]));
          }
        } else if (ia < Sq) {
#pragma unroll
          for (int i = 0; i < DQN / 8; ++i)
            atomicAdd(reinterpret_cast<float2*>(pa0 + 8 * i), make_float2(dq[4 * i], dq[4 * i + 1]));
        }
      }
      // sdS is rewritten only after the next iteration's first barrier, which the warpgroups reach after their
      // dQ wait above
    }
    qt = last_tile ? 0 : qt + 1;
    qh += last_tile;
  }
  cp_async_wait<0>();  // nothing left in flight (also when no Q tile was visited)

  // dK * scale, dV (rows j < Sk, columns c < Dout) in T. Entry e of n8 block i of accumulator n: key
  // kr + (e>>1)*8, column n*64 + 8i + 2t + (e&1).
  T* dkg = dk + (i64)b * dk_sb + (i64)hk * dk_sh;
  T* dvg = dv + (i64)b * dv_sb + (i64)hk * dv_sh;
#pragma unroll
  for (int n = 0; n < NPV; ++n) {
#pragma unroll
    for (int x = 0; x < 32; ++x) {
      const int j = j0 + kr + ((x >> 1) & 1) * 8;
      const int c = n * PVN + 8 * (x >> 2) + 2 * t + (x & 1);
      if (j < Sk && c < Dout) {
        dkg[(i64)j * dk_ss + c] = from_float<T>(dk_acc[n][x] * scale);
        dvg[(i64)j * dv_ss + c] = from_float<T>(dv_acc[n][x]);
      }
    }
  }
  // dq_mode 2: the block's shared memory must outlive the last dQ reduction's read of it; its global writes need
  // no wait (done by the kernel's end, as a TMA store epilogue's)
  if (dq_mode == 2 && (tid & 127) == 0) bulk_wait_read<0>();
}

}  // namespace attn_bwd
}  // namespace cuflash
