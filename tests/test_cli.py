"""The ``cuflash`` command and the experiment scripts' command lines, on the CPU: exit statuses, --quick against
explicit flags, argument validation, the names a smoke run writes under, the no-GPU paths. Nothing is written
into the checkout (results and plots are pointed at tmp_path)."""
import ast
import json
import sys
from pathlib import Path

import pytest

from cuflash import bench, cli
from script_loader import load_script

EXP = Path(__file__).resolve().parent.parent / "experiments"


def _script(name):
    return load_script(name, "test_cli")


@pytest.fixture(autouse=True)
def _results_in_tmp(tmp_path, monkeypatch):
    """Every write of bench.write_results and every plot of bench.PLOTS lands in tmp_path."""
    monkeypatch.setattr(bench, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(bench, "PLOTS", tmp_path / "plots")


# ------------------------------------------------------------------------------------------ exit statuses
@pytest.mark.parametrize("body,rc", [("return [{'row': 1}]", 0), ("return None", 0), ("return 3", 3),
                                     ("return 'done'", 0), ("pass", 0)])
def test_run_script_takes_only_an_int_as_the_exit_status(tmp_path, monkeypatch, body, rc):
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "stand_in.py").write_text(f"def main(argv=None):\n    {body}\n")
    monkeypatch.setattr(cli, "ROOT", tmp_path)
    argv = list(sys.argv)
    assert cli.main(["run", "stand_in", "--x"]) == rc
    assert sys.argv == argv  # restored after the script ran


def _main_returns(path):
    """The expressions main() of ``path`` returns (its own body: not those of nested functions or lambdas)."""
    tree = ast.parse(path.read_text())
    main = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"), None)
    out, todo = [], list(main.body) if main else []
    while todo:
        n = todo.pop()
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        if isinstance(n, ast.Return):
            out.append(n.value)
        todo.extend(ast.iter_child_nodes(n))
    return out


def _exit_status_like(e):
    """An int literal, None, a conditional between such, or a call (a helper returning the exit status)."""
    if e is None or isinstance(e, ast.Call):
        return True
    if isinstance(e, ast.Constant):
        return e.value is None or (isinstance(e.value, int) and not isinstance(e.value, bool))
    if isinstance(e, ast.IfExp):
        return _exit_status_like(e.body) and _exit_status_like(e.orelse)
    return False


@pytest.mark.parametrize("path", sorted(p for p in EXP.glob("*.py") if not p.name.startswith("_")),
                         ids=lambda p: p.stem)
def test_every_experiment_main_returns_an_exit_status(path):
    bad = [ast.unparse(e) for e in _main_returns(path) if not _exit_status_like(e)]
    assert not bad, f"{path.name}: main returns {bad} (an exit status is an int or None)"


# ------------------------------------------------------------------------------------------ no GPU
@pytest.mark.parametrize("name", ["softmax_sweep", "attention_bench"])
def test_sweeps_without_gpu_say_so_and_exit_2(name, monkeypatch, capsys):
    monkeypatch.setattr(bench, "has_gpu", lambda: False)
    assert _script(name).main(["--quick"]) == 2
    assert f"{name}: no CUDA device visible" in capsys.readouterr().out
    assert cli.main(["run", name, "--quick"]) == 2


def test_softmax_sweep_help_description_is_whole(capsys):
    mod = _script("softmax_sweep")
    first = mod.__doc__.split("\n")[0]
    assert first.endswith(".") and not first.rstrip(".").endswith(",")
    with pytest.raises(SystemExit):
        mod.parse_args(["--help"])
    assert "and a copy." in capsys.readouterr().out


# ------------------------------------------------------------------------------------------ --quick and flags
def test_softmax_sweep_quick_keeps_explicit_flags():
    mod = _script("softmax_sweep")
    a = mod.parse_args(["--quick", "--mib", "8", "--cols", "1024", "--rep", "3"])
    assert (a.mib, a.cols, a.rep) == (8, "1024", 3)
    a = mod.parse_args(["--quick"])
    assert (a.mib, a.cols, a.rep) == (64, "1024,16384,65536,1048576", 5)
    a = mod.parse_args([])
    assert (a.mib, a.cols.split(",")[0], a.cols.split(",")[-1], a.rep) == (256, "1024", "1048576", 20)


def test_attention_bench_quick_keeps_explicit_flags_and_rep_is_not_clamped():
    mod = _script("attention_bench")
    a = mod.parse_args(["--quick", "--seqlens", "512", "--dtypes", "float16", "--rep", "5"])
    assert (a.seqlens, a.dtypes, a.rep, a.warmup) == ([512], ["float16"], 5, 3)
    a = mod.parse_args(["--quick"])
    assert (a.seqlens, a.dtypes, a.rep, a.warmup) == ([1024, 4096], ["bfloat16"], 20, 3)
    a = mod.parse_args(["--rep", "5"])
    assert a.rep == 5 and a.dtypes == ["bfloat16", "float16"] and a.seqlens[0] == 512 and a.warmup == 5
    assert mod.per_round(5) * mod.ROUNDS == 20 and mod.per_round(30) == 6  # what the timing does with --rep


def test_fig2_and_amp_quick_keep_explicit_flags():
    a = _script("fig2").parse_args(["--quick", "--batch", "8"])
    assert (a.batch, a.name) == (8, "fig2_quick")
    assert _script("fig2").parse_args(["--quick"]).batch == 4
    assert _script("fig2").parse_args([]).batch == 64
    amp = _script("amp_training")
    a = amp.parse_args(["--quick", "--steps", "10"])
    assert (a.steps, a.growth_interval) == (10, 50)
    a = amp.parse_args(["--growth-interval", "7"])
    assert (a.steps, a.growth_interval) == (2000, 7)


# ------------------------------------------------------------------------------------------ validation
@pytest.mark.parametrize("name,argv,says", [
    ("attention_bench", ["--dtypes", "float32"], "invalid choice: 'float32'"),
    ("attention_bench", ["--rep", "0"], "must be a positive integer"),
    ("attention_bench", ["--seqlens", "-512"], "must be a positive integer"),
    ("attention_bench", ["--warmup", "-1"], "must be an integer >= 0"),
    ("softmax_sweep", ["--dtypes", "float32,float64"], "'float64' not among float32, float16, bfloat16"),
    ("softmax_sweep", ["--methods", "online,fast"], "'fast' not among online, safe, naive"),
    ("softmax_sweep", ["--mib", "-1"], "must be a positive integer"),
    ("softmax_sweep", ["--rep", "0"], "must be a positive integer"),
    ("softmax_sweep", ["--cols", "1024,0"], "comma-separated positive integers"),
    ("fig2", ["--dtype", "float32"], "invalid choice: 'float32'"),
    ("fig2", ["--batch", "0"], "must be a positive integer"),
    ("fig2", ["--block-sizes", "16,x"], "comma-separated positive integers"),
    ("amp_training", ["--steps", "0"], "must be a positive integer"),
    ("amp_training", ["--lr", "-0.1"], "must be a positive number"),
    ("amp_training", ["--init-scale", "nan"], "must be a positive number"),
    ("attention_bwd_bench", ["--rep", "0"], "must be a positive integer"),
    ("attention_bwd_bench", ["--warmup", "-1"], "must be an integer >= 0"),
    ("attention_bwd_bench", ["--head-dims", "0"], "must be a positive integer"),
    ("attention_sm90_bench", ["--rep", "0"], "must be a positive integer"),
    ("attention_sm90_bench", ["--dtypes", "float32"], "invalid choice: 'float32'"),
    ("roofline", ["--rep", "0"], "must be a positive integer"),
    ("softmax_passes", ["--elements", "0"], "must be a positive integer"),
    ("softmax_passes", ["--cols", "1024,x"], "comma-separated positive integers"),
    ("softmax_passes", ["--dtypes", "float32,int8"], "'int8' not among"),
    ("softmax_passes", ["--ncu-timeout", "0"], "must be a positive number"),
    ("norm_fusion", ["--shapes", "4096x0"], "TOKENSxHIDDEN"),
    ("norm_fusion", ["--shapes", "4096"], "TOKENSxHIDDEN"),
    ("norm_fusion", ["--dtypes", "int8"], "'int8' not among"),
    ("norm_fusion", ["--kinds", "batch"], "'batch' not among layer, rms"),
    ("traffic_check", ["--timeout", "-5"], "must be a positive number"),
    ("numerics_reduction_order", ["--n", "0"], "must be a positive integer"),
    ("numerics_reduction_order", ["--dtypes", "float64"], "'float64' not among"),
    ("numerics_softmax_overflow", ["--n", "-3"], "must be a positive integer"),
    ("numerics_variance", ["--n", "0"], "must be a positive integer"),
])
def test_nonsense_arguments_are_usage_errors(name, argv, says, capsys):
    """Every experiment script's bad flags are argparse usage errors (exit 2) that say what is wrong."""
    mod = _script(name)
    with pytest.raises(SystemExit) as e:
        mod.parse_args(argv) if hasattr(mod, "parse_args") else mod.main(argv)
    assert e.value.code == 2
    assert says in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ smoke-run names
@pytest.mark.parametrize("name,plot", [("softmax_sweep", "softmax_bandwidth"), ("attention_bench", "attention_tflops")])
def test_quick_runs_have_their_own_names(name, plot):
    mod = _script(name)
    a = mod.parse_args([])
    assert (a.name, a.plot) == (name, plot)                       # the committed full run
    a = mod.parse_args(["--quick"])
    assert (a.name, a.plot) == (f"{name}_quick", f"{name}_quick")  # never over it
    a = mod.parse_args(["--quick", "--name", "mine"])
    assert (a.name, a.plot) == ("mine", "mine")                   # what the user asked for
    assert mod.parse_args(["--name", name]).plot == plot


def test_run_names_helper():
    sys.path.insert(0, str(EXP))
    try:
        from _common import run_names
    finally:
        sys.path.remove(str(EXP))
    from argparse import Namespace

    assert run_names(Namespace(name=None, quick=False), "norm_sweep", "norm_bandwidth") == "norm_bandwidth"
    a = Namespace(name=None, quick=True)
    assert run_names(a, "norm_sweep", "norm_bandwidth") == "norm_sweep_quick" and a.name == "norm_sweep_quick"
    a = Namespace(name=None, quick=True)
    assert run_names(a, "amp_training", "amp_training", "model_only") == "amp_training_quick_model_only"
    a = Namespace(name="x", quick=True)
    assert run_names(a, "norm_sweep", "norm_bandwidth") == "x" and a.name == "x"


def test_amp_training_quick_model_only_does_not_replace_the_full_run(tmp_path, capsys):
    assert _script("amp_training").main(["--quick", "--model-only"]) == 0
    res, plots = tmp_path / "results", tmp_path / "plots"
    assert sorted(p.name for p in res.iterdir()) == ["amp_training_quick_model_only.csv",
                                                    "amp_training_quick_model_only.json"]
    assert [p.name for p in plots.iterdir()] == ["amp_training_quick_model_only.png"]
    doc = json.loads((res / "amp_training_quick_model_only.json").read_text())
    assert doc["meta"]["c_skipped"] is True and doc["meta"]["args"]["quick"] is True
    # and it replots under its own name too
    (plots / "amp_training_quick_model_only.png").unlink()
    assert _script("amp_training").main(["--replot", "--quick", "--model-only"]) == 0
    assert (plots / "amp_training_quick_model_only.png").is_file()


# ------------------------------------------------------------------------------------------ --replot
def test_fig2_replot_reads_committed_results_and_writes_into_out(tmp_path, capsys):
    out = tmp_path / "x"
    assert _script("fig2").main(["--replot", "--out", str(out)]) == 0
    assert (out / "plots" / "fig2.png").stat().st_size > 1000
    assert f"rows from {EXP / 'results' / 'fig2.json'}" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        _script("fig2").main(["--replot", "--name", "no_such_run", "--out", str(out)])
    assert "no results file" in str(e.value.code) and "no_such_run.json" in str(e.value.code)


def test_fig2_without_gpu_leaves_committed_results_alone(tmp_path, monkeypatch, capsys):
    import tempfile

    monkeypatch.setattr(bench, "has_gpu", lambda: False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    before = (EXP / "results" / "fig2_predicted.json").read_bytes()
    assert _script("fig2").main([]) == 0
    (scratch,) = tmp_path.glob("cuflash_fig2_*")
    assert (scratch / "fig2_predicted.json").is_file() and (scratch / "plots" / "fig2_predicted.png").is_file()
    assert (EXP / "results" / "fig2_predicted.json").read_bytes() == before


def test_attention_bench_replot_into_plots(tmp_path):
    assert _script("attention_bench").main(["--replot"]) == 0
    assert (tmp_path / "plots" / "attention_tflops.png").stat().st_size > 1000
