// cuflash/tma.cuh — the tensor memory accelerator (sm_90): tiled bulk copies global -> shared described by a
// tensor map (CUtensorMap, built on the host by cuTensorMapEncodeTiled and passed as a __grid_constant__ kernel
// parameter), completed on an mbarrier by transaction bytes; tiled stores and bulk reductions shared -> global
// (bulk groups).
#pragma once
#include "cuflash/mbarrier.cuh"  // mbar_arrive_expect_tx

namespace cuflash {

// The 128-byte opaque CUtensorMap (cuda.h: CU_TENSOR_MAP_NUM_QWORDS = 16, 64-byte aligned).
struct __align__(64) TmaMap {
  unsigned long long opaque[16];
};

// Copy the box at coordinates (c0 innermost .. c3) of the 4-D tensor `map` into shared memory at `dst` (laid out
// and swizzled as the map says); completion is signalled on `mbar` (complete_tx with the box's bytes).
// Out-of-bounds elements of the box are filled with zeros.
__device__ __forceinline__ void tma_load_4d(unsigned dst, const TmaMap* map, int c0, int c1, int c2, int c3,
                                            unsigned mbar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(mbar)
      : "memory");
}

// Copy the swizzled box at `src` in shared memory to coordinates (c0 innermost .. c3) of the 4-D tensor `map` (the
// reverse of tma_load_4d); out-of-bounds elements of the box are not written. Asynchronous: a bulk group of the
// issuing thread (bulk_commit, then bulk_wait_read before `src` is reused, bulk_wait_all before the kernel ends).
// Shared memory written by the generic proxy needs fence_proxy_async() and a barrier before the issue.
__device__ __forceinline__ void tma_store_4d(const TmaMap* map, unsigned src, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%1, %2, %3, %4}], [%5];\n" ::"l"(
                   reinterpret_cast<unsigned long long>(map)),
               "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(src)
               : "memory");
}

// Bulk reduction shared -> global by the copy engine: dst[k] += src[k] for `bytes` / 4 floats (dst and src
// 16-byte aligned, bytes a multiple of 16), asynchronous; the issuing thread tracks it with bulk groups. Shared
// memory written by the generic proxy needs fence_proxy_async() (cuflash/wgmma.cuh) and a barrier before the issue.
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, unsigned src, unsigned bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(
                   __cvta_generic_to_global(dst)),
               "r"(src), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// All but the newest N bulk groups of this thread have finished reading their shared-memory source.
template <int N> __device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
// Every bulk group of this thread has completed (its writes are done).
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

}  // namespace cuflash
