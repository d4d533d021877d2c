// cuflash/cluster.cuh — thread-block cluster primitives (sm_90+: clusters and distributed shared memory do not
// exist before Hopper; kernels that use them are declared for sm_90 only, and this header is empty on older
// architectures). The compiler's built-ins (cooperative_groups::this_cluster() wraps the same ones, but its header
// needs the CCCL headers on the include path, which the offline compile check does not have).
//   cluster_rank()        this block's rank in its cluster
//   cluster_arrive()      release: this thread's earlier memory operations are visible to the cluster once the
//                         barrier completes
//   cluster_wait()        acquire. Every thread of every block of the cluster takes part; arrive and wait alternate
//   cluster_sync()        arrive, then wait
//   cluster_arrive_relaxed()  arrive without release (nothing of this thread's is published by it; an
//                         mbarrier initialised before it is published by fence.mbarrier_init instead)
//   cluster_map(p, rank)  the address of `p` (a __shared__ object of this block) in block `rank`'s shared memory
// A point-to-point exchange without a cluster barrier (an mbarrier in the receiving block counts the bytes):
//   cluster_map_u32(a, rank)           the shared::cluster address of shared-window address `a` in block `rank`
//   st_async_f2(a, v, mbar)            store v at shared::cluster address a (another block's) and signal its
//                                      arrival there: complete_tx of 8 bytes on the mbarrier at shared::cluster mbar
//   mbar_wait_cluster(a, parity)       mbar_wait with acquire at cluster scope: the peers' st.async data is visible
//   cluster_send_f2<CL>(v, xch, rank, mbar)  one warp: v into slot `rank` of xch in every block of the cluster
//                                      (lane 0 its own block's, then its arrival expecting 8 bytes a peer; lane q
//                                      block q's by st_async_f2); receivers wait with mbar_wait_cluster. v must be
//                                      the same bits in every lane (broadcast lane 0's after a merge that is not
//                                      bitwise symmetric), or the blocks receive different values
#pragma once
#include "cuflash/mbarrier.cuh"

namespace cuflash {

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
__device__ __forceinline__ unsigned cluster_rank() { return __clusterRelativeBlockRank(); }
__device__ __forceinline__ void cluster_arrive() { __cluster_barrier_arrive(); }
__device__ __forceinline__ void cluster_wait() { __cluster_barrier_wait(); }
__device__ __forceinline__ void cluster_sync() { cluster_arrive(); cluster_wait(); }
__device__ __forceinline__ void cluster_arrive_relaxed() { __cluster_barrier_arrive_relaxed(); }
template <typename S> __device__ __forceinline__ S* cluster_map(S* p, unsigned rank) {
  return reinterpret_cast<S*>(__cluster_map_shared_rank(reinterpret_cast<void*>(p), rank));
}

__device__ __forceinline__ unsigned cluster_map_u32(unsigned addr, unsigned rank) {
  unsigned r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}
__device__ __forceinline__ void st_async_f2(unsigned addr, float2 v, unsigned mbar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, [%3];\n" ::"r"(addr),
               "f"(v.x), "f"(v.y), "r"(mbar) : "memory");
}
__device__ __forceinline__ void mbar_wait_cluster(unsigned addr, unsigned parity) {
  unsigned done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n" : "=r"(done) : "r"(addr), "r"(parity) : "memory");
  } while (!done);
}
template <int CL>
__device__ __forceinline__ void cluster_send_f2(float2 v, float2* xch, unsigned rank, unsigned mbar) {
  const int lane = threadIdx.x & 31;
  if (lane == 0) {
    xch[rank] = v;
    mbar_arrive_expect_tx(mbar, 8 * (CL - 1));
  }
  if (lane < CL && lane != (int)rank)
    st_async_f2(cluster_map_u32((unsigned)__cvta_generic_to_shared(xch + rank), lane), v, cluster_map_u32(mbar, lane));
}
#endif

}  // namespace cuflash
