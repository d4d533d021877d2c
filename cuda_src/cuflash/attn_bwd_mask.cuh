// cuflash/attn_bwd_mask.cuh — the attention backward's mask tests and the Q tiles a K/V tile meets, shared by its
// mma.sync (attention_bwd.cu) and wgmma (attention_bwd_sm90.cu) kernels. Bottom-right aligned: query i sits at key
// position i + shift (shift = Sk - Sq); key j is visible iff j < Sk, i < Sq, (right < 0 || j <= i + shift + right)
// and (left < 0 || j >= i + shift - left).
#pragma once

namespace cuflash {
namespace attn_bwd {

constexpr float LOG2E = 1.4426950408889634f;

// The visibility rule above as ranges, for tiles that need a mask: bounds computed once per row, then one compare
// pair an entry (a per-entry test of the rule compiled to several times that).
// The keys [lo, hi) query i sees (none when i >= Sq): (i, j) visible <=> lo <= j < hi, for j >= 0.
__device__ __forceinline__ void key_range(int i, int Sq, int Sk, int shift, int left, int right, int& lo, int& hi) {
  hi = i >= Sq ? 0 : (right < 0 ? Sk : min(Sk, i + shift + right + 1));
  lo = left < 0 ? 0 : i + shift - left;
}
// The queries [lo, hi) that see key j (none when j >= Sk): (i, j) visible <=> lo <= i < hi, for i >= 0.
__device__ __forceinline__ void query_range(int j, int Sq, int Sk, int shift, int left, int right, int& lo,
                                            int& hi) {
  hi = j >= Sk ? 0 : (left < 0 ? Sq : min(Sq, j - shift + left + 1));
  lo = right < 0 ? 0 : j - shift - right;
}

// Every (query, key) of queries [i0, i0 + ni) x keys [j0, j0 + nj) is visible (no tail, no mask edge): the
// tile's P needs no per-entry mask (per-entry tests of the rule were most of the softmax step's instructions).
__device__ __forceinline__ bool tile_visible(int i0, int ni, int j0, int nj, int Sq, int Sk, int shift, int left,
                                             int right) {
  return i0 + ni <= Sq && j0 + nj <= Sk && (right < 0 || j0 + nj - 1 <= i0 + shift + right) &&
         (left < 0 || j0 >= i0 + ni - 1 + shift - left);
}

// The Q tiles of BR rows that see at least one key of [j0, j1): tiles it0, it0 + BR, ... (ntiles of them).
__device__ __forceinline__ void query_tiles(int j0, int j1, int Sq, int shift, int left, int right, int BR,
                                            int& it0, int& ntiles) {
  const long long ilo = right < 0 ? 0 : max(0ll, (long long)j0 - shift - right);
  const long long ihi = left < 0 ? (long long)Sq - 1 : min((long long)Sq - 1, (long long)j1 - 1 - shift + left);
  it0 = (int)(ilo / BR) * BR;
  ntiles = ihi < ilo ? 0 : (int)((ihi - it0) / BR + 1);
}

}  // namespace attn_bwd
}  // namespace cuflash
