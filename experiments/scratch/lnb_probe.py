"""Probe (scratch): which row-to-thread mapping lets a bf16 LayerNorm backward reach 80 % of the copy bandwidth?
Plain kernels: a group of GT threads per row (R groups per block), VPT 16-byte vectors of x and dy per thread,
the weights and the dw/db partial sums of a thread's columns held in registers across rows (persistent grid),
one block sum per row (double-buffered, one __syncthreads). PF = 1 loads the next row's x, dy, mean, rstd before
the current row's sums (register double buffer). ACC = 0 leaves out dw/db (the dx-only bound). Timed beside
cuflash.layer_norm_backward, torch's native_layer_norm_backward and a copy; bytes = x + dy read, dx written."""
import json
import os
import sys

sys.path.insert(0, ".")
import numpy as np  # noqa: E402
import cupy as cp  # noqa: E402
from cuflash import bench, _compile, _dtypes, layer_norm, layer_norm_backward  # noqa: E402

SRC = r'''
#include "cuflash/common.cuh"
#include "cuflash/async_copy.cuh"
using namespace cuflash;
typedef __nv_bfloat16 bf;
typedef Vec<bf, 8> V;
__device__ __forceinline__ V opaque(const V& a) {  // the compiler recomputes floats from it instead of keeping them
  V r;
  const unsigned* s = reinterpret_cast<const unsigned*>(&a);
  unsigned* d = reinterpret_cast<unsigned*>(&r);
#pragma unroll
  for (int i = 0; i < 4; ++i) asm volatile("mov.b32 %0, %1;" : "=r"(d[i]) : "r"(s[i]));
  return r;
}
// MODE 0: the row's x, dy loaded at the top of its iteration; 1: the next row's loaded into a second register
// buffer before this row's sums; 2: rows staged through S shared-memory stages by cp.async, S - 1 rows ahead
template <int VPT, int GT, int R, int MODE, int ACC, int MINB, int S>
__global__ void __launch_bounds__(GT * R, MINB) lnb(const bf* __restrict__ dy, const bf* __restrict__ x,
    const bf* __restrict__ w, const float* __restrict__ mean, const float* __restrict__ rstd, bf* __restrict__ dx,
    float* __restrict__ ws_dw, float* __restrict__ ws_db, long long rows, int hidden) {
  constexpr int NW = GT / 32;
  __shared__ float2 red[2][R][NW > 0 ? NW : 1];
  extern __shared__ __align__(16) unsigned char stage[];
  const int t = threadIdx.x % GT, g = threadIdx.x / GT, lane = threadIdx.x & 31, wg = t >> 5;
  const int nvec = hidden / 8;
  V wr[VPT];
  float pdw[VPT][8], pdb[VPT][8];
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int v = k * GT + t;
    if (v < nvec) wr[k] = V::load(w + v * 8);
#pragma unroll
    for (int i = 0; i < 8; ++i) pdw[k][i] = pdb[k][i] = 0.f;
  }
  const long long step = (long long)gridDim.x * R;
  long long row = (long long)blockIdx.x * R + g;
  // stage s of group g: [VPT][GT] vectors of x, then of dy
  auto sx = [&](int s, int k) { return smem_u32(stage) + (((g * S + s) * 2 * VPT + k) * GT + t) * 16; };
  auto sd = [&](int s, int k) { return smem_u32(stage) + (((g * S + s) * 2 * VPT + VPT + k) * GT + t) * 16; };
  auto issue = [&](long long rw, int s) {
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int v = k * GT + t;
      const bool p = rw < rows && v < nvec;
      cp_async_16(sx(s, k), p ? x + rw * hidden + v * 8 : x, p);
      cp_async_16(sd(s, k), p ? dy + rw * hidden + v * 8 : dy, p);
    }
    cp_async_commit();
  };
  V xa[MODE == 1 ? VPT : 1], da[MODE == 1 ? VPT : 1];
  float mu_n = 0.f, r_n = 0.f;
  auto load = [&](long long rw) {
    if (rw < rows) {
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        const int v = k * GT + t;
        if (v < nvec) { xa[k] = V::load(x + rw * hidden + v * 8); da[k] = V::load(dy + rw * hidden + v * 8); }
      }
      mu_n = mean[rw]; r_n = rstd[rw];
    }
  };
  if (MODE == 1) load(row);
  if (MODE == 2) {
    if (row < rows) { mu_n = mean[row]; r_n = rstd[row]; }
#pragma unroll
    for (int s = 0; s < S - 1; ++s) issue(row + s * step, s);
  }
  int par = 0, st = 0;
  for (; row < rows; row += step) {
    V xc[VPT], dc[VPT];
    float mu, r;
    if (MODE == 0) {
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        const int v = k * GT + t;
        if (v < nvec) { xc[k] = V::load(x + row * hidden + v * 8); dc[k] = V::load(dy + row * hidden + v * 8); }
      }
      mu = mean[row]; r = rstd[row];
    } else if (MODE == 1) {
#pragma unroll
      for (int k = 0; k < VPT; ++k) { xc[k] = xa[k]; dc[k] = da[k]; }
      mu = mu_n; r = r_n;
      load(row + step);
    } else {
      mu = mu_n; r = r_n;
      if (row + step < rows) { mu_n = mean[row + step]; r_n = rstd[row + step]; }
      cp_async_wait<(S >= 2 ? S - 2 : 0)>();
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        uint4 a, b;
        asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(a.x), "=r"(a.y), "=r"(a.z), "=r"(a.w) : "r"(sx(st, k)));
        asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(b.x), "=r"(b.y), "=r"(b.z), "=r"(b.w) : "r"(sd(st, k)));
        xc[k] = *reinterpret_cast<V*>(&a); dc[k] = *reinterpret_cast<V*>(&b);
      }
      // the stage read last iteration is free: refill it with the row S - 1 ahead
      issue(row + (S - 1) * step, st == 0 ? S - 1 : st - 1);
      st = st == S - 1 ? 0 : st + 1;
    }
    float s1 = 0.f, s2 = 0.f;
#pragma unroll
    for (int k = 0; k < VPT; ++k) if (k * GT + t < nvec) {
      const V xo = opaque(xc[k]), dq = opaque(dc[k]), wo = opaque(wr[k]);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float xh = (to_float(xo.v[i]) - mu) * r, d = to_float(dq.v[i]), gg = d * to_float(wo.v[i]);
        s1 += gg; s2 = fmaf(gg, xh, s2);
        if (ACC) { pdw[k][i] = fmaf(d, xh, pdw[k][i]); pdb[k][i] += d; }
      }
    }
#pragma unroll
    for (int m = 16; m; m >>= 1) { s1 += __shfl_xor_sync(0xffffffffu, s1, m); s2 += __shfl_xor_sync(0xffffffffu, s2, m); }
    if (NW > 1) {
      if (lane == 0) red[par][g][wg] = make_float2(s1, s2);
      __syncthreads();
      // every warp sums the group's NW warp sums in lanes, then by butterfly (the same value in every lane)
      const float2 q = lane < NW ? red[par][g][lane] : make_float2(0.f, 0.f);
      s1 = q.x; s2 = q.y;
#pragma unroll
      for (int m = 16; m; m >>= 1) { s1 += __shfl_xor_sync(0xffffffffu, s1, m); s2 += __shfl_xor_sync(0xffffffffu, s2, m); }
      par ^= 1;
    }
    const float c1 = s1 / hidden, c2 = s2 / hidden;
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int v = k * GT + t;
      if (v < nvec) {
        V o;
        const V xo = opaque(xc[k]), dq = opaque(dc[k]), wo = opaque(wr[k]);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const float xh = (to_float(xo.v[i]) - mu) * r, gg = to_float(dq.v[i]) * to_float(wo.v[i]);
          o.v[i] = from_float<bf>(r * (gg - c1 - xh * c2));
        }
        o.store(dx + row * hidden + v * 8);
      }
    }
  }
  if (MODE == 2) cp_async_wait<0>();
  if (ACC) {
    const long long p = (long long)blockIdx.x * R + g;
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int v = k * GT + t;
      if (v < nvec) {
#pragma unroll
        for (int i = 0; i < 8; i += 4) {
          *reinterpret_cast<float4*>(ws_dw + p * hidden + v * 8 + i) = make_float4(pdw[k][i], pdw[k][i + 1], pdw[k][i + 2], pdw[k][i + 3]);
          *reinterpret_cast<float4*>(ws_db + p * hidden + v * 8 + i) = make_float4(pdb[k][i], pdb[k][i + 1], pdb[k][i + 2], pdb[k][i + 3]);
        }
      }
    }
  }
}
'''

# hidden -> (VPT, GT, R, MINB) mappings; each also with PF in {0, 1}
CONFIGS = {
    1024: [(1, 128, 1, 8), (1, 128, 2, 4), (2, 64, 2, 4), (2, 64, 4, 2), (4, 32, 4, 4)],
    2048: [(1, 256, 1, 4), (2, 128, 1, 6), (2, 256, 1, 3), (4, 64, 2, 4)],
    4096: [(1, 512, 1, 2), (2, 256, 1, 3), (2, 512, 1, 1), (4, 128, 1, 4)],
    8192: [(1, 1024, 1, 1), (2, 512, 1, 1), (4, 256, 1, 2)],
    16384: [(2, 1024, 1, 1), (4, 512, 1, 1)],
}


VARIANTS = [(0, 1, 1), (1, 1, 1), (2, 1, 2), (2, 1, 3), (2, 0, 3)]  # (MODE, ACC, S)


def variants(c):
    """The register double buffer (MODE 1) only where a thread holds one vector (it spills beyond)."""
    return [v for v in VARIANTS if v[0] != 1 or c[0] == 1]


def name(c, var):
    v, gt, r, minb = c
    mode, acc, st = var
    return f"lnb<{v}, {gt}, {r}, {mode}, {acc}, {minb}, {st}>"


def main():
    dev = cp.cuda.Device()
    sms = dev.attributes["MultiProcessorCount"]
    hiddens = [int(h) for h in sys.argv[1].split(",")] if len(sys.argv) > 1 else list(CONFIGS)
    names = sorted({name(c, var) for H in hiddens for c in CONFIGS[H] for var in variants(c)})
    mod = cp.RawModule(code=SRC, options=_compile.options() + ("-ftz=true",), name_expressions=names)
    try:
        import torch
    except Exception:
        torch = None
    n = 1 << 30
    a8 = cp.empty(n, cp.uint8)
    c8 = cp.empty_like(a8)
    copy = bench.time_cuda(lambda: cp.copyto(c8, a8), rep=30)
    copy_gbps = 2 * n / copy["median_ms"] / 1e6
    out = {"copy_GBps": copy_gbps, "rows": []}
    print(f"copy {copy_gbps:.0f} GB/s")
    from cuflash.norm import _resident_blocks
    for H in hiddens:
        R = (256 << 20) // (2 * H)
        x = (cp.random.standard_normal((R, H), dtype=cp.float32) * 2 + 0.5).astype(_dtypes.bfloat16)
        dy = cp.random.standard_normal((R, H), dtype=cp.float32).astype(_dtypes.bfloat16)
        w = cp.random.standard_normal(H, dtype=cp.float32).astype(_dtypes.bfloat16)
        b = cp.random.standard_normal(H, dtype=cp.float32).astype(_dtypes.bfloat16)
        _, mean, rstd = layer_norm(x, (H,), w, b, return_stats=True)
        rdx, rdw, rdb = layer_norm_backward(dy, x, w, mean, rstd)
        rdx, rdw, rdb = (a.astype(cp.float32) for a in (rdx, rdw, rdb))
        by = 3 * x.nbytes

        def rec(nm, ms, err, regs=None):
            gb = by / ms / 1e6
            out["rows"].append({"hidden": H, "impl": nm, "GBps": gb, "frac_copy": gb / copy_gbps, "err": err,
                                "regs": regs})
            print(f"{H:6d} {nm:34s} {gb:7.0f} GB/s {gb / copy_gbps:.3f} err {err} regs {regs}")

        t = bench.time_cuda(lambda: layer_norm_backward(dy, x, w, mean, rstd), rep=30)
        rec("cuflash", t["median_ms"], 0.0)
        for c in CONFIGS[H]:
            for var in variants(c):
                k = mod.get_function(name(c, var))
                v, gt, r, minb = c
                mode, acc, st = var
                smem = r * st * gt * v * 32 if mode == 2 else 0
                nb = min((R + r - 1) // r, _resident_blocks(k, gt * r, smem, dev.id) * sms)
                dx = cp.full((R, H), 7, _dtypes.bfloat16)
                ws_dw = cp.full((nb * r, H), np.nan, cp.float32)
                ws_db = cp.full((nb * r, H), np.nan, cp.float32)
                args = (dy, x, w, mean, rstd, dx, ws_dw, ws_db, np.int64(R), np.int32(H))
                f = lambda: _compile.launch(k, (nb,), (gt * r,), args, shared_mem=smem)  # noqa: E731
                f()
                cp.cuda.runtime.deviceSynchronize()
                err = [float(cp.abs(dx.astype(cp.float32) - rdx).max())]
                if acc:
                    err += [float(cp.abs(ws_dw.sum(0) - rdw).max()), float(cp.abs(ws_db.sum(0) - rdb).max())]
                t = bench.time_cuda(f, rep=30)
                regs = (k.num_regs, k.local_size_bytes, nb)
                rec(f"v{v} gt{gt} r{r} minb{minb} mode{mode} acc{acc} s{st}", t["median_ms"], [round(e, 4) for e in err],
                    regs)
        if torch is not None:
            tx = torch.from_dlpack(x.view(cp.int16)).view(torch.bfloat16)
            tdy = torch.from_dlpack(dy.view(cp.int16)).view(torch.bfloat16)
            tw = torch.from_dlpack(w.view(cp.int16)).view(torch.bfloat16)
            tb = torch.from_dlpack(b.view(cp.int16)).view(torch.bfloat16)
            tm = torch.from_dlpack(mean).reshape(R, 1)
            tr = torch.from_dlpack(rstd).reshape(R, 1)
            f = lambda: torch.ops.aten.native_layer_norm_backward(tdy, tx, [H], tm, tr, tw, tb,  # noqa: E731
                                                                    [True, True, True])
            f()
            torch.cuda.synchronize()
            t = bench.time_cuda(f, rep=30)
            rec("torch", t["median_ms"], 0.0)
    json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "lnb_probe.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
