// attention_fa1.cu — the FlashAttention-1 schedule (Dao et al. 2022, Algorithm 1), as a study kernel.
//
// K/V tiles are the OUTER loop and live on the host: one launch per outer step j. Inside a launch every block
// owns one Q tile i of one (batch, head): it loads Kj, Vj and Qi into shared memory, READS Oi, mi, li back from
// HBM (float32 buffers), updates them exactly as Algorithm 1 lines 9-13 (O kept normalised, line 12:
//   Oi <- diag(li_new)^-1 (diag(li) e^{mi - mi_new} Oi + e^{m~ij - mi_new} P~ij Vj)),
// and WRITES them back. So the HBM round trips of O, m, l per outer step are real and show in DRAM counters.
// On a tile's last visited step the block writes the output in the input dtype and lse = m + log(l) instead.
//
// Traffic per (batch, head) without masks: K, V read once (2 N d s); Q read Tc times (Tc N d s); O, m, l
// read and written Tc - 1 times (2 (Tc - 1) N (d + 2) 4): Theta(N^2 d / Bc) (the paper's Theorem 2).
//
// Math is SIMT float32 from shared memory (no tensor cores): this kernel teaches the schedule, not speed.
// Any head_dim <= 256 (runtime, loops over d); masks bottom-right aligned (query row r sits at key r + Sk - Sq);
// masked scores are -INFINITY and every exp(a - m) is guarded for m = -inf; rows that see no key give
// output 0 and lse -inf. GQA: query head h reads KV head h / group.
#include "cuflash/common.cuh"

using namespace cuflash;

#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif

namespace fa1 {

constexpr int NT = 256;  // threads per block

// Row stride (in floats) of a shared tile of width D: odd, so that threads walking rows are conflict-free.
__device__ __forceinline__ int smem_stride(int D) { return D | 1; }

template <typename T, int Br, int Bc>
__global__ void __launch_bounds__(NT) fa1_step(
    const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
    float* __restrict__ o_acc, float* __restrict__ m_buf, float* __restrict__ l_buf,   // (B, Hq, Sq[, D])
    T* __restrict__ out, float* __restrict__ lse,                                        // (B, Hq, Sq[, D])
    int heads_q, int group, int seqlen_q, int seqlen_k, int D,
    i64 q_sb, i64 q_sh, i64 q_ss, i64 k_sb, i64 k_sh, i64 k_ss, i64 v_sb, i64 v_sh, i64 v_ss,
    float scale, int win_left, int win_right, int j)
{
  extern __shared__ float smem[];
  const int ld = smem_stride(D);
  float* sQ = smem;                    // [Br][ld]
  float* sK = sQ + Br * ld;            // [Bc][ld]
  float* sV = sK + Bc * ld;            // [Bc][ld]
  float* sS = sV + Bc * ld;            // [Br][Bc + 1]  scores, then P~ij
  float* sAlpha = sS + Br * (Bc + 1);  // [Br] coefficient of the old O
  float* sBeta = sAlpha + Br;          // [Br] coefficient of P~ V
  const int lds = Bc + 1;

  const int bh = blockIdx.x;           // batch * heads_q + head
  const int b = bh / heads_q, h = bh % heads_q, hk = h / group;
  const int i = blockIdx.y;            // Q tile
  const int q0 = i * Br;
  const int q1 = min(q0 + Br, seqlen_q);
  const int tid = threadIdx.x;
  const int shift = seqlen_k - seqlen_q;

  // Keys [lo, hi) any row of this tile may see, and the K/V tiles [jlo, jhi) that hold them.
  int hi = win_right < 0 ? seqlen_k : min(seqlen_k, q1 - 1 + shift + win_right + 1);
  int lo = win_left < 0 ? 0 : max(0, q0 + shift - win_left);
  const i64 row0 = (i64)bh * seqlen_q;   // row index of (b, h, 0) in the (B, Hq, Sq) buffers
  if (hi <= lo) {                        // the whole tile sees no key: output 0, lse -inf, once
    if (j == 0) {
      for (int r = tid; r < q1 - q0; r += NT) lse[row0 + q0 + r] = -INFINITY;
      for (int e = tid; e < (q1 - q0) * D; e += NT)
        out[(row0 + q0 + e / D) * D + e % D] = from_float<T>(0.f);
    }
    return;
  }
  const int jlo = lo / Bc, jhi = (hi + Bc - 1) / Bc;
  if (j < jlo || j >= jhi) return;       // tile (i, j) fully masked: Oi, mi, li stay as they are in HBM
  const bool first = (j == jlo), last = (j == jhi - 1);
  const int k0 = j * Bc;

  // Load Qi, Kj, Vj (converted to float). Rows past the end are zero-filled (and masked below).
  const T* qp = q + (i64)b * q_sb + (i64)h * q_sh;
  const T* kp = k + (i64)b * k_sb + (i64)hk * k_sh;
  const T* vp = v + (i64)b * v_sb + (i64)hk * v_sh;
  for (int e = tid; e < Br * D; e += NT) {
    const int r = e / D, c = e % D;
    sQ[r * ld + c] = (q0 + r < seqlen_q) ? to_float(qp[(i64)(q0 + r) * q_ss + c]) : 0.f;
  }
  for (int e = tid; e < Bc * D; e += NT) {
    const int r = e / D, c = e % D;
    const bool in = k0 + r < seqlen_k;
    sK[r * ld + c] = in ? to_float(kp[(i64)(k0 + r) * k_ss + c]) : 0.f;
    sV[r * ld + c] = in ? to_float(vp[(i64)(k0 + r) * v_ss + c]) : 0.f;
  }
  __syncthreads();

  // S_ij = scale * Qi Kj^T, masked entries -inf (line 9).
  for (int e = tid; e < Br * Bc; e += NT) {
    const int r = e / Bc, c = e % Bc;
    const int qi = q0 + r, kj = k0 + c;
    bool ok = qi < seqlen_q && kj < seqlen_k;
    if (win_right >= 0) ok = ok && kj <= qi + shift + win_right;
    if (win_left >= 0) ok = ok && kj >= qi + shift - win_left;
    float acc = 0.f;
    if (ok) {
      const float* a = sQ + r * ld;
      const float* bb = sK + c * ld;
      for (int t = 0; t < D; ++t) acc = fmaf(a[t], bb[t], acc);
    }
    sS[r * lds + c] = ok ? acc * scale : -INFINITY;
  }
  __syncthreads();

  // Per row: m~ij = rowmax, P~ij = exp(S - m~ij), l~ij = rowsum (line 10); m_new, l_new (line 11).
  for (int r = tid; r < Br; r += NT) {
    const int qi = q0 + r;
    float* srow = sS + r * lds;
    float mt = -INFINITY;
    for (int c = 0; c < Bc; ++c) mt = fmaxf(mt, srow[c]);
    float lt = 0.f;
    for (int c = 0; c < Bc; ++c) {
      const float p = (srow[c] == -INFINITY) ? 0.f : expf(srow[c] - mt);
      srow[c] = p;
      lt += p;
    }
    float mi = -INFINITY, li = 0.f;
    if (!first && qi < seqlen_q) { mi = m_buf[row0 + qi]; li = l_buf[row0 + qi]; }
    const float mn = fmaxf(mi, mt);
    float alpha = 0.f, beta = 0.f, ln = 0.f;
    if (isnan(lt) || isnan(li)) {          // a NaN score in this tile or an earlier one: out and lse NaN, as
      alpha = beta = ln = lt + li;         // in the fused kernels (the tests below read NaN as an empty row)
    } else if (mn != -INFINITY) {
      const float ea = (mi == -INFINITY) ? 0.f : expf(mi - mn);
      const float eb = (mt == -INFINITY) ? 0.f : expf(mt - mn);
      ln = ea * li + eb * lt;
      if (ln > 0.f) { alpha = ea * li / ln; beta = eb / ln; }
    }
    sAlpha[r] = alpha;
    sBeta[r] = beta;
    if (qi < seqlen_q) {                   // line 13: write mi, li back (or the lse on the last step)
      if (last) lse[row0 + qi] = (ln > 0.f) ? mn + logf(ln) : isnan(ln) ? ln : -INFINITY;
      else { m_buf[row0 + qi] = mn; l_buf[row0 + qi] = ln; }
    }
  }
  __syncthreads();

  // Oi <- alpha * Oi + beta * P~ij Vj (line 12), read from and written back to HBM.
  const int rows = q1 - q0;
  for (int e = tid; e < rows * D; e += NT) {
    const int r = e / D, c = e % D;
    const float* prow = sS + r * lds;
    float pv = 0.f;
    for (int t = 0; t < Bc; ++t) pv = fmaf(prow[t], sV[t * ld + c], pv);
    const i64 g = (row0 + q0 + r) * D + c;
    const float old = first ? 0.f : o_acc[g];
    const float alpha = sAlpha[r];
    const float o = (alpha == 0.f ? 0.f : alpha * old) + sBeta[r] * pv;
    if (last) out[g] = from_float<T>(o);
    else o_acc[g] = o;
  }
}

}  // namespace fa1
