"""The report and the predicted-mode (no GPU) sweeps: run on the CPU into a temporary folder (``--out``), so
committed results are never overwritten; plus the ncu CSV parser and the measured/modeled comparison."""
import importlib
import json
from pathlib import Path

import pytest

from cuflash import ncu
from script_loader import load_script

EXP = Path(__file__).resolve().parent.parent / "experiments"


def _script(name):
    return load_script(name, "test")


@pytest.fixture(autouse=True)
def _restore_results_dir():
    from cuflash import bench

    saved = bench.RESULTS, bench.PLOTS
    yield
    bench.RESULTS, bench.PLOTS = saved


@pytest.mark.parametrize("name,stem", [("fig2", "fig2_quick_predicted"),  # a --quick run has its own name
                                       ("softmax_passes", "softmax_passes_quick_predicted"),
                                       ("norm_fusion", "norm_fusion_quick_predicted"),
                                       ("roofline", "roofline_quick_predicted")])
def test_predicted_sweeps(tmp_path, name, stem):
    rc = _script(name).main(["--predict", "--quick", "--gpu", "H200", "--out", str(tmp_path)])
    assert rc == 0
    doc = json.loads((tmp_path / f"{stem}.json").read_text())
    assert doc["meta"]["predicted"] is True
    assert doc["rows"] and all(r["mode"] == "predicted" for r in doc["rows"])
    assert all(r.get("ms", 0) > 0 or r.get("fwd_ms", 0) > 0 for r in doc["rows"])
    assert doc["environment"]["command"]
    assert (tmp_path / "plots" / f"{stem}.png").stat().st_size > 1000
    assert (tmp_path / f"{stem}.csv").is_file()


def test_fig2_predicted_shape_of_the_result(tmp_path):
    _script("fig2").main(["--predict", "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "fig2_predicted.json").read_text())["rows"]
    a = {r["impl"]: r for r in rows if r["figure"] == "2a"}
    assert a["cuflash standard"]["hbm_gb_model"] > a["cuflash fa1"]["hbm_gb_model"] > a["cuflash fa2"]["hbm_gb_model"]
    b = [r["hbm_gb_model"] for r in rows if r["figure"] == "2b"]
    assert b == sorted(b, reverse=True)


def test_report_reads_whatever_exists(tmp_path):
    res = tmp_path / "results"
    _script("fig2").main(["--predict", "--quick", "--out", str(res), "--plots", str(tmp_path / "plots")])
    _script("norm_fusion").main(["--predict", "--quick", "--out", str(res), "--plots", str(tmp_path / "plots")])
    (res / "broken.json").write_text("{not json")
    (res / "other_kind.json").write_text(json.dumps({"rows": [{"foo": 1, "bar": "x"}]}))
    (res / "gpu_tests.json").write_text(json.dumps({"environment": {"gpu": "NVIDIA H200", "commit": "abc"},
                                                    "counts": {"passed": 3, "failed": 1, "skipped": 0},
                                                    "failed": ["tests/test_x.py::t"]}))
    out = tmp_path / "REPORT.md"
    rc = _script("report").main(["--results", str(res), "--plots", str(tmp_path / "plots"), "--out", str(out)])
    assert rc == 0
    text = out.read_text()
    print(text[:1500])
    assert "The table every kernel is judged by" in text
    assert "PREDICTED" in text
    assert "FlashAttention Fig. 2" in text and "Fused residual + norm" in text
    assert "![fig2_quick_predicted](plots/fig2_quick_predicted.png)" in text
    assert "broken.json" in text and "other kind" in text
    assert "GPU test records" in text and "tests/test_x.py::t" in text


def test_report_on_missing_folder(tmp_path, capsys):
    """A results folder that does not exist: exit 2, a message naming it, no report written."""
    out = tmp_path / "R.md"
    assert _script("report").main(["--results", str(tmp_path / "nope"), "--plots", str(tmp_path / "nope"),
                                   "--out", str(out)]) == 2
    assert not out.exists()
    assert f"no results folder {tmp_path / 'nope'}" in capsys.readouterr().err


def test_cli_report_on_missing_folder(tmp_path, capsys):
    from cuflash import cli

    out = tmp_path / "R.md"
    assert cli.main(["report", "--results", "/nonexistent/cuflash", "--out", str(out)]) == 2
    assert not out.exists() and "no results folder" in capsys.readouterr().err


def test_report_on_empty_folder(tmp_path):
    out = tmp_path / "R.md"
    assert _script("report").main(["--results", str(tmp_path), "--plots", str(tmp_path), "--out", str(out)]) == 0
    assert "No results" in out.read_text()


def test_cli_report(tmp_path):
    from cuflash import cli

    out = tmp_path / "R.md"
    assert cli.main(["report", "--results", str(tmp_path), "--plots", str(tmp_path), "--out", str(out)]) == 0
    assert out.is_file()


NCU_CSV = '''==PROF== Connected to process 1
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","1","python3","h","fa1_step","1","7","(256, 1, 1)","(1024, 16, 1)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","byte","268,435,456"
"0","1","python3","h","fa1_step","1","7","(256, 1, 1)","(1024, 16, 1)","0","9.0","Command line profiler metrics","dram__bytes_write.sum","Mbyte","2.5"
"1","1","python3","h","fa1_step","1","7","(256, 1, 1)","(1024, 16, 1)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","Kbyte","1.5"
"1","1","python3","h","fa1_step","1","7","(256, 1, 1)","(1024, 16, 1)","0","9.0","Command line profiler metrics","dram__bytes_write.sum","byte","0"
'''


def test_ncu_csv_and_compare():
    rows = ncu.parse_csv(NCU_CSV)
    assert [r["id"] for r in rows] == [0, 1]
    assert rows[0]["read_bytes"] == 268435456 and rows[0]["write_bytes"] == 2.5e6
    assert rows[1]["read_bytes"] == 1500
    assert ncu.parse_csv("no profile output") == []
    c = ncu.compare(80.0, 100)
    assert c["measured_over_modeled"] == pytest.approx(0.8) and "L2" in c["model_note"]
    assert ncu.compare(105.0, 100)["model_note"] == ""
    assert ncu.compare(None, 100)["measured_over_modeled"] is None
    s = ncu._script("x = 1", "y = x + 1\nz = y", 3)
    compile(s, "region", "exec")
    assert "_prof.start()" in s and "range(3)" in s



def _softmax_passes_timed_rows(mod, tmp_path):
    """Rows as the timing loop leaves them (from the predicted quick sweep, relabelled measured), a torch row per
    shape, and one cuflash row whose timing failed."""
    mod.main(["--predict", "--quick", "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "softmax_passes_quick_predicted.json").read_text())["rows"]
    out = []
    for r in rows:
        r = dict(r, mode="measured", ms=0.01)
        r.pop("predicted_for", None)
        out.append(r)
        if r["method"] == "online (cuflash default)":
            out.append({"kernel": "softmax", "method": "torch.softmax", "dtype": r["dtype"], "shape": r["shape"],
                        "rows": r["rows"], "cols": r["cols"], "bytes_model": 1, "mode": "measured", "ms": 0.01})
    out[1].pop("ms")
    out[1]["error"] = "RuntimeError: timing failed"
    return out


def test_softmax_passes_ncu_merge(tmp_path, monkeypatch):
    """The batched ncu phase: one measure_many process for every timed cuflash row (one input per shape in the
    setup, torch and failed rows left out), the bytes merged into the right rows, per-call errors kept apart
    from the timings; --ncu-per-dtype: one process per dtype, the results written after each."""
    mod = _script("softmax_passes")
    rows = _softmax_passes_timed_rows(mod, tmp_path)
    n_cuflash = sum(r["method"] != "torch.softmax" for r in rows)
    shapes = {(r["dtype"], r["rows"], r["cols"]) for r in rows}
    setup, calls, targets = mod.ncu_plan(rows)
    assert len(calls) == n_cuflash - 1 and 1 not in targets
    assert all(rows[i]["method"] != "torch.softmax" for i in targets)
    assert setup.count("from_float32(") == len(shapes)
    compile(ncu._script(setup, calls, 1), "region", "exec")
    assert "sm.softmax(X[0], axis=-1, method='naive')" in calls
    assert "sm._softmax_impl(X[0], -1, sm.OP_SOFTMAX, 'online', {'single_read': False})" in calls

    seen = []

    def fake_measure_many(setup, calls, repeat=1, kernel_regex=None, timeout=600, **kw):
        seen.append((setup, list(calls), timeout))
        res = []
        for j, c in enumerate(calls):
            if j == 2:
                res.append({"bytes": None, "read_bytes": None, "write_bytes": None, "launches": [], "n_launches": 0,
                            "error": "RuntimeError: boom"})
            else:   # bytes tagged by the call index: 1000 * (j + 1)
                res.append({"bytes": 1000.0 * (j + 1), "read_bytes": 600.0 * (j + 1),
                            "write_bytes": 400.0 * (j + 1), "launches": [{}], "n_launches": 1, "error": None})
        return res

    monkeypatch.setattr(ncu, "measure_many", fake_measure_many)
    st = mod.measure_bytes(rows, timeout=42, per_dtype=False)
    assert len(seen) == 1 and seen[0][2] == 42 and st["processes"] == 1
    assert st["calls"] == len(calls) and st["measured"] == len(calls) - 1 and not st["errors"]
    for j, i in enumerate(targets):
        r = rows[i]
        assert r["ms"] == 0.01 and "error" not in r              # the timings are untouched
        assert r["modeled_bytes"] == r["bytes_model"]
        if j == 2:
            assert r["measured_bytes"] is None and r["ncu_error"] == "RuntimeError: boom"
        else:
            s = {"float32": 4, "bfloat16": 2}[r["dtype"]]
            assert r["measured_bytes"] == 1000.0 * (j + 1) and "ncu_error" not in r
            assert r["measured_over_modeled"] == pytest.approx(1000.0 * (j + 1) / r["bytes_model"])
            assert r["passes_measured"] == pytest.approx(1000.0 * (j + 1) / (r["rows"] * r["cols"] * s))
    assert "measured_bytes" not in rows[1] and all("measured_bytes" not in r for r in rows
                                                    if r["method"] == "torch.softmax")

    # one process per dtype, results written after each; a process that fails as a whole keeps the timings
    rows = _softmax_passes_timed_rows(mod, tmp_path)
    seen.clear()
    writes = []

    def failing_for_bf16(setup, calls, **kw):
        if "_dtypes.bfloat16" in setup:
            raise ncu.NcuUnavailable("ncu timed out after 42 s")
        assert "_dtypes.float32" in setup
        return fake_measure_many(setup, calls, **kw)

    monkeypatch.setattr(ncu, "measure_many", failing_for_bf16)
    st = mod.measure_bytes(rows, timeout=42, per_dtype=True, after_group=lambda: writes.append(1))
    assert st["processes"] == 2 and len(writes) == 2 and len(seen) == 1
    assert st["errors"] == ["bfloat16: ncu timed out after 42 s"]
    bf = [r for r in rows if r["dtype"] == "bfloat16" and r["method"] != "torch.softmax"]
    assert bf and all(r["measured_bytes"] is None and "timed out" in r["ncu_error"] and r["ms"] for r in bf)
    f32 = [r for r in rows if r["dtype"] == "float32" and r["method"] != "torch.softmax" and "error" not in r]
    assert sum(r["measured_bytes"] is not None for r in f32) == len(f32) - 1

def test_report_labels_rows_without_kernel_or_shape(tmp_path):
    """Tile-sweep rows and the one-row-per-shape attention benches get a kernel, a shape and a peer ratio."""
    res = tmp_path / "results"
    assert _script("tile_sweep").main(["--predict", "--quick", "--out", str(res), "--plots",
                                       str(tmp_path / "plots")]) == 0
    (res / "attention_bench.json").write_text(json.dumps({"environment": {"gpu": "NVIDIA H200"}, "rows": [
        {"dtype": "bfloat16", "head_dim": 64, "seqlen": 512, "causal": True, "batch": 32, "heads": 32,
         "tiles": "128x64/4w", "cuflash_ms": 0.35, "cuflash_tflops": 196.0, "cuflash_err": 0.001,
         "wgmma_ms": 0.37, "wgmma_tflops": 185.0, "wgmma_err": 0.001, "torch_flash_ms": 0.29,
         "ratio_vs_flash": 0.83, "wgmma_ratio_vs_flash": 0.79}]}))
    (res / "softmax_sweep.json").write_text(json.dumps({"rows": [
        {"dtype": "float32", "rows": 64, "cols": 1024, "impl": "cuflash", "method": "online", "path": "warp",
         "ms": 0.1, "GBps": 3000.0, "frac_of_copy": 0.9, "max_abs_err": 1e-9},
        {"dtype": "float32", "rows": 64, "cols": 1024, "impl": "torch.softmax", "method": "", "ms": 0.2,
         "GBps": 1500.0, "frac_of_copy": 0.45},
        {"dtype": "float32", "rows": 64, "cols": 1024, "impl": "cuflash.log_softmax", "method": "online",
         "path": "warp", "ms": 0.1, "GBps": 3000.0, "frac_of_copy": 0.9, "max_abs_err": 1e-7},
        {"dtype": "float32", "rows": 64, "cols": 1024, "impl": "torch.log_softmax", "method": "", "ms": 0.4,
         "GBps": 750.0, "frac_of_copy": 0.22}]}))
    out = tmp_path / "REPORT.md"
    assert _script("report").main(["--results", str(res), "--plots", str(tmp_path / "plots"), "--out", str(out)]) == 0
    text = out.read_text()
    judged = text.split("## The table every kernel is judged by")[1].split("\n## ")[0]
    rows = [ln for ln in judged.splitlines() if ln.startswith("| ") and not ln.startswith("| source")]
    assert rows and all(ln.split("|")[2].strip() and ln.split("|")[3].strip() for ln in rows)  # kernel, shape
    assert "| attention fa2 128×64/4w (default) | B1 H4 N1024 d64 |" in judged
    # the --quick run's file (attention_tile_sweep_quick_predicted) is labelled as the tile sweep's
    assert "speed_vs_default_tile=1" in judged and "attention_tile_sweep_quick_predicted (PREDICTED)" in judged
    assert "| attention fa2 128x64/4w causal | B32 H32 N512 d64 |" in judged
    assert "| attention wgmma sm90 causal |" in judged and "speed_vs_torch_flash=0.79" in judged
    assert "| cuflash softmax online (warp) | 64x1024 |" in judged and "speed_vs_torch=2" in judged
    log_row = next(ln for ln in rows if "cuflash.log_softmax online (warp)" in ln)
    assert "speed_vs_torch=4" in log_row  # against torch.log_softmax (0.4 ms), not torch.softmax (0.2 ms)
    assert "![attention_tile_sweep_quick_predicted](plots/attention_tile_sweep_quick_predicted.png)" in text


# ------------------------------------------------------------------------------------------ traffic_check (issue #7)
TRAFFIC_KERNELS = {"softmax", "log_softmax", "logsumexp", "layer_norm", "rms_norm", "layer_norm_backward",
                   "rms_norm_backward", "attention", "attention_backward", "unscale_and_check", "sgd_momentum_step",
                   "adamw_step"}


def test_traffic_check_quick_predicted(tmp_path, capsys):
    """Model only (--predict): every kernel, its model from cuflash.traffic, PREDICTED labels, exit 0."""
    from cuflash import traffic

    assert _script("traffic_check").main(["--predict", "--quick", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "traffic_check_quick_predicted.json").read_text())
    rows = doc["rows"]
    assert doc["meta"]["predicted"] is True and doc["environment"]["command"]
    assert {r["kernel"] for r in rows} == TRAFFIC_KERNELS
    assert all(r["mode"] == "predicted" and r["model_bytes"] > 0 and r["call"] for r in rows)
    variants = [r["variant"] for r in rows if r["kernel"] == "attention"]
    assert [v.split()[0] for v in variants] == ["fa2", "fa1", "standard", "wgmma"]   # H200: cc 9.0
    sm = {r["variant"]: r for r in rows if r["kernel"] == "softmax"}
    assert sm["online (block)"]["model_bytes"] == traffic.softmax_bytes(2048, 4096, "float32", "cached")
    assert sm["safe (stream)"]["model_bytes"] == traffic.softmax_bytes(2048, 4096, "float32", "safe")
    assert sm["online (split)"]["model_bytes"] > traffic.softmax_bytes(32, 262144, "float32", "cached")
    bwd = next(r for r in rows if r["kernel"] == "attention_backward")
    bc = importlib.import_module("cuflash.attention_bwd").DEFAULT_BC[128]
    assert bwd["model_bytes"] == traffic.attention_backward_bytes(1, 8, 2048, 2048, 128, 64, bc, "bfloat16")
    assert (tmp_path / "traffic_check_quick_predicted.csv").is_file()
    assert (tmp_path / "plots" / "traffic_check_quick_predicted.png").stat().st_size > 1000
    assert not (tmp_path / "traffic_check.json").exists()
    # another GPU table: no wgmma row off Hopper
    assert _script("traffic_check").main(["--predict", "--quick", "--gpu", "A100", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "traffic_check_quick_predicted.json").read_text())["rows"]
    assert not any(r["variant"].startswith("wgmma") for r in rows)
    # --replot redraws from the JSON alone
    (tmp_path / "plots" / "traffic_check_quick_predicted.png").unlink()
    assert _script("traffic_check").main(["--replot", "--predict", "--quick", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "plots" / "traffic_check_quick_predicted.png").is_file()


@pytest.mark.skipif(__import__("cuflash").bench.has_gpu(), reason="checks the no-GPU path")
def test_traffic_check_without_gpu_exits_2(tmp_path, capsys):
    assert _script("traffic_check").main(["--quick", "--out", str(tmp_path)]) == 2
    assert "PREDICTED" in capsys.readouterr().out
    assert json.loads((tmp_path / "traffic_check_quick_predicted.json").read_text())["meta"]["predicted"] is True


def test_traffic_check_measured_path_and_report(tmp_path, monkeypatch):
    """The measured path with ncu faked (one measure_many call for all kernels), then the report's table."""
    from cuflash import bench

    mod = _script("traffic_check")
    res = tmp_path / "results"
    real_device = mod.Device
    monkeypatch.setattr(mod, "Device", lambda gpu, real: real_device(gpu, False))
    monkeypatch.setattr(bench, "has_gpu", lambda: True)
    monkeypatch.setattr(ncu, "available", lambda: True)
    a = mod.parse_args(["--quick"])
    model = [r["model_bytes"] for r, _ in mod.cases(a, real_device("H200", False))]
    seen = []

    def fake_measure_many(setup, calls, **kw):
        compile(ncu._script(setup, calls, 1), "region", "exec")     # the generated program is valid Python
        seen.append(len(calls))
        out = []
        for i, _ in enumerate(calls):
            if i == 1:
                out.append({"read_bytes": None, "write_bytes": None, "bytes": None, "launches": [],
                            "n_launches": 0, "error": "RuntimeError: boom"})
                continue
            b = model[i] * (1.02 if i == 0 else 0.5)
            out.append({"read_bytes": 0.75 * b, "write_bytes": 0.25 * b, "bytes": b, "launches": [{}] * 3,
                        "n_launches": 3, "error": None})
        return out

    monkeypatch.setattr(ncu, "measure_many", fake_measure_many)
    assert mod.main(["--quick", "--out", str(res), "--plots", str(tmp_path / "plots")]) == 0
    assert seen == [len(model)]                                      # ONE ncu process for every kernel
    rows = json.loads((res / "traffic_check_quick.json").read_text())["rows"]
    assert all(r["mode"] == "measured" for r in rows)
    assert rows[0]["ratio"] == pytest.approx(1.02) and rows[0]["flag"] == "" and rows[0]["model_note"] == ""
    assert rows[1]["measured_gb"] is None and rows[1]["error"] == "RuntimeError: boom"
    assert rows[2]["ratio"] == pytest.approx(0.5) and rows[2]["flag"] == ">10%"
    assert rows[2]["model_note"] == "measured 0.50x model: " + mod.WHY["stream"][0]
    assert all(r["model_note"] for r in rows[2:])
    assert (tmp_path / "plots" / "traffic_check_quick.png").stat().st_size > 1000
    # the report's traffic section reads the full run's file: the quick run's, renamed as a full run's would be
    for f in (res / "traffic_check_quick.json", res / "traffic_check_quick.csv",
              tmp_path / "plots" / "traffic_check_quick.png"):
        f.rename(f.with_name(f.name.replace("_quick", "")))
    out = tmp_path / "REPORT.md"
    assert _script("report").main(["--results", str(res), "--plots", str(tmp_path / "plots"), "--out", str(out)]) == 0
    text = out.read_text()
    print(text)
    sec = text.split("## Modeled vs measured HBM bytes")[1].split("\n## ")[0]
    assert "| kernel | shape | dtype | modeled GB | measured GB | measured / modeled | note |" in sec
    assert "| softmax online (block) | 2048x4096 | float32 | 0.06711 | 0.06845 | 1.02 |  |" in sec
    assert "RuntimeError: boom" in sec and "> 10 %: measured 0.50x model: dQ float32 atomics" in sec
    assert "..." not in sec                                            # notes short enough for the table
    assert "![traffic_check](plots/traffic_check.png)" in sec
    assert text.count("traffic_check.json") == 1                     # no second, generic section


def test_cli_run_lists_scripts(capsys):
    from cuflash import cli

    assert cli.main(["run"]) == 0
    out = capsys.readouterr().out
    assert "tile_sweep" in out and "norm_sweep" in out and "_common" not in out
    assert cli.main(["run", "no_such_script"]) == 2
    err = capsys.readouterr().err
    assert "no_such_script" in err and "tile_sweep" in err


def test_cli_help_version_and_info_help(capsys):
    from cuflash import __version__, cli

    for args in ([], ["help"], ["--help"]):
        assert cli.main(args) == 0
        assert "usage: cuflash" in capsys.readouterr().out
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"cuflash {__version__}"
    assert cli.main(["info", "--help"]) == 0  # says what it does, does not run it
    assert "usage: cuflash info" in capsys.readouterr().out
    assert cli.main(["info", "--bogus"]) == 2
    assert cli.main(["bogus"]) == 2


def test_cli_sweep_rejects_a_head_dim_without_tiles(tmp_path, capsys):
    from cuflash import cli

    with pytest.raises(SystemExit) as e:
        cli.main(["sweep", "--predict", "--head-dims", "80", "--out", str(tmp_path)])
    assert e.value.code == 2 and "invalid choice: 80" in capsys.readouterr().err


def test_host_us_per_call_counts_calls_and_waits():
    """bench.host_us_per_call: warm-up calls, then the timed calls between two waits; a positive time per call."""
    from cuflash import bench

    calls, waits = [], []
    us = bench.host_us_per_call(lambda: calls.append(1), calls=100, warmup=5, sync=lambda: waits.append(len(calls)))
    assert len(calls) == 105 and waits == [5, 105] and us > 0


def test_environment_names_the_sources(tmp_path, monkeypatch):
    """Every record carries the hashes of the kernel sources and of the Python package: the one of cuda_src/ is
    the kernel cache key's (_compile.source_hash), and a changed file changes it."""
    from cuflash import _compile, bench

    env = bench.environment()
    h = env["source_hashes"]
    assert h["cuda_src"] == _compile.source_hash() and len(h["cuda_src"]) == 16 and len(h["cuflash_py"]) == 16
    src = tmp_path / "cuda_src"
    src.mkdir()
    (src / "a.cu").write_text("x")
    monkeypatch.setattr(_compile, "SRC_DIR", src)
    _compile.source_hash.cache_clear()
    try:
        first = _compile.source_hash()
        (src / "a.cu").write_text("y")
        _compile.source_hash.cache_clear()
        assert _compile.source_hash() != first
    finally:
        monkeypatch.undo()
        _compile.source_hash.cache_clear()
    assert _compile.source_hash() == h["cuda_src"]
