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


def _check(tmp_path, gpu="H200", batch=1, heads=4, seqlen=1024):
    doc = json.loads((tmp_path / "attention_tile_sweep_predicted.json").read_text())
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
    assert (tmp_path / "attention_tile_sweep_predicted.csv").is_file()
    assert (tmp_path / "plots" / "attention_tile_sweep_predicted.png").stat().st_size > 1000
    assert not (tmp_path / "attention_tile_sweep.json").exists()  # no measured file is written
    return rows


def test_tile_sweep_predict_flag_returns_0(tmp_path, capsys):
    rc = _tile_sweep().main(["--predict", "--quick", "--gpu", "H200", "--out", str(tmp_path)])
    assert rc == 0
    _check(tmp_path)
    assert "PREDICTED" in capsys.readouterr().out


def test_tile_sweep_predict_other_gpu_skips_what_does_not_fit(tmp_path):
    assert _tile_sweep().main(["--predict", "--quick", "--gpu", "A100", "--out", str(tmp_path)]) == 0
    rows = _check(tmp_path, gpu="A100")
    skipped = json.loads((tmp_path / "attention_tile_sweep_predicted.json").read_text())["meta"]["skipped_smem"]
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
