"""The control benchmark's comparison of a planner row with the static fleets (benchmarks/bench_sim.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "bench_sim", Path(__file__).resolve().parents[2] / "benchmarks" / "bench_sim.py")
bench_sim = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_sim)


def _row(policy: str, att: float, gph: float) -> dict:
    return {"policy": policy, "slo_attainment": att, "gpu_hours": gph}


@pytest.mark.parametrize("at_att, at_gph, dominated, saved", [
    (_row("best static (5x1)", 0.99, 6.0), _row("best static within planner's GPU-hours (4x1)", 0.95, 4.8), None,
     1 - 5.4 / 6.0),
    # the cheapest static reaching the planner's attainment is also cheaper: better on both
    (_row("best static (4x1)", 0.98, 5.0), None, "4x1", 1 - 5.4 / 5.0),
    # within the planner's GPU-hours a static fleet meets more requests: better on both
    (None, _row("best static within planner's GPU-hours (10x2)", 0.985, 5.4), "10x2", None),
    # a tie on both axes is no win
    (_row("best static (4x2)", 0.98, 5.4), None, None, 0.0),
])
def test_static_comparison(at_att, at_gph, dominated, saved):
    out = bench_sim.static_comparison(_row("planner", 0.98, 5.4), at_att, at_gph)
    assert out["dominated_by_static"] == dominated
    assert out["gpu_hours_saved_vs_static_frac"] == (None if saved is None else pytest.approx(saved))
    if at_att is not None:
        assert out["static_at_attainment"]["fleet"] == at_att["policy"].split("(")[-1].rstrip(")")


@pytest.mark.parametrize("policy, start", [("planner", "warm"), ("planner+served", "warm"), ("planner+cold", "cold"),
                                           ("planner+warm+hpa", "warm-up trace"), ("planner+running+served", "running"),
                                           ("static:4x2", "n/a"), ("best static (5x1)", "n/a"), ("oracle", "n/a")])
def test_start_of(policy, start):
    assert bench_sim.start_of(policy) == start


def test_trace_load_model_names_copies_and_the_servegen_day():
    assert "independent tenants" in bench_sim.trace_load_model("azure2023_code x8", 30.0)
    assert "synchronised" in bench_sim.trace_load_model("mooncake x2", 1.0)
    assert "no copies" in bench_sim.trace_load_model("servegen m-mid day 1 x0.02", 30.0)
