"""Scratch (#4): a float32 simulation (NumPy) of one warp's LayerNorm M2 over 32 lanes x 32 values, the exact
two-pass formula against one pass about a shift (a lane's first value, or the mean of the 32 lanes' first values),
accumulated per lane in float32 and reduced by a butterfly; relative error against float64 for 4000 warps of
several means and scales, and the share of warps whose shift lies more than sqrt(K) standard deviations off.
    python3 experiments/scratch/ln_shift_sim.py   (output: experiments/results/logs/ln_shift_sim.txt)"""
import numpy as np
rng=np.random.default_rng(0)
f=np.float32
W=4000; L=32; V=32  # warps, lanes, values per lane
def tree(a):  # butterfly over lanes axis=1 (float32)
    a=a.copy()
    n=a.shape[1]
    while n>1:
        n//=2; a=(a[:,:n]+a[:,n:2*n]).astype(f)
    return a[:,0]
def run(loc, scale, forced_z=None):
    x=(rng.standard_normal((W,L,V))*scale+loc).astype(f)
    if forced_z is not None:
        x[:,0,0]=(x.astype(np.float64).mean((1,2)) + forced_z*x.astype(np.float64).std((1,2))).astype(f)
    x64=x.astype(np.float64); m64=x64.mean((1,2)); M64=((x64-m64[:,None,None])**2).sum((1,2))
    c=f(L*V)
    # two-pass
    s=np.zeros((W,L),f)
    for i in range(V): s=(s+x[:,:,i]).astype(f)
    m=(tree(s)/c).astype(f)
    q=np.zeros((W,L),f)
    for i in range(V):
        d=(x[:,:,i]-m[:,None]).astype(f); q=(q+d*d).astype(f)
    M2a=tree(q)
    # shifted
    s0=x[:,0,0]
    S=np.zeros((W,L),f);Q=np.zeros((W,L),f)
    for i in range(V):
        d=(x[:,:,i]-s0[:,None]).astype(f); S=(S+d).astype(f); Q=(Q+d*d).astype(f)
    S=tree(S);Q=tree(Q); md=(S/c).astype(f); M2b=(Q-S*md).astype(f)
    z2=(S.astype(np.float64)*md)/np.maximum(M2b,1e-30)
    ea=np.abs(M2a/M64-1); eb=np.abs(M2b/M64-1)
    return ea, eb, z2
for loc,scale in [(0,1),(3,1),(1000,1),(0,1e-3)]:
    ea,eb,z2=run(loc,scale)
    print(f"loc {loc} scale {scale}: twopass max {ea.max():.2e} med {np.median(ea):.2e} | shift max {eb.max():.2e} med {np.median(eb):.2e} | P(z2>8) {np.mean(z2>8):.4f} P(z2>4) {np.mean(z2>4):.3f}")
for z in [1,2,3,4]:
    ea,eb,z2=run(1000,1,forced_z=z)
    print(f"forced z {z} loc 1000: twopass max {ea.max():.2e} shift max {eb.max():.2e} med {np.median(eb):.2e}")
print("--- shift = mean of lanes' first values")
def run2(loc, scale, outlier=None):
    x=(rng.standard_normal((W,L,V))*scale+loc).astype(f)
    if outlier is not None: x[:,:,0]=f(outlier)  # a channel pattern hitting every sample
    x64=x.astype(np.float64); m64=x64.mean((1,2)); M64=((x64-m64[:,None,None])**2).sum((1,2))
    c=f(L*V)
    s0=(tree(x[:,:,0])/f(32)).astype(f)
    S=np.zeros((W,L),f);Q=np.zeros((W,L),f)
    for i in range(V):
        d=(x[:,:,i]-s0[:,None]).astype(f); S=(S+d).astype(f); Q=(Q+d*d).astype(f)
    S=tree(S);Q=tree(Q); md=(S/c).astype(f); M2b=(Q-S*md).astype(f)
    z2=(S.astype(np.float64)*md)/np.maximum(M2b,1e-30)
    eb=np.abs(M2b/M64-1)
    return eb,z2
for loc,scale in [(0,1),(3,1),(1000,1),(0,1e-3)]:
    eb,z2=run2(loc,scale)
    print(f"loc {loc} scale {scale}: shift32 max {eb.max():.2e} med {np.median(eb):.2e} | max z2 {z2.max():.3f}")
eb,z2=run2(0,1,outlier=30)
print(f"outlier channel 30: max {eb.max():.2e} z2 {np.median(z2):.1f}")
