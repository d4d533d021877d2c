// cuflash/common.cuh — dtype traits and vector load/store shared by every kernel.
//   to_float / from_float convert float, __half, __nv_bfloat16 (and double) to and from the accumulator type.
//   Vec<T, N> is N elements of T loaded or stored as one aligned access (16 bytes when N * sizeof(T) == 16).
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#ifndef CUFLASH_SRC_HASH
#define CUFLASH_SRC_HASH 0
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

// N elements loaded/stored as one access; the pointer must be aligned to sizeof(Vec).
template <typename T, int N> struct alignas(sizeof(T) * N) Vec {
  T v[N];
  __device__ __forceinline__ static Vec load(const T* p) { return *reinterpret_cast<const Vec*>(p); }
  __device__ __forceinline__ void store(T* p) const { *reinterpret_cast<Vec*>(p) = *this; }
};

// Elements per 16-byte access.
template <typename T> struct Vec16 { static constexpr int N = 16 / sizeof(T); };

}  // namespace cuflash
