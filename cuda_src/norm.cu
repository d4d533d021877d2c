// norm.cu — LayerNorm and RMSNorm, forward (optionally fused with the residual add) and backward, each one
// pass over HBM per row: the row is held on chip (registers, then shared memory) between its statistics and
// its output.
//
//   LayerNorm (Ba, Kiros & Hinton 2016):  y = (h - mean) * rstd * w + b,  rstd = 1 / sqrt(var + eps)
//   RMSNorm (Zhang & Sennrich 2019):      y = h * rstd * w,               rstd = 1 / sqrt(mean(h^2) + eps)
//   with h = x, or h = x + residual rounded to T (the returned new residual stream, so y == norm(h) exactly).
//
// Layout of one row (64-bit offset off = row * hidden, T arrays 16-byte aligned at their base): `head` scalars up
// to the first 16-byte boundary, `body` vectors of VEC = 16 / sizeof(T) elements, `tail` scalars. Thread t of
// the G threads of a row owns body vectors v = k * G + t (chunk k); chunks k < NV stay in registers, the next
// `smem_chunks` in dynamic shared memory, any further ones are re-read from global memory (the two-pass
// fallback for huge rows; L2 usually serves them). Thread t < head / t < tail also owns one head / tail scalar.
// When hidden % VEC == 0 every row starts aligned (head == 0), so a thread owns the same columns in every row it
// handles: for its first NH chunks the weight/bias vectors (backward: also the dw/db partial sums) are kept in
// registers across rows instead of being loaded (read-modified-written) again per row.
//
// Kernels (templates over T in {float, __half, __nv_bfloat16}, W (weight/bias type) in {float, T}, KIND, NH, and
// for the forward RES, the fused residual add):
//   norm_fwd     statistics (LayerNorm: two-pass over registers when the row fits them, else Welford/Chan;
//                RMSNorm: float32 sum of squares) + normalise
//   norm_fwd_stream  the forward of whole-vector rows of 4096+ vectors, rows staged ahead by cp.async
//   norm_fwd_cluster the forward of long whole-vector rows over a thread-block cluster (sm_90+), each block's
//                share in registers, the blocks' statistics exchanged by st.async + mbarrier
//   norm_bwd     dx per row from two row sums; dweight/dbias partial column sums per block (in shared memory
//                when they fit, else in the block's own workspace row), written to a [nblocks, hidden] float32
//                workspace — no atomics; rows are assigned to blocks in a fixed order
//   norm_bwd_stream  the backward of whole-vector rows of 64..2048 vectors: two rows staged ahead by cp.async,
//                dweight/dbias partials in registers, one workspace row per row group
//   norm_bwd_cluster the same for rows of up to 8 x 2048 vectors over a thread-block cluster (sm_90+), the
//                blocks' row sums exchanged by st.async + mbarrier, one workspace row per cluster
//   reduce_parts the second, deterministic reduction of the workspace over blocks (fixed order)
//
// Traffic: forward reads h once (x, plus residual) and writes y (plus h); backward reads x and dy, writes dx.
#include "cuflash/welford.cuh"
#include "cuflash/async_copy.cuh"
#include "cuflash/cluster.cuh"

namespace cuflash {

enum { LAYER = 0, RMS = 1 };

struct RowSplit {
  int head, body, tail;
};

// The row starting at element offset `off` (base pointer 16-byte aligned): scalars, aligned vectors, scalars.
template <int VEC> __device__ __forceinline__ RowSplit row_split(i64 off, int hidden) {
  int head = (int)((VEC - (int)(off % VEC)) % VEC);
  if (head > hidden) head = hidden;
  const int body = (hidden - head) / VEC;
  return {head, body, hidden - head - body * VEC};
}

// A copy of a 16-byte vector the compiler cannot see through: converting it to float in pass 1 then does not let
// the compiler keep those floats alive until pass 2 (twice the registers of the packed 16-bit row).
// The same holds for weights kept in registers across rows: converted per use, not hoisted out of the row loop.
template <typename V> __device__ __forceinline__ V opaque(const V& a) {
  static_assert(sizeof(V) % 16 == 0, "16- or 32-byte vectors only");
  V r;
  const unsigned* s = reinterpret_cast<const unsigned*>(&a);
  unsigned* d = reinterpret_cast<unsigned*>(&r);
#pragma unroll
  for (int i = 0; i < (int)(sizeof(V) / 4); ++i) asm volatile("mov.b32 %0, %1;" : "=r"(d[i]) : "r"(s[i]));
  return r;
}

// A packed vector of weights as floats.
template <typename W, int VEC> __device__ __forceinline__ void unpack(const Vec<W, VEC>& p, float (&out)[VEC]) {
#pragma unroll
  for (int i = 0; i < VEC; ++i) out[i] = to_float(p.v[i]);
}

// VEC weights starting at column `col`: one aligned vector access when `vec`, else scalar loads.
template <typename W, int VEC>
__device__ __forceinline__ void load_params(const W* __restrict__ p, int col, bool vec, float (&out)[VEC]) {
  if (vec) {
    unpack<W, VEC>(Vec<W, VEC>::load(p + col), out);
  } else {
#pragma unroll
    for (int i = 0; i < VEC; ++i) out[i] = to_float(p[col + i]);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Forward. WARP: a warp per row, blockDim.x / 32 rows per block (<= 256 threads), the row in registers,
// reduced with shuffles only (no block barrier, no shared memory). Otherwise a block of G = blockDim.x threads
// per row. Grid-stride over rows (any row count). MINB: the blocks per SM the launch bounds promise (registers
// per thread <= 65536 / (MINB * blockDim)), which decides how many chunks' weights (NH) fit in registers.
// ALIGNED: hidden % VEC == 0 (the wrapper aligns every base pointer to 16 bytes, so every row then starts on a
// vector): no head/tail scalars and vector weight loads only, which the compiler can then drop (bf16 LayerNorm
// warp path: 72 -> 64 registers).
template <typename T, typename W, int KIND, int NV, int NH, int MINB, bool RES, bool WARP, bool TWO_PASS,
          bool ALIGNED, bool SMEMC>
__global__ void __launch_bounds__(WARP ? 256 : 512, MINB) norm_fwd(
    const T* __restrict__ x, const T* __restrict__ res, const W* __restrict__ w, const W* __restrict__ b,
    T* __restrict__ y, T* __restrict__ hout, float* __restrict__ mean_out, float* __restrict__ rstd_out,
    const i64 rows, const int hidden, const float eps, const int nchunks, const int smem_chunks) {
  constexpr int VEC = Vec16<T>::N;
  static_assert(NH >= 0 && NH <= NV, "held chunks are register chunks");
  typedef Vec<T, VEC> V;
  extern __shared__ __align__(16) unsigned char dsmem[];
  V* cache = reinterpret_cast<V*>(dsmem);  // [smem_chunks][G] vectors, each thread only touches its own slots
  __shared__ Welford red_w[32];
  __shared__ Sum1 red_s[32];
  const int G = WARP ? 32 : blockDim.x;
  const int t = WARP ? threadIdx.x & 31 : threadIdx.x, ROWS = WARP ? blockDim.x >> 5 : 1;
  const int grp = WARP ? threadIdx.x >> 5 : 0;
  constexpr bool has_res = RES;  // a template flag: the residual path's registers do not burden the plain one
  if (KIND == RMS) b = nullptr;  // RMSNorm has no bias (rms_norm passes none): no registers held for it

  // ---- the weights and bias of this thread's first NH register chunks, loaded once for all its rows. When
  // every row starts 16-byte aligned (hidden % VEC == 0: head == 0) thread t owns the same columns in every row,
  // so loading them again per row (from L1/L2) only adds load instructions — two per data vector with a bias —
  // to a kernel whose load/store pipe, not DRAM, was the limit. Held packed in W, converted per use. NH is as
  // many chunks as fit the registers left under the launch bounds (cuflash/norm.py: _HELD_FWD).
  typedef Vec<W, VEC> P;
  const bool held = NH > 0 && hidden % VEC == 0;
  P wreg[NH > 0 ? NH : 1], breg[NH > 0 ? NH : 1];
  if (held) {
#pragma unroll
    for (int k = 0; k < NH; ++k) {
      const int v = k * G + t;
      if (v < hidden / VEC) {
        if (w) wreg[k] = P::load(w + v * VEC);
        if (b) breg[k] = P::load(b + v * VEC);
      }
    }
  }

  for (i64 row = (i64)blockIdx.x * ROWS + grp; row < rows; row += (i64)gridDim.x * ROWS) {
    const i64 off = row * (i64)hidden;
    const RowSplit rs = ALIGNED ? RowSplit{0, hidden / VEC, 0} : row_split<VEC>(off, hidden);
    const T* xr = x + off + rs.head;  // aligned body start
    const T* rr = has_res ? res + off + rs.head : nullptr;
    T* hr = has_res ? hout + off + rs.head : nullptr;
    T* yr = y + off + rs.head;

    // ---- pass 1: load h (x, or x + residual rounded to T, stored as the new residual), statistics
    V reg[NV];
    if (has_res) {
      V rv[NV];
#pragma unroll
      for (int k = 0; k < NV; ++k) {
        const int v = k * G + t;
        if (v < rs.body) { reg[k] = V::load(xr + v * VEC); rv[k] = V::load(rr + v * VEC); }
      }
#pragma unroll
      for (int k = 0; k < NV; ++k) {
        const int v = k * G + t;
        if (v < rs.body) {
#pragma unroll
          for (int i = 0; i < VEC; ++i) reg[k].v[i] = from_float<T>(to_float(reg[k].v[i]) + to_float(rv[k].v[i]));
          reg[k].store(hr + v * VEC);
        }
      }
    } else {
#pragma unroll
      for (int k = 0; k < NV; ++k) {
        const int v = k * G + t;
        if (v < rs.body) reg[k] = V::load(xr + v * VEC);
      }
    }
    // The chunks kept in shared memory are copied there by cp.async, all in flight with the register loads (no
    // registers held while in flight; each thread reads back only its own slots, after cp.async.wait_group, and
    // refills them only after its previous row's last read of them). With a residual its chunks land in a second
    // region, cache + smem_chunks * G (the wrapper sizes the shared memory for both). Loaded through registers
    // instead, a few at a time between Welford merges, they left a float32 32K row's loads mostly serialised:
    // 0.52 of the copy bandwidth on the H200, where a Triton kernel that issues the whole row at once reached 0.85.
    // (only in the SMEMC instantiations, which the wrapper launches for rows that have such chunks: the others
    // compile as without this code; sharing one slowed fused RMSNorm at bfloat16 2K-16K by 10-15 %)
    const int nsm = SMEMC ? min(smem_chunks, nchunks - NV) : 0;
    V* rcache = cache + smem_chunks * G;
    if (SMEMC && nsm > 0) {
      for (int k = 0; k < nsm; ++k) {
        const int v = (NV + k) * G + t;
        if (v < rs.body) {
          cp_async_16(smem_u32(cache + k * G + t), xr + v * VEC, true);
          if (has_res) cp_async_16(smem_u32(rcache + k * G + t), rr + v * VEC, true);
        }
      }
      cp_async_commit();
    }

    Welford st = Welford::identity();
    float ss = 0.f;
    auto stats_vec = [&](const V& a0) {
      float f[VEC];
      if constexpr (KIND == LAYER) {
        to_floats(opaque(a0), f);
      } else {
        const V a = opaque(a0);
#pragma unroll
        for (int i = 0; i < VEC; ++i) f[i] = to_float(a.v[i]);
      }
      if (KIND == LAYER) {
        welford_push_vec<VEC>(st, f);
      } else {
#pragma unroll
        for (int i = 0; i < VEC; ++i) ss = fmaf(f[i], f[i], ss);
      }
    };
    auto stats_one = [&](float h) {
      if (KIND == LAYER) welford_push(st, h);
      else ss = fmaf(h, h, ss);
    };

    // Over this thread's register chunks: acc + the sum of the values, acc + the sum of their squared deviations
    // from m (the two passes of the exact two-pass formula; LayerNorm).
    auto reg_sum = [&](float acc) {
#pragma unroll
      for (int k = 0; k < NV; ++k)
        if (k * G + t < rs.body) {
          float f[VEC];
          to_floats(opaque(reg[k]), f);
#pragma unroll
          for (int i = 0; i < VEC; ++i) acc += f[i];
        }
      return acc;
    };
    auto reg_sq_dev = [&](float m, float acc) {
#pragma unroll
      for (int k = 0; k < NV; ++k)
        if (k * G + t < rs.body) {
          float f[VEC];
          to_floats(opaque(reg[k]), f);
#pragma unroll
          for (int i = 0; i < VEC; ++i) { const float d = f[i] - m; acc = fmaf(d, d, acc); }
        }
      return acc;
    };

    // A row held entirely on chip (LayerNorm): two plain sums, the mean from the first and the sum of squared
    // deviations from it in the second, both over the registers and (SMEMC) the shared-memory chunks (the exact
    // two-pass formula; below). The launch guarantees nchunks <= NV, or with SMEMC nchunks <= NV + smem_chunks.
    constexpr bool two_pass = KIND == LAYER && TWO_PASS;
    if (KIND == LAYER && !two_pass) {
      // the chunks held in registers: this thread's exact (count, mean, M2), two passes over its registers
      // (one division per row instead of a Chan merge per vector); later chunks are merged vector by vector
      float cnt = 0.f;
#pragma unroll
      for (int k = 0; k < NV; ++k)
        if (k * G + t < rs.body) cnt += (float)VEC;
      const float m = cnt > 0.f ? __fdividef(reg_sum(0.f), cnt) : 0.f;
      st = Welford{cnt, m, reg_sq_dev(m, 0.f)};
    } else if (KIND == RMS) {
#pragma unroll
      for (int k = 0; k < NV; ++k)
        if (k * G + t < rs.body) stats_vec(reg[k]);
    }

    // chunks beyond the registers: shared memory while it lasts, else re-read in pass 2
    if (SMEMC && nsm > 0) cp_async_wait<0>();  // this thread's copies of the row have landed
#pragma unroll 4
    for (int k = NV; k < nchunks; ++k) {
      const int v = k * G + t;
      if (v < rs.body) {
        if (SMEMC && k - NV < nsm) {  // copied above
          V a = cache[(k - NV) * G + t];
          if (has_res) {  // h = x + residual, rounded: the new residual stream, and what the row normalises
            const V r = rcache[(k - NV) * G + t];
#pragma unroll
            for (int i = 0; i < VEC; ++i) a.v[i] = from_float<T>(to_float(a.v[i]) + to_float(r.v[i]));
            a.store(hr + v * VEC);
            cache[(k - NV) * G + t] = a;
          }
          if constexpr (!two_pass) stats_vec(a);  // two-pass: summed below
          continue;
        }
        V a = V::load(xr + v * VEC);
        if (has_res) {
          const V r = V::load(rr + v * VEC);
#pragma unroll
          for (int i = 0; i < VEC; ++i) a.v[i] = from_float<T>(to_float(a.v[i]) + to_float(r.v[i]));
          a.store(hr + v * VEC);
        }
        if (k - NV < smem_chunks) cache[(k - NV) * G + t] = a;
        stats_vec(a);
      }
    }

    // head / tail scalars (column t, and column head + body*VEC + t)
    const bool do_head = t < rs.head, do_tail = t < rs.tail;
    const int col_head = t, col_tail = rs.head + rs.body * VEC + t;
    float h_head = 0.f, h_tail = 0.f;
    auto load_one = [&](int col) -> float {
      float h = to_float(x[off + col]);
      if (has_res) {
        const T hv = from_float<T>(h + to_float(res[off + col]));
        hout[off + col] = hv;
        h = to_float(hv);
      }
      return h;
    };
    if (do_head) { h_head = load_one(col_head); if (!two_pass) stats_one(h_head); }
    if (do_tail) { h_tail = load_one(col_tail); if (!two_pass) stats_one(h_tail); }

    float mu = 0.f, rstd;
    if (two_pass) {
      // Welford/Chan merges cost three shuffles and a division per level, and ran this memory-bound kernel at
      // 0.71-0.74 of the copy bandwidth on the H200 (bf16); two plain sums, with the weights loaded per chunk
      // (HOLD off for 16-bit LayerNorm, fewer registers, more rows in flight) reach 0.92-0.95 in the same
      // probe (experiments/results/logs/ln_probe_e0db513.json). Exact two-pass, so never E[x^2] - E[x]^2.
      float sum = reg_sum((do_head ? h_head : 0.f) + (do_tail ? h_tail : 0.f));
      if constexpr (two_pass && SMEMC) {  // and over the shared-memory chunks (h, written there by pass 1)
        for (int k = 0; k < nsm; ++k)
          if ((NV + k) * G + t < rs.body) {
            float f[VEC];
            to_floats(cache[k * G + t], f);
#pragma unroll
            for (int i = 0; i < VEC; ++i) sum += f[i];
          }
      }
      sum = (WARP ? warp_allreduce<32>(Sum1{sum}, Sum1Op()) : block_allreduce(Sum1{sum}, Sum1Op(), red_s)).a;
      mu = sum / (float)hidden;
      float q = 0.f;
      if (do_head) q = (h_head - mu) * (h_head - mu);
      if (do_tail) q = fmaf(h_tail - mu, h_tail - mu, q);
      q = reg_sq_dev(mu, q);
      if constexpr (two_pass && SMEMC) {
        for (int k = 0; k < nsm; ++k)
          if ((NV + k) * G + t < rs.body) {
            float f[VEC];
            to_floats(cache[k * G + t], f);
#pragma unroll
            for (int i = 0; i < VEC; ++i) { const float d = f[i] - mu; q = fmaf(d, d, q); }
          }
      }
      q = (WARP ? warp_allreduce<32>(Sum1{q}, Sum1Op()) : block_allreduce(Sum1{q}, Sum1Op(), red_s)).a;
      rstd = rsqrtf(q / (float)hidden + eps);
    } else if (KIND == LAYER) {
      st = WARP ? warp_allreduce<32>(st, WelfordOp()) : block_allreduce(st, WelfordOp(), red_w);
      mu = st.mean;
      float var = st.m2 / st.n;
      var = var < 0.f ? 0.f : var;  // clamp at 0 (fmaxf would turn a NaN from inf/NaN input into 0)
      rstd = rsqrtf(var + eps);
      // Chan's merge is not symmetric in its arguments: lanes may differ in the last bit. Every warp ends with
      // the same lane-0 state, so broadcast it and the whole row uses one (mean, rstd), the one returned.
      mu = __shfl_sync(0xffffffffu, mu, 0);
      rstd = __shfl_sync(0xffffffffu, rstd, 0);
    } else {
      const Sum1 s = WARP ? warp_allreduce<32>(Sum1{ss}, Sum1Op()) : block_allreduce(Sum1{ss}, Sum1Op(), red_s);
      rstd = rsqrtf(s.a / (float)hidden + eps);
    }
    if (t == 0) {
      if (mean_out) mean_out[row] = mu;
      if (rstd_out) rstd_out[row] = rstd;
    }

    auto out = [&](const W* __restrict__ w, const W* __restrict__ b) {
      // ---- pass 2: y = (h - mu) * rstd * w + b
      const bool pvec = ALIGNED || rs.head == 0;  // params are vector-aligned only when the body starts at column 0
      auto emit_vec = [&](const V& a, int k, int v) {  // body vector v of chunk k
        float wv[VEC], bv[VEC];
        if (held && k < NH) {
          if (w) unpack<W, VEC>(opaque(wreg[k]), wv);
          if (b) unpack<W, VEC>(opaque(breg[k]), bv);
        } else {
          const int col = rs.head + v * VEC;
          if (w) load_params<W, VEC>(w, col, pvec, wv);
          if (b) load_params<W, VEC>(b, col, pvec, bv);
        }
        V o;
        if constexpr (KIND == LAYER) {  // bfloat16 pairs by one integer op an element (to_floats; RMSNorm keeps the
                                        // per-element form: with to_floats four of its instantiations spilled)
          float f[VEC];
          to_floats(a, f);
#pragma unroll
          for (int i = 0; i < VEC; ++i) {
            const float r = (f[i] - mu) * rstd;
            o.v[i] = from_float<T>(w ? (b ? fmaf(r, wv[i], bv[i]) : r * wv[i]) : (b ? r + bv[i] : r));
          }
        } else {
#pragma unroll
          for (int i = 0; i < VEC; ++i) {
            const float r = (to_float(a.v[i]) - mu) * rstd;
            o.v[i] = from_float<T>(w ? (b ? fmaf(r, wv[i], bv[i]) : r * wv[i]) : (b ? r + bv[i] : r));
          }
        }
        o.store(yr + v * VEC);
      };
      auto emit_one = [&](float h, int col) {
        float r = (h - mu) * rstd;
        if (w) r *= to_float(w[col]);
        if (b) r += to_float(b[col]);
        y[off + col] = from_float<T>(r);
      };

#pragma unroll
      for (int k = 0; k < NV; ++k) {
        const int v = k * G + t;
        if (v < rs.body) emit_vec(reg[k], k, v);
        asm volatile("" ::: "memory");  // keep the (L1-resident) weight loads of chunk k + 1 from piling up early
      }
#pragma unroll 1  // shared-memory reads: unrolling only costs registers (spills for float + residual)
      for (int k = NV; k < nchunks; ++k) {
        const int v = k * G + t;
        if (v < rs.body) {
          V a;
          if (k - NV < smem_chunks) a = cache[(k - NV) * G + t];
          else a = has_res ? V::load(hr + v * VEC) : V::load(xr + v * VEC);  // this thread wrote hr itself
          emit_vec(a, NV, v);  // chunks beyond the registers: weights loaded per row
        }
      }
      if (do_head) emit_one(h_head, col_head);
      if (do_tail) emit_one(h_tail, col_tail);
    };
    // Plain LayerNorm with weight and bias: its own copy of the output loop, in which both are known present (w
    // and b above are the lambda's): bfloat16 2K-8K +2.9-3.8 %, float32 even (logs/norm_fwd_split_ab_b5a5b41.json).
    // A copy for each of the four presences made 40 instantiations spill.
    if (KIND == LAYER && !RES && w && b) out(w, b);
    else out(w, b);
  }
}

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
// norm_fwd_cluster's output phase, y = (h - mu) * rstd * w + b over a thread's VPT vectors (v = t + k * G), for
// one presence of the weight and bias (HW, HB; SM: read from the thread's shared-memory slots, else per use)
template <bool HW, bool HB, bool SM, int VPT, typename V, typename P, typename W, typename T>
__device__ __forceinline__ void cluster_emit(const V (&reg)[VPT], float mu, float rstd, const W* __restrict__ w,
                                             const W* __restrict__ b, const P* wsm, const P* bsm,
                                             T* __restrict__ yr, int t, int G, int body) {
  constexpr int VEC = Vec16<T>::N;
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int v = t + k * G;
    if (v < body) {
      float wv[VEC], bv[VEC];
      if (HW) unpack<W, VEC>(SM ? wsm[k * G + threadIdx.x] : P::load(w + v * VEC), wv);
      if (HB) unpack<W, VEC>(SM ? bsm[k * G + threadIdx.x] : P::load(b + v * VEC), bv);
      V o;
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        const float r = (to_float(reg[k].v[i]) - mu) * rstd;
        o.v[i] = from_float<T>(HW ? (HB ? fmaf(r, wv[i], bv[i]) : r * wv[i]) : (HB ? r + bv[i] : r));
      }
      o.store(yr + (i64)v * VEC);
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Forward of a long row of whole 16-byte vectors over the CL blocks of a thread-block cluster (sm_90+): one row
// per cluster (gridDim.x = rows * CL), block r owning vectors [r * 4G, (r + 1) * 4G) of it, four a thread, in
// registers (G = blockDim.x). A block holding a whole 128 KiB row (norm_fwd with shared-memory chunks) leaves one
// or two rows in flight per SM, each loaded, reduced and written in turn; split over the cluster, a row's share
// is small enough for registers and several blocks per SM overlap one's loads with another's reduction.
// Statistics: each warp reduces its values by shuffles (LayerNorm: their sum, then their squared deviations from
// the warp's mean, the exact two-pass formula on them), warp 0 merges the warps' states into the block's (one block
// barrier); the CL block states go to every block by st.async, counted by an mbarrier
// in the receiver (no cluster barrier on the row's path: the one at the start, which publishes the mbarriers'
// initialisation, is waited for only after the loads are in flight), and every block merges them in rank order
// (Chan et al. 1979 for LayerNorm: M2 = sum M2_r + n_r (mean_r - mean)^2), so all get the same bits.
// A block leaves after its own mbarrier completes: every store into its shared memory has landed by then, and a
// peer it stored into waits for that store before it leaves.
// HOLD: persistent clusters (gridDim.x / CL of them, as many as fit at once), rows cluster-stride, each thread's
// weight and bias vectors loaded once into its own slots of dynamic shared memory (registers would spill: float32
// weights of a 16-bit row take 64 registers with the bias) and read back per row: without it every block of every
// row re-reads its share of them from L2, as many bytes as x for plain LayerNorm (the one kind that ran slower on
// this path). Each thread reads only the slots it wrote: no barrier. Two
// exchange buffers and mbarriers by row parity: a peer sends row i's state only after it has received this block's
// state of row i - 1, which this block sends after its block barrier of that row, after every thread here has
// read row i - 2's buffer and waited for its mbarrier phase, so the buffer and the phase row i uses are free.
// Not HOLD, with 16-byte weight vectors (W of T's size): each row's share of the weight and bias is copied into
// the same slots by cp.async.ca, issued right after the row's loads of x, and waited for before the output phase:
// read there from L1/L2 (as float32 weights of a 16-bit row still are), they came with no other load in flight.
// H200, same run (logs/ln_affine_async_ab_07301ce.json): fused-residual LayerNorm bfloat16 32K 0.893 -> 0.951 of
// copy, 16K 0.944 -> 0.975, float32 16K 0.948 -> 0.970; RMSNorm bfloat16 32K 0.920 -> 0.973, float32 16K 0.944
// -> 0.971, with residual bfloat16 32K 0.956 -> 0.978. By cp.async.cg (L2 only) it lost where CL = 4 (RMSNorm
// float32 16K 0.76). Plain LayerNorm with weight and bias stays off this path (FWD_CLUSTER_LAYER_AFFINE): staged,
// bfloat16 16K rose from 0.75 to 0.79 of copy, and with the output loop specialised (below) to 0.87, against
// norm_fwd's 0.90 with its loop specialised too (logs/ln_affine_plan_ab_af82988.json). Neither L1 eviction hints
// (logs/ln_affine_l1pol_ab_873fb11.json) nor the held form run one cluster per 2-16 rows, its weight re-reads
// from L2 cut that much (logs/ln_hold_rows_ab_bced2a1.json), gained.
// PF > 0 (study, with HOLD and no residual): each thread's share of the next row is loaded into a second register
// buffer before this row's reduction, so a block keeps a row's loads in flight while it reduces, exchanges and
// writes the current one; PF is the launch bounds' blocks per SM (LayerNorm needs 88-118 registers: 2 without
// spills, 3 with a few words spilled; RMSNorm fits 64: 4).
// Blocks per SM (launch bounds): a block loads its share, then reduces, exchanges and writes it with no load in
// flight, so the bytes in flight per SM are set by the resident blocks (the prefetching form at 2 blocks ran bf16
// LayerNorm at 0.46-0.53 of copy). Plain LayerNorm (no residual, not held) with CL <= 4: 5 (48 registers, no
// spills; at 4 it took 56-64 and ran at 0.75-0.85 of copy without weights where RMSNorm, 40 registers and 6
// blocks, ran at 0.97-0.98); the others 4 (at 5, CL = 8, the held forms and float16 with float32 weights and a
// residual spill).
template <typename T, typename W, int KIND, bool RES, int CL, bool HOLD = false, int PF = 0>
__global__ void __cluster_dims__(CL, 1, 1)
    __launch_bounds__(256, PF ? PF : (KIND == LAYER && !RES && !HOLD && CL <= 4 ? 5 : 4))
    norm_fwd_cluster(
    const T* __restrict__ x, const T* __restrict__ res, const W* __restrict__ w, const W* __restrict__ b,
    T* __restrict__ y, T* __restrict__ hout, float* __restrict__ mean_out, float* __restrict__ rstd_out,
    const i64 rows, const int hidden, const float eps) {  // !HOLD: rows == gridDim.x / CL
  static_assert(CL == 2 || CL == 4 || CL == 8, "portable cluster sizes");
  static_assert(!PF || (HOLD && !RES), "the next row is prefetched on the held path, without residual");
  constexpr int VEC = Vec16<T>::N, VPT = 4, NB = HOLD ? 2 : 1;
  typedef Vec<T, VEC> V;
  typedef Vec<W, VEC> P;
  __shared__ float2 xch[NB][CL];
  __shared__ __align__(8) unsigned long long mbar[NB];
  const unsigned rank = cluster_rank();
  const int G = blockDim.x, body = hidden / VEC, share = VPT * G;
  const int t = (int)rank * share + threadIdx.x;  // this thread's first vector; its k-th is t + k * G
  if (KIND == RMS) b = nullptr;
  if (threadIdx.x == 0) {
#pragma unroll
    for (int q = 0; q < NB; ++q) mbar_init(smem_u32(&mbar[q]), 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  cluster_arrive_relaxed();  // waited for below, before the first st.async: the loads go out meanwhile

  constexpr bool STAGE = !HOLD && sizeof(P) == 16;  // each row's weight share copied in by cp.async.ca
  extern __shared__ __align__(16) unsigned char dsmem[];  // HOLD, STAGE: [w | b][k][thread] weight vectors
  P* const wsm = reinterpret_cast<P*>(dsmem);
  P* const bsm = wsm + VPT * G;
  if (HOLD) {
#pragma unroll
    for (int k = 0; k < VPT; ++k)
      if (t + k * G < body) {
        if (w) wsm[k * G + threadIdx.x] = P::load(w + (t + k * G) * VEC);
        if (b) bsm[k * G + threadIdx.x] = P::load(b + (t + k * G) * VEC);
      }
  }

  // values of block r's share of the row (0 for a block past its end)
  auto share_count = [&](int r) { return (float)(max(0, min(share, body - r * share)) * VEC); };
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = G >> 5;  // G a multiple of 32, <= 256
  // per warp: count, mean, M2 (RMSNorm: -, sum of squares, -). HOLD: the warps write it for the next row only
  // after their mbarrier wait, which completes after warp 0's arrival, which follows warp 0's reads of it
  __shared__ float wst[3][8];
  // the same bits in every lane (the butterfly adds the same pairs, commutatively)
  auto warp_sum = [](float v) { return warp_allreduce<32>(Sum1{v}, Sum1Op()).a; };

  const i64 step = gridDim.x / CL;  // HOLD: rows cluster-stride
  V reg[VPT], nxt[VPT];              // this row's share; PF: the next row's, loaded while this one is reduced
  auto load_row = [&](V (&dst)[VPT], const i64 row) {
#pragma unroll
    for (int k = 0; k < VPT; ++k)
      if (t + k * G < body) dst[k] = V::load(x + row * (i64)hidden + (i64)(t + k * G) * VEC);
  };

  // ---- one row; `it` counts this cluster's rows (buffer it % NB, mbarrier phase parity (it / NB) % 2)
  auto do_row = [&](const i64 row, const int it) {
    const i64 off = row * (i64)hidden;
    if (!PF) load_row(reg, row);  // PF: loaded during the previous row (the first before the loop)
    if (STAGE && (w || b)) {  // this row's weight and bias share, in flight with its loads
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        const bool in = t + k * G < body;
        const int v = in ? t + k * G : 0;  // an empty slot copies nothing (source size 0) from a valid address
        if (w) cp_async_ca_16(wsm + k * G + threadIdx.x, w + v * VEC, in);
        if (b) cp_async_ca_16(bsm + k * G + threadIdx.x, b + v * VEC, in);
      }
      cp_async_commit();
    }
    if (PF && row + step < rows) load_row(nxt, row + step);
    if (RES) {
      V rv[VPT];
#pragma unroll
      for (int k = 0; k < VPT; ++k)
        if (t + k * G < body) rv[k] = V::load(res + off + (i64)(t + k * G) * VEC);
#pragma unroll
      for (int k = 0; k < VPT; ++k)
        if (t + k * G < body) {  // h = x + residual rounded to T: the new residual stream, and what is normalised
#pragma unroll
          for (int i = 0; i < VEC; ++i) reg[k].v[i] = from_float<T>(to_float(reg[k].v[i]) + to_float(rv[k].v[i]));
          reg[k].store(hout + off + (i64)(t + k * G) * VEC);
        }
    }

    // ---- this block's share, reduced with shuffles in each warp and then by warp 0 over the warps' states (one
    // block barrier: two block-wide sums, four barriers, ran plain LayerNorm at 0.72-0.78 of copy at float32
    // 16K-32K against 0.92-0.93 for RMSNorm, logs/norm_sweep_f07348f.json). LayerNorm: each warp's (count, sum),
    // its mean, then its M2 about that mean (the exact two-pass formula on the warp's values), warps merged by
    // Chan's formula; RMSNorm: the sum of squares.
    auto sq_dev = [&](float m) {  // this thread's sum of (h - m)^2 (m = 0: RMSNorm's sum of squares)
      float q = 0.f;
#pragma unroll
      for (int k = 0; k < VPT; ++k)
        if (t + k * G < body) {
          const V a = opaque(reg[k]);
#pragma unroll
          for (int i = 0; i < VEC; ++i) { const float d = to_float(a.v[i]) - m; q = fmaf(d, d, q); }
        }
      return q;
    };
    if (KIND == LAYER) {
      float s = 0.f, c = 0.f;  // c: the warp's count of values (its lanes' vectors below body), no shuffle needed
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        c += (float)(min(32, max(0, body - (t - lane + k * G))) * VEC);
        if (t + k * G < body) {
          float f[VEC];
          to_floats(opaque(reg[k]), f);
#pragma unroll
          for (int i = 0; i < VEC; ++i) s += f[i];
        }
      }
      s = warp_sum(s);
      const float m = c > 0.f ? s / c : 0.f;
      const float q = warp_sum(sq_dev(m));
      if (lane == 0) { wst[0][wid] = c; wst[1][wid] = m; wst[2][wid] = q; }
    } else {
      const float q = warp_sum(sq_dev(0.f));
      if (lane == 0) wst[1][wid] = q;
    }
    __syncthreads();

    // ---- warp 0: the block's state (LayerNorm: mean, M2 about it; RMSNorm: sum of squares, 0) to slot `rank`
    // of every block's xch (lane 0 its own, then its arrival; lane q to block q by st.async)
    if (it == 0) cluster_wait();  // every block's mbarriers are initialised
    const int q = HOLD ? it & 1 : 0;
    const unsigned mb = smem_u32(&mbar[q]);
    float2* xb = xch[q];
    if (wid == 0) {
      float2 mine;
      if (KIND == LAYER) {  // Chan's merge is not symmetric: lanes may differ in the last bit, lane 0's is sent
        Welford st = lane < nw ? Welford{wst[0][lane], wst[1][lane], wst[2][lane]} : Welford::identity();
        st = warp_allreduce<32>(st, WelfordOp());
        mine = make_float2(__shfl_sync(0xffffffffu, st.mean, 0), __shfl_sync(0xffffffffu, st.m2, 0));
      } else {
        mine = make_float2(warp_sum(lane < nw ? wst[1][lane] : 0.f), 0.f);
      }
      cluster_send_f2<CL>(mine, xb, rank, mb);
    }
    mbar_wait_cluster(mb, HOLD ? (it >> 1) & 1 : 0);
    if (STAGE && (w || b)) cp_async_wait<0>();  // this thread's weight and bias copies have landed
    float mu = 0.f, rstd;
    if (KIND == LAYER) {  // Chan et al. over the CL blocks: mean = sum n_r mean_r / n, M2 = sum M2_r + n_r d_r^2
      float s = 0.f;
#pragma unroll
      for (int r = 0; r < CL; ++r) s = fmaf(share_count(r), xb[r].x, s);
      mu = s / (float)hidden;
      float m2 = 0.f;
#pragma unroll
      for (int r = 0; r < CL; ++r) {
        const float d = xb[r].x - mu;
        m2 += xb[r].y + share_count(r) * d * d;  // an empty block: mean 0, M2 0, count 0
      }
      rstd = rsqrtf(m2 / (float)hidden + eps);
    } else {
      float qs = 0.f;
#pragma unroll
      for (int r = 0; r < CL; ++r) qs += xb[r].x;
      rstd = rsqrtf(qs / (float)hidden + eps);
    }
    if (rank == 0 && threadIdx.x == 0) {
      if (mean_out) mean_out[row] = mu;
      if (rstd_out) rstd_out[row] = rstd;
    }

    // ---- y = (h - mu) * rstd * w + b; weights from shared memory (HOLD, STAGE) or read per use (L1/L2). One
    // loop per presence of w and b (HW, HB), chosen once a row: with both tested per vector (branches around each
    // weight load, a four-way select) plain LayerNorm ran this path at 0.72-0.90 of copy, specialised 0.82-0.95
    // (bfloat16 16K 0.78 -> 0.88, float32 16K 0.83 -> 0.89; logs/norm_emit_ab_20b5a00.json; Nsight Compute:
    // logs/ncu_ln_cluster_{bare,affine}_009c85a.txt, logs/ncu_ln_cluster_emit_20b5a00.txt)
    constexpr bool SM = HOLD || STAGE;
    if (w && b) cluster_emit<true, true, SM, VPT>(reg, mu, rstd, w, b, wsm, bsm, y + off, t, G, body);
    else if (w) cluster_emit<true, false, SM, VPT>(reg, mu, rstd, w, b, wsm, bsm, y + off, t, G, body);
    else if (b) cluster_emit<false, true, SM, VPT>(reg, mu, rstd, w, b, wsm, bsm, y + off, t, G, body);
    else cluster_emit<false, false, SM, VPT>(reg, mu, rstd, w, b, wsm, bsm, y + off, t, G, body);
    if (PF) {
#pragma unroll
      for (int k = 0; k < VPT; ++k) reg[k] = nxt[k];
    }
  };

  if constexpr (!HOLD) {
    do_row(blockIdx.x / CL, 0);
  } else {
    int it = 0;
    if (PF && blockIdx.x / CL < rows) load_row(reg, blockIdx.x / CL);
    for (i64 row = blockIdx.x / CL; row < rows; row += step) do_row(row, it++);
    if (it == 0) cluster_wait();  // a cluster without rows still completes the start barrier (rows < clusters)
  }
}
#endif

// ---------------------------------------------------------------------------------------------------------------
// Forward, streamed (rows whose length is a multiple of VEC, so every row starts 16-byte aligned; not too long).
// A memory-bound kernel is as fast as the bytes it keeps in flight: holding the row in registers (norm_fwd)
// caps them at what the register file holds, and a row's load phase does not overlap its reduction and store.
// Here each thread stages its vectors of the next STAGES - 1 rows in shared memory with cp.async (no registers
// while in flight) and works on the current row from shared memory: the loads of later rows overlap the
// statistics and the stores of this one.
//   WARP: a warp per row (blockDim.x / 32 rows per block at a time), STAGES = 3; else a block per row, STAGES as
//   the planner sets it (norm.STREAM_STAGES: 2, the next row in flight while one is worked on; 3 where three fit).
//   The copies go through L1 (cp.async.ca): by .cg, L2 served each sector twice (cuflash/async_copy.cuh).
//   Thread t of a row's G threads owns vectors v = k * G + t, k < nvr. Each thread reads back only the shared
//   slots it filled itself, so cp.async.wait_group alone orders them (no barrier). Slot layout
//   [stage][k][thread] keeps a warp's 16-byte accesses on distinct banks. With RES the stage also holds the
//   residual's vectors (k = nvr .. 2 nvr - 1); h = x + residual overwrites the x slot.
//   Rows go to the groups of a persistent grid (gridDim.x = resident blocks) as they ask for them (a ticket per
//   stream; without one, grid-stride), so a thread's columns are the same in every row: the weights and bias of
//   its first NH chunks are loaded once and held in registers, later chunks load theirs per row. Shared memory,
//   not registers, bounds this kernel's occupancy (one 512-thread block, or two 256-thread warp-path blocks of
//   <= 100 KiB, per SM), hence the explicit minimum blocks: without it ptxas held some instantiations to 64
//   registers and spilled.
template <typename T, typename W, int KIND, int NH, bool RES, bool WARP, int STAGES = WARP ? 3 : 2>
__global__ void __launch_bounds__(WARP ? 256 : 512, WARP ? 2 : 1) norm_fwd_stream(
    const T* __restrict__ x, const T* __restrict__ res, const W* __restrict__ w, const W* __restrict__ b,
    T* __restrict__ y, T* __restrict__ hout, float* __restrict__ mean_out, float* __restrict__ rstd_out,
    const i64 rows, const int hidden, const float eps, const int nvr, unsigned* __restrict__ ticket) {
  constexpr int VEC = Vec16<T>::N;
  static_assert(STAGES == 2 || STAGES == 3, "rows staged: the current one and one or two ahead");
  typedef Vec<T, VEC> V;
  extern __shared__ __align__(16) unsigned char dsmem[];
  V* ring = reinterpret_cast<V*>(dsmem);
  __shared__ Welford red_w[32];  // unused: kept so that the RMSNorm instantiations compile exactly as before
  __shared__ Sum1 red_s[32];
  const int G = WARP ? 32 : blockDim.x;
  const int t = WARP ? threadIdx.x & 31 : threadIdx.x;
  const int ROWS = WARP ? blockDim.x >> 5 : 1, grp = WARP ? threadIdx.x >> 5 : 0;
  const int body = hidden / VEC;
  const int per = RES ? 2 * nvr : nvr;  // slots per thread per stage
  // this thread's slot k of stage st: the 32-bit shared address base + (st * per + k) * kstride
  const uint32_t base = smem_u32(ring + threadIdx.x), kstride = blockDim.x * 16u;
  auto stage = [&](int st) { return base + (uint32_t)(st * per) * kstride; };
  const i64 step = (i64)gridDim.x * ROWS;
  if (KIND == RMS) b = nullptr;  // RMSNorm has no bias (rms_norm passes none)

  typedef Vec<W, VEC> P;  // the weights and bias of chunks k < NH, packed in W, for every row
  P wreg[NH > 0 ? NH : 1], breg[NH > 0 ? NH : 1];
#pragma unroll
  for (int k = 0; k < NH; ++k) {
    const int v = k * G + t;
    if (k < nvr && v < body) {
      if (w) wreg[k] = P::load(w + v * VEC);
      if (b) breg[k] = P::load(b + v * VEC);
    }
  }

  auto issue = [&](i64 row, int st) {  // this thread's vectors of `row` (and of its residual) into stage st
    if (row >= rows) return;
    const i64 off = row * (i64)hidden;
    const uint32_t s0 = stage(st);
    for (int k = 0; k < nvr; ++k) {
      const int v = k * G + t;
      if (v < body) {
        cp_async_l1_16(s0 + k * kstride, x + off + (i64)v * VEC, true);
        if (RES) cp_async_l1_16(s0 + (nvr + k) * kstride, res + off + (i64)v * VEC, true);
      }
    }
  };
  auto lds = [](uint32_t a) {
    V r;
    *reinterpret_cast<uint4*>(r.v) = lds_16(a);
    return r;
  };

  // ---- one row from stage address s0. This thread's vectors k * G + t of the row are those with k < kn (the
  // same in every row): the loops run to kn, with no test per vector (a test, its branch and the slot address it
  // recomputed cost about 1.5 instructions an element over the three passes)
  const int kn = min(nvr, max(0, (body - t + G - 1) / G));
  auto do_row = [&](const i64 row, const uint32_t s0) {
    const i64 off = row * (i64)hidden;
    // ---- statistics (and h = x + residual, stored to HBM and back into the x slot). The row is on chip, so
    // LayerNorm takes the exact two-pass formula: the sum, then the squared deviations from the mean over the
    // staged row again (Welford/Chan merges cost a division per vector; with bf16 rows of 32K the kernel ran at
    // 0.74 of copy where RMSNorm, one plain sum, ran at 0.88)
    float ss = 0.f;  // LayerNorm: the sum of h; RMSNorm: the sum of h^2
    const uint32_t r0 = s0 + nvr * kstride;  // RES: the residual's slots
#pragma unroll 4
    for (int k = 0; k < kn; ++k) {
      V a = lds(s0 + k * kstride);
      if (RES) {
        const V r = lds(r0 + k * kstride);
#pragma unroll
        for (int i = 0; i < VEC; ++i) a.v[i] = from_float<T>(to_float(a.v[i]) + to_float(r.v[i]));
        a.store(hout + off + (i64)(k * G + t) * VEC);
        sts_16(s0 + k * kstride, *reinterpret_cast<const uint4*>(a.v));
      }
      float f[VEC];
      to_floats(a, f);
      if (KIND == LAYER) {
#pragma unroll
        for (int i = 0; i < VEC; ++i) ss += f[i];
      } else {
#pragma unroll
        for (int i = 0; i < VEC; ++i) ss = fmaf(f[i], f[i], ss);
      }
    }
    float mu = 0.f, rstd;
    if (KIND == LAYER) {
      mu = (WARP ? warp_allreduce<32>(Sum1{ss}, Sum1Op()) : block_allreduce(Sum1{ss}, Sum1Op(), red_s)).a /
           (float)hidden;
      float q = 0.f;
#pragma unroll 4
      for (int k = 0; k < kn; ++k) {
        float f[VEC];
        to_floats(lds(s0 + k * kstride), f);
#pragma unroll
        for (int i = 0; i < VEC; ++i) { const float d = f[i] - mu; q = fmaf(d, d, q); }
      }
      q = (WARP ? warp_allreduce<32>(Sum1{q}, Sum1Op()) : block_allreduce(Sum1{q}, Sum1Op(), red_s)).a;
      rstd = rsqrtf(q / (float)hidden + eps);
    } else {
      const Sum1 s1 = WARP ? warp_allreduce<32>(Sum1{ss}, Sum1Op()) : block_allreduce(Sum1{ss}, Sum1Op(), red_s);
      rstd = rsqrtf(s1.a / (float)hidden + eps);
    }
    if (t == 0) {
      if (mean_out) mean_out[row] = mu;
      if (rstd_out) rstd_out[row] = rstd;
    }

    auto out = [&](const W* __restrict__ w, const W* __restrict__ b) {
      // ---- y = (h - mean) * rstd * w + b, from the staged row
      auto emit = [&](int k, const float (&wv)[VEC], const float (&bv)[VEC]) {
        float f[VEC];
        to_floats(lds(s0 + k * kstride), f);
        V o;
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
          const float r = (f[i] - mu) * rstd;
          o.v[i] = from_float<T>(w ? (b ? fmaf(r, wv[i], bv[i]) : r * wv[i]) : (b ? r + bv[i] : r));
        }
        o.store(y + off + (k * G + t) * VEC);
      };
#pragma unroll
      for (int k = 0; k < NH; ++k) {  // weights held in registers
        if (k < kn) {
          float wv[VEC], bv[VEC];
          if (w) to_floats(opaque(wreg[k]), wv);
          if (b) to_floats(opaque(breg[k]), bv);
          emit(k, wv, bv);
        }
      }
#pragma unroll 1  // at 2 or 4 the plain-LayerNorm copy of this loop spills 12-28 bytes
      for (int k = NH; k < kn; ++k) {  // weights loaded per row
        float wv[VEC], bv[VEC];
        if (w) load_params<W, VEC>(w, (k * G + t) * VEC, true, wv);
        if (b) load_params<W, VEC>(b, (k * G + t) * VEC, true, bv);
        emit(k, wv, bv);
      }
    };
    // Plain LayerNorm with weight and bias: its own copy of the output loop, as in norm_fwd (bfloat16 32K 0.855 ->
    // 0.883 of copy, float32 16K even, logs/norm_stream_split_ab_0abf0e2.json)
    if (KIND == LAYER && !RES && w && b) out(w, b);
    else out(w, b);
  };

  // The block's groups of ROWS rows: claimed from `ticket` in the order blocks ask (the SMs do not all stream at
  // the same rate, and with a fixed share per block the slowest SM finished last), or, without a ticket,
  // blockIdx.x + k * gridDim.x. q[0]: the group worked on; q[1..STAGES-1]: the groups staged ahead. A claim is
  // made a row before its group is staged (thread 0's atomic result is stored after the row's work, so its
  // latency is not waited on), and published by the barrier at the top of the next row.
  __shared__ i64 s_claim[2];
  i64 q[STAGES];
  int par = 0;
  if (ticket != nullptr) {
    if (threadIdx.x == 0) s_claim[0] = (i64)atomicAdd(ticket, (unsigned)(STAGES * ROWS));
    __syncthreads();
    const i64 g0 = s_claim[0];
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) q[s] = g0 + s * ROWS;
    if (threadIdx.x == 0) s_claim[1] = g0 + (STAGES - 1) * ROWS;  // the first row's claim ahead
    par = 1;
  } else {
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) q[s] = (i64)blockIdx.x * ROWS + s * step;
  }
  i64 k_next = STAGES - 1;
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    issue(q[s] + grp, s);
    cp_async_commit();
  }
  int st = 0;
  while (q[0] < rows) {  // block-uniform
    unsigned tk = 0;
    if (ticket != nullptr) {
      if (threadIdx.x == 0) tk = atomicAdd(ticket, (unsigned)ROWS);  // the claim for the next row's staging
      __syncthreads();                                               // publishes the previous row's claim
      q[STAGES - 1] = s_claim[par];
    } else {
      q[STAGES - 1] = (i64)blockIdx.x * ROWS + (k_next++) * step;
    }
    issue(q[STAGES - 1] + grp, (st + STAGES - 1) % STAGES);
    cp_async_commit();
    cp_async_wait<STAGES - 1>();  // this row's copies (this thread's) have landed
    if (q[0] + grp < rows) do_row(q[0] + grp, stage(st));
    if (ticket != nullptr) {
      par ^= 1;
      if (threadIdx.x == 0) s_claim[par] = (i64)tk;  // read after the next row's barrier
    }
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) q[s] = q[s + 1];
    st = (st + 1) % STAGES;
  }
  if (ticket != nullptr && threadIdx.x == 0) {  // the last block out resets the ticket for the next launch
    __threadfence();
    if (atomicAdd(ticket + 1, 1u) == gridDim.x - 1) {
      ticket[0] = 0;
      ticket[1] = 0;
    }
  }
  cp_async_wait<0>();
}

// ---------------------------------------------------------------------------------------------------------------
// Backward. With xhat = (x - mean) * rstd (RMSNorm: mean = 0) and g = dy * w:
//   LayerNorm  dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
//   RMSNorm    dx = rstd * (g - xhat * mean(g * xhat))
//   dw = sum over rows of dy * xhat,  db = sum over rows of dy.
// A block is ROWS groups of G threads, each group one row at a time (ROWS > 1 only when G == 32: a warp per
// row); rows go to groups in a fixed order. Every group accumulates its dw/db column partials in its own region
// (shared memory, or when `acc_global` its block's workspace row, ROWS == 1); at the end the block sums its
// groups in order and writes its partial row ws[blockIdx.x, :]. reduce_parts then sums over blocks.
// When every row starts aligned (hidden % VEC == 0) a thread owns the same columns in every row: for its first
// NH chunks the weights are loaded once and the dw/db partial sums stay in registers across the group's rows,
// written to the group's region once at the end (same float additions in the same order as the region would
// see) instead of a read-modify-write of shared memory per vector and row.
template <typename T, typename W, int KIND, int NV, int NH>
__global__ void __launch_bounds__(512) norm_bwd(
    const T* __restrict__ dy, const T* __restrict__ x, const W* __restrict__ w, const float* __restrict__ mean,
    const float* __restrict__ rstd, T* __restrict__ dx, float* __restrict__ ws_dw, float* __restrict__ ws_db,
    const i64 rows, const int hidden, const int nchunks, const int G, const int dw_global, const int db_global) {
  constexpr int VEC = Vec16<T>::N;
  static_assert(NH >= 0 && NH <= NV, "held chunks are register chunks");
  typedef Vec<T, VEC> V;
  extern __shared__ __align__(16) unsigned char dsmem[];
  __shared__ Sum2 red[32];
  const int ROWS = blockDim.x / G;
  const int t = threadIdx.x % G, grp = threadIdx.x / G;
  const bool acc_vec = hidden % VEC == 0;  // then every row starts aligned and each thread keeps its columns
  if (KIND == RMS) ws_db = nullptr;  // RMSNorm has no bias to differentiate (the wrapper passes none)
  const bool held = NH > 0 && acc_vec;
  typedef Vec<W, VEC> P;
  P wreg[NH > 0 ? NH : 1];
  float rdw[NH > 0 ? NH : 1][VEC], rdb[NH > 0 ? NH : 1][VEC];  // this thread's dw / db partial sums
  if (held) {
#pragma unroll
    for (int k = 0; k < NH; ++k) {
      const int v = k * G + t;
      if (w && v < hidden / VEC) wreg[k] = P::load(w + v * VEC);
#pragma unroll
      for (int i = 0; i < VEC; ++i) rdw[k][i] = rdb[k][i] = 0.f;
    }
  }
  // accumulator regions: shared memory [ROWS][hidden] per accumulated quantity, or the workspace row
  float* sm = reinterpret_cast<float*>(dsmem);
  float* adw = nullptr;
  float* adb = nullptr;
  if (ws_dw) {
    if (dw_global) adw = ws_dw + (i64)blockIdx.x * hidden;
    else { adw = sm + (i64)grp * hidden; sm += (i64)ROWS * hidden; }
  }
  if (ws_db) {
    if (db_global) adb = ws_db + (i64)blockIdx.x * hidden;
    else adb = sm + (i64)grp * hidden;
  }
  for (int c = t; c < hidden; c += G) {
    if (adw) adw[c] = 0.f;
    if (adb) adb[c] = 0.f;
  }
  __syncthreads();

  auto acc_add = [&](float* a, int col, const float (&v)[VEC]) {
    if (acc_vec) {
#pragma unroll
      for (int j = 0; j < VEC / 4; ++j) {
        float4* p = reinterpret_cast<float4*>(a + col + 4 * j);
        float4 q = *p;
        q.x += v[4 * j]; q.y += v[4 * j + 1]; q.z += v[4 * j + 2]; q.w += v[4 * j + 3];
        *p = q;
      }
    } else {
#pragma unroll
      for (int i = 0; i < VEC; ++i) a[col + i] += v[i];
    }
  };

  const i64 step = (i64)gridDim.x * ROWS;
  for (i64 row = (i64)blockIdx.x * ROWS + grp; row < rows; row += step) {
    const i64 off = row * (i64)hidden;
    const RowSplit rs = row_split<VEC>(off, hidden);
    const T* xr = x + off + rs.head;
    const T* dyr = dy + off + rs.head;
    T* dxr = dx + off + rs.head;
    const float mu = KIND == LAYER ? mean[row] : 0.f;
    const float r = rstd[row];
    const bool pvec = rs.head == 0;

    V xreg[NV], dreg[NV];
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int v = k * G + t;
      if (v < rs.body) { xreg[k] = V::load(xr + v * VEC); dreg[k] = V::load(dyr + v * VEC); }
    }

    // the weights of chunk k (body vector v) as floats: held in registers, or loaded
    auto weights = [&](int k, int v, float (&wv)[VEC]) {
      if (!w) return;
      if (held && k < NH) unpack<W, VEC>(opaque(wreg[k]), wv);
      else load_params<W, VEC>(w, rs.head + v * VEC, pvec, wv);
    };

    // ---- pass 1: row sums of g and g * xhat; column partials of dy * xhat and dy
    float s1 = 0.f, s2 = 0.f;
    auto pass1_vec = [&](const V& xa0, const V& da0, int k, int v) {
      const V xa = opaque(xa0), da = opaque(da0);  // recompute in pass 2 from the packed row, not keep floats
      const int col = rs.head + v * VEC;
      float wv[VEC], pdw[VEC], pdb[VEC];
      weights(k, v, wv);
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        const float xh = (to_float(xa.v[i]) - mu) * r;
        const float d = to_float(da.v[i]);
        const float g = w ? d * wv[i] : d;
        s1 += g;
        s2 = fmaf(g, xh, s2);
        // a rounded product, never fused into the accumulation (whether the compiler would contract it differs
        // by type): the same sums whether a chunk's partials live in registers or in the accumulator region
        pdw[i] = __fmul_rn(d, xh);
        pdb[i] = d;
      }
      if (held && k < NH) {
#pragma unroll
        for (int i = 0; i < VEC; ++i) { rdw[k][i] += pdw[i]; rdb[k][i] += pdb[i]; }
      } else {
        if (adw) acc_add(adw, col, pdw);
        if (adb) acc_add(adb, col, pdb);
      }
    };
    auto pass1_one = [&](int col) {
      const float xh = (to_float(x[off + col]) - mu) * r;
      const float d = to_float(dy[off + col]);
      const float g = w ? d * to_float(w[col]) : d;
      s1 += g;
      s2 = fmaf(g, xh, s2);
      if (adw) adw[col] += __fmul_rn(d, xh);  // as pass1_vec: the product rounded, then added
      if (adb) adb[col] += d;
    };
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int v = k * G + t;
      if (v < rs.body) pass1_vec(xreg[k], dreg[k], k, v);
      asm volatile("" ::: "memory");  // one chunk's weights and accumulators at a time (registers)
    }
#pragma unroll 4
    for (int k = NV; k < nchunks; ++k) {
      const int v = k * G + t;
      if (v < rs.body) pass1_vec(V::load(xr + v * VEC), V::load(dyr + v * VEC), NV, v);
    }
    const bool do_head = t < rs.head, do_tail = t < rs.tail;
    const int col_head = t, col_tail = rs.head + rs.body * VEC + t;
    if (do_head) pass1_one(col_head);
    if (do_tail) pass1_one(col_tail);

    Sum2 s{s1, s2};
    if (G == 32) s = warp_allreduce<32>(s, Sum2Op());
    else s = block_allreduce(s, Sum2Op(), red);
    const float c1 = KIND == LAYER ? s.a / (float)hidden : 0.f;
    const float c2 = s.b / (float)hidden;

    // ---- pass 2: dx
    auto pass2_vec = [&](const V& xa, const V& da, int k, int v) {
      float wv[VEC];
      weights(k, v, wv);
      V o;
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        const float xh = (to_float(xa.v[i]) - mu) * r;
        const float d = to_float(da.v[i]);
        const float g = w ? d * wv[i] : d;
        o.v[i] = from_float<T>(r * (g - c1 - xh * c2));
      }
      o.store(dxr + v * VEC);
    };
    auto pass2_one = [&](int col) {
      const float xh = (to_float(x[off + col]) - mu) * r;
      const float d = to_float(dy[off + col]);
      const float g = w ? d * to_float(w[col]) : d;
      dx[off + col] = from_float<T>(r * (g - c1 - xh * c2));
    };
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int v = k * G + t;
      if (v < rs.body) pass2_vec(xreg[k], dreg[k], k, v);
      asm volatile("" ::: "memory");
    }
#pragma unroll 4
    for (int k = NV; k < nchunks; ++k) {
      const int v = k * G + t;
      if (v < rs.body) pass2_vec(V::load(xr + v * VEC), V::load(dyr + v * VEC), NV, v);
    }
    if (do_head) pass2_one(col_head);
    if (do_tail) pass2_one(col_tail);
    // the next row may give a column to another thread of the group (odd hidden): order the accumulator updates
    if (!acc_vec) {
      if (G == 32) __syncwarp();
      else __syncthreads();
    }
  }

  // the register-held partial sums into this group's region (their columns were left at zero until now)
  if (held) {
#pragma unroll
    for (int k = 0; k < NH; ++k) {
      const int v = k * G + t;
      if (v < hidden / VEC) {
#pragma unroll
        for (int j = 0; j < VEC; j += 4) {
          const float *pw = rdw[k] + j, *pb = rdb[k] + j;
          if (adw) *reinterpret_cast<float4*>(adw + v * VEC + j) = make_float4(pw[0], pw[1], pw[2], pw[3]);
          if (adb) *reinterpret_cast<float4*>(adb + v * VEC + j) = make_float4(pb[0], pb[1], pb[2], pb[3]);
        }
      }
    }
  }

  // ---- the block's partial row: sum its groups' regions in order (shared memory), or already in place
  __syncthreads();
  const int nt = blockDim.x;
  if (ws_dw && !dw_global) {
    const float* a = reinterpret_cast<const float*>(dsmem);
    for (int c = threadIdx.x; c < hidden; c += nt) {
      float s = 0.f;
      for (int g = 0; g < ROWS; ++g) s += a[(i64)g * hidden + c];
      ws_dw[(i64)blockIdx.x * hidden + c] = s;
    }
  }
  if (ws_db && !db_global) {
    const float* a = reinterpret_cast<const float*>(dsmem) + (ws_dw && !dw_global ? (i64)ROWS * hidden : 0);
    for (int c = threadIdx.x; c < hidden; c += nt) {
      float s = 0.f;
      for (int g = 0; g < ROWS; ++g) s += a[(i64)g * hidden + c];
      ws_db[(i64)blockIdx.x * hidden + c] = s;
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Backward, streamed (rows of whole 16-byte vectors, 64 to 2048 of them: the wrapper's choice). norm_bwd holds a
// row's x and dy in registers, which caps the bytes in flight and serialises a row's loads with its sums and
// stores; here thread t of a row's G threads owns body vectors t, G + t, ... (VPT of them) and stages them for the
// next S - 1 rows in shared memory with cp.async, so later rows' loads overlap this row's work. Slot layout
// [stage][x|dy][k][thread]; a thread reads back only the slots it filled itself, so cp.async.wait_group alone
// orders them (no barrier). VPT = 2 (rows of up to 1024 vectors) keeps the row's vectors in registers between
// the two passes; VPT = 4 (1025..2048 vectors, 512 threads) reads them from the stage again in the second pass,
// which leaves the registers to the 4 * VEC dw and db partial sums (held in registers too, the probe's VPT = 4
// kernel spilled). The row's two sums: warp shuffles, then (G > 32) one barrier on a double-buffered
// array. ROWS = blockDim.x / G rows at a time per block; the block's loop is uniform (a group past the last row
// still joins the barrier). Persistent grid (gridDim.x = resident blocks, rows grid-stride in a fixed order): a
// thread's columns are the same in every row, so its weights and its dw/db partial sums stay in registers
// (2 * VPT * VEC floats) and are written once, to workspace row blockIdx.x * ROWS + group (reduce_parts sums
// them in a fixed order). Probe (experiments/scratch/lnb_probe.py, bf16 LayerNorm, H200): 0.86-0.905 of the
// copy bandwidth at hidden 1K-8K with 3 stages, against 0.57-0.65 for norm_bwd.
template <typename T, typename W, int KIND, int S, int VPT, int CL, bool LAG, int NB>
__device__ __forceinline__ void bwd_stream_body(
    const T* __restrict__ dy, const T* __restrict__ x, const W* __restrict__ w, const float* __restrict__ mean,
    const float* __restrict__ rstd, T* __restrict__ dx, float* __restrict__ ws_dw, float* __restrict__ ws_db,
    const i64 rows, const int hidden, const int G, const unsigned rank, const int unit, const int nunits,
    float2* xch, float2* stat, const unsigned mbar) {
  constexpr int VEC = Vec16<T>::N;
  constexpr bool REREAD = VPT > 2;  // the second pass reads the row from its stage again (not kept in registers)
  // weights wider than the data (float32 weights of a 16-bit row) at VPT = 4 would spill: read per use (L1)
  constexpr bool WREG = !(REREAD && sizeof(W) > sizeof(T));
  static_assert(S >= 2, "at least one row in flight ahead");
  typedef Vec<T, VEC> V;
  typedef Vec<W, VEC> P;
  extern __shared__ __align__(16) unsigned char dsmem[];
  V* ring = reinterpret_cast<V*>(dsmem);
  __shared__ float2 red[2][16];  // [parity][warp of the block] (blockDim.x <= 512)
  const int ROWS = blockDim.x / G, grp = threadIdx.x / G, tl = threadIdx.x % G;
  const int t = (CL > 1 ? (int)rank * (VPT * G) : 0) + tl;  // this thread's first vector; its k-th is t + k * G
  const int lane = threadIdx.x & 31, nw = G >> 5, w0 = grp * nw;  // G is a multiple of 32
  const int body = hidden / VEC;
  if (KIND == RMS) ws_db = nullptr;  // RMSNorm has no bias (the wrapper passes none)
  auto slot = [&](int st, int a, int k) { return ring + ((st * 2 + a) * VPT + k) * blockDim.x + threadIdx.x; };

  P wreg[WREG ? VPT : 1];
  float pdw[VPT][VEC], pdb[VPT][VEC];
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    if (WREG && w && k * G + t < body) wreg[k] = P::load(w + (k * G + t) * VEC);
#pragma unroll
    for (int i = 0; i < VEC; ++i) pdw[k][i] = pdb[k][i] = 0.f;
  }

  const i64 step = (i64)nunits * ROWS;
  auto issue = [&](i64 row, int st) {  // this thread's vectors of `row` into stage st (zeros past the end)
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int v = k * G + t;
      const bool p = row < rows && v < body;
      const i64 o = p ? row * (i64)hidden + (i64)v * VEC : 0;
      cp_async_16(smem_u32(slot(st, 0, k)), x + o, p);
      cp_async_16(smem_u32(slot(st, 1, k)), dy + o, p);
    }
    cp_async_commit();
  };
  const i64 first = (i64)unit * ROWS;  // the unit's first row base; group grp takes base + grp
#pragma unroll
  for (int s = 0; s < S - 1; ++s) issue(first + s * step + grp, s);
  float mu_n = 0.f, r_n = 0.f;  // the next row's statistics, loaded a row ahead
  if (first + grp < rows) {
    if (KIND == LAYER) mu_n = mean[first + grp];
    r_n = rstd[first + grp];
  }

  V xa[REREAD ? 1 : VPT], da[REREAD ? 1 : VPT];  // VPT = 2: the row's vectors, read from the stage once
  // ---- the row's sums of g and g * xhat (g = dy * w) over this thread's vectors (stage `cur`); dw, db partials
  auto pass1 = [&](int cur, bool live, float mu, float r, float& s1, float& s2) {
    s1 = s2 = 0.f;
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      if (live && k * G + t < body) {
        // recomputed in the second pass, not kept as floats
        const V xo = REREAD ? *slot(cur, 0, k) : opaque(xa[k]), dq = REREAD ? *slot(cur, 1, k) : opaque(da[k]);
        float wv[VEC];
        if (w) unpack<W, VEC>(WREG ? opaque(wreg[k]) : P::load(w + (k * G + t) * VEC), wv);
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
          const float xh = (to_float(xo.v[i]) - mu) * r;
          const float d = to_float(dq.v[i]);
          const float g = w ? d * wv[i] : d;
          s1 += g;
          s2 = fmaf(g, xh, s2);
          pdw[k][i] = fmaf(d, xh, pdw[k][i]);
          pdb[k][i] += d;
        }
      }
    }
  };
  // ---- the group's sums: warp shuffles, then (G > 32) one barrier on a double-buffered array (every lane)
  int par = 0;
  auto group_sum = [&](float& s1, float& s2) {
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) {
      s1 += __shfl_xor_sync(0xffffffffu, s1, m);
      s2 += __shfl_xor_sync(0xffffffffu, s2, m);
    }
    if (nw > 1) {  // the group's warp sums, summed by every warp in lanes then by butterfly (same in every lane)
      if (lane == 0) red[par][w0 + (tl >> 5)] = make_float2(s1, s2);
      __syncthreads();
      const float2 q = lane < nw ? red[par][w0 + lane] : make_float2(0.f, 0.f);
      s1 = q.x;
      s2 = q.y;
#pragma unroll
      for (int m = 16; m > 0; m >>= 1) {
        s1 += __shfl_xor_sync(0xffffffffu, s1, m);
        s2 += __shfl_xor_sync(0xffffffffu, s2, m);
      }
      par ^= 1;  // the next row writes the other half: no second barrier before this row's reads
    }
  };
  // ---- dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) from the row's sums s1, s2 of g and g * xhat
  auto pass2 = [&](int cur, i64 row, bool live, float mu, float r, float s1, float s2) {
    const float c1 = KIND == LAYER ? s1 / (float)hidden : 0.f;
    const float c2 = s2 / (float)hidden;
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int v = k * G + t;
      if (live && v < body) {
        const V xo = REREAD ? *slot(cur, 0, k) : opaque(xa[k]), dq = REREAD ? *slot(cur, 1, k) : opaque(da[k]);
        float wv[VEC];
        if (w) unpack<W, VEC>(WREG ? opaque(wreg[k]) : P::load(w + (k * G + t) * VEC), wv);
        V o;
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
          const float xh = (to_float(xo.v[i]) - mu) * r;
          const float d = to_float(dq.v[i]);
          const float g = w ? d * wv[i] : d;
          o.v[i] = from_float<T>(r * (g - c1 - xh * c2));
        }
        o.store(dx + row * (i64)hidden + (i64)v * VEC);
      }
    }
  };

  int st = 0;
  if constexpr (CL == 1) {
    for (i64 base = first; base < rows; base += step) {
      const i64 row = base + grp;
      const bool live = row < rows;
      const float mu = mu_n, r = r_n;
      if (row + step < rows) {
        if (KIND == LAYER) mu_n = mean[row + step];
        r_n = rstd[row + step];
      }
      cp_async_wait<S - 2>();  // this row's copies (this thread's) have landed
      const int cur = st;
      if (!REREAD) {
#pragma unroll
        for (int k = 0; k < VPT; ++k) { xa[k] = *slot(st, 0, k); da[k] = *slot(st, 1, k); }
      }
      issue(row + (S - 1) * step, st == 0 ? S - 1 : st - 1);  // into the stage read in the previous iteration
      st = st == S - 1 ? 0 : st + 1;
      float s1, s2;
      pass1(cur, live, mu, r, s1, s2);
      group_sum(s1, s2);
      pass2(cur, row, live, mu, r, s1, s2);
    }
  }
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
  if constexpr (CL > 1) {  // one row at a time (ROWS = 1, G = blockDim.x >= 64), the same rows in every block
    static_assert(REREAD, "the cluster kernel reads the row from its stage in both passes");
    // the cluster's row sums through buffer b of NB: this block's go to slot `rank` of every block's xch[b]
    // (thread 0 its own, with the row's statistics in stat[b], before its arrival: the mbarrier's release), thread
    // q to block q by st.async; receive waits for all of them and adds the CL slots in rank order (the same bits in
    // every block), and returns the row's statistics (held in shared memory, not in registers, across a pass)
    unsigned phase = 0;  // bit b: the parity of mbarrier b's current phase
    auto send = [&](int b, float s1, float s2, float mu, float r) {
      const unsigned mb = mbar + 8 * b;
      if (threadIdx.x == 0) {
        xch[b * CL + rank] = make_float2(s1, s2);
        stat[b] = make_float2(mu, r);
        mbar_arrive_expect_tx(mb, 8 * (CL - 1));
      }
      if (threadIdx.x < CL && threadIdx.x != rank)
        st_async_f2(cluster_map_u32(smem_u32(xch + b * CL + rank), threadIdx.x), make_float2(s1, s2),
                    cluster_map_u32(mb, threadIdx.x));
    };
    auto receive = [&](int b, float& s1, float& s2, float& mu, float& r) {
      mbar_wait_cluster(mbar + 8 * b, (phase >> b) & 1);
      phase ^= 1u << b;
      s1 = s2 = 0.f;
#pragma unroll
      for (int q = 0; q < CL; ++q) {
        const float2 v = xch[b * CL + q];
        s1 += v.x;
        s2 += v.y;
      }
      const float2 m = stat[b];
      mu = m.x;
      r = m.y;
    };
    int xb = 0;
    if constexpr (!LAG) {
      for (i64 row = first; row < rows; row += step) {
        const float mu = mu_n, r = r_n;
        if (row + step < rows) {
          if (KIND == LAYER) mu_n = mean[row + step];
          r_n = rstd[row + step];
        }
        cp_async_wait<S - 2>();
        const int cur = st;
        st = st == S - 1 ? 0 : st + 1;
        float s1, s2;
        pass1(cur, true, mu, r, s1, s2);
        group_sum(s1, s2);
        send(xb, s1, s2, mu, r);
        float mu2, r2;
        receive(xb, s1, s2, mu2, r2);
        pass2(cur, row, true, mu, r, s1, s2);
        issue(row + (S - 1) * step, cur == 0 ? S - 1 : cur - 1);  // into the previous row's stage (done with)
        xb = xb == NB - 1 ? 0 : xb + 1;
      }
    } else {  // row i's second pass after row i + 1's first: the peers' sums have had a whole pass to arrive
      for (i64 row = first;; row += step) {  // one more turn than rows: the last row's second pass
        const bool have = row < rows;
        const int cur = st;
        if (have) {
          const float mu = mu_n, r = r_n;
          if (row + step < rows) {
            if (KIND == LAYER) mu_n = mean[row + step];
            r_n = rstd[row + step];
          }
          cp_async_wait<S - 2>();
          st = st == S - 1 ? 0 : st + 1;
          float s1, s2;
          pass1(cur, true, mu, r, s1, s2);
          group_sum(s1, s2);
          send(xb, s1, s2, mu, r);
        }
        if (row != first) {  // the previous row: its stage is the one before cur
          float s1, s2, mu, r;
          receive(xb == 0 ? NB - 1 : xb - 1, s1, s2, mu, r);
          pass2(cur == 0 ? S - 1 : cur - 1, row - step, true, mu, r, s1, s2);
        }
        if (!have) break;
        issue(row + (S - 1) * step, cur == 0 ? S - 1 : cur - 1);  // into the previous row's stage (done with)
        xb = xb == NB - 1 ? 0 : xb + 1;
      }
    }
  }
#endif
  cp_async_wait<0>();

  // ---- this group's partial row (zeros for a group that had no row)
  const i64 p = (i64)unit * ROWS + grp;
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int v = k * G + t;
    if (v < body) {
#pragma unroll
      for (int j = 0; j < VEC; j += 4) {
        const float *a = pdw[k] + j, *b = pdb[k] + j;
        if (ws_dw) *reinterpret_cast<float4*>(ws_dw + p * hidden + v * VEC + j) = make_float4(a[0], a[1], a[2], a[3]);
        if (ws_db) *reinterpret_cast<float4*>(ws_db + p * hidden + v * VEC + j) = make_float4(b[0], b[1], b[2], b[3]);
      }
    }
  }
}

// One block per row group (gridDim.x = resident blocks); partial row blockIdx.x * ROWS + group.
template <typename T, typename W, int KIND, int S, int VPT, int MAXT, int MINB>
__global__ void __launch_bounds__(MAXT, MINB) norm_bwd_stream(
    const T* __restrict__ dy, const T* __restrict__ x, const W* __restrict__ w, const float* __restrict__ mean,
    const float* __restrict__ rstd, T* __restrict__ dx, float* __restrict__ ws_dw, float* __restrict__ ws_db,
    const i64 rows, const int hidden, const int G) {
  bwd_stream_body<T, W, KIND, S, VPT, 1, false, 0>(dy, x, w, mean, rstd, dx, ws_dw, ws_db, rows, hidden, G, 0,
                                                   blockIdx.x, gridDim.x, nullptr, nullptr, 0);
}

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
// A row over the CL blocks of a thread-block cluster (sm_90+), G = blockDim.x threads and VPT = 4 vectors a thread
// in each, block r owning vectors [r * 4G, (r + 1) * 4G); clusters take rows cluster-stride (persistent grid: as
// many clusters as can be resident at once); partial row = the cluster's index, each block writing its columns.
// The row's sums: each block's two sums go to every peer by st.async, counted by an mbarrier of the receiving
// block (8 bytes from each of the CL - 1 peers, plus its own thread 0's arrival), no cluster barrier per row.
// LAG: a row's second pass runs after the next row's first, so the wait for the peers' sums is a pass late and
// costs nothing (the ring's stage of the row is refilled only after it); without LAG each row waits for them.
// NB buffers (xch, mbarriers) by row: a peer sends row i's sums only after it has received this block's sums of
// row i - 1 (LAG: i - 2), which this block sends after the block barrier of that row — after every thread here
// is done with row i - 2 (LAG: i - 4) — so NB = 2 (LAG: 4) buffers never overwrite sums not yet read.
template <typename T, typename W, int KIND, int S, int CL, bool LAG>
__global__ void __cluster_dims__(CL, 1, 1) __launch_bounds__(512, 1) norm_bwd_cluster(
    const T* __restrict__ dy, const T* __restrict__ x, const W* __restrict__ w, const float* __restrict__ mean,
    const float* __restrict__ rstd, T* __restrict__ dx, float* __restrict__ ws_dw, float* __restrict__ ws_db,
    const i64 rows, const int hidden) {
  static_assert(CL == 2 || CL == 4 || CL == 8, "portable cluster sizes");
  constexpr int NB = LAG ? 4 : 2;
  __shared__ float2 xch[NB][CL], stat[NB];
  __shared__ __align__(8) unsigned long long mbar[NB];
  if (threadIdx.x == 0) {
#pragma unroll
    for (int b = 0; b < NB; ++b) mbar_init(smem_u32(&mbar[b]), 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  cluster_sync();  // every block's mbarriers are initialised before any peer signals them
  bwd_stream_body<T, W, KIND, S, 4, CL, LAG, NB>(dy, x, w, mean, rstd, dx, ws_dw, ws_db, rows, hidden, blockDim.x,
                                                 cluster_rank(), blockIdx.x / CL, gridDim.x / CL, &xch[0][0],
                                                 stat, smem_u32(&mbar[0]));
  cluster_sync();  // no block leaves while a peer's store into it may be in flight
}
#endif

// ---------------------------------------------------------------------------------------------------------------
// out[c] = sum over p of ws[p, c], in a fixed order: lane ty of a 32 x 32 block sums parts ty, ty + 32, ...,
// then row ty == 0 adds the 32 lane sums in order. Deterministic for a given (nparts, hidden).
template <typename O>
__global__ void __launch_bounds__(1024) reduce_parts(const float* __restrict__ ws, O* __restrict__ out,
                                                     const int nparts, const int hidden) {
  __shared__ float part[32][33];
  const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
  const int c = blockIdx.x * 32 + tx;
  float s = 0.f;
  if (c < hidden)
    for (int p = ty; p < nparts; p += 32) s += ws[(i64)p * hidden + c];
  part[ty][tx] = s;
  __syncthreads();
  if (ty == 0 && c < hidden) {
    float total = 0.f;
#pragma unroll 8
    for (int i = 0; i < 32; ++i) total += part[i][tx];
    out[c] = from_float<O>(total);
  }
}

}  // namespace cuflash
