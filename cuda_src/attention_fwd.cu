// attention_fwd.cu — tiled attention forward with online softmax (FlashAttention-2 schedule, Dao 2023).
//
// Version 1 (attention_fwd_f32): the seed tile loop (flash-attention-minimal shape) in plain float32 SIMT code:
//   one warp per query row, K/V tiles of Bc keys in shared memory. The float32 path: exact fp32 arithmetic,
//   not tensor cores.
// Version 2 (attention_fwd_kernel): the FA-2 schedule on tensor cores (fp16 / bf16 inputs):
//   one block per (Q tile of Br rows, head, batch); each warp owns 16·MT query rows of the tile;
//   K_j / V_j tiles of Bc keys stream through shared memory with cp.async (STAGES-deep pipeline);
//   S = Q·K_j^T with mma.sync m16n8k16 (ldmatrix), online softmax on the accumulator fragments
//   (m, l per row; a row is spread over the 4 lanes of a quad), P rounded to T in registers and used
//   directly as the A operand of O += P·V_j (V via ldmatrix.trans); division by l deferred to the end.
//   K/V tiles outside the mask are skipped; elementwise masking only where a tile straddles a boundary.
// Traffic per (batch, head): reads Q once (N·d), K and V once per Q tile (2·Tr·N·d), writes O (N·d) and lse (N).
//
// Masking (FlashAttention >= 2.1, bottom-right aligned): query row i sits at key position i + shift,
// shift = seqlen_k - seqlen_q; key j is visible iff j < seqlen_k, (right < 0 || j <= i + shift + right) and
// (left < 0 || j >= i + shift - left). Causal = right 0. A row that sees no key writes 0 and lse = -inf.
// Scores are kept in log2 units: s2 = (q·k) * softmax_scale * log2(e); p = exp2(s2 - m2).
#include "cuflash/common.cuh"
#include "cuflash/mma.cuh"

#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif

namespace cuflash {

// Visible keys [lo, hi) for query rows [q0, q1) (q1 > q0); may be empty (lo >= hi).
__device__ __forceinline__ void key_range(int q0, int q1, int seqlen_k, int shift, int left, int right,
                                          int& lo, int& hi) {
  hi = right < 0 ? seqlen_k : min(seqlen_k, q1 - 1 + shift + right + 1);
  lo = left < 0 ? 0 : max(0, q0 + shift - left);
}

__device__ __forceinline__ bool key_visible(int i, int j, int seqlen_k, int shift, int left, int right) {
  return j < seqlen_k && (right < 0 || j <= i + shift + right) && (left < 0 || j >= i + shift - left);
}

// ======================================================================================================
// Version 2: tensor cores. T in {__half, __nv_bfloat16}; HEAD_DIM in {32, 64, 96, 128, 256};
// MT m16 tiles per warp: warp w owns query rows [16·MT·w, 16·MT·(w+1)) of the tile, NWARPS = Br / (16·MT);
// Bc % 16 == 0, STAGES >= 2. MT = 2 halves the shared-memory reads of K and V per mma (one ldmatrix feeds
// MT mma) at the cost of twice the accumulator registers.
// Q fragments stay in registers when QREG (MT·HEAD_DIM <= 128), else they are re-read from shared memory.
// ======================================================================================================
template <int HEAD_DIM, int Br, int Bc, int STAGES>
struct FwdSmem {
  static constexpr int LD = HEAD_DIM + 8;  // padded row (elements): 8 rows of ldmatrix hit distinct banks
  static constexpr int Q_ELEMS = Br * LD;
  static constexpr int KV_ELEMS = Bc * LD;
  static constexpr int ELEMS = Q_ELEMS + 2 * STAGES * KV_ELEMS;  // Q, then K stages, then V stages
};

template <typename T, int HEAD_DIM, int Br, int Bc, int STAGES, int MT>
__global__ void __launch_bounds__(Br / (16 * MT) * 32)
attention_fwd_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                     T* __restrict__ out, float* __restrict__ lse,
                     i64 q_sb, i64 q_sh, i64 q_ss, i64 k_sb, i64 k_sh, i64 k_ss,
                     i64 v_sb, i64 v_sh, i64 v_ss, i64 o_sb, i64 o_sh, i64 o_ss,
                     int heads_q, int group, int seqlen_q, int seqlen_k, float scale_log2,
                     int left, int right) {
  static_assert(Br % (16 * MT) == 0 && Bc % 16 == 0 && HEAD_DIM % 16 == 0 && STAGES >= 2, "tile shape");
  constexpr int NWARPS = Br / (16 * MT);
  constexpr int NT = NWARPS * 32;
  constexpr bool QREG = HEAD_DIM * MT <= 128;
  constexpr int KSTEPS = HEAD_DIM / 16;  // k16 steps of Q·K^T
  constexpr int NTILES = Bc / 8;         // n8 tiles of S
  constexpr int DTILES = HEAD_DIM / 8;   // n8 tiles of O
  constexpr int CHUNKS = HEAD_DIM / 8;   // 16-byte chunks per row
  typedef FwdSmem<HEAD_DIM, Br, Bc, STAGES> SM;
  constexpr int LD = SM::LD;

  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sK = sQ + SM::Q_ELEMS;
  T* sV = sK + STAGES * SM::KV_ELEMS;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;
  const int q0 = (gridDim.x - 1 - blockIdx.x) * Br;  // longest (causal) Q tiles first
  const int h = blockIdx.y, b = blockIdx.z, hk = h / group;
  const int shift = seqlen_k - seqlen_q;
  const T* qp = q + b * q_sb + h * q_sh;
  const T* kp = k + b * k_sb + hk * k_sh;
  const T* vp = v + b * v_sb + hk * v_sh;
  T* op = out + b * o_sb + h * o_sh;
  float* lp = lse + ((i64)b * heads_q + h) * seqlen_q;

  int lo, hi;
  key_range(q0, min(q0 + Br, seqlen_q), seqlen_k, shift, left, right, lo, hi);
  const int j_lo = lo / Bc;
  const int j_hi = hi > lo ? (hi + Bc - 1) / Bc : j_lo;  // K tiles [j_lo, j_hi)

  // ---- prologue: Q tile and the first STAGES-1 K/V tiles ----
  for (int c = tid; c < Br * CHUNKS; c += NT) {
    int r = c / CHUNKS, col = (c % CHUNKS) * 8;
    bool ok = q0 + r < seqlen_q;
    cp_async_16(smem_u32(sQ + r * LD + col), ok ? qp + (i64)(q0 + r) * q_ss + col : qp, ok);
  }
  auto load_kv = [&](int j, int st) {
    T* dK = sK + st * SM::KV_ELEMS;
    T* dV = sV + st * SM::KV_ELEMS;
    for (int c = tid; c < Bc * CHUNKS; c += NT) {
      int r = c / CHUNKS, col = (c % CHUNKS) * 8;
      int key = j * Bc + r;
      bool ok = key < seqlen_k;  // zero-fill the tail (and mask it to -inf below)
      cp_async_16(smem_u32(dK + r * LD + col), ok ? kp + (i64)key * k_ss + col : kp, ok);
      cp_async_16(smem_u32(dV + r * LD + col), ok ? vp + (i64)key * v_ss + col : vp, ok);
    }
  };
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (j_lo + s < j_hi) load_kv(j_lo + s, s);
    cp_async_commit();
  }

  float o[MT][DTILES][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int i = 0; i < DTILES; ++i) o[mt][i][0] = o[mt][i][1] = o[mt][i][2] = o[mt][i][3] = 0.f;
  float m2[MT][2], l[MT][2];  // running max (log2 units) of rows g, g+8 of each m-tile; lane-partial sums
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) m2[mt][0] = m2[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.f;
  uint32_t qf[QREG ? MT : 1][QREG ? KSTEPS : 1][4];  // Q A-fragments (QREG)

  const int wrow = warp * 16 * MT;  // first row of this warp in the tile
  const uint32_t sQ_lane = smem_u32(sQ + (wrow + (lane & 15)) * LD + (lane >> 4) * 8);

  for (int j = j_lo; j < j_hi; ++j) {
    const int st = (j - j_lo) % STAGES;
    if (j + STAGES - 1 < j_hi) load_kv(j + STAGES - 1, (j - j_lo + STAGES - 1) % STAGES);
    cp_async_commit();
    cp_async_wait<STAGES - 1>();  // tile j (and Q) have landed
    __syncthreads();
    if constexpr (QREG) {
      if (j == j_lo) {
#pragma unroll
        for (int mt = 0; mt < (QREG ? MT : 1); ++mt)
#pragma unroll
          for (int kk = 0; kk < (QREG ? KSTEPS : 1); ++kk)
            ldmatrix_x4(qf[mt][kk], sQ_lane + (mt * 16 * LD + kk * 16) * sizeof(T));
      }
    }
    const T* cK = sK + st * SM::KV_ELEMS;
    const T* cV = sV + st * SM::KV_ELEMS;

    // ---- S = Q K_j^T (16·MT x Bc per warp); one ldmatrix of K feeds MT x 2 mma ----
    float s[MT][NTILES][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int n = 0; n < NTILES; ++n) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.f;
    const uint32_t sK_lane = smem_u32(cK + ((lane >> 4) * 8 + (lane & 7)) * LD + ((lane >> 3) & 1) * 8);
#pragma unroll
    for (int kk = 0; kk < KSTEPS; ++kk) {
      uint32_t a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        if constexpr (QREG) {
#pragma unroll
          for (int i = 0; i < 4; ++i) a[mt][i] = qf[QREG ? mt : 0][QREG ? kk : 0][i];
        } else {
          ldmatrix_x4(a[mt], sQ_lane + (mt * 16 * LD + kk * 16) * sizeof(T));
        }
      }
#pragma unroll
      for (int n = 0; n < NTILES; n += 2) {
        uint32_t bk[4];
        ldmatrix_x4(bk, sK_lane + (n * 8 * LD + kk * 16) * sizeof(T));
        const uint32_t b0[2] = {bk[0], bk[1]}, b1[2] = {bk[2], bk[3]};
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_m16n8k16<T>(s[mt][n], a[mt], b0);
          mma_m16n8k16<T>(s[mt][n + 1], a[mt], b1);
        }
      }
    }

    // ---- scale to log2 units; mask where the tile straddles a boundary or the seqlen_k tail ----
    const int k0 = j * Bc;
    const bool need_mask = (k0 + Bc > seqlen_k) ||
                           (right >= 0 && k0 + Bc - 1 > q0 + shift + right) ||
                           (left >= 0 && k0 < q0 + Br - 1 + shift - left);
    // Masking by per-row key bounds: the element (n, e) sits at key k0 + 2t + c, c = n * 8 + (e & 1) a
    // compile-time constant, so each row's visible keys [lo, hi) (key_visible) become bounds on c once per row and
    // an element costs a compare with an immediate and a select (the per-element key_visible test compiled to
    // several times that; the Hopper kernel's count: experiments/scratch/sass_mask.py).
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const int row_a = q0 + wrow + mt * 16 + g;  // the two query rows this lane holds in m-tile mt
      int hi[2] = {0, 0}, lo[2] = {0, 0};
      if (need_mask) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int row = row_a + 8 * r, base = k0 + 2 * t;
          hi[r] = (right < 0 ? seqlen_k : min(seqlen_k, row + shift + right + 1)) - base;  // c < hi
          lo[r] = (left < 0 ? -Bc : row + shift - left - base);                            // c >= lo
        }
      }
#pragma unroll
      for (int n = 0; n < NTILES; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float x = s[mt][n][e] * scale_log2;
          if (need_mask) {
            const int c = n * 8 + (e & 1), r = e >> 1;
            if (!(c < hi[r] && c >= lo[r])) x = -INFINITY;
          }
          s[mt][n][e] = x;
        }
      }
    }

    // ---- online softmax: rows g (e = 0, 1) and g + 8 (e = 2, 3) of each m-tile ----
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float mx = m2[mt][r];
#pragma unroll
        for (int n = 0; n < NTILES; ++n) mx = fmaxf(mx, fmaxf(s[mt][n][2 * r], s[mt][n][2 * r + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_use = mx == -INFINITY ? 0.f : mx;  // fully masked so far: every p is exp2(-inf) = 0
        const float alpha = exp2f(m2[mt][r] - m_use);    // m2 = -inf -> 0 (nothing to rescale)
        m2[mt][r] = mx;
        float sum = 0.f;
#pragma unroll
        for (int n = 0; n < NTILES; ++n) {
          float p0 = exp2f(s[mt][n][2 * r] - m_use), p1 = exp2f(s[mt][n][2 * r + 1] - m_use);
          s[mt][n][2 * r] = p0;
          s[mt][n][2 * r + 1] = p1;
          sum += p0 + p1;
        }
        l[mt][r] = l[mt][r] * alpha + sum;
#pragma unroll
        for (int d = 0; d < DTILES; ++d) {
          o[mt][d][2 * r] *= alpha;
          o[mt][d][2 * r + 1] *= alpha;
        }
      }
    }

    // ---- O += P V_j: P (C fragments of S) rounded to T is the A operand; one ldmatrix of V feeds MT x 2 mma ----
    const uint32_t sV_lane = smem_u32(cV + (((lane >> 3) & 1) * 8 + (lane & 7)) * LD + (lane >> 4) * 8);
#pragma unroll
    for (int kk = 0; kk < Bc / 16; ++kk) {
      uint32_t a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        a[mt][0] = pack2<T>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        a[mt][1] = pack2<T>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        a[mt][2] = pack2<T>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        a[mt][3] = pack2<T>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int d = 0; d < DTILES; d += 2) {
        uint32_t bv[4];
        ldmatrix_x4_trans(bv, sV_lane + (kk * 16 * LD + d * 8) * sizeof(T));
        const uint32_t b0[2] = {bv[0], bv[1]}, b1[2] = {bv[2], bv[3]};
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_m16n8k16<T>(o[mt][d], a[mt], b0);
          mma_m16n8k16<T>(o[mt][d + 1], a[mt], b1);
        }
      }
    }
    __syncthreads();  // every warp is done with stage st before it is refilled
  }
  cp_async_wait<0>();
  __syncthreads();

  // ---- epilogue: O / l (0 for a row that saw no key), lse = (m2 + log2 l) * ln 2 ----
  // Each warp stages its 16·MT output rows in its own rows of sQ, then writes 16-byte chunks.
  T* sO = sQ + wrow * LD;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float lt = l[mt][r];
      lt += __shfl_xor_sync(0xffffffffu, lt, 1);
      lt += __shfl_xor_sync(0xffffffffu, lt, 2);
      inv[r] = lt == 0.f ? 0.f : 1.f / lt;  // (NaN inputs propagate: l = NaN)
      const int row = q0 + wrow + mt * 16 + g + 8 * r;
      if (t == 0 && row < seqlen_q)
        lp[row] = lt == 0.f ? -INFINITY : (m2[mt][r] + log2f(lt)) * 0.69314718055994531f;
    }
#pragma unroll
    for (int d = 0; d < DTILES; ++d) {
      const int col = d * 8 + 2 * t;
      *reinterpret_cast<uint32_t*>(sO + (mt * 16 + g) * LD + col) =
          pack2<T>(o[mt][d][0] * inv[0], o[mt][d][1] * inv[0]);
      *reinterpret_cast<uint32_t*>(sO + (mt * 16 + g + 8) * LD + col) =
          pack2<T>(o[mt][d][2] * inv[1], o[mt][d][3] * inv[1]);
    }
  }
  __syncwarp();
  for (int c = lane; c < 16 * MT * CHUNKS; c += 32) {
    int r = c / CHUNKS, col = (c % CHUNKS) * 8;
    int row = q0 + wrow + r;
    if (row < seqlen_q) Vec<T, 8>::load(sO + r * LD + col).store(op + (i64)row * o_ss + col);
  }
}

// ======================================================================================================
// Version 1: float32 SIMT (the float32 path: exact fp32 arithmetic, not tensor cores).
// Block = NW warps, one query row per warp; K/V tiles of 32 keys in shared memory (K rows padded by one
// float so that lane j reading K[j][c] hits bank (j + c) % 32). Lane j scores key j of the tile; lane c owns
// output columns c, c + 32, ...
// ======================================================================================================
template <int HEAD_DIM, int NW>
__global__ void __launch_bounds__(NW * 32)
attention_fwd_f32(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                  float* __restrict__ out, float* __restrict__ lse,
                  i64 q_sb, i64 q_sh, i64 q_ss, i64 k_sb, i64 k_sh, i64 k_ss,
                  i64 v_sb, i64 v_sh, i64 v_ss, i64 o_sb, i64 o_sh, i64 o_ss,
                  int heads_q, int group, int seqlen_q, int seqlen_k, float scale_log2, int left, int right) {
  constexpr int Bc = 32, KLD = HEAD_DIM + 1, DPL = (HEAD_DIM + 31) / 32;  // columns per lane
  extern __shared__ __align__(16) unsigned char smem_raw[];
  float* sK = reinterpret_cast<float*>(smem_raw);  // [Bc][KLD]
  float* sV = sK + Bc * KLD;                        // [Bc][HEAD_DIM]
  float* sQ = sV + Bc * HEAD_DIM;                   // [NW][HEAD_DIM]
  float* sP = sQ + NW * HEAD_DIM;                   // [NW][Bc]

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int q0 = blockIdx.x * NW, i = q0 + warp;
  const int h = blockIdx.y, b = blockIdx.z, hk = h / group, shift = seqlen_k - seqlen_q;
  const float* qp = q + b * q_sb + h * q_sh;
  const float* kp = k + b * k_sb + hk * k_sh;
  const float* vp = v + b * v_sb + hk * v_sh;

  for (int c = lane; c < HEAD_DIM; c += 32) sQ[warp * HEAD_DIM + c] = i < seqlen_q ? qp[(i64)i * q_ss + c] : 0.f;
  int lo, hi;
  key_range(q0, min(q0 + NW, seqlen_q), seqlen_k, shift, left, right, lo, hi);
  const int j_lo = lo / Bc, j_hi = hi > lo ? (hi + Bc - 1) / Bc : j_lo;

  float m2 = -INFINITY, l = 0.f, o[DPL];
#pragma unroll
  for (int c = 0; c < DPL; ++c) o[c] = 0.f;

  for (int j = j_lo; j < j_hi; ++j) {
    __syncthreads();  // previous tile consumed (and sQ written, first time)
    for (int e = tid; e < Bc * HEAD_DIM; e += NW * 32) {
      int r = e / HEAD_DIM, c = e % HEAD_DIM, key = j * Bc + r;
      bool ok = key < seqlen_k;
      sK[r * KLD + c] = ok ? kp[(i64)key * k_ss + c] : 0.f;
      sV[r * HEAD_DIM + c] = ok ? vp[(i64)key * v_ss + c] : 0.f;
    }
    __syncthreads();
    const int key = j * Bc + lane;
    float x = 0.f;
    for (int c = 0; c < HEAD_DIM; ++c) x = fmaf(sQ[warp * HEAD_DIM + c], sK[lane * KLD + c], x);
    x *= scale_log2;
    if (!key_visible(i, key, seqlen_k, shift, left, right)) x = -INFINITY;
    float mx = x;
#pragma unroll
    for (int off = 16; off; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    mx = fmaxf(mx, m2);
    const float m_use = mx == -INFINITY ? 0.f : mx;
    const float alpha = exp2f(m2 - m_use);
    const float p = exp2f(x - m_use);
    float sum = p;
#pragma unroll
    for (int off = 16; off; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    m2 = mx;
    l = l * alpha + sum;
    sP[warp * Bc + lane] = p;
    __syncwarp();
#pragma unroll
    for (int c = 0; c < DPL; ++c) {
      int col = lane + 32 * c;
      float acc = o[c] * alpha;
      if (col < HEAD_DIM)
        for (int r = 0; r < Bc; ++r) acc = fmaf(sP[warp * Bc + r], sV[r * HEAD_DIM + col], acc);
      o[c] = acc;
    }
    __syncwarp();
  }
  if (i < seqlen_q) {
    const float inv = l == 0.f ? 0.f : 1.f / l;
    float* orow = out + b * o_sb + h * o_sh + (i64)i * o_ss;
#pragma unroll
    for (int c = 0; c < DPL; ++c)
      if (lane + 32 * c < HEAD_DIM) orow[lane + 32 * c] = o[c] * inv;
    if (lane == 0)
      lse[((i64)b * heads_q + h) * seqlen_q + i] = l == 0.f ? -INFINITY : (m2 + log2f(l)) * 0.69314718055994531f;
  }
}

}  // namespace cuflash
