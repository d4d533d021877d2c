// cuflash/mbarrier.cuh — shared-memory 64-bit barrier objects (mbarrier, sm_80+; transaction counts sm_90+).
// Addresses are 32-bit shared-window addresses (smem_u32).
//   mbar_init(a, count)          the phase completes after `count` arrivals (one thread, before any use; then
//                                fence.mbarrier_init and a barrier before other threads or blocks touch it)
//   mbar_arrive(a)               one arrival, release semantics
//   mbar_arrive_cnt(a, n)        n arrivals at once (sm_90)
//   mbar_arrive_expect_tx(a, n)  one arrival that also raises the phase's expected transaction count by n bytes:
//                                the phase completes once every arrival is in and that many bytes have landed
//   mbar_wait(a, parity)         blocks until the phase with that parity has completed (acquire, CTA scope)
//   cp_async_arrive_noinc(a)     one arrival triggered when every cp.async issued so far by this thread has landed
//                                (count it in `count`; no pending-count increment)
#pragma once

namespace cuflash {

__device__ __forceinline__ void mbar_init(unsigned addr, unsigned count) {
  asm volatile("mbarrier.init.shared.b64 [%0], %1;\n" ::"r"(addr), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned addr) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared.b64 st, [%0];\n}\n" ::"r"(addr) : "memory");
}
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
// `count` arrivals at once (sm_90)
__device__ __forceinline__ void mbar_arrive_cnt(unsigned addr, unsigned count) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0], %1;\n" ::"r"(addr), "r"(count) : "memory");
}
#endif
__device__ __forceinline__ void mbar_wait(unsigned addr, unsigned parity) {
  unsigned done = 0;
  do {
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done) : "r"(addr), "r"(parity) : "memory");
  } while (!done);
}
__device__ __forceinline__ void cp_async_arrive_noinc(unsigned addr) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared.b64 [%0];\n" ::"r"(addr) : "memory");
}
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
__device__ __forceinline__ void mbar_arrive_expect_tx(unsigned mbar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(mbar), "r"(bytes) : "memory");
}
#endif

}  // namespace cuflash
