"""Backtest metrics on tiny hand-computed series, and the `sla-planner backtest` CLI."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from planner.backtest import rolling_origin, score_forecasts
from planner.predictors.registry import make_predictor
from planner_cli.main import main as cli

NAN = math.nan


def minutes(n: int) -> np.ndarray:
    return 60.0 * np.arange(1, n + 1)


# ---------------------------------------------------------------- metrics


def test_score_forecasts_by_hand():
    # y = 10, 20, 30; forecasts 12, 18, 30; last value 8, 10, 20; p90 15, 19, 30
    s = score_forecasts([10, 20, 30], [12, 18, 30], [8, 10, 20], [15, 19, 30])
    assert s.mae == pytest.approx(4 / 3)  # |2| + |-2| + 0 = 4 over 3
    assert s.mase == pytest.approx((4 / 3) / (22 / 3))  # last value: 2 + 10 + 10 = 22
    assert s.bias == pytest.approx(0.0)  # +2 - 2 + 0
    assert s.under_rate == pytest.approx(1 / 3)  # only 18 < 20
    assert s.smape == pytest.approx((4 / 22 + 4 / 38 + 0) / 3)  # 2|e| / (|f| + |y|)
    assert s.p90_coverage == pytest.approx(2 / 3)  # 10 <= 15, 20 > 19, 30 <= 30
    assert s.n == 3


@pytest.mark.parametrize(
    "y, f, base, field, expected",
    [
        pytest.param([0, 0], [0, 0], [1, 1], "smape", 0.0, id="0/0 counts as 0 sMAPE"),
        pytest.param([0, 4], [2, 4], [0, 4], "mase", NAN, id="perfect baseline: MASE undefined (NaN)"),
        pytest.param([1, NAN, 3], [2, 99, 2], [1, 1, 1], "mae", 1.0, id="NaN target dropped: (1 + 1) / 2"),
        pytest.param([5, 5], [6, 7], [5, 5], "bias", 1.5, id="over-forecast bias (1 + 2) / 2"),
    ],
)
def test_score_forecasts_edge_cases(y, f, base, field, expected):
    got = getattr(score_forecasts(y, f, base), field)
    assert (math.isnan(got) and math.isnan(expected)) or got == pytest.approx(expected)


def test_score_forecasts_rejects_nan_forecasts_and_mismatch():
    with pytest.raises(ValueError, match="y_pred has NaN/inf where y_true is known"):
        score_forecasts([1, 2], [1, NAN], [1, 1])
    with pytest.raises(ValueError, match="y_pred has 1 values, y_true has 2"):
        score_forecasts([1, 2], [1], [1, 1])
    with pytest.raises(ValueError, match="no finite targets"):
        score_forecasts([NAN], [1], [1])


# ---------------------------------------------------------------- rolling origin


def test_rolling_origin_constant_by_hand():
    # y = 1, 2, 4, 7 from origin 1: forecasts 1, 2, 4 for 2, 4, 7 -> errors 1, 2, 3
    r = rolling_origin(minutes(4), [1, 2, 4, 7], ConstantFactory(), start=1)
    assert r.forecast.tolist() == [1, 2, 4]
    assert r.target_index.tolist() == [1, 2, 3]
    assert r.scores.mae == pytest.approx(2.0)
    assert r.scores.mase == pytest.approx(1.0)
    assert r.scores.under_rate == 1.0 and r.scores.bias == pytest.approx(-2.0)


def test_rolling_origin_k_step():
    # y = 1, 2, 4, 7, 11; horizon 2 from origin 2: forecast 2 for y[3]=7, 4 for y[4]=11
    r = rolling_origin(minutes(5), [1, 2, 4, 7, 11], ConstantFactory(), start=2, horizon=2)
    assert r.target_index.tolist() == [3, 4]
    assert r.scores.mae == pytest.approx((5 + 7) / 2)
    assert r.baseline.tolist() == [2, 4]


def test_rolling_origin_seasonal_naive_beats_last_value_on_a_cycle():
    # period-4 cycle 0, 10, 20, 10 repeated: seasonal naive is exact after one season
    y = [0, 10, 20, 10] * 6
    r = rolling_origin(minutes(24), y, lambda: make_predictor("seasonal_naive", season_s=240.0), start=5)
    assert r.scores.mae == 0.0 and r.scores.mase == 0.0


def test_rolling_origin_skips_missing_targets_and_uses_the_window():
    seen = []

    class Spy:
        def __init__(self):
            self.inner = make_predictor("constant")

        def fit(self, t, y):
            seen.append(len(y))
            self.inner.fit(t, y)
            return self

        def predict(self, h=1):
            return self.inner.predict(h)

        def predict_quantile(self, q, h=1):
            return self.inner.predict_quantile(q, h)

    r = rolling_origin(minutes(6), [1, 2, NAN, 4, 5, 6], Spy, start=2, window=3)
    # origins 2..5; target 2 is NaN (skipped); windows are the last <= 3 points
    assert r.target_index.tolist() == [3, 4, 5]
    assert seen == [3, 3, 3]
    assert r.scores.n == 3


def test_rolling_origin_coverage_from_the_predictor_quantile():
    r = rolling_origin(minutes(30), np.full(30, 7.0), ConstantFactory(), start=3)
    assert r.scores.p90_coverage == 1.0 and r.ms_per_step >= 0


@pytest.mark.parametrize(
    "kwargs, match",
    [
        pytest.param({"horizon": 0}, "horizon must be an integer >= 1", id="horizon 0"),
        pytest.param({"start": 0}, "start must be an integer >= 1", id="start 0"),
        pytest.param({"start": 9}, "series has 4 points, need at least start", id="too short"),
        pytest.param({"window": 0}, "window must be None or an integer >= 1", id="window 0"),
    ],
)
def test_rolling_origin_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        rolling_origin(minutes(4), [1, 2, 3, 4], ConstantFactory(), **kwargs)


class ConstantFactory:
    def __call__(self):
        return make_predictor("constant")


# ---------------------------------------------------------------- CLI


def test_cli_backtest_on_a_real_trace(shared_data, tmp_path, capsys):
    out = tmp_path / "bt.json"
    trace = shared_data / "traces" / "mooncake_fast25_synthetic_trace.jsonl.gz"
    rc = cli(["backtest", "--series", str(trace), "--bin-s", "120", "--predictor", "constant,kalman,auto",
              "--json", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    # 1,019 s of trace in 120 s bins: 8 whole bins (the partial ninth is dropped)
    assert doc["series"]["intervals"] == 8
    assert set(doc["predictors"]) == {"constant", "kalman", "auto"}
    for m in doc["predictors"].values():
        assert {"mae", "smape", "mase", "bias", "under_rate", "p90_coverage", "ms_per_step"} <= set(m)
    assert doc["predictors"]["constant"]["mase"] == 1.0
    assert "| auto |" in capsys.readouterr().out


def test_cli_backtest_csv_of_values(tmp_path):
    csv = tmp_path / "load.csv"
    csv.write_text("t_s,rps,other\n60,10,1\n120,12,1\n180,,1\n240,11,1\n300,13,1\n360,12,1\n420,14,1\n")
    out = tmp_path / "o.json"
    rc = cli(["backtest", "--series", str(csv), "--column", "rps", "--predictor", "constant",
              "--start", "2", "--json", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["series"]["missing"] == 1
    # targets 240..420 (180 missing): last values 12, 11, 13, 12 vs 11, 13, 12, 14 -> MAE (1+2+1+2)/4
    assert doc["predictors"]["constant"]["mae"] == pytest.approx(1.5)


@pytest.mark.parametrize(
    "content, args, message",
    [
        pytest.param("t_s,a,b\n60,1,2\n", [], "several value columns (a, b): choose one with --column", id="ambiguous"),
        pytest.param("t_s,a\n60,1\n", ["--column", "rps"], "no column 'rps'; columns: a", id="unknown column"),
        pytest.param("t_s,a\n60,1\n120,x\n", [], "line 3: column 'a': 'x' is not a number", id="bad cell"),
        pytest.param("t_s,a\n60,1\n", ["--predictor", "lstm"], "unknown predictor 'lstm'; valid: constant", id="unknown predictor"),
        pytest.param("t_s,a\n60,1\n120,2\n", [], "2 intervals, need at least --start + --horizon = 6", id="too short"),
    ],
)
def test_cli_backtest_bad_input_exits_2_naming_the_problem(tmp_path, capsys, content, args, message):
    path = tmp_path / "bad.csv"
    path.write_text(content)
    rc = cli(["backtest", "--series", str(path), *args])
    err = capsys.readouterr().err
    assert rc == 2
    assert message in err
    if "predictor" not in message:
        assert str(path) in err


def test_cli_backtest_missing_file(tmp_path, capsys):
    rc = cli(["backtest", "--series", str(tmp_path / "nope.csv")])
    assert rc == 2 and "nope.csv: file not found" in capsys.readouterr().err


def test_cli_backtest_servegen_masks_collection_gaps(shared_data, tmp_path):
    out = tmp_path / "sg.json"
    archive = shared_data / "traces" / "servegen_language_m-small.tar.gz"
    # 6-hour bins (36 windows each) keep this quick; a bin containing a gap window is masked
    rc = cli(["backtest", "--series", str(archive), "--bin-s", "21600", "--predictor", "constant",
              "--json", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["series"]["intervals"] == 56  # 14 days x 4
    assert doc["series"]["missing"] > 0
