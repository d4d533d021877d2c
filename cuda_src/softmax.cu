// softmax.cu — row softmax, log_softmax, logsumexp and online-softmax state over rows of length n.
//
// A row is n contiguous elements; rows are ld elements apart (64-bit offsets, any ld). Every kernel keeps the
// online state (m, l) of cuflash/online_softmax.cuh per thread over several elements, merges it across the
// lanes of a warp by shuffles, across warps through shared memory, and across blocks through a workspace.
//
//   version 1, softmax_cached   ("online", one read): the row (or a chunk of it) is loaded once into registers,
//              16-byte vectors, G threads per row: G <= 32 is a warp or part of one (short rows, several rows
//              per block, no shared memory); G = THREADS is a block per row. Reads n, writes n.
//              With K > 1 chunks per row (a study path; version 3 is the default split) each block takes a
//              ticket, holds its chunk in registers, publishes its partial state to the workspace, waits until
//              the K partial states of its row are there, merges them (same order in every block) and writes
//              its chunk: still one read. Tickets are taken in the order blocks start, so a block waits only on
//              blocks that already run or on blocks that can start; with K <= the blocks that fit on the
//              GPU at once no wait can deadlock (the host checks K against the occupancy). Measured on the
//              H200: the waits cost ~30% (2.0-2.3 TB/s on long rows).
//   version 3, softmax_split ("online", long rows or few rows: one HBM read, software-pipelined): ticket t reduces
//              chunk t and publishes its state (phase 1), then normalises chunk t - D (phase 2): it waits until
//              the K states of that chunk's row are published, merges them, re-reads the chunk (from L2: it
//              was read only D tickets earlier) and writes it. A block waits only after publishing, and only
//              on chunks with smaller tickets (D >= K): no deadlock at any row length, no residency limit;
//              the wait is almost never felt because D spans a wave of blocks. Reads n from HBM (n more from
//              L2 while D chunks fit there), writes n.
//   version 2, softmax_partial + softmax_normalise / softmax_finalize  (any length, streaming):
//              stage 1 reduces chunks of rows to partial states in the workspace; stage 2 merges the K
//              partials of a row in every block and normalises (softmax: reads 2n, writes n) or writes lse /
//              the state (reads n). The "safe" method runs stage 1 twice (max, then sum of exp(x - max)) and
//              reads 3n; the "naive" method sums exp(x) with no max (overflows by design).
//   version 4, softmax_cluster ("online", long rows on sm_90+: one HBM read, no second read at all while a row
//              fits on chip): a row is split over the C blocks of a thread-block cluster (C = 2, 4, 8, 16, fixed at
//              compile time by __cluster_dims__, so an ordinary launch works; C = 1: a block per row, the row
//              in shared memory). Block r of the cluster takes the
//              r-th contiguous segment of the row: it copies the segment once into shared memory (bulk copies,
//              cp.async.bulk, or cp.async per thread, as the host picks for C; never read from L2 again, yet
//              marked evict-last at C <= 8, which measured faster there), reduces it to a state, and the C
//              block states are exchanged through distributed shared memory: every block sends its state into
//              a slot of every peer (st.async, completing on the peer's mbarrier), each block merges the C slots
//              in rank order once they are in (the same bits in every block), and writes its segment's output
//              from shared memory.
//              A segment longer than its hold (the host's CLUSTER_HOLD_BYTES, 64 KiB a block) streams its remainder
//              from global memory in the reduction and re-reads it (from L2, it was read moments earlier) in the
//              output phase. Clusters take rows cluster-stride when there are more rows than clusters.
//              Reads n, writes n.
//   version 5, softmax_hold ("online", rows of 2 MiB and more on sm_90: one HBM read, no L2 re-read): chunks of
//              the rows held in shared memory by a cooperative persistent grid, each written once the states of
//              its row are published (see the kernel). Reads n, writes n.
// Vector slots: a row starting h elements past a 16-byte boundary is read as aligned 16-byte slots from
// x_row - h; the first and last slots are read element by element (scalar head and tail), the others as one
// 16-byte load. Input and output rows share h (the host guarantees it or copies the input).
#include "cuflash/common.cuh"
#include "cuflash/reduce.cuh"
#include "cuflash/online_softmax.cuh"
#include "cuflash/cluster.cuh"
#include "cuflash/async_copy.cuh"

namespace cuflash {

enum { OP_SOFTMAX = 0, OP_LOG_SOFTMAX = 1, OP_LSE = 2, OP_STATE = 3 };
enum { MODE_ONLINE = 0, MODE_MAX = 1, MODE_SUMEXP = 2, MODE_NAIVE = 3 };

template <typename T> __device__ __forceinline__ T to_out(float a) { return from_float<T>(a); }
template <typename T> __device__ __forceinline__ T to_out(double a) { return from_double<T>(a); }

template <typename A, typename B> struct same_t { static constexpr bool value = false; };
template <typename A> struct same_t<A, A> { static constexpr bool value = true; };

// A 16-byte slot of VEC = 16 / sizeof(T) elements kept as four raw 32-bit words: 16-bit elements stay packed in
// pairs whichever way the slot was filled (one vector load, or element loads at a row's head and tail), so the
// register-cached row costs four registers per slot. (Element-wise copies of __nv_bfloat16 values would unpack
// them into one register each.)
template <typename T> struct alignas(16) Slot {
  static constexpr int VEC = 16 / sizeof(T);
  unsigned w[4];
  __device__ __forceinline__ static Slot load(const T* p) {
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    return {{u.x, u.y, u.z, u.w}};
  }
  // One 16-byte global store (explicit: from a plain uint4 store the compiler emitted four 32-bit STGs where the
  // words came from different branches of the output pass and sat in non-adjacent registers). STREAMING: .cs
  // (evict-first), for output that nothing reads soon, out of the way of L2 re-reads.
  template <bool STREAMING = false> __device__ __forceinline__ void store(T* p) const {
    if constexpr (STREAMING)
      asm volatile("st.global.cs.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "r"(w[0]), "r"(w[1]), "r"(w[2]),
                   "r"(w[3]) : "memory");
    else
      asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "r"(w[0]), "r"(w[1]), "r"(w[2]),
                   "r"(w[3]) : "memory");
  }
  __device__ __forceinline__ static Slot neg_inf() {  // -inf in every element (constant bits)
    const unsigned a = same_t<T, __half>::value ? 0xFC00FC00u : same_t<T, __nv_bfloat16>::value ? 0xFF80FF80u
                     : same_t<T, float>::value ? 0xFF800000u : 0u;
    const unsigned b = same_t<T, double>::value ? 0xFFF00000u : a;  // double: low word 0, high word 0xFFF00000
    return {{a, b, a, b}};
  }
  // element k (k a compile-time constant after unrolling) widened to the accumulator type
  __device__ __forceinline__ typename Acc<T>::type get(int k) const {
    if constexpr (same_t<T, float>::value) return __uint_as_float(w[k]);
    else if constexpr (same_t<T, double>::value) return __hiloint2double((int)w[2 * k + 1], (int)w[2 * k]);
    else if constexpr (same_t<T, __half>::value)
      return __half2float(__ushort_as_half((unsigned short)(w[k >> 1] >> (16 * (k & 1)))));
    else return __uint_as_float((k & 1) ? (w[k >> 1] & 0xFFFF0000u) : (w[k >> 1] << 16));
  }
  // set elements k and k + 1 (16-bit types: one word) from accumulator values
  template <typename A> __device__ __forceinline__ void put2(int k, A a, A b) {
    if constexpr (same_t<T, float>::value) { w[k] = __float_as_uint(a); w[k + 1] = __float_as_uint(b); }
    else if constexpr (same_t<T, double>::value) {
      w[2 * k] = (unsigned)__double2loint(a); w[2 * k + 1] = (unsigned)__double2hiint(a);
      w[2 * k + 2] = (unsigned)__double2loint(b); w[2 * k + 3] = (unsigned)__double2hiint(b);
    } else if constexpr (same_t<T, __half>::value)
      w[k >> 1] = (unsigned)__half_as_ushort(__float2half_rn(a)) |
                  ((unsigned)__half_as_ushort(__float2half_rn(b)) << 16);
    else
      w[k >> 1] = (unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(a)) |
                  ((unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(b)) << 16);
  }
  // raw bits of element k, as stored
  __device__ __forceinline__ unsigned long long bits(int k) const {
    if constexpr (sizeof(T) == 8) return ((unsigned long long)w[2 * k + 1] << 32) | w[2 * k];
    else if constexpr (sizeof(T) == 4) return w[k];
    else return (w[k >> 1] >> (16 * (k & 1))) & 0xFFFFu;
  }
};

// Elements before the row start inside its first 16-byte slot.
template <typename T> __device__ __forceinline__ int head_of(const T* row) {
  return (int)((reinterpret_cast<unsigned long long>(row) & 15ull) / sizeof(T));
}

// A chunk of a row as 16-byte slots: slot j holds elements base[j·VEC .. j·VEC + VEC); only offsets in [lo, hi)
// belong to the row (lo > 0 only for the head of chunk 0, hi < slots·VEC only at the row's tail).
// All offsets inside a chunk are 32-bit; the chunk's base is a 64-bit pointer.
struct ChunkRange {
  i64 first;  // element index (in the row) of the chunk's slot 0; negative by the head h for chunk 0
  int lo, hi, nslots;
};
template <int VEC>
__device__ __forceinline__ ChunkRange chunk_range(int h, i64 n, i64 v0, i64 max_slots) {
  const i64 nvec = (h + n + VEC - 1) / VEC;
  ChunkRange c;
  c.nslots = (int)max(min(nvec - v0, max_slots), (i64)0);
  c.first = v0 * VEC - h;
  c.lo = (int)max(-c.first, (i64)0);
  c.hi = (int)min(n - c.first, (i64)c.nslots * VEC);
  return c;
}

// L2 eviction policies for the split's two reads of a chunk: keep it (evict_last) until its re-read, which
// marks it evict_first.
__device__ __forceinline__ unsigned long long l2_policy(bool keep) {
  unsigned long long p;
  if (keep) asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
  else asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
  return p;
}
__device__ __forceinline__ uint4 load16_hint(const void* p, unsigned long long pol) {
  uint4 r;
  asm("ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p), "l"(pol));
  return r;
}

// Slot at element offset e of a chunk: one 16-byte load when it lies inside the row (with an L2 policy when
// HINT), else element loads (the scalar head and tail) padded with -inf.
template <typename T, bool HINT = false>
__device__ __forceinline__ Slot<T> load_slot(const T* base, int e, int lo, int hi, unsigned long long pol = 0) {
  constexpr int VEC = Slot<T>::VEC;
  if (e >= lo && e + VEC <= hi) {
    if (!HINT) return Slot<T>::load(base + e);
    const uint4 u = load16_hint(base + e, pol);
    return {{u.x, u.y, u.z, u.w}};
  }
  Slot<T> r = Slot<T>::neg_inf();
  if constexpr (sizeof(T) == 2) {
    const unsigned short* b = reinterpret_cast<const unsigned short*>(base);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int e0 = e + 2 * q, e1 = e0 + 1;
      const unsigned lo16 = (e0 >= lo && e0 < hi) ? (unsigned)b[e0] : (r.w[q] & 0xFFFFu);
      const unsigned hi16 = (e1 >= lo && e1 < hi) ? (unsigned)b[e1] : (r.w[q] >> 16);
      r.w[q] = lo16 | (hi16 << 16);
    }
  } else if constexpr (sizeof(T) == 4) {
    const unsigned* b = reinterpret_cast<const unsigned*>(base);
#pragma unroll
    for (int k = 0; k < 4; ++k)
      if (e + k >= lo && e + k < hi) r.w[k] = b[e + k];
  } else {
    const unsigned long long* b = reinterpret_cast<const unsigned long long*>(base);
#pragma unroll
    for (int k = 0; k < 2; ++k)
      if (e + k >= lo && e + k < hi) {
        const unsigned long long u = b[e + k];
        r.w[2 * k] = (unsigned)u;
        r.w[2 * k + 1] = (unsigned)(u >> 32);
      }
  }
  return r;
}

template <typename T, bool STREAMING = false>
__device__ __forceinline__ void store_slot(T* base, const Slot<T>& r, int e, int lo, int hi) {
  constexpr int VEC = Slot<T>::VEC;
  if (e >= lo && e + VEC <= hi) {
    r.template store<STREAMING>(base + e);
    return;
  }
#pragma unroll
  for (int k = 0; k < VEC; ++k) {
    if (e + k >= lo && e + k < hi) {
      if constexpr (sizeof(T) == 2) reinterpret_cast<unsigned short*>(base)[e + k] = (unsigned short)r.bits(k);
      else if constexpr (sizeof(T) == 4) reinterpret_cast<unsigned*>(base)[e + k] = (unsigned)r.bits(k);
      else reinterpret_cast<unsigned long long*>(base)[e + k] = r.bits(k);
    }
  }
}

// Max over a thread's slots (padding is -inf), NaN-propagating. 16-bit types compare packed pairs (exact).
template <typename T, int NV>
__device__ __forceinline__ typename Acc<T>::type thread_max(const Slot<T> (&buf)[NV]) {
  typedef typename Acc<T>::type A;
  if constexpr (sizeof(T) == 2) {
    unsigned m2 = buf[0].w[0];
#pragma unroll
    for (int i = 0; i < NV; ++i)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        if constexpr (same_t<T, __half>::value) asm("max.NaN.f16x2 %0, %1, %2;" : "=r"(m2) : "r"(m2), "r"(buf[i].w[q]));
        else asm("max.NaN.bf16x2 %0, %1, %2;" : "=r"(m2) : "r"(m2), "r"(buf[i].w[q]));
      }
    Slot<T> t;
    t.w[0] = m2;
    return nan_max(t.get(0), t.get(1));
  } else {
    A m = buf[0].get(0);
#pragma unroll
    for (int i = 0; i < NV; ++i)
#pragma unroll
      for (int k = 0; k < Slot<T>::VEC; ++k) m = nan_max(m, buf[i].get(k));
    return m;
  }
}

// exp(x - m) for every element x of a row with max m, in one FFMA and one MUFU.EX2: exp2(x·log2e − mc), mc the
// rounded m·log2e. Used for 16-bit inputs when |m| <= FAST_EXP_MAX_M (then m is finite). The rounding error
// r = m·log2e − mc (exact by an FMA; |r| <= 2^-14 at |m| = 1024) scales every exp of the row alike by 2^r, so
// a sum of them is multiplied by 2^-r once (the max element then still counts 1, to ex2.approx's 2^-22). The
// softmax output exp2(x·log2e − e2) (output_const) keeps its rounding of e2: <= 4.3e-5 relative at |m| = 1024,
// a tenth of a float16 half-ulp, a ninetieth of bfloat16's. Otherwise (float32: its own ulp is smaller; huge or
// infinite m) exp(x − m) with x = m = +inf counting 1.
// One instruction in three per element fewer: 16-bit rows are twice the elements per byte of float32 ones.
#define FAST_EXP_MAX_M 1024.0f
#define LOG2E_F 1.4426950408889634f
__device__ __forceinline__ float ex2_approx(float a) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(a));
  return r;
}
template <typename T, typename A> __device__ __forceinline__ bool fast_exp(A m) {
  if constexpr (sizeof(T) == 2) return fabsf(m) <= FAST_EXP_MAX_M;
  else return false;
}
// Sum of exp(x - m) over the elements of N slots (m the max they were reduced with, not -inf).
template <typename T, int N, typename A>
__device__ __forceinline__ A sum_exp(const Slot<T> (&buf)[N], A m, int valid = N) {
  A acc = 0;
  if (fast_exp<T>(m)) {
    const float mc = (float)m * LOG2E_F;
#pragma unroll
    for (int u = 0; u < N; ++u)
      if (u < valid)
#pragma unroll
        for (int k = 0; k < Slot<T>::VEC; ++k) acc += ex2_approx(fmaf((float)buf[u].get(k), LOG2E_F, -mc));
    acc *= ex2_approx(-fmaf((float)m, LOG2E_F, -mc));  // 2^-r: the sum of exp(x - m) itself
  } else {
#pragma unroll
    for (int u = 0; u < N; ++u)
      if (u < valid)
#pragma unroll
        for (int k = 0; k < Slot<T>::VEC; ++k) {
          const A x = buf[u].get(k);
          acc += exp_fast(x == m ? (A)0 : x - m);  // x = m = +inf counts 1
        }
  }
  return acc;
}

// Fold U slots (-inf padded) into a state: one max over all of them, one rescale of the running sum, then one
// exp per element (none when the running max is -inf).
template <typename T, int U, typename A>
__device__ __forceinline__ void accumulate(SoftmaxState<A>& s, const Slot<T> (&buf)[U], int mode, A m_row) {
  constexpr int VEC = Slot<T>::VEC;
  if (mode == MODE_NAIVE) {
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int k = 0; k < VEC; ++k) s.l += exp_fast(buf[u].get(k));
    return;
  }
  const A mv = thread_max(buf);
  if (mode == MODE_MAX) { s.m = nan_max(s.m, mv); return; }
  const A mn = mode == MODE_SUMEXP ? m_row : nan_max(s.m, mv);
  if (mn == -(A)INFINITY) return;  // everything so far is -inf: the state stays empty
  const A acc = sum_exp<T, U>(buf, mn);
  s.l = (mode == MODE_SUMEXP ? s.l : s.l * rescale(s.m, mn)) + acc;
  s.m = mn;
}

// What the output pass needs of the row's final state: m, and c = 1/l (softmax) or log(l) (log_softmax);
// fast: softmax of 16-bit input with |m| <= FAST_EXP_MAX_M, whose outputs are exp2(x·log2e − e2) with
// e2 = m·log2e + log2(l) (one FFMA and one MUFU.EX2 per element, the division folded into the exponent).
template <typename A> struct OutConst {
  int op;
  A m, c;
  bool fast;
  float e2;
};
template <typename T, typename A>
__device__ __forceinline__ OutConst<A> output_const(const SoftmaxState<A>& s, int op) {
  OutConst<A> o{op, s.m, op == OP_SOFTMAX ? softmax_scale(s) : log_acc(s.l), false, 0.0f};
  if (op == OP_SOFTMAX && fast_exp<T>(s.m)) {  // (then l >= 1: the max itself counts 1)
    o.fast = true;
    o.e2 = fmaf((float)s.m, LOG2E_F, __log2f((float)s.l));
  }
  return o;
}

// The output of a slot from the row's final state.
template <typename T, typename A>
__device__ __forceinline__ Slot<T> output_slot(const Slot<T>& r, const OutConst<A>& oc) {
  Slot<T> o;
  if (oc.fast) {
#pragma unroll
    for (int k = 0; k < Slot<T>::VEC; k += 2)
      o.put2(k, (A)ex2_approx(fmaf((float)r.get(k), LOG2E_F, -oc.e2)),
             (A)ex2_approx(fmaf((float)r.get(k + 1), LOG2E_F, -oc.e2)));
    return o;
  }
#pragma unroll
  for (int k = 0; k < Slot<T>::VEC; k += 2) {
    const A x0 = r.get(k), x1 = r.get(k + 1);
    if (oc.op == OP_SOFTMAX) o.put2(k, softmax_of(x0, oc.m, oc.c), softmax_of(x1, oc.m, oc.c));
    else o.put2(k, log_softmax_of(x0, oc.m, oc.c), log_softmax_of(x1, oc.m, oc.c));
  }
  return o;
}

// 16-bit T: calls f(c), c a copy of oc whose fast and op are compile-time constants in each of the three calls: one
// copy of the caller's output loop per case, in which output_slot's per-slot tests fold away (as norm.cu's output
// loops with the weight and bias known present, 20b5a00 / f788cba). 16-bit rows of 4K-1M columns +0.1-9 % of copy
// (logs/softmax_out_split_ab_d8618b0.json). Else f(oc). The cases are output_slot's: fast (set only with
// OP_SOFTMAX), softmax, and every other op as log_softmax (callers return before the output when op >= OP_LSE).
template <typename T, typename A, typename F>
__device__ __forceinline__ void with_output_const(const OutConst<A>& oc, F&& f) {
  if constexpr (sizeof(T) == 2) {
    OutConst<A> c = oc;
    if (oc.fast) {
      c.fast = true;
      c.op = OP_SOFTMAX;
      f(c);
    } else if (oc.op == OP_SOFTMAX) {
      c.fast = false;
      c.op = OP_SOFTMAX;
      f(c);
    } else {
      c.fast = false;
      c.op = OP_LOG_SOFTMAX;
      f(c);
    }
  } else {  // (no fast form; split, the float32 and float64 kernels spilled 16-88 bytes)
    f(oc);
  }
}

// Merge the K partial states of a row (ws[0..K)) with every thread of the block; every block that merges the
// same K states gets the same bits (fixed order). Partials are read through L2 (__ldcg): other blocks wrote them.
template <typename A>
__device__ __forceinline__ SoftmaxState<A> merge_partials(const SoftmaxState<A>* ws, int K, SoftmaxState<A>* smem) {
  SoftmaxState<A> s = SoftmaxState<A>::identity();
  for (int j = threadIdx.x; j < K; j += blockDim.x) {
    SoftmaxState<A> p;
    p.m = __ldcg(&ws[j].m);
    p.l = __ldcg(&ws[j].l);
    s = merge(s, p);
  }
  return block_allreduce(s, MergeOp(), smem);
}

// Per-row results of the reduction ops.
template <typename T, typename A>
__device__ __forceinline__ void write_row_result(int op, i64 row, const SoftmaxState<A>& s, T* y, A* out_m,
                                                 A* out_l) {
  if (op == OP_LSE) y[row] = to_out<T>(lse_of(s));
  else { out_m[row] = s.m; out_l[row] = s.l; }
}

// ---------------------------------------------------------------------------------------------------------
// version 1: the row held on chip.
//   G threads per row (G <= 32: THREADS / G rows per block; G == THREADS: one row or chunk per block),
//   NV slots of 16 bytes per thread: a group holds G·NV slots. K > 1: chunks of S slots, single read.
template <typename T, int G, int THREADS, int NV>
__global__ void __launch_bounds__(THREADS, (NV * THREADS > 4096 ? 1 : 1024 / THREADS))  // 64 registers (NV 16: 128)
softmax_cached(const T* __restrict__ x, i64 ldx, T* __restrict__ y, i64 ldy, i64 rows, i64 n, int op,
               typename Acc<T>::type* __restrict__ out_m, typename Acc<T>::type* __restrict__ out_l,
               int K, int S, int* __restrict__ counters, SoftmaxState<typename Acc<T>::type>* __restrict__ ws) {
  typedef typename Acc<T>::type A;
  typedef SoftmaxState<A> St;
  constexpr int VEC = Slot<T>::VEC;
  static_assert(G <= 32 || G == THREADS, "a group is part of a warp or the whole block");
  __shared__ St smem[32];
  __shared__ int s_ticket;

  CUFLASH_TL(0);
  const int t = G == THREADS ? threadIdx.x : threadIdx.x % G;  // thread within its row group
  i64 row, chunk = 0;
  if (K > 1) {  // take a ticket: chunks are handed out in the order blocks start
    if (threadIdx.x == 0) s_ticket = atomicAdd(counters, 1);
    __syncthreads();
    row = s_ticket / K;
    chunk = s_ticket % K;
  } else {
    row = (i64)blockIdx.x * (THREADS / G) + threadIdx.x / G;
  }
  const bool active = row < rows;
  const T* xr = x + (active ? row : 0) * ldx;
  const int h = head_of(xr);
  const ChunkRange c = chunk_range<VEC>(h, active ? n : 0, chunk * S, K > 1 ? (i64)S : (i64)G * NV);
  const T* xb = xr + c.first;

  Slot<T> buf[NV];  // the row (chunk), in registers; -inf past its end
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int j = t + i * G;
    buf[i] = j < c.nslots ? load_slot<T>(xb, j * VEC, c.lo, c.hi) : Slot<T>::neg_inf();
  }
  // thread state: the max, then one exp per element (none for padding slots, none when all is -inf)
  const A m = thread_max(buf);
  // (slots past the row's end are skipped: i < valid; the row fills a prefix of the i's)
  const A l = m != -(A)INFINITY ? sum_exp<T, NV>(buf, m, c.nslots > t ? (c.nslots - t + G - 1) / G : 0) : (A)0;
  St s{m, l};
  if (G <= 32) s = warp_allreduce<(G <= 32 ? G : 32)>(s, MergeOp());
  else s = block_allreduce(s, MergeOp(), smem);
  CUFLASH_TL(1);

  if (K > 1) {  // publish this chunk's state, wait for the row's K states, merge them
    if (threadIdx.x == 0) {
      __stcg(&ws[row * K + chunk].m, s.m);
      __stcg(&ws[row * K + chunk].l, s.l);
      __threadfence();
      atomicAdd(&counters[1 + row], 1);
      volatile int* done = counters + 1 + row;
      while (*done < K) __nanosleep(100);
      __threadfence();
    }
    __syncthreads();
    s = merge_partials(ws + row * K, K, smem);
  }
  if (!active) return;
  if (op >= OP_LSE) {
    if (t == 0 && chunk == 0) write_row_result(op, row, s, y, out_m, out_l);
    return;
  }
  const OutConst<A> oc0 = output_const<T>(s, op);
  T* yb = y + row * ldy + c.first;
  if constexpr (sizeof(T) == 2) {
    with_output_const<T>(oc0, [&](const OutConst<A>& oc) {
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        const int j = t + i * G;
        if (j < c.nslots) store_slot<T>(yb, output_slot<T>(buf[i], oc), j * VEC, c.lo, c.hi);
      }
    });
  } else {  // no lambda at all: one capturing buf made ptxas spill 64 bytes in the float64 kernel
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int j = t + i * G;
      if (j < c.nslots) store_slot<T>(yb, output_slot<T>(buf[i], oc0), j * VEC, c.lo, c.hi);
    }
  }
  CUFLASH_TL(2);
}

// ---------------------------------------------------------------------------------------------------------
// version 2: streaming. Block b takes chunk b % K (S slots) of row b / K. U slots in flight per thread.
template <typename T, int THREADS, int U>
__global__ void __launch_bounds__(THREADS, 1)
softmax_partial(const T* __restrict__ x, i64 ldx, i64 rows, i64 n, int K, i64 S, int mode,
                const SoftmaxState<typename Acc<T>::type>* __restrict__ prev,
                SoftmaxState<typename Acc<T>::type>* __restrict__ ws) {
  typedef typename Acc<T>::type A;
  typedef SoftmaxState<A> St;
  constexpr int VEC = Slot<T>::VEC;
  __shared__ St smem[32];
  const i64 row = blockIdx.x / K, chunk = blockIdx.x % K;
  const T* xr = x + row * ldx;
  const ChunkRange c = chunk_range<VEC>(head_of(xr), n, chunk * S, S);
  const T* xb = xr + c.first;
  const A m_row = mode == MODE_SUMEXP ? merge_partials(prev + row * K, K, smem).m : (A)0;
  St s = St::identity();
  if (mode == MODE_NAIVE) s.m = 0;
  for (int base = threadIdx.x; base < c.nslots; base += THREADS * U) {
    Slot<T> buf[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      buf[u] = base + u * THREADS < c.nslots ? load_slot<T>(xb, (base + u * THREADS) * VEC, c.lo, c.hi)
                                             : Slot<T>::neg_inf();
    accumulate<T, U>(s, buf, mode, m_row);
  }
  if (mode == MODE_SUMEXP) s.m = m_row;
  s = block_allreduce(s, MergeOp(), smem);
  if (threadIdx.x == 0) ws[row * K + chunk] = s;
}

template <typename T, int THREADS, int U>
__global__ void __launch_bounds__(THREADS, 1)
softmax_normalise(const T* __restrict__ x, i64 ldx, T* __restrict__ y, i64 ldy, i64 rows, i64 n, int K, i64 S,
                  int op, const SoftmaxState<typename Acc<T>::type>* __restrict__ ws) {
  typedef typename Acc<T>::type A;
  constexpr int VEC = Slot<T>::VEC;
  __shared__ SoftmaxState<A> smem[32];
  const i64 row = blockIdx.x / K, chunk = blockIdx.x % K;
  const T* xr = x + row * ldx;
  const ChunkRange c = chunk_range<VEC>(head_of(xr), n, chunk * S, S);
  const T* xb = xr + c.first;
  T* yb = y + row * ldy + c.first;
  const SoftmaxState<A> s = merge_partials(ws + row * K, K, smem);
  with_output_const<T>(output_const<T>(s, op), [&](const OutConst<A>& oc) {
    for (int base = threadIdx.x; base < c.nslots; base += THREADS * U) {
      Slot<T> buf[U];
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (base + u * THREADS < c.nslots) buf[u] = load_slot<T>(xb, (base + u * THREADS) * VEC, c.lo, c.hi);
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (base + u * THREADS < c.nslots)
          store_slot<T>(yb, output_slot<T>(buf[u], oc), (base + u * THREADS) * VEC, c.lo, c.hi);
    }
  });
}

// ---------------------------------------------------------------------------------------------------------
// version 3: the software-pipelined split (float accumulators). ws: rows·K 64-bit words, zero before the
// launch; a published state is (m, l) packed in one word, never 0 (l = 0 only with m = -inf), so the word is
// both the data and its ready flag: one store publishes, no fence or counter. counters[0]: the ticket.
__device__ __forceinline__ unsigned long long pack_state(const SoftmaxState<float>& s) {
  return ((unsigned long long)__float_as_uint(s.l) << 32) | __float_as_uint(s.m);
}

template <typename T, int THREADS, int U>
__global__ void __launch_bounds__(THREADS, (sizeof(T) == 2 ? 768 : 1024) / THREADS)  // 64 (16-bit: 85) registers
softmax_split(const T* __restrict__ x, i64 ldx, T* __restrict__ y, i64 ldy, i64 rows, i64 n, int op, int K, i64 S,
              i64 D, unsigned long long* __restrict__ ws, int* __restrict__ counters) {
  typedef float A;
  typedef SoftmaxState<A> St;
  constexpr int VEC = Slot<T>::VEC;
  __shared__ St smem[32];
  __shared__ i64 s_ticket;
  if (threadIdx.x == 0) s_ticket = atomicAdd(reinterpret_cast<unsigned long long*>(counters), 1ull);
  __syncthreads();
  const i64 t = s_ticket, T_total = rows * K;
  if (t < T_total) {  // phase 1: reduce chunk t, publish its state
    const i64 row = t / K, chunk = t % K;
    const T* xr = x + row * ldx;
    const ChunkRange c = chunk_range<VEC>(head_of(xr), n, chunk * S, S);
    const T* xb = xr + c.first;
    St s = St::identity();
    const unsigned long long keep = l2_policy(true);
    for (int base = threadIdx.x; base < c.nslots; base += THREADS * U) {
      Slot<T> buf[U];
#pragma unroll
      for (int u = 0; u < U; ++u)
        buf[u] = base + u * THREADS < c.nslots ? load_slot<T, true>(xb, (base + u * THREADS) * VEC, c.lo, c.hi, keep)
                                               : Slot<T>::neg_inf();
      accumulate<T, U>(s, buf, MODE_ONLINE, (A)0);
    }
    s = block_allreduce(s, MergeOp(), smem);
    if (threadIdx.x == 0) *reinterpret_cast<volatile unsigned long long*>(&ws[t]) = pack_state(s);
  }
  const i64 t2 = t - D;
  if (t2 < 0 || t2 >= T_total) return;
  // phase 2: normalise chunk t2 once its row's K states are all published
  const i64 row = t2 / K, chunk = t2 % K;
  St s = St::identity();
  for (int j = threadIdx.x; j < K; j += THREADS) {
    const volatile unsigned long long* p = &ws[row * K + j];
    unsigned long long v;
    while ((v = *p) == 0ull) __nanosleep(64);
    s = merge(s, St{__uint_as_float((unsigned)v), __uint_as_float((unsigned)(v >> 32))});
  }
  s = block_allreduce(s, MergeOp(), smem);
  const OutConst<A> oc0 = output_const<T>(s, op);
  const T* xr = x + row * ldx;
  const ChunkRange c = chunk_range<VEC>(head_of(xr), n, chunk * S, S);
  const T* xb = xr + c.first;
  T* yb = y + row * ldy + c.first;
  const unsigned long long drop = l2_policy(false);
  with_output_const<T>(oc0, [&](const OutConst<A>& oc) {
    for (int base = threadIdx.x; base < c.nslots; base += THREADS * U) {
      Slot<T> buf[U];
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (base + u * THREADS < c.nslots)
          buf[u] = load_slot<T, true>(xb, (base + u * THREADS) * VEC, c.lo, c.hi, drop);
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (base + u * THREADS < c.nslots)
          store_slot<T, true>(yb, output_slot<T>(buf[u], oc), (base + u * THREADS) * VEC, c.lo, c.hi);
    }
  });
}

// One warp per row merges the row's K partial states and writes lse (in T) or the state.
template <typename T>
__global__ void softmax_finalize(i64 rows, int K, int op, const SoftmaxState<typename Acc<T>::type>* __restrict__ ws,
                                 T* __restrict__ y, typename Acc<T>::type* __restrict__ out_m,
                                 typename Acc<T>::type* __restrict__ out_l) {
  typedef typename Acc<T>::type A;
  const i64 row = ((i64)blockIdx.x * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;  // whole warps leave together
  SoftmaxState<A> s = SoftmaxState<A>::identity();
  for (int j = lane; j < K; j += 32) s = merge(s, ws[row * K + j]);
  s = warp_allreduce<32>(s, MergeOp());
  if (lane == 0) write_row_result(op, row, s, y, out_m, out_l);
}

// ---------------------------------------------------------------------------------------------------------
// version 4: the cluster split (sm_90+). Compiled only for sm_90 and newer: thread-block clusters and
// distributed shared memory do not exist before Hopper (the host declares these names for sm_90 only).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900

// The cluster primitives (cluster_rank, cluster_send_f2, mbar_wait_cluster, ...): cuflash/cluster.cuh.

// cp.async of one 16-byte slot with an L2 eviction policy: cuflash/async_copy.cuh's cp_async_slot. The copies a
// thread issues become visible to that thread after cp.async.wait_group: in the cluster kernel's cp.async variant
// each thread reads back only the slots it copied itself, so no block barrier guards the segment (the bulk
// variant's thread 0 copies for all: a barrier a row).
// Wait until at most `pending` (0..3; a constant after unrolling) of this thread's committed groups are in flight.
__device__ __forceinline__ void cp_async_wait_pending(int pending) {
  if (pending <= 0) cp_async_wait<0>();
  else if (pending == 1) cp_async_wait<1>();
  else if (pending == 2) cp_async_wait<2>();
  else cp_async_wait<3>();
}

// One bulk copy (sm_90) of `bytes` (a multiple of 16, 16-byte aligned both sides) from global to this block's
// shared memory, completing on the mbarrier at `mbar` (its expected transaction bytes raised beforehand).
__device__ __forceinline__ void bulk_copy_g2s(unsigned smem, const void* gmem, unsigned bytes, unsigned mbar,
                                              unsigned long long pol) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, "
               "[%3], %4;\n" ::"r"(smem), "l"(gmem), "r"(bytes), "r"(mbar), "l"(pol) : "memory");
}

// Thread 0 asks L2 for the whole 16-byte slots [a, b) of a segment based at xb (16-byte aligned): one bulk
// prefetch (sm_90), a hint that costs no registers and keeps HBM busy ahead of the register-limited loads.
template <typename T>
__device__ __forceinline__ void prefetch_slots_l2(const T* xb, int a, int b, unsigned long long pol) {
  if (threadIdx.x == 0 && b > a)
    asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;\n" ::"l"(xb + (i64)a * Slot<T>::VEC),
                 "r"((unsigned)(b - a) * 16u), "l"(pol) : "memory");
}

// Held slot j of a segment (its row's head or tail slot) loaded element by element, −inf padded, into shared memory.
template <typename T>
__device__ __forceinline__ void stage_slot(uint4* held_raw, int j, const T* xb, const ChunkRange& c) {
  const Slot<T> r = load_slot<T>(xb, j * Slot<T>::VEC, c.lo, c.hi);
  held_raw[j] = make_uint4(r.w[0], r.w[1], r.w[2], r.w[3]);
}

// The block's state of a row from its threads' states, in every thread with the same bits: the max M by a
// butterfly of maxima (exact), then each thread's l scaled to M once, l·e^(m−M) (rescale: expf, the edge cases of
// merge), summed by a butterfly of additions (commutative: every lane gets the same bits) and over the warps in
// warp order. The same value as a tree of merges, which costs two expf per level (ten levels for 256 threads:
// ~380 instructions a thread a row, against ~110 here, when a thread holds only 64-128 elements of the row).
// red: [2][THREADS / 32] floats; two block barriers. Row to row, none is needed before the first write: a thread
// writes red[0] of the next row only after the second barrier of this one, which every thread reaches after its
// reads of red[0]; it writes red[1] after the next row's first barrier, after every thread's reads of red[1].
template <int THREADS>
__device__ __forceinline__ SoftmaxState<float> block_state(SoftmaxState<float> s, float (*red)[THREADS / 32]) {
  constexpr int NW = THREADS / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float m = s.m;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = nan_max(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (lane == 0) red[0][warp] = m;
  __syncthreads();
  m = red[0][0];
#pragma unroll
  for (int w = 1; w < NW; ++w) m = nan_max(m, red[0][w]);
  float l = __fmul_rn(s.l, rescale(s.m, m));  // not contracted into the first addition (lanes would differ)
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
  if (lane == 0) red[1][warp] = l;
  __syncthreads();
  l = red[1][0];
#pragma unroll
  for (int w = 1; w < NW; ++w) l += red[1][w];
  return {m, l};
}

// softmax_cluster<T, THREADS, C, BULK>: C blocks (a cluster; C = 1: one block, no exchange) per row, rows
// cluster-stride; BULK: how the held part is copied (bulk copies by thread 0, or cp.async by every thread; the
// host picks per cluster size, as measured on the H200). seg: slots per block segment (the host picks
// ceil(row slots / C)); hold: slots of a segment held in shared memory (the dynamic shared memory is hold x 16
// bytes; the lse/state ops pass 0 and stream). Float accumulators (16- and 32-bit inputs).
//
// The schedule of one row, in block r (rank r of the cluster), thread t:
//   1. copy: thread t folds the held slots j = t + k·THREADS (k < ceil(held / THREADS)), in P = 4 groups of
//      consecutive k (group p: slots [p·kq·THREADS, (p+1)·kq·THREADS)). BULK: thread 0 copies each group's whole
//      slots by one bulk copy (cp.async.bulk, completing on the mbarrier cbar[p]) once every thread is past the
//      previous row; else thread t issues cp.async for its own slots, a commit group per p (no barrier: it reads
//      back only what it copied). The head and tail slots of an unaligned row are loaded element by element
//      (−inf padded) by the thread that folds them;
//   2. stream: the segment's slots past `hold` (only for rows longer than C·hold slots) are read with 16-byte
//      loads (evict-last: they are read again in step 5), PF slots behind a bulk L2 prefetch that thread 0
//      keeps ahead of them, and folded into the thread's state while the copies fly;
//   3. reduce: wait for group p (BULK: cbar[p], phase parity of the row counter; else cp.async.wait_group),
//      fold its slots into the state, p = 0..3 (the later groups keep arriving); then the block's state
//      (block_state, the same bits everywhere);
//   4. exchange (C > 1): warp 0 sends the block state to slot r of every block's `xch[parity]` (lane 0 its own
//      slot and its arrival on the local mbarrier, lane q to block q by st.async, completing on block q's
//      mbarrier); each block waits on its own mbarrier (no cluster-wide barrier per row) and merges
//      xch[parity][0..C) in rank order: the same state, bit for bit, in every block of the cluster. xch and the
//      mbarriers are double-buffered by row parity: a peer sends row i + 2's state only after it has received
//      this block's state of row i + 1, which this block sends after it has read the slots of row i.
//   5. output: the streamed slots first (re-read from L2, evict-first, prefetched again in case L2 lost them),
//      then the held slots from shared memory;
//      16-byte streaming stores (scalar at the head and tail). lse/state: rank 0 writes the row's result.
// Before its first st.async a block waits for the arrive every block makes at its start, once its mbarriers are
// initialised (peers' shared memory exists only once they run); once a block has the states of its last row
// no peer writes to it again, so blocks may exit.
template <typename T, int THREADS, int C, bool BULK>
__global__ void __cluster_dims__(C, 1, 1) __launch_bounds__(THREADS, 1024 / THREADS)  // 64 registers (4 blocks of 256)
softmax_cluster(const T* __restrict__ x, i64 ldx, T* __restrict__ y, i64 ldy, i64 rows, i64 n, int op,
                float* __restrict__ out_m, float* __restrict__ out_l, i64 seg, int hold) {
  typedef float A;
  typedef SoftmaxState<A> St;
  constexpr int VEC = Slot<T>::VEC;
  constexpr int P = 4;   // copy groups per row: the reduction starts on the first quarter
  constexpr int UH = 4;  // held slots folded per step (from shared memory)
  constexpr int US = 4;  // streamed slots in flight per thread (from L2, prefetched)
  constexpr int STEP = THREADS * US, PF = 8 * STEP;  // slots per streaming step; prefetch distance (128 KiB)
  static_assert(sizeof(T) <= 4, "float accumulators: 16- and 32-bit inputs");
  static_assert(C == 1 || C == 2 || C == 4 || C == 8 || C == 16,
                "one block, a portable cluster size, or 16 (non-portable: the host allows it on the function)");
  extern __shared__ uint4 held_raw[];  // hold slots of the segment
  Slot<T>* held = reinterpret_cast<Slot<T>*>(held_raw);
  __shared__ float red[2][THREADS / 32];
  __shared__ float2 xch[2][C];                        // the C block states (m, l) of a row, by row parity
  __shared__ __align__(8) unsigned long long mbar[2];  // ... and the mbarriers their st.async complete on
  __shared__ __align__(8) unsigned long long cbar[BULK ? P : 1];  // BULK: the P bulk copies complete on these

  const unsigned rank = C > 1 ? cluster_rank() : 0;
  CUFLASH_TL(0);
  const i64 nclusters = gridDim.x / C;
  const unsigned long long keep = l2_policy(true), drop = l2_policy(false);
  // the held copies' L2 policy: evict_last at C <= 8, evict_first at 16 (H200, README #3: with evict_first the
  // first launches on new input ran 3-5 % slower at C = 2-8, and C = 2 and 4 ran 0.7-1.5 % slower after; at C = 16,
  // where 2 MiB rows also stream, evict_last measured -0.5 %)
  const unsigned long long hold_pol = C <= 8 ? keep : drop;
  if (threadIdx.x == 0 && (BULK || C > 1)) {
    if constexpr (BULK)
      for (int p = 0; p < P; ++p) mbar_init(smem_u32(&cbar[p]), 1);
    if constexpr (C > 1) {
      mbar_init(smem_u32(&mbar[0]), 1);
      mbar_init(smem_u32(&mbar[1]), 1);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  if constexpr (C > 1) cluster_arrive_relaxed();  // "this block runs, its mbarriers are set" (before st.async)
  bool waited = false;
  i64 it = 0;  // rows this cluster has taken
  for (i64 row = blockIdx.x / C; row < rows; row += nclusters, ++it) {
    const T* xr = x + row * ldx;
    const ChunkRange c = chunk_range<VEC>(head_of(xr), n, (i64)rank * seg, seg);
    const T* xb = xr + c.first;
    const int nh = min(c.nslots, hold);           // held slots of this segment
    const int kmax = (nh + THREADS - 1) / THREADS;  // held slots per thread (at most)
    const int kq = (kmax + P - 1) / P;              // ... per commit group

    // 1. copy the held slots (P groups: group p holds slots [p·kq·THREADS, (p+1)·kq·THREADS))
    if constexpr (BULK) {
      // thread 0: a bulk copy of each group's whole slots, completing on cbar[p], once every thread is past the
      // previous row's reads of `held`; the head and tail slots of an unaligned row (at most slot 0 and the last)
      // are loaded element by element (−inf padded) by the thread that folds them
      if (it > 0) {  // every thread is past the previous row's reads of `held` (and its generic accesses are
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // ordered before the async proxy's writes)
        __syncthreads();
      }
      const int w0 = c.lo > 0 ? 1 : 0, w1 = min(c.hi / VEC, nh);  // the whole slots [w0, w1) of the held part
      if (threadIdx.x == 0) {
#pragma unroll
        for (int p = 0; p < P; ++p) {
          const int a = max(p * kq * THREADS, w0), b = min((p + 1) * kq * THREADS, w1);
          const unsigned bytes = b > a ? (unsigned)(b - a) * 16u : 0u, mb = smem_u32(&cbar[p]);
          mbar_arrive_expect_tx(mb, bytes);
          if (bytes) bulk_copy_g2s(smem_u32(&held[a]), xb + (i64)a * VEC, bytes, mb, hold_pol);
        }
      }
      const int jt = max(w1, w0);  // the partial last slot of the held part, if jt < nh (then jt = nh − 1)
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const int j = q == 0 ? 0 : jt;
        if ((q == 0 ? w0 > 0 && nh > 0 : jt < nh) && threadIdx.x == j % THREADS) {
          stage_slot(held_raw, j, xb, c);
        }
      }
    } else {  // thread t: cp.async of its own slots, a commit group per p
#pragma unroll
      for (int p = 0; p < P; ++p) {
        const int k1 = min((p + 1) * kq, kmax);
        for (int k = p * kq; k < k1; ++k) {
          const int j = threadIdx.x + k * THREADS, e = j * VEC;
          if (j >= nh) break;
          if (e >= c.lo && e + VEC <= c.hi) cp_async_slot(&held[j], xb + e, hold_pol);
          else {  // head or tail slot: element loads, -inf padded
            stage_slot(held_raw, j, xb, c);
          }
        }
        cp_async_commit();
      }
    }

    // 2. stream the slots past the held part (rows longer than the cluster's shared memory), PF slots of
    //    bulk L2 prefetch ahead of the loads
    const int pf0 = max(nh, c.lo > 0 ? 1 : 0), pf1 = min(c.nslots, c.hi / VEC);  // whole slots, past the held
    for (int a = pf0; a < min(nh + PF, pf1); a += STEP) prefetch_slots_l2(xb, a, min(a + STEP, pf1), keep);
    St s = St::identity();
    for (int base0 = nh; base0 < c.nslots; base0 += STEP) {
      prefetch_slots_l2(xb, base0 + PF, min(base0 + PF + STEP, pf1), keep);
      const int base = base0 + threadIdx.x;
      Slot<T> buf[US];
#pragma unroll
      for (int u = 0; u < US; ++u)
        buf[u] = base + u * THREADS < c.nslots ? load_slot<T, true>(xb, (base + u * THREADS) * VEC, c.lo, c.hi, keep)
                                               : Slot<T>::neg_inf();
      accumulate<T, US>(s, buf, MODE_ONLINE, (A)0);
    }

    // 3. fold the held slots in as their groups land, then the block's state
    if (BULK && it == 0) __syncthreads();  // the mbarriers' initialisation, before any thread waits on them
#pragma unroll
    for (int p = 0; p < P; ++p) {
      if constexpr (BULK) mbar_wait(smem_u32(&cbar[p]), (unsigned)(it & 1));
      else cp_async_wait_pending(P - 1 - p);
      const int k1 = min((p + 1) * kq, kmax);
      for (int k = p * kq; k < k1; k += UH) {
        Slot<T> buf[UH];
#pragma unroll
        for (int u = 0; u < UH; ++u) {
          const int j = threadIdx.x + (k + u) * THREADS;
          buf[u] = (k + u < k1 && j < nh) ? Slot<T>::load(reinterpret_cast<const T*>(&held[j])) : Slot<T>::neg_inf();
        }
        accumulate<T, UH>(s, buf, MODE_ONLINE, (A)0);
      }
    }
    s = block_state<THREADS>(s, red);  // the same bits in every thread (thread q's copy goes to block q)

    // 4. exchange the C block states through distributed shared memory; merge them in rank order (C > 1)
    if constexpr (C > 1) {
      if (!waited) {
        cluster_wait();  // every block of the cluster has started
        waited = true;
      }
      const int parity = (int)(it & 1);
      const unsigned mb = smem_u32(&mbar[parity]);
      if (threadIdx.x < 32) cluster_send_f2<C>(make_float2(s.m, s.l), xch[parity], rank, mb);
      mbar_wait_cluster(mb, (unsigned)(it >> 1) & 1u);
      s = St{xch[parity][0].x, xch[parity][0].y};
#pragma unroll
      for (int q = 1; q < C; ++q) s = merge(s, St{xch[parity][q].x, xch[parity][q].y});
    }

    if (it == 0) CUFLASH_TL(1);
    if (op >= OP_LSE) {
      if (rank == 0 && threadIdx.x == 0) write_row_result(op, row, s, y, out_m, out_l);
      continue;
    }
    // 5. output: streamed slots (from L2), then held slots (from shared memory)
    T* yb = y + row * ldy + c.first;
    for (int a = pf0; a < min(nh + PF, pf1); a += STEP) prefetch_slots_l2(xb, a, min(a + STEP, pf1), drop);
    with_output_const<T>(output_const<T>(s, op), [&](const OutConst<A>& oc) {
      for (int base0 = nh; base0 < c.nslots; base0 += STEP) {
        prefetch_slots_l2(xb, base0 + PF, min(base0 + PF + STEP, pf1), drop);
        const int base = base0 + threadIdx.x;
        Slot<T> buf[US];
#pragma unroll
        for (int u = 0; u < US; ++u)
          if (base + u * THREADS < c.nslots)
            buf[u] = load_slot<T, true>(xb, (base + u * THREADS) * VEC, c.lo, c.hi, drop);
#pragma unroll
        for (int u = 0; u < US; ++u)
          if (base + u * THREADS < c.nslots)
            store_slot<T, true>(yb, output_slot<T>(buf[u], oc), (base + u * THREADS) * VEC, c.lo, c.hi);
      }
      for (int k = 0; k < kmax; k += UH) {
#pragma unroll
        for (int u = 0; u < UH; ++u) {
          const int j = threadIdx.x + (k + u) * THREADS;
          if (k + u < kmax && j < nh)
            store_slot<T, true>(yb, output_slot<T>(Slot<T>::load(reinterpret_cast<const T*>(&held[j])), oc),
                                j * VEC, c.lo, c.hi);
        }
      }
    });
  }
  if (C > 1 && !waited) cluster_wait();  // a cluster without a row: pair the start arrive
  CUFLASH_TL(2);
}

// ---------------------------------------------------------------------------------------------------------
// version 5: the held split (sm_90 in the planner; "online", rows of 2 MiB and more, too long for a cluster's
// shared memory): one HBM read, no L2 re-read. The input's rows are cut into chunks of at most S slots, K a row,
// numbered c = row·K + k over the whole input. A persistent grid of G blocks, launched cooperatively (the driver
// refuses a grid that cannot all be resident at once), gives block b the chunks b, b + G, b + 2G, ...: its
// iteration i's chunk is b + i·G. Iteration i of a block
//   1. issues the cp.async copy of its chunk i + AHEAD into shared-memory buffer (i + AHEAD) % NB (each thread its
//      own slots, so no barrier guards a buffer: a thread reads back only what it copied);
//   2. waits for its chunk i, reduces it to the block's state (block_state) and publishes it in ws[c] (one packed
//      64-bit word, data and ready flag at once, as version 3);
//   3. waits for the K states of chunk i − LAG's row (the first THREADS of them loaded before step 1), merges
//      them (every block of the row alike: the same bits) and writes chunk i − LAG from its buffer.
// NB = AHEAD + 1 + LAG buffers: the one being filled last held chunk i − LAG − 1, written in iteration i − 1.
// No deadlock when K <= G + 1 (LAG >= 1): the row of a block's chunk i − LAG ends at most K − 1 chunks later, in
// iteration i − LAG + 1 <= i of some block, and every block publishes its iteration-i chunk before it waits in
// iteration i (by induction on i, every wait of iteration i ends once all blocks run). So the host launches only
// resident blocks and checks K (the same argument allows K <= LAG·G + 1; the host keeps K <= G + 1 for every LAG).
// With LAG = 2 the states a block waits for were published an iteration earlier.
// Shared memory: NB·S 16-byte slots, S <= THREADS·SPT.
__device__ __forceinline__ unsigned long long ld_volatile(const unsigned long long* p) {
  return *reinterpret_cast<const volatile unsigned long long*>(p);
}

template <typename T, int THREADS, int SPT, int AHEAD, int LAG>
__global__ void __launch_bounds__(THREADS, (SPT <= 4 ? 1024 : 512) / THREADS)  // 64 (or 128) registers
softmax_hold(const T* __restrict__ x, i64 ldx, T* __restrict__ y, i64 ldy, i64 rows, i64 n, int op, int K,
             int S, unsigned long long* __restrict__ ws) {
  typedef float A;
  typedef SoftmaxState<A> St;
  constexpr int VEC = Slot<T>::VEC, NB = AHEAD + 1 + LAG;
  static_assert(sizeof(T) <= 4, "float accumulators: 16- and 32-bit inputs");
  static_assert(AHEAD >= 1 && AHEAD <= 3 && LAG >= 1, "cp.async waits for 1-3 groups; LAG >= 1 (no deadlock)");
  extern __shared__ uint4 held_raw[];  // NB buffers of S slots
  __shared__ float red[2][THREADS / 32];
  const i64 G = gridDim.x, total = rows * (i64)K;
  const unsigned long long pol = l2_policy(false);  // the copies: nothing reads them from L2 again

  // chunk c's elements in its row (row c / K, starting at x's row pointer + r.first)
  auto range = [&](i64 c, i64 row) {
    return chunk_range<VEC>(head_of(x + row * ldx), n, (c - row * K) * (i64)S, S);
  };
  // 1. copy chunk c (if any) into buffer bi: cp.async of the whole slots, element loads at a row's head and tail
  auto issue = [&](i64 c, int bi) {
    if (c < total) {
      const i64 row = c / K;
      const ChunkRange r = range(c, row);
      const T* xb = x + row * ldx + r.first;
      uint4* buf = held_raw + bi * S;
#pragma unroll
      for (int u = 0; u < SPT; ++u) {
        const int j = threadIdx.x + u * THREADS, e = j * VEC;
        if (j < r.nslots) {
          if (e >= r.lo && e + VEC <= r.hi) cp_async_slot(&buf[j], xb + e, pol);
          else stage_slot(buf, j, xb, r);
        }
      }
    }
    cp_async_commit();  // one group an iteration (empty past the end)
  };

#pragma unroll
  for (int a = 0; a < AHEAD; ++a) issue(blockIdx.x + a * G, a);
  for (i64 i = 0;; ++i) {
    const i64 c0 = blockIdx.x + i * G;  // this iteration's chunk
    const i64 cw = c0 - LAG * G;        // the chunk written now
    if (cw >= total) break;
    // the first THREADS states of chunk cw's row, loaded now: their latency hides behind the copy and reduction
    // (measured: 0.707 -> 0.751 of copy on 4 MiB float32 rows)
    const i64 wrow = cw >= 0 ? cw / K : 0;
    unsigned long long w0 = 0;
    if (cw >= 0 && threadIdx.x < K) w0 = ld_volatile(&ws[wrow * K + threadIdx.x]);
    issue(c0 + AHEAD * G, (int)((i + AHEAD) % NB));
    cp_async_wait<AHEAD>();
    if (c0 < total) {  // 2. reduce and publish chunk c0
      const ChunkRange r = range(c0, c0 / K);
      const Slot<T>* buf = reinterpret_cast<const Slot<T>*>(held_raw + (int)(i % NB) * S);
      Slot<T> v[SPT];
#pragma unroll
      for (int u = 0; u < SPT; ++u) {
        const int j = threadIdx.x + u * THREADS;
        v[u] = j < r.nslots ? buf[j] : Slot<T>::neg_inf();
      }
      St s = St::identity();
      accumulate<T, SPT>(s, v, MODE_ONLINE, (A)0);
      s = block_state<THREADS>(s, red);
      if (threadIdx.x == 0) *reinterpret_cast<volatile unsigned long long*>(&ws[c0]) = pack_state(s);
    }
    if (cw >= 0) {  // 3. chunk cw: its row's K states, then its output
      St s = St::identity();
      for (int j = threadIdx.x; j < K; j += THREADS) {
        unsigned long long w = j == threadIdx.x ? w0 : 0ull;
        while (w == 0ull && (w = ld_volatile(&ws[wrow * K + j])) == 0ull) __nanosleep(32);
        s = merge(s, St{__uint_as_float((unsigned)w), __uint_as_float((unsigned)(w >> 32))});
      }
      s = block_state<THREADS>(s, red);
      const ChunkRange r = range(cw, wrow);
      T* yb = y + wrow * ldy + r.first;
      const Slot<T>* buf = reinterpret_cast<const Slot<T>*>(held_raw + (int)((i - LAG) % NB) * S);
      with_output_const<T>(output_const<T>(s, op), [&](const OutConst<A>& oc) {
#pragma unroll
        for (int u = 0; u < SPT; ++u) {
          const int j = threadIdx.x + u * THREADS;
          if (j < r.nslots) store_slot<T, true>(yb, output_slot<T>(buf[j], oc), j * VEC, r.lo, r.hi);
        }
      });
    }
  }
  cp_async_wait<0>();
}

#endif  // __CUDA_ARCH__ >= 900

// Elementwise merge of two arrays of states (merge_states in Python).
template <typename A>
__global__ void softmax_merge_states(const A* __restrict__ ma, const A* __restrict__ la, const A* __restrict__ mb,
                                     const A* __restrict__ lb, A* __restrict__ m, A* __restrict__ l, i64 count) {
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (i64)gridDim.x * blockDim.x) {
    const SoftmaxState<A> s = merge(SoftmaxState<A>{ma[i], la[i]}, SoftmaxState<A>{mb[i], lb[i]});
    m[i] = s.m;
    l[i] = s.l;
  }
}

}  // namespace cuflash
