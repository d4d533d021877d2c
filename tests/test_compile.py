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


# Without NVRTC the compile check skips on a developer's machine (with the reason) but fails in CI, where the
# README's install (the cuda12 extra brings NVRTC and the CUDA headers from PyPI) must make it run.
needs_nvrtc = pytest.mark.skipif(not _nvrtc_ok() and not os.environ.get("CI"),
                                 reason="libnvrtc not found (pip install -e '.[cuda12]' brings it)")


def _arches(extra):
    if any(o.startswith("--gpu-architecture") or o.startswith("-arch") for o in extra):
        return ["90a"]  # the instantiation fixes its own architecture (sm_90a kernels)
    return ["80", "90"]


def _job(args):
    source, names, arch, extra = args
    try:
        return args, _compile.compile_offline_many(source, names, arch=arch, extra_options=extra), None
    except RuntimeError as e:
        return args, None, str(e)[:4000]


@needs_nvrtc
def test_every_declared_kernel_compiles_without_spills(capsys):
    from concurrent.futures import ProcessPoolExecutor

    decl = _compile.declared()
    assert decl, "no kernel declared: the wrappers must call _compile.declare"
    release = {(s, n, e): r for s, n, e, r in decl}
    groups = {}  # one NVRTC program per (source, options, arch): the front end parses the headers once
    for source, name, extra, _ in decl:
        for arch in _arches(extra):
            groups.setdefault((source, arch, extra), []).append(name)
    jobs = [(s, names, a, e) for (s, a, e), names in groups.items()]
    rows, failures = [], []
    with ProcessPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1))) as pool:
        for (source, names, arch, extra), reps, err in pool.map(_job, jobs):
            if err:
                failures.append(err)
                continue
            for name in names:
                rep, rel = reps[name], release[(source, name, extra)]
                spill = rep["spill_stores"] + rep["spill_loads"]
                rows.append((source, name, arch, rep["registers"], rep["smem"], rep["stack"], spill, rel))
                if spill and rel:
                    failures.append(f"{source} {name} sm_{arch}: {spill} bytes of spills in a release configuration")
    with capsys.disabled():
        print(f"\n{'source':<22} {'sm':<4} {'regs':>4} {'smem':>6} {'stack':>5} {'spill':>5}  instantiation")
        for s, n, a, r, sm, st, sp, rel in rows:
            print(f"{s:<22} {a:<4} {r:>4} {sm:>6} {st:>5} {sp:>5}  {n}{'' if rel else '  (study)'}")
        print(f"{len(rows)} instantiations compiled in {len(jobs)} NVRTC programs")
    assert not failures, "\n".join(failures)


def test_max_active_clusters_without_a_driver(monkeypatch):
    """No libcuda (or an old one without cuOccupancyMaxActiveClusters): None, so the callers fall back to their
    guess instead of failing."""
    import ctypes

    def no_lib(name):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(ctypes, "CDLL", no_lib)
    assert _compile.max_active_clusters(object(), 2, 512, 0) is None

    class OldLib:  # a driver without the entry point
        def __getattr__(self, name):
            raise AttributeError(name)

    monkeypatch.setattr(ctypes, "CDLL", lambda name: OldLib())
    assert _compile.max_active_clusters(object(), 2, 512, 0) is None


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


def test_missing_sources_name_the_editable_install(tmp_path, monkeypatch):
    """An install without cuda_src/ beside the package fails on the first compile with a message saying why."""
    monkeypatch.setattr(_compile, "SRC_DIR", tmp_path / "cuda_src")
    with pytest.raises(FileNotFoundError, match="pip install -e"):
        _compile.read_source("softmax.cu")


def test_scalar_errors_describe_arrays_by_shape():
    """A (device) array passed where a number is expected is named by shape and dtype, not printed (its repr
    would copy it to the host)."""
    import numpy as np

    from cuflash._attn_common import as_bool, as_float, as_int

    a = np.arange(12.0).reshape(3, 4)
    for fn in (as_float, as_int, as_bool):
        with pytest.raises(TypeError, match=r"shape \(3, 4\) and dtype float64") as e:
            fn(a, "eps")
        assert "11." not in str(e.value)
