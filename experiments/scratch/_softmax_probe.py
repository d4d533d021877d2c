"""Shared by the softmax probes (scratch): the tree's cuflash.softmax (sm), the softmax sweep module (sw, from
experiments/ of the working directory: the tree under test), the same-run copy bandwidth, each shape's input at
256 MiB and the fraction of copy a time gives. A probe run as a file imports it from its own folder:
    from _softmax_probe import sm, sw, bench, NBYTES, copy_bandwidth, inputs, frac, own_array, fill_normal"""
import importlib
import sys

sys.path.insert(1, "experiments")
import softmax_sweep as sw  # noqa: E402
from cuflash import _dtypes, bench  # noqa: E402

sm = importlib.import_module("cuflash.softmax")
NBYTES = 256 << 20


def copy_bandwidth():
    """The device-to-device copy of NBYTES (GB/s read + written), 30 launches: the probes' ceiling."""
    return sw.copy_bandwidth(NBYTES, 30)


def inputs(shapes, sets=1):
    """For each (dtype name, cols) of shapes: (dtype name, cols, dtype, rows, [sets random rows x cols inputs]),
    rows = NBYTES / row bytes; the inputs are dropped before the next shape's are drawn."""
    for dname, cols in shapes:
        dt = getattr(_dtypes, dname)
        rows = NBYTES // (cols * dt.itemsize)
        xs = [sw._inputs(rows, cols, dname, None)[0] for _ in range(sets)]
        yield dname, cols, dt, rows, xs
        xs.clear()


def frac(rows, cols, dt, ms, copy):
    """The fraction of the copy bandwidth of a softmax of rows x cols (read and written once) that takes ms."""
    return 2 * rows * cols * dt.itemsize / (ms * 1e-3) / 1e9 / copy


def own_array(dt, shape, nbytes=None, offset=0):
    """An array at ``offset`` in a cudaMalloc of its own (``nbytes``, default NBYTES; no pool): fresh memory, freed
    with the array (the sm_*_probe.py probes of the cluster rows' output-buffer state)."""
    import cupy as cp

    return cp.ndarray(shape, dtype=dt, memptr=cp.cuda.MemoryPointer(cp.cuda.Memory(nbytes or NBYTES), offset))


def fill_normal(x):
    """x filled with standard normal draws (float32, rounded to x's dtype)."""
    import cupy as cp

    x[...] = cp.random.standard_normal(x.shape, dtype=cp.float32).astype(x.dtype)
    return x
