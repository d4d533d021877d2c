// cuflash/async_copy.cuh — cp.async (sm_80+): 16-byte (and 4-byte) copies from global to shared memory that
// need no registers while in flight, so a kernel can keep many more bytes in flight than its register file holds.
//   smem_u32(p)              the 32-bit shared-window address of a shared-memory pointer
//   cp_async_16(dst, src, p) copy 16 bytes when p, else write 16 zero bytes (nothing is read; src must still be
//                            a valid-looking address, e.g. a base pointer). .cg: cached in L2 only.
//   cp_async_l1_16(d, s, p)  the same through L1 (.ca, allocated in L1 as well): what a memory-bound stream uses
//   cp_async_ca_16(d, s, p)  cp_async_l1_16 from a generic shared-memory pointer
//   cp_async_slot(d, s, pol) copy 16 bytes with an L2 eviction policy (createpolicy's 64-bit descriptor), .cg
//   cp_async_4(dst, src, p)  the same as cp_async_16 for 4 bytes (.ca: .cg copies only 16)
//   cp_async_commit()        closes the group of this thread's copies issued since the last commit
//   cp_async_wait<N>()       waits until at most N of this thread's committed groups are still in flight; other
//                            threads' copies need a barrier (__syncthreads / __syncwarp) before they are read
// .cg or .ca: on the H200 a warp's .cg copies of 16 bytes a thread (512 contiguous bytes) made L2 serve every
// 32-byte sector twice (Nsight Compute, norm_fwd_stream at 256 MiB: 16.9M sectors read for x's 8.39M, with or
// without a branch around each copy), .ca copies once (8.53M, x and the weights): its plain LayerNorm bf16 32K
// 0.877 -> 0.922 of copy, float32 16K 0.887 -> 0.926. Not everywhere a gain: the same switch lost in norm_fwd's
// shared-memory chunks (bf16 64K 0.708 -> 0.667) and in the 16-bit streamed backward (0.80-0.90 -> 0.74-0.81,
// float32 +2-8 %); softmax's held copies (cp_async_slot) moved -0.7..+1.5 %. So only norm_fwd_stream takes it
// (experiments/results/logs/ca_ab_*.log, README).
#pragma once

namespace cuflash {

typedef unsigned int uint32_t;  // NVRTC has no <cstdint>

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes from / to a 32-bit shared-memory address (volatile: ordered with the cp.async waits around them).
__device__ __forceinline__ uint4 lds_16(uint32_t a) {
  uint4 r;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "r"(a));
  return r;
}
__device__ __forceinline__ void sts_16(uint32_t a, uint4 v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(a), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool pred) {
  int n = pred ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n) : "memory");
}
// 16 bytes (0 when !pred: zero-filled) through L1 (.ca: a warp's 16-byte requests merged into whole sectors).
__device__ __forceinline__ void cp_async_l1_16(uint32_t dst, const void* src, bool pred) {
  int n = pred ? 16 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n) : "memory");
}
// The same to a generic shared-memory pointer.
__device__ __forceinline__ void cp_async_ca_16(void* dst, const void* src, bool pred) {
  cp_async_l1_16(smem_u32(dst), src, pred);
}
// 16 bytes from generic pointers (smem a shared-memory one) with the L2 cache hint pol.
__device__ __forceinline__ void cp_async_slot(void* smem, const void* gmem, unsigned long long pol) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem),
               "l"(pol) : "memory");
}
// 4 bytes (cp.async.ca: .cg takes only 16), zero-filled when !pred.
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, bool pred) {
  int n = pred ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(n) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

}  // namespace cuflash
