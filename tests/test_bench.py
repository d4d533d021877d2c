"""cuflash.bench on the CPU: errors() (non-finite outputs, zero references, shapes), write_results() (CSV quoting,
strict JSON, sub-folders, gpu/commit columns), table() and time_cuda()'s argument checks."""
import csv
import json
import math
import re

import numpy as np
import pytest

from cuflash import bench

INF, NAN = math.inf, math.nan


# ------------------------------------------------------------------------------------------------ errors
@pytest.mark.parametrize("out_bad,ref_bad", [(NAN, 1.0), (INF, 1.0), (-INF, 1.0), (1.0, NAN), (1.0, INF),
                                             (INF, -INF), (NAN, INF), (-INF, NAN)])
def test_errors_nonfinite_mismatch_is_an_infinite_error(out_bad, ref_bad):
    """A position whose finiteness differs makes the errors inf; positions where both hold the same non-finite
    value agree and leave the errors of the finite positions as they are."""
    out = np.array([INF, -INF, NAN, 1.0, 2.0])
    ref = np.array([INF, -INF, NAN, 1.5, 2.0])
    e = bench.errors(out, ref)
    assert e == {"max_abs_err": 0.5, "max_rel_err": pytest.approx(1 / 3), "mean_abs_err": 0.25,
                 "nonfinite_mismatch": 0}
    out[4], ref[4] = out_bad, ref_bad
    e = bench.errors(out, ref)
    assert e["nonfinite_mismatch"] == 1
    assert math.isinf(e["max_abs_err"]) and math.isinf(e["max_rel_err"])


def test_errors_relative_error_divides_by_at_least_1e_30():
    """max_rel_err = max |out-ref| / max(|ref|, 1e-30): a zero reference with a nonzero output is not hidden."""
    e = bench.errors(np.array([1.0, 0.0, 2.0]), np.array([0.0, 0.0, 2.0]))
    assert e["max_abs_err"] == 1.0
    assert e["max_rel_err"] == pytest.approx(1e30)
    assert bench.errors(np.zeros(3), np.zeros(3))["max_rel_err"] == 0.0


@pytest.mark.parametrize("out_shape,ref_shape", [((2,), (2, 2)), ((2, 2), (2,)), ((1, 3), (3,))])
def test_errors_refuses_different_shapes(out_shape, ref_shape):
    with pytest.raises(ValueError, match=re.escape(str(out_shape)) + ".*" + re.escape(str(ref_shape))):
        bench.errors(np.ones(out_shape), np.ones(ref_shape))


# ------------------------------------------------------------------------------------------------ write_results
@pytest.fixture
def results(tmp_path, monkeypatch):
    """bench.RESULTS in a temporary folder and a fixed environment."""
    monkeypatch.setattr(bench, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(bench, "environment", lambda: {"gpu": "Test GPU, rev 2", "commit": "abc123", "x": INF})
    return tmp_path / "results"


def _read_csv(path):
    with open(path, newline="") as f:
        return list(csv.reader(f))


def test_write_results_csv_quotes_values_and_names_gpu_and_commit(results):
    rows = [{"path": 'path "cluster", C=2', "ms": 0.123456789, "note": None},
            {"path": "plain", "ms": np.float32(2.5), "gpu": "row's own"}]
    bench.write_results("t", rows)
    got = _read_csv(results / "t.csv")
    assert got[0] == ["path", "ms", "note", "gpu", "commit"]
    assert got[1] == ['path "cluster", C=2', "0.123457", "", "Test GPU, rev 2", "abc123"]
    assert got[2] == ["plain", "2.5", "", "row's own", "abc123"]


def test_write_results_json_is_strict_with_nonfinite_as_strings(results):
    rows = [{"a": NAN, "b": INF, "c": -INF, "d": np.float32("nan"), "e": [1.0, INF], "f": 0.5}]
    path = bench.write_results("t", rows, {"m": (np.float64("-inf"), 2)})

    def refuse(c):
        raise ValueError(f"non-strict JSON constant {c}")

    doc = json.loads(path.read_text(), parse_constant=refuse)
    assert doc["rows"] == [{"a": "nan", "b": "inf", "c": "-inf", "d": "nan", "e": [1.0, "inf"], "f": 0.5}]
    assert doc["meta"] == {"m": ["-inf", 2]}
    assert doc["environment"]["x"] == "inf"


def test_write_results_creates_a_sub_folder_and_refuses_paths_outside(results):
    path = bench.write_results("logs/run_1", [{"a": 1}])
    assert path == results / "logs" / "run_1.json" and path.is_file()
    assert (results / "logs" / "run_1.csv").is_file()
    for bad in ("../outside", "/tmp/outside", ""):
        with pytest.raises(ValueError, match="name"):
            bench.write_results(bad, [{"a": 1}])
    assert not (results.parent / "outside.json").exists()


# ------------------------------------------------------------------------------------------------ table
def test_table_empty_none_escaped_bars_and_numpy_floats():
    t = bench.table([{"a": None, "b": "x|y", "c": np.float32(1 / 3), "d": np.float64(2 / 3), "e": 1 / 7}],
                    list("abcdef"))
    assert t.splitlines() == ["| a | b | c | d | e | f |", "|---|---|---|---|---|---|",
                              "|  | x\\|y | 0.3333 | 0.6667 | 0.1429 |  |"]


# ------------------------------------------------------------------------------------------------ time_cuda
@pytest.mark.parametrize("kw,word", [({"rep": 0}, "rep"), ({"rep": -1}, "rep"), ({"warmup": -1}, "warmup")])
def test_time_cuda_refuses_bad_counts_before_launching(kw, word):
    calls = []
    with pytest.raises(ValueError, match=word):
        bench.time_cuda(lambda: calls.append(1), **kw)
    assert calls == []
