"""The tile sweep's model-only PREDICTED mode (the main job on a machine without a GPU): runs on the CPU into a
temporary folder (``--out``), so committed results are never overwritten."""
import importlib
import importlib.util
import json
from pathlib import Path

import pytest

from cuflash import bench, gpus, traffic
from cuflash._dtypes import bfloat16

attention = importlib.import_module("cuflash.attention")  # the module (cuflash.attention is the function)

EXP = Path(__file__).resolve().parent.parent / "experiments"


def _tile_sweep():
    spec = importlib.util.spec_from_file_location("_cuflash_test_tile_sweep", EXP / "tile_sweep.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(autouse=True)
def _restore_results_dir(monkeypatch):
    monkeypatch.setattr(bench, "RESULTS", bench.RESULTS)
    monkeypatch.setattr(bench, "PLOTS", bench.PLOTS)


def _check(tmp_path, gpu="H200", batch=1, heads=4, seqlen=1024, stem="attention_tile_sweep_quick"):
    """The predicted sweep written under ``stem`` (the --quick runs below: attention_tile_sweep_quick)."""
    doc = json.loads((tmp_path / f"{stem}_predicted.json").read_text())
    meta, rows = doc["meta"], doc["rows"]
    assert meta["predicted"] is True and meta["gpu_table"] == gpu and "PREDICTED" in meta["note"]
    g = gpus.get(gpu)
    want = [(d, *c) for d in (64, 128) for c in attention.instantiated_tiles(bfloat16, d)
            if attention.smem_bytes(bfloat16, d, c[0], c[1]) <= g.smem_optin_per_block]
    assert [(r["head_dim"], r["Br"], r["Bc"], r["warps"]) for r in rows] == want
    for r in rows:
        assert r["mode"] == "predicted" and r["predicted_for"] == gpu
        assert (r["batch"], r["heads"], r["seqlen"], r["dtype"]) == (batch, heads, seqlen, "bfloat16")
        mb = traffic.attention_bytes("fa2", batch, heads, seqlen, seqlen, r["head_dim"], r["Br"], r["Bc"],
                                     "bfloat16", False)
        fl = traffic.attention_flops(batch, heads, seqlen, seqlen, r["head_dim"])
        assert r["model_bytes"] == mb
        assert r["ms"] == pytest.approx(gpus.predict_time_s(mb, fl, gpu, "bfloat16") * 1e3)
        assert r["tflops"] == pytest.approx(fl / (r["ms"] * 1e-3) / 1e12)
    # one default per head_dim; a larger Br never moves more modeled bytes
    assert sum(r["default"] for r in rows) == 2
    for d in (64, 128):
        rs = sorted((r for r in rows if r["head_dim"] == d), key=lambda r: r["Br"])
        assert [r["model_bytes"] for r in rs] == sorted((r["model_bytes"] for r in rs), reverse=True)
    assert (tmp_path / f"{stem}_predicted.csv").is_file()
    assert (tmp_path / "plots" / f"{stem}_predicted.png").stat().st_size > 1000
    assert not (tmp_path / f"{stem}.json").exists()  # no measured file is written
    assert not (tmp_path / "attention_tile_sweep_predicted.json").exists() or stem == "attention_tile_sweep"
    return rows


def test_tile_sweep_predict_flag_returns_0(tmp_path, capsys):
    rc = _tile_sweep().main(["--predict", "--quick", "--gpu", "H200", "--out", str(tmp_path)])
    assert rc == 0
    _check(tmp_path)
    assert "PREDICTED" in capsys.readouterr().out


def test_tile_sweep_predict_other_gpu_skips_what_does_not_fit(tmp_path):
    assert _tile_sweep().main(["--predict", "--quick", "--gpu", "A100", "--out", str(tmp_path)]) == 0
    rows = _check(tmp_path, gpu="A100")
    skipped = json.loads((tmp_path / "attention_tile_sweep_quick_predicted.json").read_text())["meta"]["skipped_smem"]
    assert all(s["smem_bytes"] > gpus.get("A100").smem_optin_per_block for s in skipped)
    assert len(rows) + len(skipped) == sum(len(attention.instantiated_tiles(bfloat16, d)) for d in (64, 128))


@pytest.mark.skipif(bench.has_gpu(), reason="checks the no-GPU path")
def test_tile_sweep_without_gpu_writes_predicted_and_exits_2(tmp_path, capsys):
    rc = _tile_sweep().main(["--quick", "--out", str(tmp_path)])
    assert rc == 2
    assert "no CUDA device visible" in capsys.readouterr().out
    _check(tmp_path)


@pytest.mark.skipif(bench.has_gpu(), reason="checks the no-GPU path")
def test_cli_sweep_without_gpu(tmp_path):
    from cuflash import cli

    assert cli.main(["sweep", "--quick", "--out", str(tmp_path)]) == 2
    _check(tmp_path)


def test_tile_sweep_without_gpu_leaves_committed_results_alone(tmp_path, monkeypatch, capsys):
    """No GPU, no --predict, no --out (the README's first command): exit 2 with its message, the PREDICTED files
    in a new temporary folder, never in experiments/results (or plots/)."""
    import tempfile

    mod = _tile_sweep()
    monkeypatch.setattr(bench, "has_gpu", lambda: False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    committed = EXP / "results" / "attention_tile_sweep_predicted.json"
    before = committed.read_bytes()
    assert mod.main([]) == 2
    out = capsys.readouterr().out
    assert "no CUDA device visible" in out and f"PREDICTED files go to {tmp_path}" in out
    (scratch,) = tmp_path.glob("cuflash_tile_sweep_*")
    _check(scratch, batch=4, heads=16, seqlen=4096, stem="attention_tile_sweep")
    assert committed.read_bytes() == before


def test_tile_sweep_quick_keeps_explicit_flags_and_says_when_rep_is_raised(capsys):
    mod = _tile_sweep()
    a = mod.parse_args(["--quick", "--batch", "2", "--seqlen", "512", "--rep", "25"])
    assert (a.batch, a.heads, a.seqlen, a.rep, a.warmup) == (2, 4, 512, 25, 2)
    assert a.name == "attention_tile_sweep_quick"
    assert mod.parse_args(["--quick", "--name", "mine"]).name == "mine"
    a = mod.parse_args([])
    assert (a.batch, a.heads, a.seqlen, a.rep, a.warmup, a.name) == (4, 16, 4096, 30, 5, "attention_tile_sweep")
    capsys.readouterr()
    assert mod.parse_args(["--rep", "5"]).rep == 20
    assert "--rep 5 raised to 20" in capsys.readouterr().out
    for bad in (["--rep", "0"], ["--batch", "-1"], ["--warmup", "-2"], ["--seqlen", "x"]):
        with pytest.raises(SystemExit) as e:
            mod.parse_args(bad)
        assert e.value.code == 2


def test_tile_sweep_usage_names_how_it_was_called(monkeypatch, capsys):
    from cuflash import cli

    mod = _tile_sweep()
    monkeypatch.setattr("sys.argv", [str(EXP / "tile_sweep.py")])
    with pytest.raises(SystemExit):
        mod.parse_args(["--help"])
    assert capsys.readouterr().out.startswith("usage: tile_sweep.py ")
    with pytest.raises(SystemExit):
        cli.main(["sweep", "--help"])
    assert capsys.readouterr().out.startswith("usage: cuflash sweep ")


def test_tile_sweep_replot_reads_the_committed_results_into_out(tmp_path):
    """--replot --out DIR: the committed experiments/results file (DIR has none), the plot into DIR/plots."""
    assert _tile_sweep().main(["--replot", "--predict", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "plots" / "attention_tile_sweep_predicted.png").stat().st_size > 1000
    with pytest.raises(SystemExit) as e:
        _tile_sweep().main(["--replot", "--name", "no_such_run", "--out", str(tmp_path)])
    assert "no results file" in str(e.value.code) and "no_such_run.json" in str(e.value.code)
