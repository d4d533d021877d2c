"""Probe (scratch): which row-to-thread mapping lets a bf16 LayerNorm forward reach the copy bandwidth?
Plain one-row-per-block kernels (NT threads, VPT 16-byte vectors each, two block sums: mean, then sum of squared
deviations from registers), timed beside cuflash.layer_norm, a Triton one-row-per-program LayerNorm and a copy."""
import sys, json
sys.path.insert(0, ".")
import numpy as np, cupy as cp
from cuflash import bench, _compile, layer_norm

SRC = r'''
#include "cuflash/common.cuh"
#include "cuflash/welford.cuh"
using namespace cuflash;
typedef __nv_bfloat16 bf;
typedef Vec<bf, 8> V;
template <int NT> __device__ __forceinline__ float block_sum(float v, float* sm) {
  #pragma unroll
  for (int m = 16; m; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
  if (NT == 32) return v;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) sm[w] = v;
  __syncthreads();
  float t = lane < NT / 32 ? sm[lane] : 0.f;
  #pragma unroll
  for (int m = 16; m; m >>= 1) t += __shfl_xor_sync(0xffffffffu, t, m);
  return t;
}
// one row per block (ROWS = 1) or ROWS rows per block of NT * ROWS threads when NT == 32
template <int VPT, int NT, int ROWS, int HOLDW, int MODE>
__global__ void __launch_bounds__(NT * ROWS) ln_probe(const bf* __restrict__ x, const bf* __restrict__ w,
    const bf* __restrict__ b, bf* __restrict__ y, float* __restrict__ mo, float* __restrict__ ro, long long rows,
    int hidden, float eps) {
  __shared__ float sm[32];
  __shared__ Welford wsm[32];
  const int t = threadIdx.x % NT, g = threadIdx.x / NT;
  const int nvec = hidden / 8;
  V wr[VPT], br[VPT];
  if (HOLDW) {
    #pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int v = k * NT + t;
      if (v < nvec) { wr[k] = V::load(w + v * 8); br[k] = V::load(b + v * 8); }
    }
  }
  for (long long row = (long long)blockIdx.x * ROWS + g; row < rows; row += (long long)gridDim.x * ROWS) {
    const bf* xr = x + row * hidden; bf* yr = y + row * hidden;
    V a[VPT];
    #pragma unroll
    for (int k = 0; k < VPT; ++k) { const int v = k * NT + t; if (v < nvec) a[k] = V::load(xr + v * 8); }
    if (!HOLDW && MODE != 2) {
      #pragma unroll
      for (int k = 0; k < VPT; ++k) {
        const int v = k * NT + t;
        if (v < nvec) { wr[k] = V::load(w + v * 8); br[k] = V::load(b + v * 8); }
      }
    }
    float s = 0.f;
    #pragma unroll
    for (int k = 0; k < VPT; ++k) if (k * NT + t < nvec) {
      #pragma unroll
      for (int i = 0; i < 8; ++i) s += to_float(a[k].v[i]);
    }
    float mean, rstd;
    if (MODE == 1) {
      float cnt = 0.f;
      #pragma unroll
      for (int k = 0; k < VPT; ++k) if (k * NT + t < nvec) cnt += 8.f;
      const float m = cnt > 0.f ? __fdividef(s, cnt) : 0.f;
      float q = 0.f;
      #pragma unroll
      for (int k = 0; k < VPT; ++k) if (k * NT + t < nvec) {
        #pragma unroll
        for (int i = 0; i < 8; ++i) { const float d = to_float(a[k].v[i]) - m; q = fmaf(d, d, q); }
      }
      Welford st{cnt, m, q};
      st = NT == 32 ? warp_allreduce<32>(st, WelfordOp()) : block_allreduce(st, WelfordOp(), wsm);
      mean = __shfl_sync(0xffffffffu, st.mean, 0);
      rstd = __shfl_sync(0xffffffffu, rsqrtf(fmaxf(st.m2 / st.n, 0.f) + eps), 0);
    } else {
      mean = block_sum<NT>(s, sm) / hidden;
      float q = 0.f;
      #pragma unroll
      for (int k = 0; k < VPT; ++k) if (k * NT + t < nvec) {
        #pragma unroll
        for (int i = 0; i < 8; ++i) { const float d = to_float(a[k].v[i]) - mean; q = fmaf(d, d, q); }
      }
      rstd = rsqrtf(block_sum<NT>(q, sm) / hidden + eps);
    }
    if (t == 0) { mo[row] = mean; ro[row] = rstd; }
    #pragma unroll
    for (int k = 0; k < VPT; ++k) { const int v = k * NT + t; if (v < nvec) {
      if (MODE == 2 && !HOLDW) { wr[k] = V::load(w + v * 8); br[k] = V::load(b + v * 8); }
      V o;
      #pragma unroll
      for (int i = 0; i < 8; ++i)
        o.v[i] = from_float<bf>(fmaf((to_float(a[k].v[i]) - mean) * rstd, to_float(wr[k].v[i]), to_float(br[k].v[i])));
      o.store(yr + v * 8);
    }
    if (MODE == 2) asm volatile("" ::: "memory"); }
  }
}
'''

def main():
    dev = cp.cuda.Device()
    sms = dev.attributes["MultiProcessorCount"]
    configs = {1024: [(4, 32, 1), (4, 32, 8)], 2048: [(8, 32, 1), (4, 64, 1), (2, 128, 1)],
               4096: [(4, 128, 1), (8, 64, 1)], 8192: [(4, 256, 1), (8, 128, 1)]}
    VARIANTS = [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]  # (HOLDW, MODE)
    names = [f"ln_probe<{v}, {n}, {r}, {h}, {m}>" for H in configs for (v, n, r) in configs[H] for h, m in VARIANTS]
    mod = cp.RawModule(code=SRC, options=_compile.options() + ("-ftz=true",), name_expressions=names)
    try:
        import torch, triton, triton.language as tl
    except Exception:
        torch = None
    tri = None
    if torch is not None:
        @triton.jit
        def ln_k(x_ptr, w_ptr, b_ptr, y_ptr, n_cols, eps, BLOCK: tl.constexpr):
            row = tl.program_id(0); offs = tl.arange(0, BLOCK); mask = offs < n_cols
            x = tl.load(x_ptr + row * n_cols + offs, mask=mask, other=0.).to(tl.float32)
            mean = tl.sum(x, 0) / n_cols; d = tl.where(mask, x - mean, 0.)
            r = tl.rsqrt(tl.sum(d * d, 0) / n_cols + eps)
            w = tl.load(w_ptr + offs, mask=mask, other=0.).to(tl.float32)
            b = tl.load(b_ptr + offs, mask=mask, other=0.).to(tl.float32)
            tl.store(y_ptr + row * n_cols + offs, (d * r * w + b).to(y_ptr.dtype.element_ty), mask=mask)
        tri = ln_k
    n = 1 << 30
    a8 = cp.empty(n, cp.uint8); c8 = cp.empty_like(a8)
    copy = bench.time_cuda(lambda: cp.copyto(c8, a8), rep=30)
    copy_gbps = 2 * n / copy["median_ms"] / 1e6
    out = {"copy_GBps": copy_gbps, "rows": []}
    print(f"copy {copy_gbps:.0f} GB/s")
    from cuflash import _dtypes
    for H, cfgs in configs.items():
        R = (256 << 20) // (2 * H)
        xf = cp.random.standard_normal((R, H), dtype=cp.float32) * 2 + 0.5
        x = xf.astype(_dtypes.bfloat16); w = (cp.random.standard_normal(H, dtype=cp.float32)).astype(_dtypes.bfloat16)
        b = cp.random.standard_normal(H, dtype=cp.float32).astype(_dtypes.bfloat16)
        ref = layer_norm(x, (H,), w, b).astype(cp.float32)
        by = 2 * x.nbytes
        def rec(name, ms, err):
            g = by / ms / 1e6
            out["rows"].append({"hidden": H, "impl": name, "GBps": g, "frac_copy": g / copy_gbps,
                                "max_abs_vs_cuflash": err})
            print(f"{H:6d} {name:28s} {g:7.0f} GB/s {g / copy_gbps:.3f} err {err:.3g}")
        t = bench.time_cuda(lambda: layer_norm(x, (H,), w, b), rep=30)
        rec("cuflash", t["median_ms"], 0.0)
        for (v, nt, r) in cfgs:
            for h, mode in VARIANTS:
                k = mod.get_function(f"ln_probe<{v}, {nt}, {r}, {h}, {mode}>")
                y = cp.full((R, H), 7, _dtypes.bfloat16); mo = cp.empty(R, cp.float32); ro = cp.empty(R, cp.float32)
                for grid_kind in ("rows", "persist"):
                    if grid_kind == "rows":
                        grid = (R + r - 1) // r
                    else:
                        from cuflash.norm import _resident_blocks
                        nb = _resident_blocks(k, nt * r, 0, dev.id)
                        grid = min((R + r - 1) // r, nb * sms)
                    args = (x, w, b, y, mo, ro, np.int64(R), np.int32(H), np.float32(1e-5))
                    f = lambda: k((grid,), (nt * r,), args)
                    f(); cp.cuda.runtime.deviceSynchronize()
                    err = float(cp.abs(y.astype(cp.float32) - ref).max())
                    t = bench.time_cuda(f, rep=30)
                    rec(f"probe vpt{v} nt{nt} r{r} hold{h} mode{mode} {grid_kind}", t["median_ms"], err)
        if tri is not None:
            tx = torch.from_dlpack(x.view(cp.int16)).view(torch.bfloat16)
            tw = torch.from_dlpack(w.view(cp.int16)).view(torch.bfloat16)
            tb = torch.from_dlpack(b.view(cp.int16)).view(torch.bfloat16); ty = torch.empty_like(tx)
            B = triton.next_power_of_2(H); nw = min(32, max(4, B // 256))
            f = lambda: tri[(R,)](tx, tw, tb, ty, H, 1e-5, BLOCK=B, num_warps=nw)
            f(); torch.cuda.synchronize()
            t = bench.time_cuda(f, rep=30)
            rec(f"triton nw{nw}", t["median_ms"], 0.0)
            t = bench.time_cuda(lambda: torch.nn.functional.layer_norm(tx, (H,), tw, tb), rep=30)
            rec("torch", t["median_ms"], 0.0)
    import os
    json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "ln_probe.json"), "w"), indent=1)

if __name__ == "__main__":
    main()
