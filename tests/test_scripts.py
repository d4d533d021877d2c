"""The remaining experiment scripts' command lines on the CPU (as tests/test_cli.py for the sweeps): --quick keeps
explicit flags, a smoke or model-only run never writes under the committed names, size/dtype flags are validated,
a run without a GPU writes its prediction to --out or a temporary folder, never into experiments/results."""
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from cuflash import bench, ncu
from script_loader import load_script

ROOT = Path(__file__).resolve().parent.parent
EXP = ROOT / "experiments"


def _script(name):
    return load_script(name, "test_scripts")


@pytest.fixture(autouse=True)
def committed(tmp_path, monkeypatch):
    """bench.RESULTS / bench.PLOTS stand for the committed experiments/results and plots (tmp_path/committed);
    temporary folders are made under tmp_path/tmp. Returns the committed folder."""
    monkeypatch.setattr(bench, "RESULTS", tmp_path / "committed" / "results")
    monkeypatch.setattr(bench, "PLOTS", tmp_path / "committed" / "plots")
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    return tmp_path / "committed"


def _files(folder):
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


# ------------------------------------------------------------------------------------------ attention benchmarks
def test_attention_bwd_bench_quick_keeps_explicit_flags_and_rep_is_not_clamped():
    mod = _script("attention_bwd_bench")
    a = mod.parse_args(["--quick", "--seqlens", "512", "--head-dims", "64", "--dtypes", "float16", "--rep", "5",
                        "--warmup", "0"])
    assert (a.seqlens, a.head_dims, a.dtypes, a.rep, a.warmup) == ([512], [64], ["float16"], 5, 0)
    a = mod.parse_args(["--quick"])
    assert (a.seqlens, a.head_dims, a.dtypes, a.rep, a.warmup) == ([1024, 4096], [128], ["bfloat16"], 20, 3)
    a = mod.parse_args(["--rep", "5"])
    assert (a.rep, a.warmup, a.head_dims, a.dtypes) == (5, 5, [64, 128], ["bfloat16", "float16"])
    assert a.seqlens == [512, 1024, 2048, 4096, 8192, 16384] and a.masks == ["full", "causal"]


def test_attention_sm90_bench_quick_keeps_explicit_flags_and_rep_is_not_clamped():
    mod = _script("attention_sm90_bench")
    a = mod.parse_args(["--quick", "--seqlens", "4096", "--dtypes", "float16", "--rep", "3"])
    assert (a.seqlens, a.dtypes, a.rep, a.warmup, a.all_tiles) == ([4096], ["float16"], 3, 3, True)
    a = mod.parse_args(["--quick"])
    assert (a.seqlens, a.dtypes, a.rep, a.all_tiles) == ([2048, 16384], ["bfloat16"], 20, True)
    a = mod.parse_args(["--rep", "5"])
    assert (a.seqlens, a.dtypes, a.rep, a.all_tiles) == ([2048, 4096, 8192, 16384], ["bfloat16", "float16"], 5, False)


@pytest.mark.parametrize("name,plot", [("attention_bwd_bench", "attention_bwd_tflops"),
                                       ("attention_sm90_bench", "attention_sm90_tflops")])
def test_attention_quick_runs_have_their_own_names(name, plot):
    mod = _script(name)
    assert (lambda a: (a.name, a.plot))(mod.parse_args([])) == (name, plot)
    assert (lambda a: (a.name, a.plot))(mod.parse_args(["--quick"])) == (f"{name}_quick", f"{name}_quick")
    assert (lambda a: (a.name, a.plot))(mod.parse_args(["--quick", "--name", "mine"])) == ("mine", "mine")


@pytest.mark.parametrize("name", ["attention_bwd_bench", "attention_sm90_bench"])
def test_attention_benchmarks_without_gpu_exit_2(name, monkeypatch, capsys, committed):
    monkeypatch.setattr(bench, "has_gpu", lambda: False)
    assert _script(name).main(["--quick"]) == 2
    assert f"{name}: no CUDA device visible" in capsys.readouterr().out
    assert _files(committed) == []


# ------------------------------------------------------------------------------------------ predicted sweeps
def test_softmax_passes_and_norm_fusion_quick_keep_explicit_flags():
    sp = _script("softmax_passes")
    a = sp.parse_args(["--quick", "--elements", "1048576", "--cols", "4096", "--dtypes", "float16"])
    assert (a.elements, a.cols, a.dtypes) == (1 << 20, "4096", "float16")
    a = sp.parse_args(["--quick", "--elements", str(1 << 24)])
    assert (a.elements, a.cols, a.dtypes) == (1 << 24, "1024,16384,262144", "float32,bfloat16")
    assert sp.parse_args([]).dtypes == "float32,bfloat16,float16" and sp.parse_args([]).elements == 1 << 26
    nf = _script("norm_fusion")
    a = nf.parse_args(["--quick", "--shapes", "1024x512", "--dtypes", "float32"])
    assert (a.shapes, a.dtypes) == ("1024x512", "float32")
    assert (lambda a: (a.shapes, a.dtypes))(nf.parse_args(["--quick"])) == ("4096x1024,2048x4096", "bfloat16")
    assert nf.parse_args([]).dtypes == "bfloat16,float32"


def _quick_stem(name):
    """A --quick prediction's file stem: <name>_quick_predicted (never the committed <name>_predicted)."""
    return f"{name}_quick_predicted"


@pytest.mark.parametrize("name,rc", [("roofline", 0), ("softmax_passes", 0), ("norm_fusion", 0),
                                     ("traffic_check", 2)])
def test_without_gpu_the_prediction_goes_to_a_temporary_folder(name, rc, tmp_path, monkeypatch, capsys, committed):
    monkeypatch.setattr(bench, "has_gpu", lambda: False)
    assert _script(name).main(["--quick"]) == rc
    assert _files(committed) == []                                     # nothing over experiments/results or plots
    (scratch,) = (tmp_path / "tmp").glob(f"cuflash_{name}_*")
    stem = _quick_stem(name)
    assert _files(scratch) == sorted([f"plots/{stem}.png", f"{stem}.csv", f"{stem}.json"])
    assert json.loads((scratch / f"{stem}.json").read_text())["meta"]["predicted"] is True
    assert f"the PREDICTED files go to {scratch}" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["roofline", "softmax_passes", "norm_fusion", "traffic_check"])
def test_without_gpu_out_and_predict_choose_the_folder(name, tmp_path, monkeypatch, committed):
    monkeypatch.setattr(bench, "has_gpu", lambda: False)
    stem = _quick_stem(name)
    _script(name).main(["--quick", "--out", str(tmp_path / "mine")])
    assert (tmp_path / "mine" / f"{stem}.json").is_file() and _files(committed) == []
    monkeypatch.setattr(bench, "RESULTS", committed / "results")       # (--out moved it: a new process here)
    assert _script(name).main(["--quick", "--predict"]) == 0           # the explicit --predict: the results folder
    assert _files(committed) == [f"plots/{stem}.png", f"results/{stem}.csv", f"results/{stem}.json"]
    assert list((tmp_path / "tmp").iterdir()) == []


def test_traffic_check_ncu_failure_goes_to_a_temporary_folder_and_exits_1(tmp_path, monkeypatch, committed):
    mod = _script("traffic_check")
    real_device = mod.Device
    monkeypatch.setattr(mod, "Device", lambda gpu, real: real_device(gpu, False))
    monkeypatch.setattr(bench, "has_gpu", lambda: True)
    monkeypatch.setattr(ncu, "available", lambda: True)

    def broken(*args, **kw):
        raise ncu.NcuUnavailable("ncu: ERR_NVGPUCTRPERM")

    monkeypatch.setattr(ncu, "measure_many", broken)
    assert mod.main(["--quick"]) == 1
    assert _files(committed) == []
    (scratch,) = (tmp_path / "tmp").glob("cuflash_traffic_check_*")
    assert json.loads((scratch / "traffic_check_quick_predicted.json").read_text())["meta"]["ncu_error"]


def test_traffic_check_predict_from_the_command_line_exits_0(tmp_path):
    """The documented status of an explicit --predict run, as the shell sees it (python experiments/...)."""
    p = subprocess.run([sys.executable, str(EXP / "traffic_check.py"), "--predict", "--quick", "--out",
                        str(tmp_path / "o")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert (tmp_path / "o" / "traffic_check_quick_predicted.json").is_file()
    assert (tmp_path / "o" / "plots" / "traffic_check_quick_predicted.png").is_file()


# ------------------------------------------------------------------------------------------ numerics
def test_numerics_formats_quick_has_its_own_name(committed):
    mod = _script("numerics_formats")
    assert mod.main(["--quick"]) == 0
    assert _files(committed) == ["plots/numerics_formats_quick.png", "results/numerics_formats_quick.csv",
                                 "results/numerics_formats_quick.json"]
    (committed / "plots" / "numerics_formats_quick.png").unlink()
    assert mod.main(["--replot", "--quick"]) == 0
    assert (committed / "plots" / "numerics_formats_quick.png").is_file()


@pytest.mark.parametrize("name", ["numerics_softmax_overflow", "numerics_variance"])
def test_numerics_model_only_runs_never_replace_the_full_run(name, monkeypatch, capsys, committed):
    monkeypatch.setattr(bench, "has_gpu", lambda: False)
    mod = _script(name)
    assert mod.main(["--quick", "--n", "64"]) == 0                    # no GPU: the NumPy model only
    stem = f"{name}_quick_model_only"
    assert _files(committed) == [f"plots/{stem}.png", f"results/{stem}.csv", f"results/{stem}.json"]
    assert json.loads((committed / "results" / f"{stem}.json").read_text())["meta"]["n"] == 64
    assert mod.main(["--model-only", "--quick", "--name", "mine"]) == 0
    assert (committed / "results" / "mine.json").is_file() and (committed / "plots" / "mine.png").is_file()
    assert not (committed / "results" / f"{name}.json").exists()
    assert "no CUDA device visible" in capsys.readouterr().out


def test_numerics_variance_replots_the_named_run(committed):
    mod = _script("numerics_variance")
    assert mod.main(["--quick", "--model-only"]) == 0
    (committed / "plots" / "numerics_variance_quick_model_only.png").unlink()
    assert mod.main(["--replot", "--quick", "--model-only"]) == 0
    assert _files(committed / "plots") == ["numerics_variance_quick_model_only.png"]


def test_numerics_reduction_order_without_gpu_exits_2(monkeypatch, capsys, committed):
    monkeypatch.setattr(bench, "has_gpu", lambda: False)
    assert _script("numerics_reduction_order").main(["--quick", "--dtypes", "float16"]) == 2
    assert "no CUDA device visible" in capsys.readouterr().out and _files(committed) == []
