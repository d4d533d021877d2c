"""GPU-free compile check: every kernel instantiation the package can launch compiles with NVRTC for sm_80 and
sm_90 (sm_90a for Hopper-only kernels), from the same sources and options as the run-time path; ptxas's
resource report is printed as a table, and a release configuration must not spill.
"""
import os

import pytest

from cuflash import _compile

nvrtc = pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="CuPy (with NVRTC) is not installed")


def _nvrtc_ok():
    try:
        nvrtc.getVersion()
        return True
    except Exception:
        return False


pytestmark = pytest.mark.skipif(not _nvrtc_ok() and not os.environ.get("CI"),
                                reason="libnvrtc not found (install the cuda13 or cuda12 extra)")


def _arches(extra):
    if any(o.startswith("--gpu-architecture") or o.startswith("-arch") for o in extra):
        return [None]  # the instantiation fixes its own architecture (sm_90a kernels)
    return ["80", "90"]


def test_every_declared_kernel_compiles_without_spills(capsys):
    decl = _compile.declared()
    assert decl, "no kernel declared: the wrappers must call _compile.declare"
    rows, failures = [], []
    for source, name, extra, release in decl:
        for arch in _arches(extra):
            try:
                rep = _compile.compile_offline(source, name, arch=arch or "90a", extra_options=extra)
            except RuntimeError as e:
                failures.append(str(e)[:4000])
                continue
            spill = rep["spill_stores"] + rep["spill_loads"]
            rows.append((source, name, arch or "90a", rep["registers"], rep["smem"], rep["stack"], spill, release))
            if spill and release:
                failures.append(f"{source} {name} sm_{arch}: {spill} bytes of spills in a release configuration")
    with capsys.disabled():
        print(f"\n{'source':<18} {'sm':<4} {'regs':>4} {'smem':>6} {'stack':>5} {'spill':>5}  instantiation")
        for s, n, a, r, sm, st, sp, rel in rows:
            print(f"{s:<18} {a:<4} {r:>4} {sm:>6} {st:>5} {sp:>5}  {n}{'' if rel else '  (study)'}")
    assert not failures, "\n".join(failures)


def test_header_edit_changes_the_cache_key(tmp_path, monkeypatch):
    """CuPy's disk cache does not hash #include'd headers; the source hash in the options must."""
    src = tmp_path / "cuda_src"
    (src / "cuflash").mkdir(parents=True)
    (src / "k.cu").write_text('#include "cuflash/h.cuh"\n')
    (src / "cuflash" / "h.cuh").write_text("#define X 1\n")
    monkeypatch.setattr(_compile, "SRC_DIR", src)
    _compile.source_hash.cache_clear()
    a = _compile.options()
    (src / "cuflash" / "h.cuh").write_text("#define X 2\n")
    _compile.source_hash.cache_clear()
    b = _compile.options()
    _compile.source_hash.cache_clear()
    assert a != b
