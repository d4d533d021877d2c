// cuflash/common.cuh — dtype traits and vector load/store shared by every kernel.
//   to_float / from_float convert float, __half, __nv_bfloat16 (and double) to and from the accumulator type.
//   Vec<T, N> is N elements of T loaded or stored as one aligned access (16 bytes when N * sizeof(T) == 16).
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#ifndef CUFLASH_SRC_HASH
#define CUFLASH_SRC_HASH 0
#endif

// Study knob (experiments/scratch/timeline_probe.py): with -DCUFLASH_TIMELINE=N the kernels that call
// CUFLASH_TL(k) record, for blocks 0..N-1, %globaltimer at mark k (0 start, 1 the row's state known, 2 end) and
// the SM id (slot 3). Compiled out otherwise.
#ifdef CUFLASH_TIMELINE
__device__ unsigned long long cuflash_timeline[(CUFLASH_TIMELINE) * 4];
#define CUFLASH_TL(k)                                                                           \
  do {                                                                                          \
    if (threadIdx.x == 0 && blockIdx.x < (CUFLASH_TIMELINE)) {                                  \
      unsigned long long t_;                                                                    \
      unsigned s_;                                                                              \
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t_));                                    \
      asm volatile("mov.u32 %0, %%smid;" : "=r"(s_));                                           \
      cuflash_timeline[blockIdx.x * 4 + (k)] = t_;                                              \
      if ((k) == 0) cuflash_timeline[blockIdx.x * 4 + 3] = s_;                                  \
    }                                                                                           \
  } while (0)
#else
#define CUFLASH_TL(k) do { } while (0)
#endif

namespace cuflash {

typedef long long i64;

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ double to_float(double x) { return x; }

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ double from_float<double>(float x) { return x; }
template <typename T> __device__ __forceinline__ T from_double(double x) { return from_float<T>((float)x); }
template <> __device__ __forceinline__ double from_double<double>(double x) { return x; }

// Accumulator type: float for 16- and 32-bit inputs, double for double.
template <typename T> struct Acc { typedef float type; };
template <> struct Acc<double> { typedef double type; };

// The widest plain word that divides BYTES: what a Vec of BYTES bytes is moved as.
template <int BYTES> struct WordOf {
  typedef typename WordOf<(BYTES % 16 == 0) ? 16 : (BYTES % 8 == 0) ? 8 : (BYTES % 4 == 0) ? 4
                          : (BYTES % 2 == 0) ? 2 : 1>::type type;
};
template <> struct WordOf<16> { typedef uint4 type; };
template <> struct WordOf<8> { typedef uint2 type; };
template <> struct WordOf<4> { typedef unsigned int type; };
template <> struct WordOf<2> { typedef unsigned short type; };
template <> struct WordOf<1> { typedef unsigned char type; };

// N elements loaded/stored as one access (two for 32 bytes); the pointer must be aligned to sizeof(Vec).
// Moved as plain words: __half and __nv_bfloat16 have user-defined copy operators, and copying a struct of them
// makes the compiler move it element by element (eight 16-bit stores instead of one 16-byte store).
template <typename T, int N> struct alignas(sizeof(T) * N) Vec {
  T v[N];
  typedef typename WordOf<sizeof(T) * N>::type Word;
  static constexpr int WORDS = sizeof(T) * N / sizeof(Word);
  __device__ __forceinline__ static Vec load(const T* p) {
    Vec r;
    const Word* s = reinterpret_cast<const Word*>(p);
    Word* d = reinterpret_cast<Word*>(r.v);
#pragma unroll
    for (int i = 0; i < WORDS; ++i) d[i] = s[i];
    return r;
  }
  // 16 and 32 bytes: explicit vector stores (generic address: global or shared). A plain uint4 store is not
  // enough: the compiler sees the 16-bit pieces and may still split it into 32-bit or 16-bit stores.
  __device__ __forceinline__ void store(T* p) const {
    const unsigned* s = reinterpret_cast<const unsigned*>(v);
    if constexpr (sizeof(T) * N == 16 || sizeof(T) * N == 32) {
#pragma unroll
      for (int i = 0; i < (int)(sizeof(T) * N / 16); ++i)
        asm volatile("st.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(p + i * (16 / sizeof(T))), "r"(s[4 * i]),
                     "r"(s[4 * i + 1]), "r"(s[4 * i + 2]), "r"(s[4 * i + 3]) : "memory");
    } else {
      const Word* sw = reinterpret_cast<const Word*>(v);
      Word* d = reinterpret_cast<Word*>(p);
#pragma unroll
      for (int i = 0; i < WORDS; ++i) d[i] = sw[i];
    }
  }
};

// The N elements of a vector as floats. bfloat16 pairs convert with one integer operation an element (the low
// half shifted up, the high half masked: a bfloat16 is the top half of its float), where __bfloat162float on each
// element took two for the high halves (a byte permute, then the shift).
template <typename T, int N> __device__ __forceinline__ void to_floats(const Vec<T, N>& a, float (&f)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) f[i] = to_float(a.v[i]);
}
template <int N> __device__ __forceinline__ void to_floats(const Vec<__nv_bfloat16, N>& a, float (&f)[N]) {
  static_assert(N % 2 == 0, "pairs");
  const unsigned* u = reinterpret_cast<const unsigned*>(a.v);
#pragma unroll
  for (int i = 0; i < N / 2; ++i) {
    f[2 * i] = __uint_as_float(u[i] << 16);
    f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
  }
}

// Elements per 16-byte access.
template <typename T> struct Vec16 { static constexpr int N = 16 / sizeof(T); };

}  // namespace cuflash
