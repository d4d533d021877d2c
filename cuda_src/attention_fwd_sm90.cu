// attention_fwd_sm90.cu — attention forward for Hopper (sm_90a): wgmma.mma_async for both GEMMs.
//
// The next rungs of the forward ladder (1: fp32 SIMT, 2: FA-2 mma.sync, in attention_fwd.cu), after
// FlashAttention-3 (Shah et al. 2024, arXiv:2407.08608):
// Version 3 (attention_fwd_sm90): warpgroup MMA, every thread loads.
//   Block = NWG consumer warpgroups (128 threads each); warpgroup w owns query rows [64w, 64w+64) of a Q tile of
//   Br = 64*NWG rows. K_j / V_j tiles of Bc keys stream through shared memory with cp.async (2 stages, all
//   threads load, 16-byte chunks written straight into the 128-byte-swizzled layout the wgmma descriptors read).
//   S = Q K_j^T:  wgmma m64n{Bc}k16, A = Q (smem, K-major), B = K_j (smem, K-major), fp32 accumulators.
//   Online softmax on the accumulator fragments (rows g and g+8 of each warp's 16; a row spans a quad).
//   O += P V_j:   wgmma m64n{PVN}k16, A = P rounded to T in registers (the accumulator layout IS the A layout),
//                 B = V_j (smem, MN-major: the transpose flag), one wgmma per PVN head_dim columns.
// Version 4 (attention_fwd_sm90_ws): warp specialisation + intra-warpgroup pipelining (+ optional ping-pong).
//   Warpgroup 0 is the producer: it only loads K/V tiles (cp.async into a STAGES-deep ring, two tiles in flight;
//   one mbarrier "full" per stage, arrived by each producer thread once its copies landed and were fenced to the
//   async proxy; one "empty" per stage, released by the consumer warps) and gives its registers away
//   (setmaxnreg.dec); warpgroups 1..NWG are consumers (setmaxnreg.inc).
//   Each consumer issues S_{j} = Q K_j^T and O += P_{j-1} V_{j-1} together, runs the softmax of S_j while the
//   P V wgmma is in flight (FA-3 Algorithm 2), then rescales O. PINGPONG (NWG = 2): named barriers order the
//   two consumers' wgmma issues so that one warpgroup's softmax overlaps the other's GEMMs (FA-3 §3.1).
//   TMA: the producer is one thread issuing tensor-memory-accelerator copies (cp.async.bulk.tensor, one per
//   64-column block of K and of V, 128-byte swizzle done by the copy engine), the "full" mbarrier completed by
//   their transaction bytes. Measured on the H200 (d 128): the cp.async producer kept the tensor pipe 32 % busy
//   (about 300 TFLOP/s, the same with no softmax at all), the kernel without any K/V loads reached 680.
// Division by l deferred to the end; O staged through the warpgroup's own Q rows, written in 16-byte chunks (the
// persistent kernel: by TMA from a K tile, OSTAGE, or with 4-byte stores from registers).
// Traffic per (batch, head): reads Q once (N·d), K and V once per Q tile (2·Tr·N·d), writes O (N·d), lse (N).
// Masking as attention_fwd.cu (bottom-right aligned, FlashAttention >= 2.1): query row i sits at key i + shift,
// shift = seqlen_k - seqlen_q; key j visible iff j < seqlen_k, (right < 0 || j <= i + shift + right),
// (left < 0 || j >= i + shift - left). Tiles outside the mask are skipped; a row seeing no key writes 0, lse -inf.
// Scores in log2 units: s2 = (q·k) * softmax_scale * log2(e).
#include "cuflash/common.cuh"
#include "cuflash/mma.cuh"
#include "cuflash/tma.cuh"
#include "cuflash/wgmma.cuh"
#include "cuflash/sm90_tiles.cuh"
#ifndef CUFLASH_FWD_PIN
#define CUFLASH_FWD_PIN 0
#endif
#ifndef CUFLASH_FWD_OSTAGE
#define CUFLASH_FWD_OSTAGE 1
#endif
#ifndef CUFLASH_FWD_QSPLIT
#define CUFLASH_FWD_QSPLIT 1
#endif
#ifndef CUFLASH_FWD_OREL_LATE
#define CUFLASH_FWD_OREL_LATE 1
#endif

#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif

namespace cuflash {

// Mask S and update the online softmax in log2 units: on return s holds p = exp2(s * scale_log2 - m_new), m2
// (scaled) and l are updated (l = l * alpha + rowsum p, this lane's partial sum), alpha = exp2(m_old - m_new) per
// row. The scale is folded into one FFMA per element (FA-3): the row max is taken on the raw scores, which needs
// scale_log2 > 0 (the wrapper guarantees it).
template <int Bc>
__device__ __forceinline__ void softmax_step(float (&s)[Bc / 2], float (&m2)[2], float (&l)[2], float (&alpha)[2],
                                             bool need_mask, int k0, int row_a, int t, int seqlen_k, int shift,
                                             int left, int right, float scale_log2) {
  constexpr int SREG = Bc / 2;
  if (need_mask) {
    // Element i sits at key col = base + c(i), c(i) = (i >> 2) * 8 + (i & 1) a compile-time constant: each row's
    // visible keys [lo, hi) (the masking rule of the header) become bounds on c once per row, so an element costs
    // a compare with an immediate and a select (the per-element test compiled to ~10 instructions an element, more
    // than the softmax itself, on every causal diagonal tile; experiments/scratch/sass_mask.py).
    const int base = k0 + 2 * t;
    int hi[2], lo[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = row_a + 8 * r;
      hi[r] = (right < 0 ? seqlen_k : min(seqlen_k, row + shift + right + 1)) - base;  // c < hi
      lo[r] = (left < 0 ? 0 : row + shift - left) - base;                               // c >= lo (left >= 0)
    }
    if (left < 0) {  // no left bound (causal, or no window): one compare an element
#pragma unroll
      for (int i = 0; i < SREG; ++i) {
        const int c = (i >> 2) * 8 + (i & 1);
        s[i] = c < hi[(i >> 1) & 1] ? s[i] : -INFINITY;
      }
    } else {
#pragma unroll
      for (int i = 0; i < SREG; ++i) {
        const int c = (i >> 2) * 8 + (i & 1), r = (i >> 1) & 1;
        s[i] = (c < hi[r] && c >= lo[r]) ? s[i] : -INFINITY;
      }
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {  // row g: elements 4i, 4i+1; row g+8: 4i+2, 4i+3
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < SREG / 4; ++i) mx = fmaxf(mx, fmaxf(s[4 * i + 2 * r], s[4 * i + 2 * r + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    mx = fmaxf(m2[r], mx * scale_log2);               // new running max (scaled; -inf * scale = -inf)
    const float m_use = mx == -INFINITY ? 0.f : mx;  // fully masked so far: every p is exp2(-inf) = 0
    alpha[r] = exp2f(m2[r] - m_use);                 // m2 = -inf -> 0 (nothing to rescale)
    m2[r] = mx;
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < SREG / 4; ++i) {
      const float p0 = exp2f(fmaf(s[4 * i + 2 * r], scale_log2, -m_use));
      const float p1 = exp2f(fmaf(s[4 * i + 2 * r + 1], scale_log2, -m_use));
      s[4 * i + 2 * r] = p0;
      s[4 * i + 2 * r + 1] = p1;
      sum += p0 + p1;
    }
    l[r] = l[r] * alpha[r] + sum;
  }
}

// O *= alpha per row; skipped when no row max of the warp moved (alpha == 1 exactly: bitwise the same result).
template <int NPV, int OREG>
__device__ __forceinline__ void rescale_o(float (&o)[NPV][OREG], const float (&alpha)[2]) {
  if (__all_sync(0xffffffffu, alpha[0] == 1.f && alpha[1] == 1.f)) return;
#pragma unroll
  for (int n = 0; n < NPV; ++n)
#pragma unroll
    for (int i = 0; i < OREG / 4; ++i) {
      o[n][4 * i] *= alpha[0];
      o[n][4 * i + 1] *= alpha[0];
      o[n][4 * i + 2] *= alpha[1];
      o[n][4 * i + 3] *= alpha[1];
    }
}

// Does tile [k0, k0 + Bc) need elementwise masking for query rows [r0, r0 + 64)?
template <int Bc>
__device__ __forceinline__ bool tile_needs_mask(int k0, int r0, int seqlen_k, int shift, int left, int right) {
  return (k0 + Bc > seqlen_k) || (right >= 0 && k0 + Bc - 1 > r0 + shift + right) ||
         (left >= 0 && k0 < r0 + 63 + shift - left);
}

// The end of one query row of a warpgroup: l summed over the quad that holds the row; its lse written by the
// quad's first thread when the row is below seqlen_q, (m2 + log2 l) * ln 2 (l == 0: the row saw no key, lse -inf;
// a NaN l, from NaN input, stays NaN, as in the FA-2 kernel); returns 1 / l (0 for a row that saw no key).
__device__ __forceinline__ float finish_row(float l, float m2, float* lp, int row, int t, int seqlen_q) {
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  const float inv = l > 0.f ? 1.f / l : 0.f;
  if (t == 0 && row < seqlen_q) lp[row] = l == 0.f ? -INFINITY : (m2 + log2f(l)) * 0.69314718055994531f;
  return inv;
}

// Epilogue of one warpgroup: O / l (0 for a row that saw no key), lse = (m2 + log2 l) * ln 2. Each warp stages
// its 16 rows in its own rows of the warpgroup's Q region (sOw: generic pointer, 64-column blocks BR rows
// apart, swizzled like Q; stage_o, which the persistent kernel uses alone, on a K tile, before a tensor-map
// store), then writes 16-byte chunks.
template <typename T, int BR, int NPV, int OREG>
__device__ __forceinline__ void stage_o(const float (&o)[NPV][OREG], const float (&l)[2], const float (&m2)[2],
                                        unsigned char* sOw, float* lp, int wrow0, int warp, int lane, int seqlen_q) {
  constexpr int PVN = OREG * 2;
  const int g = lane >> 2, t = lane & 3;
  const int ra = warp * 16 + g, rb = ra + 8;  // rows inside the warpgroup
  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) inv[r] = finish_row(l[r], m2[r], lp, wrow0 + (r == 0 ? ra : rb), t, seqlen_q);
#pragma unroll
  for (int n = 0; n < NPV; ++n)
#pragma unroll
    for (int i = 0; i < OREG / 4; ++i) {
      const int col = n * PVN + i * 8 + 2 * t;
      *reinterpret_cast<unsigned*>(sOw + sw128_offset<BR>(ra, col)) =
          pack2<T>(o[n][4 * i] * inv[0], o[n][4 * i + 1] * inv[0]);
      *reinterpret_cast<unsigned*>(sOw + sw128_offset<BR>(rb, col)) =
          pack2<T>(o[n][4 * i + 2] * inv[1], o[n][4 * i + 3] * inv[1]);
    }
}
template <typename T, int HEAD_DIM, int BR, int NPV, int OREG>
__device__ __forceinline__ void epilogue(const float (&o)[NPV][OREG], const float (&l)[2], const float (&m2)[2],
                                         unsigned char* sOw, T* op, i64 o_ss, float* lp, int wrow0, int warp,
                                         int lane, int seqlen_q) {
  stage_o<T, BR>(o, l, m2, sOw, lp, wrow0, warp, lane, seqlen_q);
  __syncwarp();
  constexpr int CH = HEAD_DIM / 8;
#pragma unroll
  for (int c = lane; c < 16 * CH; c += 32) {
    const int r = warp * 16 + c / CH, col = (c % CH) * 8;
    const int row = wrow0 + r;
    if (row < seqlen_q)
      Vec<T, 8>::load(reinterpret_cast<const T*>(sOw + sw128_offset<BR>(r, col))).store(op + (i64)row * o_ss + col);
  }
}

// Epilogue without shared memory (the persistent kernel, whose Q region is refilled for the next work tile
// meanwhile): O / l stored from the accumulator registers, two columns (4 bytes) a store; lse as epilogue().
template <typename T, int NPV, int OREG>
__device__ __forceinline__ void epilogue_direct(const float (&o)[NPV][OREG], const float (&l)[2], const float (&m2)[2],
                                                T* op, i64 o_ss, float* lp, int wrow0, int warp, int lane,
                                                int seqlen_q) {
  constexpr int PVN = OREG * 2;
  const int g = lane >> 2, t = lane & 3;
  float inv[2];
  int row[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    row[r] = wrow0 + warp * 16 + g + 8 * r;
    inv[r] = finish_row(l[r], m2[r], lp, row[r], t, seqlen_q);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (row[r] >= seqlen_q) continue;
    unsigned* dst = reinterpret_cast<unsigned*>(op + (i64)row[r] * o_ss + 2 * t);
#pragma unroll
    for (int n = 0; n < NPV; ++n)
#pragma unroll
      for (int i = 0; i < OREG / 4; ++i)
        dst[(n * PVN + i * 8) / 2] = pack2<T>(o[n][4 * i + 2 * r] * inv[r], o[n][4 * i + 2 * r + 1] * inv[r]);
  }
}

// One work tile: query rows [q0, q0 + Br) of head h of batch b, and the K/V tiles [j_lo, j_lo + n_tiles) of Bc
// keys its mask leaves visible. PERSIST: work index u of the list of (head, batch) pairs hb = h + heads_q * b in
// groups of G = group_heads, each group's G * n_q tiles ordered by Q tile (longest causal tile first), then head:
// the tiles are claimed longest first within a group (with G = 1, one head at a time, the last head's longest
// tiles start last and the launch waits for them: 5-7 % over the ideal at 2K-8K causal in a list-scheduling
// model), and the blocks running at one time share few heads, whose K and V stay in L2 (the wrapper sizes G by
// their bytes; ordered head-first, 264 blocks at once read 264 heads' K and V, more than L2 holds at 2K). Else the
// block's own tile (gridDim.x Q tiles, longest first; blockIdx.y head; blockIdx.z batch).
struct Sm90Work {
  int q0, h, b, j_lo, n_tiles;
};
template <int Br, int Bc, bool PERSIST>
__device__ __forceinline__ Sm90Work sm90_work_tile(i64 u, int n_q, int heads_q, int batch, int seqlen_q,
                                                   int seqlen_k, int left, int right, int group_heads) {
  Sm90Work w;
  if (PERSIST) {
    // (group_heads * n_q < 2^31: the wrapper caps the group)
    const i64 g0 = u / (group_heads * n_q) * group_heads;                        // the group's first hb
    const int r = (int)(u - g0 * n_q);                                          // index within the group
    const int gsz = (int)min((i64)group_heads, (i64)heads_q * batch - g0);      // (the last group may be smaller)
    const i64 hb = g0 + r % gsz;
    w.q0 = (n_q - 1 - r / gsz) * Br;
    w.h = (int)(hb % heads_q);
    w.b = (int)(hb / heads_q);
  } else {
    w.q0 = (gridDim.x - 1 - blockIdx.x) * Br;
    w.h = blockIdx.y;
    w.b = blockIdx.z;
  }
  const int shift = seqlen_k - seqlen_q;
  const int q1 = min(w.q0 + Br, seqlen_q);
  const int hi = right < 0 ? seqlen_k : min(seqlen_k, q1 - 1 + shift + right + 1);
  const int lo = left < 0 ? 0 : max(0, w.q0 + shift - left);
  w.j_lo = lo / Bc;
  w.n_tiles = hi > lo ? (hi + Bc - 1) / Bc - w.j_lo : 0;
  return w;
}

// The K/V tiles of work tile w that query rows [wrow0, wrow0 + 64) see: w.n_tiles less the trailing ones past the
// key bound of the warpgroup's last row (its last row below seqlen_q; none when it has no such row).
template <int Bc>
__device__ __forceinline__ int own_tiles(const Sm90Work& w, int wrow0, int seqlen_q, int seqlen_k, int right) {
  const int last = min(wrow0 + 63, seqlen_q - 1);
  if (last < wrow0) return 0;
  const int hi = right < 0 ? seqlen_k : min(seqlen_k, last + (seqlen_k - seqlen_q) + right + 1);
  return max(0, min(w.n_tiles, (hi + Bc - 1) / Bc - w.j_lo));
}

#define SM90_KERNEL_PARAMS                                                                                 \
  const T *__restrict__ q, const T *__restrict__ k, const T *__restrict__ v, T *__restrict__ out,        \
      float *__restrict__ lse, i64 q_sb, i64 q_sh, i64 q_ss, i64 k_sb, i64 k_sh, i64 k_ss, i64 v_sb, i64 v_sh, \
      i64 v_ss, i64 o_sb, i64 o_sh, i64 o_ss, int heads_q, int group, int seqlen_q, int seqlen_k,          \
      float scale_log2, int left, int right

// ======================================================================================================
// Version 3: all threads load (cp.async, 2 stages), every warpgroup computes.
// T in {__half, __nv_bfloat16}; HEAD_DIM in {64, 128}; Br = 64*NWG; Bc in {64, 128}; PVN in {64, HEAD_DIM}.
// Shared memory: Q (Br x HEAD_DIM), K[2], V[2] (Bc x HEAD_DIM each), + 1024 bytes for alignment.
// ======================================================================================================
template <typename T, int HEAD_DIM, int NWG, int Bc, int PVN>
__global__ void __launch_bounds__(NWG * 128, 1) attention_fwd_sm90(SM90_KERNEL_PARAMS) {
  static_assert(HEAD_DIM == 64 || HEAD_DIM == 128, "head_dim 64 or 128");
  static_assert(Bc == 64 || Bc == 128, "Bc 64 or 128");
  static_assert(PVN == 64 || PVN == HEAD_DIM, "PVN");
  constexpr int Br = 64 * NWG, NT = NWG * 128;
  constexpr int Q_BYTES = Br * HEAD_DIM * 2, KV_BYTES = Bc * HEAD_DIM * 2;
  constexpr int NPV = HEAD_DIM / PVN, OREG = PVN / 2;

  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const unsigned sbase = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const unsigned sQ = sbase, sK = sQ + Q_BYTES, sV = sK + 2 * KV_BYTES;
  unsigned char* const sgen = smem_raw + (sbase - smem_u32(smem_raw));

  const int tid = threadIdx.x, wg = tid >> 7;
  const int warp = (tid >> 5) & 3, lane = tid & 31, t = lane & 3;
  const int q0 = (gridDim.x - 1 - blockIdx.x) * Br;  // longest (causal) Q tiles first
  const int h = blockIdx.y, b = blockIdx.z, hk = h / group;
  const int shift = seqlen_k - seqlen_q;
  const T* qp = q + b * q_sb + h * q_sh;
  const T* kp = k + b * k_sb + hk * k_sh;
  const T* vp = v + b * v_sb + hk * v_sh;

  // Keys [lo, hi) visible to rows [q0, min(q0 + Br, seqlen_q)); tiles [j_lo, j_hi).
  const int q1 = min(q0 + Br, seqlen_q);
  const int hi = right < 0 ? seqlen_k : min(seqlen_k, q1 - 1 + shift + right + 1);
  const int lo = left < 0 ? 0 : max(0, q0 + shift - left);
  const int j_lo = lo / Bc;
  const int j_hi = hi > lo ? (hi + Bc - 1) / Bc : j_lo;

  load_tile_sw128<T, HEAD_DIM, Br, NT>(sQ, qp, q_ss, q0, seqlen_q, tid);
  if (j_lo < j_hi) {
    load_tile_sw128<T, HEAD_DIM, Bc, NT>(sK, kp, k_ss, j_lo * Bc, seqlen_k, tid);
    load_tile_sw128<T, HEAD_DIM, Bc, NT>(sV, vp, v_ss, j_lo * Bc, seqlen_k, tid);
  }
  cp_async_commit();

  float o[NPV][OREG];
#pragma unroll
  for (int n = 0; n < NPV; ++n)
#pragma unroll
    for (int i = 0; i < OREG; ++i) o[n][i] = 0.f;
  float s[Bc / 2];
#pragma unroll
  for (int i = 0; i < Bc / 2; ++i) s[i] = 0.f;
  unsigned pa[Bc / 16][4];
  float m2[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, alpha[2];

  const int wrow0 = q0 + wg * 64;                  // first query row of this warpgroup
  const int row_a = wrow0 + warp * 16 + (lane >> 2);
  const unsigned sQw = sQ + wg * 64 * 128;         // this warpgroup's rows inside each 64-column block

  for (int j = j_lo; j < j_hi; ++j) {
    const int st = (j - j_lo) & 1;
    if (j + 1 < j_hi) {  // prefetch tile j+1 into the other stage (freed by the barrier ending iteration j-1)
      load_tile_sw128<T, HEAD_DIM, Bc, NT>(sK + (st ^ 1) * KV_BYTES, kp, k_ss, (j + 1) * Bc, seqlen_k, tid);
      load_tile_sw128<T, HEAD_DIM, Bc, NT>(sV + (st ^ 1) * KV_BYTES, vp, v_ss, (j + 1) * Bc, seqlen_k, tid);
    }
    cp_async_commit();
    cp_async_wait<1>();   // tile j (and Q) have landed for this thread's copies
    fence_proxy_async();  // ... and are visible to the tensor cores (async proxy)
    __syncthreads();      // ... for every thread's copies

    fence_regs(s);
    wgmma_fence();
    issue_qk<T, HEAD_DIM, Br, Bc>(s, sQw, sK + st * KV_BYTES);
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(s);

    const bool need_mask = tile_needs_mask<Bc>(j * Bc, wrow0, seqlen_k, shift, left, right);
    softmax_step<Bc>(s, m2, l, alpha, need_mask, j * Bc, row_a, t, seqlen_k, shift, left, right, scale_log2);
    rescale_o(o, alpha);
    pack_p<T, Bc>(pa, s);

    fence_regs(o);
    fence_regs(pa);
    wgmma_fence();
    issue_pv<T, HEAD_DIM, Bc, PVN>(o, pa, sV + st * KV_BYTES);
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(o);
    __syncthreads();  // every warpgroup is done with stage st before it is refilled
  }
  cp_async_wait<0>();
  __syncthreads();

  epilogue<T, HEAD_DIM, Br>(o, l, m2, sgen + wg * 64 * 128, out + b * o_sb + h * o_sh, o_ss,
                            lse + ((i64)b * heads_q + h) * seqlen_q, wrow0, warp, lane, seqlen_q);
}

// ======================================================================================================
// Version 4: producer warpgroup (cp.async ring + mbarriers) and NWG consumer warpgroups; intra-warpgroup
// pipelining; PINGPONG orders the two consumers' wgmma issues (NWG == 2). Block = (NWG + 1) * 128 threads.
// Shared memory: Q (Br x HEAD_DIM), K[STAGES], V[STAGES], full[STAGES], empty[STAGES], (PERSIST) qfull[QPARTS],
// qempty[QPARTS], slot[QPARTS], (PIN) 4 bytes a consumer warp, + 1024 for alignment.
// ======================================================================================================
// TMA: K/V by the tensor memory accelerator through the 4-D maps tmap_k / tmap_v (head_dim, seqlen_k, heads_kv,
// batch; box 64 x Bc, 128-byte swizzle); else by cp.async from every producer thread (the maps are unused).
// PERSIST (with TMA): a persistent grid (one block per SM, two at Br = 64) over the list of work tiles ordered by Q
// tile (longest causal tile first) and head within groups of group_heads heads (sm90_work_tile). Block c starts with
// tile u = c; then its producer claims the next from the counter sched[0] (u = gridDim.x + atomicAdd), once the
// current tile's K/V loads are issued: the tiles go to the blocks as they free up, as the hardware hands out the
// blocks of the non-persistent grid (a fixed share, u = c, c + gridDim.x, ..., waits for the slowest SM, and on
// causal masks for the block with the longest tiles). The producer passes u to the consumers in a shared-memory slot
// per Q part, each published by that part's "full" mbarrier; u >= n_work (no tile left) ends both. The last block
// out (sched[1] counts them) sets both counters back to 0 for the next launch on the stream.
// The K/V ring and its mbarrier phases run on across work tiles (a running tile count g), so the producer loads
// the next work tile's first K/V tiles while the consumers finish the current one (its last P V, the epilogue,
// the next Q): the block launch, the barrier setup and the first loads' latency are paid once per SM instead of
// once per Q tile. O leaves by the tensor memory accelerator too, through tmap_o (OSTAGE, below; with ping-pong or
// one consumer).
// NWG == 1 (Br = 64): two blocks per SM (launch bounds of 128 registers a thread; the producer's setmaxnreg
// down to PRODUCER_REGS pays for the consumer's rise to CONSUMER_REGS, PRODUCER_REGS + CONSUMER_REGS <= 256),
// so one block's prologue (Q load, first K/V tile) and epilogue overlap the other's tile loop: short sequences,
// whose blocks see few K/V tiles, are bound by those per-block phases (persistent: two blocks per SM too).
template <typename T, int HEAD_DIM, int NWG, int Bc, int PVN, int STAGES, bool PINGPONG, int PRODUCER_REGS,
          int CONSUMER_REGS, bool TMA, bool PERSIST>
__global__ void __launch_bounds__((NWG + 1) * 128, NWG == 1 ? 2 : 1)
    attention_fwd_sm90_ws(SM90_KERNEL_PARAMS, const __grid_constant__ TmaMap tmap_k,
                          const __grid_constant__ TmaMap tmap_v, const __grid_constant__ TmaMap tmap_q,
                          const __grid_constant__ TmaMap tmap_o, unsigned* __restrict__ sched, int batch,
                          int group_heads) {
  static_assert(HEAD_DIM == 64 || HEAD_DIM == 128, "head_dim 64 or 128");
  static_assert(Bc == 64 || Bc == 128, "Bc 64 or 128");
  static_assert(PVN == 64 || PVN == HEAD_DIM, "PVN");
  static_assert(STAGES >= 2 && (!PINGPONG || NWG == 2), "stages / ping-pong with two consumers");
  static_assert(TMA || !PERSIST, "the persistent grid needs the TMA producer");
  static_assert(NWG != 1 || PRODUCER_REGS + CONSUMER_REGS <= 256, "two blocks per SM: 128 registers a thread");
  static_assert((NWG == 1 ? 2 : 1) * 128 * (PRODUCER_REGS + NWG * CONSUMER_REGS) <= 65536,
                "setmaxnreg budgets beyond the register file");
  constexpr int Br = 64 * NWG;
  constexpr int Q_BYTES = Br * HEAD_DIM * 2, KV_BYTES = Bc * HEAD_DIM * 2;
  constexpr int NPV = HEAD_DIM / PVN, OREG = PVN / 2;
  // OSTAGE (persistent, ping-pong or one consumer): each consumer writes O / l of a work tile into its 64 rows of
  // the K tile of the tile's last K/V stage (free once both consumers' last S has read it: BAR_KFREE), and one
  // thread stores them with the O tensor map (tmap_o); the stage is released once the copy engine has read it,
  // in the consumer's next work tile (release_o, where OREL_LATE says). Stored from registers instead
  // (epilogue_direct: 4-byte stores, 32 a thread at head_dim 128), O cost 7 % of a launch at head_dim 128 2K (the
  // stores left out: 1.07x).
  // The K-tile-free pair alternates between two pairs of barriers from one work tile to the next: with the turns
  // running on across tiles, consumer 0 may finish the next tile's last S (a tile of one K/V tile) before
  // consumer 1 has synced on this tile's barrier, and a second arrival in the same phase would complete it.
  // (One consumer, Br = 64: its own last S is the only reader of the K tile, no barrier.)
  constexpr bool OSTAGE = PERSIST && (PINGPONG || NWG == 1) && CUFLASH_FWD_OSTAGE;
  static_assert(!OSTAGE || Bc >= 64 * NWG, "OSTAGE: every consumer's 64 rows of O inside one K tile");
  static_assert(CUFLASH_FWD_OREL_LATE == 0 || CUFLASH_FWD_OREL_LATE == 1, "OREL_LATE 0 or 1");
  // named barriers: Q ready per consumer (OSTAGE: O staged, per consumer); ping-pong turn x2; K tile free 2 x 2
  constexpr int BAR_Q = 1, BAR_SCHED = 1 + NWG, BAR_KFREE = 1 + 2 * NWG;

  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const unsigned sbase = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const unsigned sQ = sbase, sK = sQ + Q_BYTES, sV = sK + STAGES * KV_BYTES;
  const unsigned bar_full = sV + STAGES * KV_BYTES, bar_empty = bar_full + 8 * STAGES;  // + 8 * stage
  // PERSIST: the Q tile in QPARTS parts, each with its pair (loaded by the producer, released by the part's
  // consumers after their last S) and its copy of the work-tile slot (8 bytes); then the pinning slots. QSPLIT:
  // a part per consumer (its 64 rows), so that a consumer's next Q loads once its own last S has read its rows
  // and the parts before it are released (the producer publishes them in order, after the tile's K/V loads), not
  // once every consumer's has (ping-pong: a turn earlier for consumer 0, which starts the next tile first).
  constexpr int QPARTS = CUFLASH_FWD_QSPLIT ? NWG : 1, QPART_WG = NWG / QPARTS;
  const unsigned bar_qfull = bar_empty + 8 * STAGES, bar_qempty = bar_qfull + 8 * QPARTS;
  const unsigned work_slot = bar_qempty + 8 * QPARTS;
  const unsigned pin_slots = bar_qfull + (PERSIST ? 24 * QPARTS : 0);
  unsigned char* const sgen = smem_raw + (sbase - smem_u32(smem_raw));

  const int tid = threadIdx.x, wg = tid >> 7;
  const int warp = (tid >> 5) & 3, lane = tid & 31, t = lane & 3;

  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(bar_full + 8 * s, TMA ? 1 : 128);  // TMA: one arrival + the bytes; else one per producer thread
      mbar_init(bar_empty + 8 * s, NWG * 4);  // one arrival per consumer warp
    }
    if (PERSIST) {
      for (int p = 0; p < QPARTS; ++p) {
        mbar_init(bar_qfull + 8 * p, 1);
        mbar_init(bar_qempty + 8 * p, QPART_WG * 4);
      }
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) {
    // ---------------- producer: K/V tiles into the ring ----------------
    setmaxnreg_dec<PRODUCER_REGS>();
    // the work tiles of this block: one (blockIdx) or, persistent, u = blockIdx.x, then claimed (computed after
    // setmaxnreg: values live across it get spilled)
    const int n_q = (seqlen_q + Br - 1) / Br;
    const i64 n_work = PERSIST ? (i64)n_q * heads_q * batch : 1;
    if constexpr (TMA) {
      // One thread: wait for the consumers to free a stage, announce its bytes, issue the copies. g counts the
      // K/V tiles of every work tile of this block (stage g % STAGES, its (g / STAGES)-th use).
      if (tid == 0) {
        int g = 0;
        i64 u = PERSIST ? blockIdx.x : 0;
        for (int w = 0; PERSIST || w == 0; ++w) {
          // Q part p's consumers are done with the previous tile's (and have read its u): u into their slot, then
          // the part's "full" barrier expects `bytes` (0: no tile left, a plain arrival)
          auto publish = [&](int p, unsigned bytes) {
            if (w > 0) mbar_wait(bar_qempty + 8 * p, (w - 1) & 1);
            asm volatile("st.shared.s64 [%0], %1;\n" ::"r"(work_slot + 8 * p), "l"(u) : "memory");
            mbar_arrive_expect_tx(bar_qfull + 8 * p, bytes);
          };
          if constexpr (PERSIST) {
            if (u >= n_work) {  // none left: the consumers see it in their slots
              for (int p = 0; p < QPARTS; ++p) publish(p, 0);
              break;
            }
          }
          const Sm90Work wk = sm90_work_tile<Br, Bc, PERSIST>(u, n_q, heads_q, batch, seqlen_q, seqlen_k, left, right,
                                                            group_heads);
          const int hk = wk.h / group;
          if constexpr (PERSIST) {  // this work tile's Q, part by part (64-row boxes)
            for (int p = 0; p < QPARTS; ++p) {
              publish(p, Q_BYTES / QPARTS);
              for (int r = p * QPART_WG; r < (p + 1) * QPART_WG; ++r) {
#pragma unroll
                for (int blk = 0; blk < HEAD_DIM / 64; ++blk)
                  tma_load_4d(sQ + blk * (Br * 128) + r * (64 * 128), &tmap_q, blk * 64, wk.q0 + 64 * r, wk.h, wk.b,
                              bar_qfull + 8 * p);
              }
            }
          }
          for (int it = 0; it < wk.n_tiles; ++it, ++g) {
            const int st = g % STAGES, k0 = (wk.j_lo + it) * Bc;
            if (g >= STAGES) mbar_wait(bar_empty + 8 * st, ((g / STAGES) - 1) & 1);
            const unsigned full = bar_full + 8 * st;
            mbar_arrive_expect_tx(full, 2 * KV_BYTES);
#pragma unroll
            for (int blk = 0; blk < HEAD_DIM / 64; ++blk) {
              tma_load_4d(sK + st * KV_BYTES + blk * (Bc * 128), &tmap_k, blk * 64, k0, hk, wk.b, full);
              tma_load_4d(sV + st * KV_BYTES + blk * (Bc * 128), &tmap_v, blk * 64, k0, hk, wk.b, full);
            }
          }
          // the next work tile (its latency hides behind the wait for this tile's last S)
          if constexpr (PERSIST) u = (i64)gridDim.x + atomicAdd(sched, 1u);
        }
        if constexpr (PERSIST) {  // the last block out sets the counters back to 0 for the next launch
          if (atomicAdd(sched + 1, 1u) == gridDim.x - 1) {
            sched[0] = 0u;
            sched[1] = 0u;
          }
        }
      }
      return;
    }
    const Sm90Work wk = sm90_work_tile<Br, Bc, false>(0, n_q, heads_q, batch, seqlen_q, seqlen_k, left, right, 1);
    const int n_tiles = wk.n_tiles, j_lo = wk.j_lo;
    const T* kp = k + wk.b * k_sb + (wk.h / group) * k_sh;
    const T* vp = v + wk.b * v_sb + (wk.h / group) * v_sh;
    // Two tiles in flight: tile it is signalled as soon as it has landed (each thread waits for its own copies,
    // fences them to the async proxy, then arrives: the mbarrier completes once all 128 have), then tile it+2
    // is issued into the stage the consumers released (tile it+2-STAGES). One cp.async group per tile.
    auto issue = [&](int it) {
      const int st = it % STAGES, k0 = (j_lo + it) * Bc;
      load_tile_sw128<T, HEAD_DIM, Bc, 128>(sK + st * KV_BYTES, kp, k_ss, k0, seqlen_k, tid);
      load_tile_sw128<T, HEAD_DIM, Bc, 128>(sV + st * KV_BYTES, vp, v_ss, k0, seqlen_k, tid);
    };
    if (n_tiles > 0) issue(0);
    cp_async_commit();
    if (n_tiles > 1) issue(1);
    cp_async_commit();
    for (int it = 0; it < n_tiles; ++it) {
      cp_async_wait<1>();  // this thread's copies of tile it have landed (tile it+1 may be in flight)
      fence_proxy_async();
      mbar_arrive(bar_full + 8 * (it % STAGES));
      const int nx = it + 2;
      if (nx < n_tiles) {
        if (nx >= STAGES) mbar_wait(bar_empty + 8 * (nx % STAGES), ((nx / STAGES) - 1) & 1);  // released
        issue(nx);
      }
      cp_async_commit();
    }
    cp_async_wait<0>();
  } else {
    // ---------------- consumers ----------------
    setmaxnreg_inc<CONSUMER_REGS>();
    // the work tiles of this block: one (blockIdx) or, persistent, those its producer claims (computed after
    // setmaxnreg: values live across it get spilled)
    const int n_q = (seqlen_q + Br - 1) / Br;
    const i64 n_work = PERSIST ? (i64)n_q * heads_q * batch : 1;
    const int shift = seqlen_k - seqlen_q;
    // consumer index, through a shuffle from lane 0 so that the compiler knows it is warp-uniform (CUTLASS does the
    // same): the addresses and wgmma descriptors derived from it then live in uniform registers
    const int c = __shfl_sync(0xffffffffu, wg - 1, 0);
    const unsigned sQw = sQ + c * 64 * 128;
    // (PERSIST) its part of the Q tile: that part's full / empty pair and work-tile slot
    const int qpart = c / QPART_WG;
    const unsigned qfull_c = bar_qfull + 8 * qpart, qempty_c = bar_qempty + 8 * qpart, slot_c = work_slot + 8 * qpart;
    int g = 0;  // K/V tiles consumed so far by this block (the producer's count)
    bool turns_started = false;  // (ping-pong) the first turn has been given
    int o_stage = -1;            // (OSTAGE) the stage whose K tile holds the previous work tile's O being stored
    int kfree = BAR_KFREE;       // (OSTAGE) this work tile's K-tile-free pair: BAR_KFREE or BAR_KFREE + 2
    // (OSTAGE) the previous work tile's O has left shared memory: its stage ((g - 1) % STAGES, next filled with
    // K/V tile g - 1 + STAGES) back to the producer. OREL_LATE = 1: after this tile's first S is issued, not before
    // it (0): the wait for the copy engine to read O is off the path to the first S (1.004-1.018x at head_dim 128
    // 1K-4K but for one row of 12; releasing it after the second issue was 0.7-2.6 % slower, logs/orel_rot_ab_*). A
    // tile with no K/V tile releases it after its epilogue-free path (the catch-all below the tile loop).
    auto release_o = [&]() {
      if (OSTAGE && o_stage >= 0) {
        if ((tid & 127) == 0) {
          bulk_wait_read<0>();
          mbar_arrive_cnt(bar_empty + 8 * o_stage, 4);  // for the warpgroup's 4 warps
        }
        __syncwarp();
        o_stage = -1;
      }
    };
    for (int w = 0; PERSIST || w == 0; ++w) {  // w: work tiles of this block so far (the Q barriers' phase)
      i64 u = 0;
      if constexpr (PERSIST) {  // the producer's claim, published with this tile's Q
        mbar_wait(qfull_c, w & 1);
        asm volatile("ld.shared.s64 %0, [%1];\n" : "=l"(u) : "r"(slot_c) : "memory");
        if (!CUFLASH_FWD_OREL_LATE) release_o();
        if (u >= n_work) {  // none left; consumer 0 takes consumer 1's last pass of the turn
          release_o();  // (optional: bulk_wait_all below waits for the store anyway)
          if (PINGPONG && c == 0 && turns_started) named_bar_sync(BAR_SCHED + 0, 256);
          break;
        }
      }
      const Sm90Work wk = sm90_work_tile<Br, Bc, PERSIST>(u, n_q, heads_q, batch, seqlen_q, seqlen_k, left, right,
                                                            group_heads);
      const int j_lo = wk.j_lo, h = wk.h, b = wk.b;
      const int wrow0 = wk.q0 + c * 64;
      const int row_a = wrow0 + warp * 16 + (lane >> 2);
      // The block's K/V tiles cover every row of its Br; this warpgroup's rows may see fewer (causal / right
      // window: a lower diagonal; rows past seqlen_q: none). Without ping-pong (whose turns need every consumer
      // to issue for every tile) it computes only its own first n_tiles and, for the trailing ones, waits for
      // each to land and releases its stage (an arrival before the stage is refilled would count towards the
      // previous phase). Those tiles are fully masked for its rows: the same bits for finite inputs.
      const int n_tiles = (!PINGPONG && NWG > 1) ? own_tiles<Bc>(wk, wrow0, seqlen_q, seqlen_k, right) : wk.n_tiles;
      // PERSIST: the producer loaded Q (TMA); each warp releases its part after its warpgroup's last S (release_q)
      auto release_q = [&]() {
        if constexpr (PERSIST) {
          __syncwarp();
          if (lane == 0) mbar_arrive(qempty_c);
        }
      };
      auto last_s_done = [&]() {  // this warpgroup's last S has completed: Q and (OSTAGE) the last K tile read
        release_q();
        if constexpr (OSTAGE && NWG > 1) named_bar_arrive(kfree + (c ^ 1), 256);
      };
      if (!PERSIST) {  // this warpgroup's 64 Q rows
        const T* qp = q + b * q_sb + h * q_sh;
        load_tile_sw128<T, HEAD_DIM, 64, 128, Br>(sQw, qp, q_ss, wrow0, seqlen_q, tid & 127);
        cp_async_commit();
        cp_async_wait<0>();
        fence_proxy_async();
        named_bar_sync(BAR_Q + c, 128);
      }

      float o[NPV][OREG];
#pragma unroll
      for (int n = 0; n < NPV; ++n)
#pragma unroll
        for (int i = 0; i < OREG; ++i) o[n][i] = 0.f;
      float s[Bc / 2];
#pragma unroll
      for (int i = 0; i < Bc / 2; ++i) s[i] = 0.f;
      unsigned pa[Bc / 16][4];
      float m2[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, alpha[2];

      // Ping-pong turns: consumer c waits on BAR_SCHED + c before issuing, then hands the turn to the other.
      // Both consumers issue n_tiles + 1 blocks per work tile, so the turns balance within each work tile.
      // One work tile: consumer 1 does not pass after its last block (consumer 0 has none left). Persistent
      // (XTURN): the turns run on across work tiles, so that consumer 0 issues the next tile's first S as soon as
      // consumer 1 has issued its last P V, instead of waiting for consumer 1 to start the next tile; consumer 0
      // takes the last pass when no tile is left (0.1-0.6 % at head_dim 128, logs/xturn_rot_ab_e76c628.json).
      constexpr bool XTURN = PERSIST;
      auto turn_wait = [&]() {
        if constexpr (PINGPONG) named_bar_sync(BAR_SCHED + c, 256);
      };
      auto turn_pass = [&](bool last) {
        if constexpr (PINGPONG) {
          if (XTURN || !(last && c == 1)) named_bar_arrive(BAR_SCHED + (c ^ 1), 256);
        }
      };
      if (n_tiles > 0) {
        if (PINGPONG && c == 1 && !(XTURN && turns_started)) named_bar_arrive(BAR_SCHED + 0, 256);  // 0 first
        turns_started = true;

        // ---- tile 0: S_0, softmax ----
        mbar_wait(bar_full + 8 * (g % STAGES), (g / STAGES) & 1);  // (the copies are async-proxy writes)
        turn_wait();
        fence_regs(s);
        wgmma_fence();
        issue_qk<T, HEAD_DIM, Br, Bc>(s, sQw, sK + (g % STAGES) * KV_BYTES);
        wgmma_commit();
        turn_pass(false);
        if (CUFLASH_FWD_OREL_LATE == 1) release_o();
        wgmma_wait<0>();
        fence_regs(s);
        if (n_tiles == 1) last_s_done();
        softmax_step<Bc>(s, m2, l, alpha, tile_needs_mask<Bc>(j_lo * Bc, wrow0, seqlen_k, shift, left, right),
                         j_lo * Bc, row_a, t, seqlen_k, shift, left, right, scale_log2);
        pack_p<T, Bc>(pa, s);

        // ---- tiles 1..n-1: issue S_it and P_{it-1} V_{it-1}; softmax S_it while P V runs ----
        for (int it = 1; it < n_tiles; ++it) {
          const int gi = g + it, st = gi % STAGES, pst = (gi - 1) % STAGES;
          const int k0 = (j_lo + it) * Bc;
          mbar_wait(bar_full + 8 * st, (gi / STAGES) & 1);
          turn_wait();
          fence_regs(s);
          fence_regs(o);
          fence_regs(pa);
          wgmma_fence();
          issue_qk<T, HEAD_DIM, Br, Bc>(s, sQw, sK + st * KV_BYTES);
          wgmma_commit();
          issue_pv<T, HEAD_DIM, Bc, PVN>(o, pa, sV + pst * KV_BYTES);
          wgmma_commit();
          turn_pass(false);
          wgmma_wait<1>();  // S_it done (P V still in flight)
          fence_regs(s);
          if (it == n_tiles - 1) last_s_done();
          softmax_step<Bc>(s, m2, l, alpha, tile_needs_mask<Bc>(k0, wrow0, seqlen_k, shift, left, right), k0,
                           row_a, t, seqlen_k, shift, left, right, scale_log2);
          fence_regs(s);    // keep the softmax above the wait (it overlaps the P V wgmma in flight)
          fence_regs(alpha);
          fence_regs(l);
#if CUFLASH_FWD_PIN
          // CUFLASH_FWD_PIN (the default for the 'tma' variant): the empty fences above order nothing in ptxas,
          // which moved this wait above the softmax (ptxas 13.0); a shared-memory store of its result (a slot per
          // warp after the mbarriers, never read) keeps the softmax between the two waits, overlapping the P V
          // wgmma (experiments/scratch/sass_order.py; 0-3 % faster on the H200, logs/fwd_pin_ab_0b7d0ea.json).
          if (lane == 0)
            asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(pin_slots + 4 * (4 * c + warp)),
                         "f"(l[0] + l[1])
                         : "memory");
#endif
          wgmma_wait<0>();  // P_{it-1} V_{it-1} done: O, pa and stage pst free
          fence_regs(o);
          fence_regs(pa);
          __syncwarp();
          if (lane == 0) mbar_arrive(bar_empty + 8 * pst);
          rescale_o(o, alpha);
          pack_p<T, Bc>(pa, s);
        }

        // ---- last P V ----
        const int lst = (g + n_tiles - 1) % STAGES;
        turn_wait();
        fence_regs(o);
        fence_regs(pa);
        wgmma_fence();
        issue_pv<T, HEAD_DIM, Bc, PVN>(o, pa, sV + lst * KV_BYTES);
        wgmma_commit();
        turn_pass(true);
        wgmma_wait<0>();
        fence_regs(o);
        __syncwarp();
        if (lane == 0 && !OSTAGE) mbar_arrive(bar_empty + 8 * lst);  // (OSTAGE: after O is stored from it)
      }
      release_o();  // (no K/V tile: not released above)
      for (int it = n_tiles; it < wk.n_tiles; ++it) {  // the trailing tiles no row of this warpgroup sees
        const int gi = g + it;
        mbar_wait(bar_full + 8 * (gi % STAGES), (gi / STAGES) & 1);
        __syncwarp();
        if (lane == 0) mbar_arrive(bar_empty + 8 * (gi % STAGES));
      }
      if constexpr (PERSIST) {
        float* const lp = lse + ((i64)b * heads_q + h) * seqlen_q;
        if (n_tiles == 0) release_q();
        if (OSTAGE && n_tiles > 0) {
          const int lst = (g + n_tiles - 1) % STAGES;
          const unsigned sO = sK + lst * KV_BYTES + c * 64 * 128;  // this warpgroup's rows of that K tile
          if (NWG > 1) named_bar_sync(kfree + c, 256);             // the other consumer's last S has read it
          stage_o<T, Bc>(o, l, m2, sgen + (sO - sbase), lp, wrow0, warp, lane, seqlen_q);
          fence_proxy_async();  // the generic-proxy writes, visible to the copy engine
          named_bar_sync(BAR_Q + c, 128);
          if ((tid & 127) == 0) {
#pragma unroll
            for (int blk = 0; blk < HEAD_DIM / 64; ++blk)
              tma_store_4d(&tmap_o, sO + blk * (Bc * 128), blk * 64, wrow0, h, b);
            bulk_commit();
          }
          o_stage = lst;
          kfree ^= BAR_KFREE ^ (BAR_KFREE + 2);  // the other pair for the next work tile with K/V tiles
        } else {
          epilogue_direct<T>(o, l, m2, out + b * o_sb + h * o_sh, o_ss, lp, wrow0, warp, lane, seqlen_q);
        }
      } else {
        epilogue<T, HEAD_DIM, Br>(o, l, m2, sgen + c * 64 * 128, out + b * o_sb + h * o_sh, o_ss,
                                  lse + ((i64)b * heads_q + h) * seqlen_q, wrow0, warp, lane, seqlen_q);
      }
      g += wk.n_tiles;
    }
    if (OSTAGE && (tid & 127) == 0) bulk_wait_all();  // the last O stores have completed
  }
}

}  // namespace cuflash
