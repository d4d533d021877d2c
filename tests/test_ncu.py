"""CPU tests of cuflash.ncu's multi-call profiling: the per-call split of a synthetic ncu CSV at the marker kernels,
and measure_many / measure end to end through a fake ``ncu`` that runs the generated program against a stub
``cupy`` (kernel launches are logged, not run) and prints the CSV ncu would print."""
import os
import stat
import sys
import textwrap

import pytest

from cuflash import ncu

HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
          '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')


def _csv(launches):
    """ncu --csv text for [(kernel name, read bytes, write bytes)], one ID per launch, after some ==PROF== noise."""
    lines = ["==PROF== Connected to process 1", "app output line", HEADER]
    for i, (name, rd, wr) in enumerate(launches):
        for metric, val in (("dram__bytes_read.sum", rd), ("dram__bytes_write.sum", wr)):
            lines.append(f'"{i}","1","python3","h","{name}","1","7","(1, 1, 1)","(1, 1, 1)","0","9.0",'
                         f'"Command line profiler metrics","{metric}","byte","{val:,}"')
    return "\n".join(lines) + "\n"


def test_split_at_markers():
    text = _csv([("cupy_fill", 77, 77),                      # before any marker: not attributed
                 ("cuflash_ncu_marker_0", 512, 32),           # markers never count
                 ("softmax_cached", 1000, 500), ("softmax_cached", 24, 6),
                 ("cuflash_ncu_marker_1", 512, 32),           # call 1 launches nothing
                 ("cuflash_ncu_marker_2", 512, 32),
                 ("void cuflash::norm_fwd<__nv_bfloat16>(...)", 4_000_000, 2_000_000),
                 ("cuflash_ncu_marker_3", 512, 32),
                 ("attention_fwd_kernel", 10, 20)])
    launches = ncu.parse_csv(text)
    assert len(launches) == 9
    res = ncu.split_launches(launches, 5, errors=[None, None, None, "RuntimeError: boom"])
    print(res)
    assert [r["n_launches"] for r in res[:3]] == [2, 0, 1]
    assert (res[0]["read_bytes"], res[0]["write_bytes"], res[0]["bytes"]) == (1024, 506, 1530)
    assert res[1]["bytes"] == 0 and res[1]["error"] is None
    assert res[2]["bytes"] == 6_000_000 and res[2]["launches"][0]["kernel"].startswith("void cuflash::norm_fwd")
    assert res[3]["bytes"] is None and res[3]["error"] == "RuntimeError: boom" and res[3]["n_launches"] == 1
    assert res[4]["bytes"] is None and "no marker" in res[4]["error"]          # never profiled
    assert all(not r["kernel"].startswith("cuflash_ncu_marker") for x in res for r in x["launches"])


def test_parse_keeps_every_metric_of_a_launch():
    text = _csv([("k", 10, 20)]) + (
        '"0","1","python3","h","k","1","7","(1, 1, 1)","(1, 1, 1)","0","9.0","s",'
        '"sm__warps_active.avg.pct_of_peak_sustained_active","%","61.5"\n'
        '"0","1","python3","h","k","1","7","(1, 1, 1)","(1, 1, 1)","0","9.0","s",'
        '"smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio","","3.25"\n')
    (r,) = ncu.parse_csv(text)
    assert (r["read_bytes"], r["write_bytes"]) == (10, 20)
    assert r["metrics"]["sm__warps_active.avg.pct_of_peak_sustained_active"] == 61.5
    assert r["metrics"]["smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio"] == 3.25
    assert r["metrics"]["dram__bytes_read.sum"] == 10


def test_split_divides_by_repeat_and_order_follows_ids():
    text = _csv([("cuflash_ncu_marker_1", 0, 0), ("k", 30, 3), ("k", 30, 3),
                 ("cuflash_ncu_marker_0", 0, 0), ("k", 8, 2), ("k", 8, 2)])
    a, b = ncu.split_launches(ncu.parse_csv(text), 2, repeat=2)
    assert (a["read_bytes"], a["write_bytes"], a["n_launches"]) == (8, 2, 2)
    assert (b["bytes"], b["n_launches"]) == (33, 2)


def test_script_compiles_and_has_one_range():
    s = ncu._script("x = 1", ["y = x + 1\nz = y", "pass"], 3, "/tmp/status.json")
    compile(s, "region", "exec")
    assert s.count("_prof.start()") == 1 and s.count("_prof.stop()") == 1
    assert "cuflash_ncu_marker_1" in ncu._marker_source(2) and "range(3)" in s


# ------------------------------------------------------------------------------------------ fake ncu, stub cupy
STUB_CUPY = '''
import os
_on = [False]
def _launch(name):
    if _on[0]:
        with open(os.environ["FAKE_NCU_LOG"], "a") as f:
            f.write(name + "\\n")
class _Fn:
    def __init__(self, name):
        self.name = name
    def __call__(self, grid, block, args):
        _launch(self.name)
class RawModule:
    def __init__(self, code=""):
        self.code = code
    def get_function(self, name):
        assert name in self.code, name
        return _Fn(name)
from . import cuda
'''
STUB_CUDA = '''
class Device:
    def synchronize(self):
        pass
from . import profiler
'''
STUB_PROFILER = '''
import cupy
def start():
    cupy._on[0] = True
def stop():
    cupy._on[0] = False
'''
FAKE_NCU = '''#!{python}
"""Fake ncu: runs the program (last argument) and prints the CSV of the launches it logged. A kernel named
k_<read>_<write> moved those bytes; markers claim 999 (they must not count)."""
import os, subprocess, sys
log = os.path.join(os.path.dirname(sys.argv[-1]), "launches.log")
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "argv.txt"), "w") as f:
    f.write(" ".join(sys.argv[1:]))
rc = subprocess.run(sys.argv[-2:], env=dict(os.environ, FAKE_NCU_LOG=log)).returncode
names = open(log).read().split() if os.path.exists(log) else []
print("==PROF== Disconnected")
print({header!r})
for i, n in enumerate(names):
    rd, wr = (int(x) for x in n.split("_")[1:3]) if n.startswith("k_") else (999, 999)
    for m, v in (("dram__bytes_read.sum", rd), ("dram__bytes_write.sum", wr)):
        print(f'"{{i}}","1","python3","h","{{n}}","1","7","(1, 1, 1)","(1, 1, 1)","0","9.0","s","{{m}}","byte","{{v}}"')
sys.exit(rc)
'''


@pytest.fixture
def fake_ncu(tmp_path, monkeypatch):
    stub = tmp_path / "stub"
    (stub / "cupy" / "cuda").mkdir(parents=True)
    (stub / "cupy" / "__init__.py").write_text(STUB_CUPY)
    (stub / "cupy" / "cuda" / "__init__.py").write_text(STUB_CUDA)
    (stub / "cupy" / "cuda" / "profiler.py").write_text(STUB_PROFILER)
    exe = tmp_path / "ncu"
    exe.write_text(FAKE_NCU.format(python=sys.executable, header=HEADER))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(ncu, "ncu_path", lambda: str(exe))
    monkeypatch.delenv("CUFLASH_NO_NCU", raising=False)
    return {"env": {"PYTHONPATH": os.pathsep.join([str(stub), str(ncu.ROOT)])}, "argv": tmp_path / "argv.txt"}


def test_measure_many_end_to_end(fake_ncu):
    setup = "from cupy import _launch\n_n = 0"
    calls = ["_launch('k_1000_50')\n_launch('k_24_6')",             # two kernels
             "raise ValueError('boom')",                              # fails in the warm-up: skipped
             textwrap.dedent("""
                 global _n
                 _n += 1
                 _launch('k_5_5')
                 if _n > 1:
                     raise RuntimeError('second')"""),               # fails inside the profiled range
             "pass",                                                  # launches nothing
             "_launch('k_7_3')"]
    res = ncu.measure_many(setup, calls, repeat=2, env=fake_ncu["env"], timeout=60)
    print(res)
    assert len(res) == 5
    assert (res[0]["read_bytes"], res[0]["write_bytes"], res[0]["n_launches"], res[0]["error"]) == (1024, 56, 4, None)
    assert res[1]["bytes"] is None and "warm-up" in res[1]["error"] and "boom" in res[1]["error"]
    assert res[2]["bytes"] is None and "RuntimeError: second" in res[2]["error"]
    assert res[3]["bytes"] == 0 and res[3]["n_launches"] == 0 and res[3]["error"] is None
    assert res[4]["bytes"] == 10 and res[4]["n_launches"] == 2
    argv = fake_ncu["argv"].read_text()
    assert "--profile-from-start off" in argv and "--clock-control none" in argv and "dram__bytes_read.sum" in argv
    ncu.measure_many(setup, ["pass"], env=fake_ncu["env"], timeout=60, metrics=("regex:smsp__average_warps_.*",))
    assert "dram__bytes_write.sum,regex:smsp__average_warps_.*" in fake_ncu["argv"].read_text()


def test_measure_is_measure_many_of_one(fake_ncu):
    r = ncu.measure("_launch('k_10_20')", "from cupy import _launch", env=fake_ncu["env"], timeout=60,
                    kernel_regex="k_")
    assert (r["bytes"], r["n_launches"], r["error"]) == (30, 1, None)
    assert "regex:(?:k_)|cuflash_ncu_marker" in fake_ncu["argv"].read_text()   # the markers survive the filter
    with pytest.raises(ncu.NcuUnavailable, match="boom"):
        ncu.measure("raise ValueError('boom')", "", env=fake_ncu["env"], timeout=60)


def test_measure_many_without_ncu(monkeypatch):
    monkeypatch.setattr(ncu, "ncu_path", lambda: None)
    with pytest.raises(ncu.NcuUnavailable):
        ncu.measure_many("", ["pass"])
    assert ncu.try_measure("pass") is None


def test_kernel_profile_rows_and_no_gpu_exit(monkeypatch):
    """experiments/kernel_profile.py: its calls compile, a launch's counters become one row (top stalls first),
    and without ncu it measures nothing and exits 2."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("kernel_profile", ncu.ROOT / "experiments" / "kernel_profile.py")
    kp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kp)
    for label, setup, call in kp.calls(quick=True):
        compile(setup, label, "exec")
        compile(call, label, "eval")
    m = {"gpu__time_duration.sum": 2500.0, "launch__registers_per_thread": 72.0,
         kp.STALL_PREFIX + "barrier" + kp.STALL_SUFFIX: 0.5, kp.STALL_PREFIX + "long_scoreboard" + kp.STALL_SUFFIX: 4.0,
         kp.STALL_PREFIX + "wait" + kp.STALL_SUFFIX: 1.0, kp.STALL_PREFIX + "selected" + kp.STALL_SUFFIX: 0.25}
    row = kp.summarise("c", {"kernel": "cuflash::norm_fwd<...>", "read_bytes": 8.0, "write_bytes": 4.0, "metrics": m})
    assert row["duration_us"] == 2.5 and row["registers"] == 72.0 and row["dram_bytes"] == 12.0
    assert (row["stall_1"], row["stall_2"], row["stall_3"]) == ("long_scoreboard 4.00", "wait 1.00", "barrier 0.50")
    monkeypatch.setattr(ncu, "available", lambda: False)
    assert kp.main([]) == 2

