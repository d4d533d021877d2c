// attention_bwd.cu — FlashAttention backward with recomputation (Dao, "FlashAttention-2", 2023, Alg. 2).
//
// Nothing of size seqlen_q x seqlen_k is stored: S = Q K^T * scale and P = exp(S - lse) are recomputed from the
// forward's saved logsumexp, tile by tile, on chip.
//   version 1 (bwd_preprocess):  Delta_i = rowsum(dO_i o O_i) in float32 (reads 2·N·d, writes N floats); also
//                                writes lse_safe (lse with -inf -> +inf so exp(S - lse_safe) = 0 for empty rows)
//                                and zeroes the float32 dQ accumulator of the atomic path.
//   version 2 (bwd_dkdv):        grid (ceil(Sk/Bc), heads_kv, batch). A block owns K_j, V_j (Bc x d) and loops
//                                over the query heads of its GQA group and the Q tiles that see K_j:
//                                  S^T = K_j Q_i^T, P^T = exp(S^T * scale - lse), dV_j += P^T dO_i,
//                                  dP^T = V_j dO_i^T, dS^T = P^T o (dP^T - Delta), dK_j += dS^T Q_i,
//                                  and (atomic path) dQ_i += dS_i K_j into a float32 accumulator with atomicAdd.
//                                dK, dV live in float32 registers for the whole loop (no atomics on them).
//   version 3 (bwd_dq):          the deterministic dQ: grid (ceil(Sq/Br), heads_q, batch), the block owns Q_i,
//                                dO_i and loops over the K tiles in a fixed order (recomputes S, P, dP, dS):
//                                dQ_i = scale · sum_j dS_ij K_j, written once. No atomics: bitwise reproducible.
//   version 4 (bwd_dq_convert):  dQ accumulator (float32) · scale -> dq in the input dtype and layout.
//   version 5 (bwd_*_simt):      float32 inputs: one warp per query row (dQ) / per key row (dK, dV), plain
//                                float32 FMAs and warp-shuffle dot products. Exact float32, deterministic, slow.
// Tensor cores: mma.sync m16n8k16 with float32 accumulators (16-bit inputs), warps own 16 rows; P^T and dS^T
// stay in registers as the A operand of the next product (the accumulator layout of two n8 tiles is an A
// fragment). Br = Bc = 64, 4 warps per 64 rows; head_dim 256 uses 2 warps per 16 rows, each owning half of the
// d columns of dK/dV/dQ (S and dP are computed by both).
// Masks (bottom-right aligned): query i sits at key position i + Sk - Sq; key j is visible iff
// (right < 0 || j <= i + shift + right) && (left < 0 || j >= i + shift - left) and j < Sk, i < Sq. Masked
// entries get P = 0 exactly; tiles entirely masked are never visited.
#include "cuflash/common.cuh"
#include "cuflash/mma.cuh"
#include "cuflash/attn_bwd_mask.cuh"

#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif

namespace cuflash {
namespace attn_bwd {

constexpr int BM = 64;  // Br = Bc = 64

// exp(x * scale - lse) as exp2(x * scale·log2e - lse·log2e): one FFMA and one MUFU.EX2 per entry (lse·log2e is
// what the kernels keep in shared memory or registers; +inf, an empty row's lse_safe, still gives 0).
__device__ __forceinline__ float exp_shifted(float x, float scale_log2, float lse_log2) {
  return exp2f(fmaf(x, scale_log2, -lse_log2));
}

// ------------------------------------------------------------------------------------------------------------
// version 1: Delta = rowsum(dO o O), lse_safe, zero the dQ accumulator. Grid (ceil(Sq / rows per block), Hq, B),
// 256 threads; a row (b, h, i) is `tpr` consecutive lanes (a power of two <= 32), each summing pieces of
// V = 16 / sizeof(T) elements (vec: one 16-byte load of each operand; else element by element, for any D and
// strides) before a shuffle tree over its group. The block then zeroes its rows of the accumulator, one contiguous range of float4 stores. (One
// warp per row with 2-byte loads and 64-bit index divisions ran this at 0.77 TB/s on the H200 at head_dim 64.)
template <typename T>
__device__ __forceinline__ float dot16(const T* a, const T* b) {  // 16 aligned bytes of each
  constexpr int V = 16 / sizeof(T);
  const uint4 x = *reinterpret_cast<const uint4*>(a), y = *reinterpret_cast<const uint4*>(b);
  const T* xa = reinterpret_cast<const T*>(&x);
  const T* ya = reinterpret_cast<const T*>(&y);
  float s = 0.f;
#pragma unroll
  for (int e = 0; e < V; ++e) s = fmaf(to_float(xa[e]), to_float(ya[e]), s);
  return s;
}

template <typename T>
__global__ void __launch_bounds__(256) bwd_preprocess(
    const T* __restrict__ out, const T* __restrict__ dout, const float* __restrict__ lse,
    float* __restrict__ delta, float* __restrict__ lse_safe, float* __restrict__ dq_accum,
    i64 o_sb, i64 o_sh, i64 o_ss, i64 do_sb, i64 do_sh, i64 do_ss, i64 l_sb, i64 l_sh, i64 l_ss,
    int Hq, int Sq, int D, int Dacc, int zero_dq, int tpr, int vec) {
  const int lane = threadIdx.x & 31, rpw = 32 / tpr, rpb = (blockDim.x >> 5) * rpw;
  const int h = blockIdx.y, b = blockIdx.z, i0 = blockIdx.x * rpb;
  const int i = i0 + (threadIdx.x >> 5) * rpw + lane / tpr, part = lane & (tpr - 1);
  const i64 rb = ((i64)b * Hq + h) * Sq;  // row index of (b, h, 0) in delta, lse_safe and the accumulator
  constexpr int V = 16 / sizeof(T);
  float acc = 0.f;
  if (i < Sq) {  // both load styles sum the same V-element pieces in the same order: bitwise the same Delta
    const T* o = out + b * o_sb + h * o_sh + i * o_ss;
    const T* g = dout + b * do_sb + h * do_sh + i * do_ss;
    for (int c = part * V; c < D; c += tpr * V) {
      if (vec) {
        acc += dot16(o + c, g + c);
      } else {
        float s = 0.f;
        for (int e = 0; e < V && c + e < D; ++e) s = fmaf(to_float(o[c + e]), to_float(g[c + e]), s);
        acc += s;
      }
    }
  }
  for (int m = tpr >> 1; m > 0; m >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, m);
  if (part == 0 && i < Sq) {
    delta[rb + i] = acc;
    const float L = lse[b * l_sb + h * l_sh + i * l_ss];
    lse_safe[rb + i] = (L == -INFINITY) ? INFINITY : L;
  }
  if (zero_dq) {  // rows [i0, min(i0 + rpb, Sq)) of (b, h): n floats from (rb + i0) * Dacc
    float* const a = dq_accum + (rb + i0) * Dacc;
    const int n = (min(i0 + rpb, Sq) - i0) * Dacc;
    if ((Dacc & 3) == 0) {
      for (int x = threadIdx.x; x < n / 4; x += blockDim.x) reinterpret_cast<float4*>(a)[x] = make_float4(0.f, 0.f, 0.f, 0.f);
    } else {
      for (int x = threadIdx.x; x < n; x += blockDim.x) a[x] = 0.f;
    }
  }
}

// ------------------------------------------------------------------------------------------------------------
// Shared helpers of the tensor-core kernels. HD: head_dim (padded, native), LD = HD + 8 (row pad: ldmatrix rows
// of 8 consecutive smem rows land in distinct bank groups).

// Async-load rows [row0, row0 + ROWS) of a (seqlen, HD) slice with row stride `rs` into s[ROWS][LD]; rows >=
// nrows are zero-filled. When NTHREADS is a multiple of the 16-byte chunks per row (CPR), thread t always copies
// chunk t % CPR of rows t / CPR + k * (NTHREADS / CPR): its column and row step are fixed, so each copy is a
// pointer bump (the generic loop spent ~27 instructions per 16-byte copy on divisions and 64-bit products).
template <typename T, int HD, int NTHREADS, int ROWS = BM>
__device__ __forceinline__ void load_tile_async(T* s, const T* g, i64 rs, int row0, int nrows) {
  constexpr int LD = HD + 8, CPR = HD / 8;
  if constexpr (NTHREADS % CPR == 0) {
    constexpr int RSTEP = NTHREADS / CPR, NK = (ROWS + RSTEP - 1) / RSTEP;
    const int cc = threadIdx.x % CPR, r0 = threadIdx.x / CPR;
    const T* src = g + (i64)(row0 + r0) * rs + cc * 8;
    const i64 step = (i64)RSTEP * rs;
    const uint32_t dst = smem_u32(s + r0 * LD + cc * 8);
#pragma unroll
    for (int k = 0; k < NK; ++k) {
      const int r = r0 + k * RSTEP;
      if (ROWS % RSTEP == 0 || r < ROWS) {
        const bool ok = row0 + r < nrows;
        cp_async_16(dst + k * RSTEP * LD * (int)sizeof(T), ok ? src : g, ok);
      }
      src += step;
    }
  } else {
    for (int c = threadIdx.x; c < ROWS * CPR; c += NTHREADS) {
      const int r = c / CPR, cc = c - r * CPR;
      const bool ok = row0 + r < nrows;
      const T* src = ok ? g + (i64)(row0 + r) * rs + cc * 8 : g;
      cp_async_16(smem_u32(s + r * LD + cc * 8), src, ok);
    }
  }
}

// acc(16 x 8NT) += X[xr0 .. xr0+16][0..KD] · Y[yr0 .. yr0+8NT][0..KD]^T, X and Y row-major in smem (ld LD).
template <typename T, int KD, int NT, int LD>
__device__ __forceinline__ void gemm_xyT(float (&acc)[NT][4], const T* X, int xr0, const T* Y, int yr0) {
  const int lane = threadIdx.x & 31;
  // shared-memory addresses of the k = 0 fragments; step kk is 32 bytes further (one address add per ldmatrix)
  const uint32_t xa = smem_u32(X + (xr0 + (lane & 15)) * LD + (lane >> 4) * 8);
  const uint32_t ya = smem_u32(Y + (yr0 + (lane >> 4) * 8 + (lane & 7)) * LD + ((lane >> 3) & 1) * 8);
#pragma unroll 1
  for (int kk = 0; kk < KD / 16; ++kk) {
    uint32_t a[4];
    ldmatrix_x4(a, xa + kk * 16 * (int)sizeof(T));
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      uint32_t r[4];
      ldmatrix_x4(r, ya + (np * 16 * LD + kk * 16) * (int)sizeof(T));
      const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
      mma_m16n8k16<T>(acc[2 * np], a, b0);
      mma_m16n8k16<T>(acc[2 * np + 1], a, b1);
    }
  }
}

// acc(16 x 8NT) += A(16 x 16KT, registers) · Y[0 .. 16KT][n0 .. n0+8NT] (Y row-major in smem, ld LD: k-major).
template <typename T, int KT, int NT, int LD>
__device__ __forceinline__ void gemm_rA_y(float (&acc)[NT][4], const uint32_t (&a)[KT][4], const T* Y, int n0) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int kk = 0; kk < KT; ++kk) {
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      uint32_t r[4];
      ldmatrix_x4_trans(r, smem_u32(Y + (kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * LD + n0 + np * 16 +
                                    (lane >> 4) * 8));
      const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
      mma_m16n8k16<T>(acc[2 * np], a[kk], b0);
      mma_m16n8k16<T>(acc[2 * np + 1], a[kk], b1);
    }
  }
}

// acc(16 x 8NT) += A · Y[0 .. 16KT][n0 .. n0+8NT] with A[m][k] = At[k][am0 + m] read from smem (At row-major,
// ld LDA: ldmatrix.trans) one k16 step at a time (fewer live registers than gemm_rA_y).
template <typename T, int KT, int NT, int LDA, int LD>
__device__ __forceinline__ void gemm_sAt_y(float (&acc)[NT][4], const T* At, int am0, const T* Y, int n0) {
  const int lane = threadIdx.x & 31, mi = lane >> 3;
#pragma unroll
  for (int kk = 0; kk < KT; ++kk) {
    uint32_t a[4];
    ldmatrix_x4_trans(a, smem_u32(At + (kk * 16 + (mi >> 1) * 8 + (lane & 7)) * LDA + am0 + (mi & 1) * 8));
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      uint32_t r[4];
      ldmatrix_x4_trans(r, smem_u32(Y + (kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * LD + n0 + np * 16 +
                                    (lane >> 4) * 8));
      const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
      mma_m16n8k16<T>(acc[2 * np], a, b0);
      mma_m16n8k16<T>(acc[2 * np + 1], a, b1);
    }
  }
}

// Accumulator tiles (16 x 8NT, float) -> A fragments (16 x 16(NT/2), T).
template <typename T, int NT>
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[NT / 2][4], const float (&c)[NT][4]) {
#pragma unroll
  for (int kk = 0; kk < NT / 2; ++kk) {
    a[kk][0] = pack2<T>(c[2 * kk][0], c[2 * kk][1]);
    a[kk][1] = pack2<T>(c[2 * kk][2], c[2 * kk][3]);
    a[kk][2] = pack2<T>(c[2 * kk + 1][0], c[2 * kk + 1][1]);
    a[kk][3] = pack2<T>(c[2 * kk + 1][2], c[2 * kk + 1][3]);
  }
}

template <typename T, int NT>
__device__ __forceinline__ void zero_acc(float (&c)[NT][4]) {
#pragma unroll
  for (int n = 0; n < NT; ++n) c[n][0] = c[n][1] = c[n][2] = c[n][3] = 0.f;
}


// ------------------------------------------------------------------------------------------------------------
// version 2: dK, dV per K/V tile of BC keys (and dQ by float32 atomics when use_atomic_dq); Q tiles of BM rows.
// Warp w: key rows wr*16 .. wr*16+15 of the tile (wr = w % (BC/16)), d columns wn*DW .. wn*DW+DW-1
// (wn = w / (BC/16)). For dQ (BM queries x HD) warp w owns query rows qr*16.. (qr = w % 4) and d columns
// cs*DWQ.. (cs = w / 4). Shared memory: K, V (BC x LD), Q, dO (BM x LD), dS^T (BC x (BM+8)), lse, D (BM).
template <typename T, int HD, int WN, int BC>
__global__ void __launch_bounds__(32 * (BC / 16) * WN) bwd_dkdv(
    const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, const T* __restrict__ dout,
    const float* __restrict__ lse_safe, const float* __restrict__ delta, float* __restrict__ dq_accum,
    T* __restrict__ dk, T* __restrict__ dv,
    i64 q_sb, i64 q_sh, i64 q_ss, i64 k_sb, i64 k_sh, i64 k_ss, i64 v_sb, i64 v_sh, i64 v_ss,
    i64 do_sb, i64 do_sh, i64 do_ss, i64 dk_sb, i64 dk_sh, i64 dk_ss, i64 dv_sb, i64 dv_sh, i64 dv_ss,
    int Hq, int Hkv, int Sq, int Sk, int Dout, int left, int right, float scale, int use_atomic_dq) {
  constexpr int WR = BC / 16;              // warps along the keys
  constexpr int NW = WR * WN;              // warps per block
  constexpr int NTHREADS = 32 * NW, LD = HD + 8, LDS = BM + 8, DW = HD / WN;
  constexpr int NQ = BM / 8;               // n8 tiles over the 64 queries of S^T
  constexpr int ND = DW / 8;               // n8 tiles over this warp's d columns of dK, dV
  constexpr int NCS = NW / (BM / 16);      // dQ: column splits
  constexpr int DWQ = HD / NCS;            // dQ: d columns per warp
  constexpr int NDQ = DWQ / 8;
  static_assert(DW % 16 == 0 && DWQ % 16 == 0, "d columns per warp must be a multiple of 16");
  static_assert(NW % (BM / 16) == 0, "warps must tile the dQ rows");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sK = reinterpret_cast<T*>(smem_raw);
  T* sV = sK + BC * LD;
  T* sQ = sV + BC * LD;
  T* sdO = sQ + BM * LD;
  T* sdS = sdO + BM * LD;  // dS^T: [key][query]
  float* sLse = reinterpret_cast<float*>(sdS + BC * LDS);
  float* sDelta = sLse + BM;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wr = warp % WR, wn = warp / WR;
  const int g = lane >> 2, t = lane & 3;
  const int j0 = blockIdx.x * BC;
  const int hk = blockIdx.y, b = blockIdx.z;
  const int group = Hq / Hkv;
  const int shift = Sk - Sq;
  const float scale_log2 = scale * LOG2E;

  // Query rows that see at least one key of [j0, j1).
  const int j1 = min(j0 + BC, Sk);
  int it0, ntiles;
  query_tiles(j0, j1, Sq, shift, left, right, BM, it0, ntiles);
  const int niter = ntiles * group;

  const T* kg = k + (i64)b * k_sb + (i64)hk * k_sh;
  const T* vg = v + (i64)b * v_sb + (i64)hk * v_sh;
  load_tile_async<T, HD, NTHREADS, BC>(sK, kg, k_ss, j0, Sk);
  load_tile_async<T, HD, NTHREADS, BC>(sV, vg, v_ss, j0, Sk);

  // Issue the loads of an iteration (Q_i, dO_i async; lse, Delta synchronous). Iteration it visits Q tile
  // qt = it % ntiles of query head qh = it / ntiles of the group; the loop steps both (no integer division).
  auto issue = [&](int qh, int qt) {
    const int h = hk * group + qh;
    const int i0 = it0 + qt * BM;
    load_tile_async<T, HD, NTHREADS>(sQ, q + (i64)b * q_sb + (i64)h * q_sh, q_ss, i0, Sq);
    load_tile_async<T, HD, NTHREADS>(sdO, dout + (i64)b * do_sb + (i64)h * do_sh, do_ss, i0, Sq);
    const i64 rb = ((i64)b * Hq + h) * Sq;
    for (int r = tid; r < BM; r += NTHREADS) {
      const int i = i0 + r;
      sLse[r] = i < Sq ? lse_safe[rb + i] * LOG2E : INFINITY;  // lse·log2e (exp_shifted)
      sDelta[r] = i < Sq ? delta[rb + i] : 0.f;
    }
  };
  if (niter > 0) issue(0, 0);
  cp_async_commit();

  float dk_acc[ND][4], dv_acc[ND][4];
  zero_acc<T, ND>(dk_acc);
  zero_acc<T, ND>(dv_acc);

  for (int it = 0, qh = 0, qt = 0; it < niter; ++it) {
    const int i0 = it0 + qt * BM;
    const int h = hk * group + qh;
    const bool last_tile = qt + 1 == ntiles;  // of this query head
    cp_async_wait<0>();
    __syncthreads();

    // S^T = K_w Q^T (16 keys x 64 queries), P^T = exp(S^T * scale - lse) (masked -> 0). Entry (n, e) of this
    // thread is key wr*16 + g + (e >> 1) * 8, query n*8 + 2t + (e & 1): the lse (and Delta) of its pair of
    // queries is one 8-byte shared load.
    float s[NQ][4];
    zero_acc<T, NQ>(s);
    gemm_xyT<T, HD, NQ, LD>(s, sK, wr * 16, sQ, 0);
    if (tile_visible(i0, BM, j0, BC, Sq, Sk, shift, left, right)) {
#pragma unroll
      for (int n = 0; n < NQ; ++n) {
        const float2 l2 = *reinterpret_cast<const float2*>(sLse + n * 8 + 2 * t);
#pragma unroll
        for (int e = 0; e < 4; ++e) s[n][e] = exp_shifted(s[n][e], scale_log2, (e & 1) ? l2.y : l2.x);
      }
    } else {  // this thread's two keys: the queries each sees, relative to i0 + 2t (entry query = that + c)
      int lo[2], hi[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        query_range(j0 + wr * 16 + g + 8 * r, Sq, Sk, shift, left, right, lo[r], hi[r]);
        lo[r] -= i0 + 2 * t;
        hi[r] -= i0 + 2 * t;
      }
#pragma unroll
      for (int n = 0; n < NQ; ++n) {
        const float2 l2 = *reinterpret_cast<const float2*>(sLse + n * 8 + 2 * t);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int c = n * 8 + (e & 1), r = e >> 1;
          const bool ok = c >= lo[r] && c < hi[r];
          s[n][e] = ok ? exp_shifted(s[n][e], scale_log2, (e & 1) ? l2.y : l2.x) : 0.f;
        }
      }
    }
    // dP^T = V_w dO^T; dS^T = P^T o (dP^T - Delta).
    float dp[NQ][4];
    zero_acc<T, NQ>(dp);
    gemm_xyT<T, HD, NQ, LD>(dp, sV, wr * 16, sdO, 0);
#pragma unroll
    for (int n = 0; n < NQ; ++n) {
      const float2 d2 = *reinterpret_cast<const float2*>(sDelta + n * 8 + 2 * t);
#pragma unroll
      for (int e = 0; e < 4; ++e) dp[n][e] = s[n][e] * (dp[n][e] - ((e & 1) ? d2.y : d2.x));
    }
    uint32_t pa[NQ / 2][4], dsa[NQ / 2][4];
    acc_to_a<T, NQ>(pa, s);
    acc_to_a<T, NQ>(dsa, dp);
    // dV += P^T dO, dK += dS^T Q (this warp's d columns).
    gemm_rA_y<T, NQ / 2, ND, LD>(dv_acc, pa, sdO, wn * DW);
    gemm_rA_y<T, NQ / 2, ND, LD>(dk_acc, dsa, sQ, wn * DW);

    if (use_atomic_dq && wn == 0) {
      // dS^T (rows = keys) to shared memory for the dQ product.
#pragma unroll
      for (int kk = 0; kk < NQ / 2; ++kk) {
        const int c = kk * 16 + 2 * t;
        T* row0 = sdS + (wr * 16 + g) * LDS;
        T* row1 = row0 + 8 * LDS;
        *reinterpret_cast<uint32_t*>(row0 + c) = dsa[kk][0];
        *reinterpret_cast<uint32_t*>(row1 + c) = dsa[kk][1];
        *reinterpret_cast<uint32_t*>(row0 + c + 8) = dsa[kk][2];
        *reinterpret_cast<uint32_t*>(row1 + c + 8) = dsa[kk][3];
      }
    }
    __syncthreads();  // sQ, sdO, sLse, sDelta free; sdS complete
    if (it + 1 < niter) issue(last_tile ? qh + 1 : qh, last_tile ? 0 : qt + 1);
    cp_async_commit();

    if (use_atomic_dq) {
      // dQ_i (queries qr*16.., d columns cs*DWQ..) += dS K_j, A = dS[query][key] = sdS^T (ldmatrix.trans).
      const int qr = (threadIdx.x >> 5) % (BM / 16), cs = (threadIdx.x >> 5) / (BM / 16);
      float dq[NDQ][4];
      zero_acc<T, NDQ>(dq);
      gemm_sAt_y<T, BC / 16, NDQ, LDS, LD>(dq, sdS, qr * 16, sK, cs * DWQ);
      // This thread's two query rows of the accumulator, i and i + 8: one 64-bit address each, the columns as
      // immediate offsets (a per-entry address and guard cost ~13 instructions per atomic); no guard when both
      // rows exist.
      const int ia = i0 + qr * 16 + g;
      float* pa = dq_accum + (((i64)b * Hq + h) * Sq + ia) * HD + cs * DWQ + 2 * t;
      float* pb = pa + 8 * HD;
      auto add2 = [](float* p, float x, float y) {
#if __CUDA_ARCH__ >= 900
        atomicAdd(reinterpret_cast<float2*>(p), make_float2(x, y));
#else
        atomicAdd(p, x);
        atomicAdd(p + 1, y);
#endif
      };
      if (ia + 8 < Sq) {
#pragma unroll
        for (int n = 0; n < NDQ; ++n) {
          add2(pa + n * 8, dq[n][0], dq[n][1]);
          add2(pb + n * 8, dq[n][2], dq[n][3]);
        }
      } else if (ia < Sq) {
#pragma unroll
        for (int n = 0; n < NDQ; ++n) add2(pa + n * 8, dq[n][0], dq[n][1]);
      }
    }
    qt = last_tile ? 0 : qt + 1;
    qh += last_tile;
  }

  cp_async_wait<0>();  // nothing left in flight (also when no Q tile was visited)

  // Write dK * scale, dV (rows j < Sk, columns c < Dout) in T.
  T* dkg = dk + (i64)b * dk_sb + (i64)hk * dk_sh;
  T* dvg = dv + (i64)b * dv_sb + (i64)hk * dv_sh;
#pragma unroll
  for (int n = 0; n < ND; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int j = j0 + wr * 16 + g + (e >> 1) * 8;
      const int c = wn * DW + n * 8 + 2 * t + (e & 1);
      if (j < Sk && c < Dout) {
        dkg[(i64)j * dk_ss + c] = from_float<T>(dk_acc[n][e] * scale);
        dvg[(i64)j * dv_ss + c] = from_float<T>(dv_acc[n][e]);
      }
    }
  }
}

template <int HD>
__host__ __device__ constexpr int smem_dq_bytes(int elem) {
  return 4 * BM * (HD + 8) * elem + 2 * BM * 4;
}

// ------------------------------------------------------------------------------------------------------------
// version 3: deterministic dQ. Warp w: query rows wr*16.. of the tile, d columns wn*DW...
template <typename T, int HD, int WN>
__global__ void __launch_bounds__(128 * WN) bwd_dq(
    const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, const T* __restrict__ dout,
    const float* __restrict__ lse_safe, const float* __restrict__ delta, T* __restrict__ dqo,
    i64 q_sb, i64 q_sh, i64 q_ss, i64 k_sb, i64 k_sh, i64 k_ss, i64 v_sb, i64 v_sh, i64 v_ss,
    i64 do_sb, i64 do_sh, i64 do_ss, i64 dq_sb, i64 dq_sh, i64 dq_ss,
    int Hq, int Hkv, int Sq, int Sk, int Dout, int left, int right, float scale) {
  constexpr int NTHREADS = 128 * WN, LD = HD + 8, DW = HD / WN;
  constexpr int NK = BM / 8, ND = DW / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sdO = sQ + BM * LD;
  T* sK = sdO + BM * LD;
  T* sV = sK + BM * LD;
  float* sLse = reinterpret_cast<float*>(sV + BM * LD);
  float* sDelta = sLse + BM;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wr = warp & 3, wn = warp >> 2;
  const int g = lane >> 2, t = lane & 3;
  const int i0 = blockIdx.x * BM;
  const int h = blockIdx.y, b = blockIdx.z;
  const int hk = h / (Hq / Hkv);
  const int shift = Sk - Sq;
  const float scale_log2 = scale * LOG2E;

  const int i1 = min(i0 + BM, Sq);
  const long long jlo_ll = left < 0 ? 0 : max(0ll, (long long)i0 + shift - left);
  const long long jhi_ll = right < 0 ? (long long)Sk - 1 : min((long long)Sk - 1, (long long)i1 - 1 + shift + right);
  const int jt0 = (int)(jlo_ll / BM) * BM;
  const int ntiles = jhi_ll < jlo_ll ? 0 : (int)((jhi_ll - jt0) / BM + 1);

  load_tile_async<T, HD, NTHREADS>(sQ, q + (i64)b * q_sb + (i64)h * q_sh, q_ss, i0, Sq);
  load_tile_async<T, HD, NTHREADS>(sdO, dout + (i64)b * do_sb + (i64)h * do_sh, do_ss, i0, Sq);
  const i64 rb = ((i64)b * Hq + h) * Sq;
  for (int r = tid; r < BM; r += NTHREADS) {
    const int i = i0 + r;
    sLse[r] = i < Sq ? lse_safe[rb + i] * LOG2E : INFINITY;  // lse·log2e (exp_shifted)
    sDelta[r] = i < Sq ? delta[rb + i] : 0.f;
  }
  const T* kg = k + (i64)b * k_sb + (i64)hk * k_sh;
  const T* vg = v + (i64)b * v_sb + (i64)hk * v_sh;

  float dq[ND][4];
  zero_acc<T, ND>(dq);
  float L[2] = {0.f, 0.f}, Dl[2] = {0.f, 0.f};

  for (int jt = 0; jt < ntiles; ++jt) {
    const int j0 = jt0 + jt * BM;
    __syncthreads();  // previous tile's sK, sV no longer read
    load_tile_async<T, HD, NTHREADS>(sK, kg, k_ss, j0, Sk);
    load_tile_async<T, HD, NTHREADS>(sV, vg, v_ss, j0, Sk);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    if (jt == 0) {
      L[0] = sLse[wr * 16 + g];
      L[1] = sLse[wr * 16 + g + 8];
      Dl[0] = sDelta[wr * 16 + g];
      Dl[1] = sDelta[wr * 16 + g + 8];
    }
    float s[NK][4];
    zero_acc<T, NK>(s);
    gemm_xyT<T, HD, NK, LD>(s, sQ, wr * 16, sK, 0);
    if (tile_visible(i0, BM, j0, BM, Sq, Sk, shift, left, right)) {
#pragma unroll
      for (int n = 0; n < NK; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[n][e] = exp_shifted(s[n][e], scale_log2, L[e >> 1]);
      }
    } else {  // this thread's two queries: the keys each sees, relative to j0 + 2t (entry key = that + c)
      int lo[2], hi[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        key_range(i0 + wr * 16 + g + 8 * r, Sq, Sk, shift, left, right, lo[r], hi[r]);
        lo[r] -= j0 + 2 * t;
        hi[r] -= j0 + 2 * t;
      }
#pragma unroll
      for (int n = 0; n < NK; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int c = n * 8 + (e & 1), r = e >> 1;
          const bool ok = c >= lo[r] && c < hi[r];
          s[n][e] = ok ? exp_shifted(s[n][e], scale_log2, L[e >> 1]) : 0.f;
        }
      }
    }
    float dp[NK][4];
    zero_acc<T, NK>(dp);
    gemm_xyT<T, HD, NK, LD>(dp, sdO, wr * 16, sV, 0);
#pragma unroll
    for (int n = 0; n < NK; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) dp[n][e] = s[n][e] * (dp[n][e] - Dl[e >> 1]);
    }
    uint32_t dsa[NK / 2][4];
    acc_to_a<T, NK>(dsa, dp);
    gemm_rA_y<T, NK / 2, ND, LD>(dq, dsa, sK, wn * DW);
  }

  cp_async_commit();
  cp_async_wait<0>();  // nothing left in flight (also when no K tile was visited)

  T* dqg = dqo + (i64)b * dq_sb + (i64)h * dq_sh;
#pragma unroll
  for (int n = 0; n < ND; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = i0 + wr * 16 + g + (e >> 1) * 8;
      const int c = wn * DW + n * 8 + 2 * t + (e & 1);
      if (i < Sq && c < Dout) dqg[(i64)i * dq_ss + c] = from_float<T>(dq[n][e] * scale);
    }
  }
}

// ------------------------------------------------------------------------------------------------------------
// version 4: dq = dq_accum * scale in T. The accumulator of a (batch, head) is `planes` planes of Sq rows x
// W = Dacc / planes columns (1: rows of Dacc floats; 2: the Hopper kernel's column halves, W = 32 or 64, whose
// 8-float groups of row i are XOR-permuted by i % (W / 8): group k at k ^ (i % (W / 8))). Grid (ceil(Sq / rows per
// block), Hq, B), 256 threads; a row is `tpr` consecutive lanes, each converting 4 columns at a time (one float4
// load: 4 columns never straddle an 8-float group or a plane), stored as one 8-byte store when `vec` (dq's row
// starts 8-byte aligned, Dout a multiple of 4), else element by element. (One warp per row, element by element,
// ran at 1.5 TB/s on the H200 at head_dim 64.) Dacc is a multiple of 8.
template <typename T>
__global__ void __launch_bounds__(256) bwd_dq_convert(const float* __restrict__ dq_accum, T* __restrict__ dq,
                                                       i64 dq_sb, i64 dq_sh, i64 dq_ss, int Hq, int Sq, int Dout,
                                                       int Dacc, float scale, int planes, int tpr, int vec) {
  static_assert(sizeof(T) == 2, "the atomic dQ path is for float16 / bfloat16");
  const int lane = threadIdx.x & 31, rpw = 32 / tpr, rpb = (blockDim.x >> 5) * rpw;
  const int h = blockIdx.y, b = blockIdx.z;
  const int i = blockIdx.x * rpb + (threadIdx.x >> 5) * rpw + lane / tpr, part = lane & (tpr - 1);
  if (i >= Sq) return;
  const i64 bh = (i64)b * Hq + h;
  T* const o = dq + b * dq_sb + h * dq_sh + i * dq_ss;
  const int W = Dacc / planes, sw = planes == 2 ? (i & (W / 8 - 1)) : 0;
  const i64 plane = (i64)Sq * W;
  const float* const a = dq_accum + bh * planes * plane + (i64)i * W;
  for (int c = 4 * part; c < Dout; c += 4 * tpr) {
    const int p = c >= W, cw = c - p * W;
    const float4 x = *reinterpret_cast<const float4*>(a + p * plane + ((((cw >> 3) ^ sw) << 3) | (cw & 7)));
    const T y[4] = {from_float<T>(x.x * scale), from_float<T>(x.y * scale), from_float<T>(x.z * scale),
                    from_float<T>(x.w * scale)};
    if (vec) {
      *reinterpret_cast<uint2*>(o + c) = *reinterpret_cast<const uint2*>(y);
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (c + e < Dout) o[c + e] = y[e];
    }
  }
}

// ------------------------------------------------------------------------------------------------------------
// version 5: SIMT (float32 inputs). Lane l holds columns l, l+32, ... (D <= 256: 8 per lane).
constexpr int SIMT_U = 8;

__device__ __forceinline__ float2 warp_sum2(float2 x) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) {
    x.x += __shfl_xor_sync(0xffffffffu, x.x, m);
    x.y += __shfl_xor_sync(0xffffffffu, x.y, m);
  }
  return x;
}

template <typename T>
__device__ __forceinline__ void load_row(float (&x)[SIMT_U], const T* p, int D) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int u = 0; u < SIMT_U; ++u) {
    const int c = lane + 32 * u;
    x[u] = c < D ? to_float(p[c]) : 0.f;
  }
}

// dQ: one warp per query row; keys in the row's visible range, in order.
template <typename T>
__global__ void __launch_bounds__(128) bwd_dq_simt(
    const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, const T* __restrict__ dout,
    const float* __restrict__ lse_safe, const float* __restrict__ delta, T* __restrict__ dqo,
    i64 q_sb, i64 q_sh, i64 q_ss, i64 k_sb, i64 k_sh, i64 k_ss, i64 v_sb, i64 v_sh, i64 v_ss,
    i64 do_sb, i64 do_sh, i64 do_ss, i64 dq_sb, i64 dq_sh, i64 dq_ss,
    int Hq, int Hkv, int Sq, int Sk, int D, int left, int right, float scale) {
  const int lane = threadIdx.x & 31;
  const int i = blockIdx.x * 4 + (threadIdx.x >> 5);
  const int h = blockIdx.y, b = blockIdx.z;
  if (i >= Sq) return;
  const int hk = h / (Hq / Hkv);
  const int shift = Sk - Sq;
  float qv[SIMT_U], gv[SIMT_U], acc[SIMT_U];
  load_row(qv, q + (i64)b * q_sb + (i64)h * q_sh + (i64)i * q_ss, D);
  load_row(gv, dout + (i64)b * do_sb + (i64)h * do_sh + (i64)i * do_ss, D);
#pragma unroll
  for (int u = 0; u < SIMT_U; ++u) acc[u] = 0.f;
  const i64 row = ((i64)b * Hq + h) * Sq + i;
  const float L = lse_safe[row], Dl = delta[row];
  const long long jlo = left < 0 ? 0 : max(0ll, (long long)i + shift - left);
  const long long jhi = right < 0 ? (long long)Sk - 1 : min((long long)Sk - 1, (long long)i + shift + right);
  const T* kg = k + (i64)b * k_sb + (i64)hk * k_sh;
  const T* vg = v + (i64)b * v_sb + (i64)hk * v_sh;
  for (long long j = jlo; j <= jhi; ++j) {
    float kv[SIMT_U], vv[SIMT_U];
    load_row(kv, kg + (i64)j * k_ss, D);
    load_row(vv, vg + (i64)j * v_ss, D);
    float2 sd = make_float2(0.f, 0.f);
#pragma unroll
    for (int u = 0; u < SIMT_U; ++u) {
      sd.x += qv[u] * kv[u];
      sd.y += gv[u] * vv[u];
    }
    sd = warp_sum2(sd);
    const float p = exp2f((sd.x * scale - L) * LOG2E);
    const float ds = p * (sd.y - Dl);
#pragma unroll
    for (int u = 0; u < SIMT_U; ++u) acc[u] += ds * kv[u];
  }
  T* o = dqo + (i64)b * dq_sb + (i64)h * dq_sh + (i64)i * dq_ss;
#pragma unroll
  for (int u = 0; u < SIMT_U; ++u) {
    const int c = lane + 32 * u;
    if (c < D) o[c] = from_float<T>(acc[u] * scale);
  }
}

// dK, dV: one warp per key row; query heads of the group, then visible query rows, in order.
template <typename T>
__global__ void __launch_bounds__(128) bwd_dkdv_simt(
    const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, const T* __restrict__ dout,
    const float* __restrict__ lse_safe, const float* __restrict__ delta, T* __restrict__ dk, T* __restrict__ dv,
    i64 q_sb, i64 q_sh, i64 q_ss, i64 k_sb, i64 k_sh, i64 k_ss, i64 v_sb, i64 v_sh, i64 v_ss,
    i64 do_sb, i64 do_sh, i64 do_ss, i64 dk_sb, i64 dk_sh, i64 dk_ss, i64 dv_sb, i64 dv_sh, i64 dv_ss,
    int Hq, int Hkv, int Sq, int Sk, int D, int left, int right, float scale) {
  const int lane = threadIdx.x & 31;
  const int j = blockIdx.x * 4 + (threadIdx.x >> 5);
  const int hk = blockIdx.y, b = blockIdx.z;
  if (j >= Sk) return;
  const int group = Hq / Hkv;
  const int shift = Sk - Sq;
  float kv[SIMT_U], vv[SIMT_U], dka[SIMT_U], dva[SIMT_U];
  load_row(kv, k + (i64)b * k_sb + (i64)hk * k_sh + (i64)j * k_ss, D);
  load_row(vv, v + (i64)b * v_sb + (i64)hk * v_sh + (i64)j * v_ss, D);
#pragma unroll
  for (int u = 0; u < SIMT_U; ++u) dka[u] = dva[u] = 0.f;
  // visible iff j <= i + shift + right and j >= i + shift - left  <=>  j - shift - right <= i <= j - shift + left
  const long long ilo = right < 0 ? 0 : max(0ll, (long long)j - shift - right);
  const long long ihi = left < 0 ? (long long)Sq - 1 : min((long long)Sq - 1, (long long)j - shift + left);
  for (int hq = hk * group; hq < (hk + 1) * group; ++hq) {
    const T* qg = q + (i64)b * q_sb + (i64)hq * q_sh;
    const T* gg = dout + (i64)b * do_sb + (i64)hq * do_sh;
    const i64 rb = ((i64)b * Hq + hq) * Sq;
    for (long long i = ilo; i <= ihi; ++i) {
      float qv[SIMT_U], gv[SIMT_U];
      load_row(qv, qg + (i64)i * q_ss, D);
      load_row(gv, gg + (i64)i * do_ss, D);
      float2 sd = make_float2(0.f, 0.f);
#pragma unroll
      for (int u = 0; u < SIMT_U; ++u) {
        sd.x += qv[u] * kv[u];
        sd.y += gv[u] * vv[u];
      }
      sd = warp_sum2(sd);
      const float p = exp2f((sd.x * scale - lse_safe[rb + i]) * LOG2E);
      const float ds = p * (sd.y - delta[rb + i]);
#pragma unroll
      for (int u = 0; u < SIMT_U; ++u) {
        dva[u] += p * gv[u];
        dka[u] += ds * qv[u];
      }
    }
  }
  T* ko = dk + (i64)b * dk_sb + (i64)hk * dk_sh + (i64)j * dk_ss;
  T* vo = dv + (i64)b * dv_sb + (i64)hk * dv_sh + (i64)j * dv_ss;
#pragma unroll
  for (int u = 0; u < SIMT_U; ++u) {
    const int c = lane + 32 * u;
    if (c < D) {
      ko[c] = from_float<T>(dka[u] * scale);
      vo[c] = from_float<T>(dva[u]);
    }
  }
}

}  // namespace attn_bwd
}  // namespace cuflash
