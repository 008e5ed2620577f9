"""The what-if CLI on every shipped trace format, and the what-if / sweep flows under Prefect."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from planner_cli.main import main
from sim.whatif.report import floor_words, markdown_report
from sim.whatif.scenario import WhatIfScenario
from tests.support.fixtures_prefect import prefect_harness  # noqa: F401  (fixture)

JSON_KEYS = {"requests", "slo_attainment", "ttft_ms", "itl_ms", "gpu_hours", "oracle_gpu_hours", "scale_events", "wall_s"}


def _small_azure(shared_data: Path, tmp_path: Path, *, minutes: int = 4, bad_line: str | None = None) -> Path:
    """The first `minutes` of azure2023_conv as a gzip CSV (optionally with a bad line 3)."""
    lines = gzip.open(shared_data / "traces" / "azure2023_conv.csv.gz", "rt").read().splitlines()
    keep = [lines[0]]
    first_min = int(lines[1][14:16])
    for line in lines[1:]:
        if (int(line[14:16]) - first_min) % 60 >= minutes:
            break
        keep.append(line)
    if bad_line is not None:
        keep.insert(2, bad_line)
    out = tmp_path / "conv-small.csv.gz"
    out.write_bytes(gzip.compress(("\n".join(keep) + "\n").encode()))
    return out


def _cli(trace: Path, profile: Path, *extra: str) -> list[str]:
    return ["what-if", "--trace", str(trace), "--profile", str(profile), "--ttft-ms", "200", "--itl-ms", "10",
            "--no-progress", *extra]


@pytest.mark.parametrize(
    "trace_name, extra",
    [
        pytest.param("azure2023_code.csv.gz", ["--policy", "static:2x1"], id="azure code CSV"),
        pytest.param("mooncake_fast25_synthetic_trace.jsonl.gz", ["--policy", "planner"], id="mooncake JSONL"),
        pytest.param(
            "servegen_language_m-small.tar.gz",
            ["--policy", "planner", "--servegen-duration-s", "600", "--servegen-rate-scale", "0.002"],
            id="servegen archive, 10 min at 0.2% of the rate",
        ),
    ],
)
def test_cli_on_every_trace_format(shared_data, h200_profile_dir, tmp_path, capsys, trace_name, extra):
    out = tmp_path / "out" / "s.json"
    code = main(_cli(shared_data / "traces" / trace_name, h200_profile_dir, *extra, "--json", str(out)))
    assert code == 0
    s = json.loads(out.read_text())
    assert JSON_KEYS <= set(s)
    assert s["requests"] > 100 and s["completed"] == s["requests"]
    assert 0 <= s["slo_attainment"] <= 1
    assert s["ttft_ms"]["p50"] <= s["ttft_ms"]["p90"] <= s["ttft_ms"]["p99"]
    assert s["gpu_hours"] > 0 and s["oracle_gpu_hours"] is None
    assert "SLA attainment" in capsys.readouterr().out


def test_cli_load_multiplier_and_oracle(shared_data, h200_profile_dir, tmp_path):
    trace = _small_azure(shared_data, tmp_path, minutes=4)
    out1, out3 = tmp_path / "x1.json", tmp_path / "x3.json"
    assert main(_cli(trace, h200_profile_dir, "--policy", "static:1x1", "--json", str(out1))) == 0
    assert main(_cli(trace, h200_profile_dir, "--policy", "planner", "--load-multiplier", "3", "--with-oracle",
                     "--json", str(out3))) == 0
    s1, s3 = json.loads(out1.read_text()), json.loads(out3.read_text())
    assert s3["requests"] == 3 * s1["requests"]
    assert s3["oracle_gpu_hours"] is not None and s3["oracle_gpu_hours"] > 0
    # the hindsight-reactive holds, shortest first, up to the first reaching the planner's attainment
    tried = s3["hindsight_reactive_tried"]
    assert [w for w, _, _ in tried] == [1, 2, 3, 5, 8, 12, 20][: len(tried)]
    assert all(a < s3["slo_attainment"] for _, a, _ in tried[:-1])
    assert s1["hindsight_reactive_tried"] is None
    # static 1x1 for the whole replay: 2 GPUs x simulated time
    assert s1["gpu_hours"] == pytest.approx(2 * s1["simulated_s"] / 3600)


def test_cli_warms_the_planner_from_a_trace(shared_data, h200_profile_dir, tmp_path, capsys):
    # --warmup-trace seeds the planner's load predictor as predictor.warmup_trace_path does in the deployment:
    # the first runs forecast from the warm-up trace's load, so they size (and bill) differently from a cold
    # start, and the summary names the trace.
    code = shared_data / "traces" / "azure2023_code.csv.gz"
    warm_trace = _small_azure(shared_data, tmp_path, minutes=12)
    cold_out, warm_out = tmp_path / "cold.json", tmp_path / "warm.json"
    args = ("--policy", "planner")
    assert main(_cli(code, h200_profile_dir, *args, "--json", str(cold_out))) == 0
    assert main(_cli(code, h200_profile_dir, *args, "--warmup-trace", str(warm_trace), "--json", str(warm_out))) == 0
    cold, warm = json.loads(cold_out.read_text()), json.loads(warm_out.read_text())
    assert cold["warmup_trace_path"] is None and warm["warmup_trace_path"] == str(warm_trace)
    assert warm["requests"] == cold["requests"] and warm["gpu_hours"] != cold["gpu_hours"]
    out = capsys.readouterr().out
    assert f"predictor warmed from {warm_trace}" in out
    # The warm-up's start floor: how many runs it raised and to what, in the summary, its printout and the report.
    floor = warm["warmup_floor"]
    assert cold["warmup_floor"] is None and set(floor) == {"runs", "prefill", "decode"}
    assert floor_words(floor) in out and floor_words(floor) in markdown_report(warm)


def test_a_warm_up_of_the_service_meets_the_first_burst(shared_data, h200_profile_dir, tmp_path, capsys):
    # Eight independent tenants of the bursty code trace: the cold start meets minute 3's burst (3,366 requests
    # after 477, 27 and 276) with the fleet minute 0 needed. Warmed from another hour of the same service (the
    # trace rotated by half, the same eight copies drawn again), the first run scales the fleet up to what that
    # hour's last minutes needed (the start floor), and the burst is met (docs/control.md).
    from workloads.traces import load_trace, multiply_load, rotate_time, write_mooncake_jsonl

    code = shared_data / "traces" / "azure2023_code.csv.gz"
    hour = load_trace(code)
    before = multiply_load(rotate_time(hour, (int(hour.duration_s // 60) + 1) * 30.0), 8, seed=100, jitter_s=30.0)
    warm_trace = write_mooncake_jsonl(before, tmp_path / "before.jsonl")
    cold_out, warm_out = tmp_path / "cold.json", tmp_path / "warm.json"
    args = ("--policy", "planner", "--load-multiplier", "8")
    assert main(_cli(code, h200_profile_dir, *args, "--json", str(cold_out))) == 0
    assert main(_cli(code, h200_profile_dir, *args, "--warmup-trace", str(warm_trace), "--json", str(warm_out))) == 0
    cold, warm = json.loads(cold_out.read_text()), json.loads(warm_out.read_text())
    assert warm["slo_attainment"] >= 0.99 > cold["slo_attainment"]
    assert warm["warmup_floor"]["runs"] >= 1 and warm["warmup_floor"]["prefill"] >= 3
    assert "the warm-up's floor raised prefill to" in capsys.readouterr().out


@pytest.mark.parametrize("floor, words", [
    ({"runs": 3, "prefill": 4, "decode": 0}, "the warm-up's floor raised prefill to 4 (3 run(s))"),
    ({"runs": 1, "prefill": 5, "decode": 2}, "the warm-up's floor raised prefill to 5, decode to 2 (1 run(s))"),
    ({"runs": 0, "prefill": 0, "decode": 0}, "the warm-up's floor raised no target (the sizing was above it)"),
])
def test_floor_words(floor, words):
    assert floor_words(floor) == words


def test_cli_starts_the_planner_against_a_running_fleet(shared_data, h200_profile_dir, tmp_path, capsys):
    # --lead-in replays a trace of the time before through the fleet and the planner first, unscored: on eight
    # independent tenants of the bursty code trace, the minute-3 burst that a cold start misses meets the
    # capacity the lead-in left held (docs/control.md, "A warm start and a running start").
    code = shared_data / "traces" / "azure2023_code.csv.gz"
    cold_out, running_out = tmp_path / "cold.json", tmp_path / "running.json"
    args = ("--policy", "planner", "--load-multiplier", "8")
    assert main(_cli(code, h200_profile_dir, *args, "--json", str(cold_out))) == 0
    assert main(_cli(code, h200_profile_dir, *args, "--lead-in", str(code), "--json", str(running_out))) == 0
    cold, running = json.loads(cold_out.read_text()), json.loads(running_out.read_text())
    assert cold["lead_in_trace_path"] is None and running["lead_in_trace_path"] == str(code)
    assert running["requests"] == cold["requests"]
    assert running["slo_attainment"] >= 0.99 > cold["slo_attainment"]
    assert f"started after {code}" in capsys.readouterr().out
    # The what-if flows' report artifact says how the planner started.
    assert f"| planner start | after {code}, replayed first and not scored (a running fleet) |" in (
        markdown_report(running))
    assert "planner start" not in markdown_report(cold)
    assert main(_cli(code, h200_profile_dir, *args, "--lead-in", str(tmp_path / "missing.csv"))) == 2
    assert "missing.csv" in capsys.readouterr().err


def test_cli_turns_on_the_recurrence_hold(shared_data, h200_profile_dir, tmp_path, capsys):
    # --recurrence-hold-s sets decision.independent_stabilization_s for the planner: on eight independent tenants
    # of the bursty code trace it lets lone bursts go (fewer GPU-hours; docs/control.md) and the summary says so.
    code = shared_data / "traces" / "azure2023_code.csv.gz"
    off, on = tmp_path / "off.json", tmp_path / "on.json"
    args = ("--policy", "planner", "--load-multiplier", "8")
    assert main(_cli(code, h200_profile_dir, *args, "--json", str(off))) == 0
    assert main(_cli(code, h200_profile_dir, *args, "--recurrence-hold-s", "360", "--json", str(on))) == 0
    s_off, s_on = json.loads(off.read_text()), json.loads(on.read_text())
    assert s_off["recurrence_hold_s"] is None and s_on["recurrence_hold_s"] == 360.0
    assert s_on["requests"] == s_off["requests"] and s_on["gpu_hours"] < s_off["gpu_hours"]
    assert "recurrence hold 360 s" in capsys.readouterr().out
    assert "| scale-down hold | recurrence hold, 360 s (rank 2) |" in markdown_report(s_on)
    assert "scale-down hold" not in markdown_report(s_off)
    assert main(_cli(code, h200_profile_dir, *args, "--recurrence-hold-s", "0")) == 2
    assert "recurrence_hold_s" in capsys.readouterr().err


def test_cli_sets_planner_fields(shared_data, h200_profile_dir, tmp_path, capsys):
    # --set FIELD=VALUE sets any planner configuration field for the planner policies: on eight independent
    # tenants of the bursty code trace, the previous default (burst sizing while arrivals look independent,
    # HPA's 300 s hold alone, the p90 basis from one clumping reading at 1.8) costs more GPU-hours than the
    # default's flat sizing under an hour's floor (docs/control.md); the summary, its output and the report say
    # what was set.
    code = shared_data / "traces" / "azure2023_code.csv.gz"
    base, tuned = tmp_path / "base.json", tmp_path / "tuned.json"
    args = ("--policy", "planner", "--load-multiplier", "8")
    sets = ("--set", "sizing.independent_burst_basis=null", "--set", "decision.scale_down_floor_s=null",
            "--set", "predictor.clumping_runs=1", "--set", "predictor.clumping_max_index=1.8")
    assert main(_cli(code, h200_profile_dir, *args, "--json", str(base))) == 0
    assert main(_cli(code, h200_profile_dir, *args, *sets, "--json", str(tuned))) == 0
    s_base, s_tuned = json.loads(base.read_text()), json.loads(tuned.read_text())
    assert s_base["planner_settings"] == {}
    assert s_tuned["planner_settings"] == {"sizing.independent_burst_basis": None,
                                           "decision.scale_down_floor_s": None,
                                           "predictor.clumping_runs": 1, "predictor.clumping_max_index": 1.8}
    assert s_tuned["requests"] == s_base["requests"] and s_tuned["gpu_hours"] > s_base["gpu_hours"]
    assert "predictor.clumping_max_index = 1.8" in capsys.readouterr().out
    assert "| planner settings | sizing.independent_burst_basis = " in markdown_report(s_tuned)
    assert "planner settings" not in markdown_report(s_base)
    for bad, needle in ((("--set", "decision.no_such_field=1"), "'decision.no_such_field': the planner "
                         "configuration has no such field"),
                        (("--set", "sizing.independent_burst_basis=sometimes"), "independent_burst_basis"),
                        (("--set", "decision.scale_down_stabilization_s"), "expected FIELD=VALUE")):
        assert main(_cli(code, h200_profile_dir, *args, *bad)) == 2
        err = capsys.readouterr().err.strip()
        assert needle in err and "\n" not in err and "Traceback" not in err, err


def test_cli_errors_name_the_problem(shared_data, h200_profile_dir, tmp_path, capsys):
    bad = _small_azure(shared_data, tmp_path, minutes=1, bad_line="2023-11-16 18:15:47.0,12x,5")
    assert main(_cli(bad, h200_profile_dir, "--policy", "static:1x1")) == 2
    assert "line 3: ContextTokens must be a non-negative integer, got '12x'" in capsys.readouterr().err
    assert main(_cli(bad, h200_profile_dir, "--policy", "static:1x1", "--skip-malformed")) == 0
    assert "skipped 1 malformed lines" in capsys.readouterr().err
    assert main(_cli(bad, h200_profile_dir, "--policy", "bogus")) == 2
    assert "unknown policy 'bogus'" in capsys.readouterr().err
    assert main(_cli(bad, h200_profile_dir, "--load-multiplier", "-1")) == 2
    assert "load_multiplier" in capsys.readouterr().err


def test_what_if_flow_publishes_report_and_plots(prefect_harness, shared_data, h200_profile_dir, tmp_path):  # noqa: F811
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from sim.whatif.flow import what_if_flow

    sc = WhatIfScenario(
        trace=str(_small_azure(shared_data, tmp_path, minutes=3)),
        profile_dir=str(h200_profile_dir),
        policy="planner",
        load_multiplier=2,
    )
    summary = what_if_flow(sc, output_dir=str(tmp_path / "plots"))
    assert summary["policy"] == "planner" and summary["requests"] > 0
    for path in summary["plots"].values():
        assert Path(path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    async def fetch():
        async with get_client() as client:
            return await client.read_artifacts(
                artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["what-if-planner", "what-if-planner-latency"]))
            )

    import asyncio

    arts = asyncio.run(fetch())
    kinds = {a.key: a.type for a in arts}
    assert kinds.get("what-if-planner") == "markdown" and kinds.get("what-if-planner-latency") == "image"
    report = next(a for a in arts if a.key == "what-if-planner").data
    assert "SLA attainment" in report and "GPU-hours" in report


def test_sweep_flow_locally_and_on_dask(prefect_harness, shared_data, h200_profile_dir, tmp_path):  # noqa: F811
    from distributed import LocalCluster

    from sim.whatif.flow import run_sweep

    trace = str(_small_azure(shared_data, tmp_path, minutes=2))
    grid = [
        WhatIfScenario(trace=trace, profile_dir=str(h200_profile_dir), policy=p, load_multiplier=k)
        for p in ("static:1x1", "static:2x1")
        for k in (1.0, 2.0)
    ]
    local = run_sweep(grid)
    assert [(s["policy"], s["load_multiplier"]) for s in local] == [(g.policy, g.load_multiplier) for g in grid]
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None) as cluster:
        on_dask = run_sweep(grid, dask_address=cluster.scheduler_address)
    assert [s["slo_attainment"] for s in on_dask] == [s["slo_attainment"] for s in local]
    assert [s["gpu_hours"] for s in on_dask] == pytest.approx([s["gpu_hours"] for s in local])


def test_cli_times_engines_as_the_profile_or_as_dynamos_mocker(shared_data, h200_profile_dir, tmp_path, capsys):
    trace = _small_azure(shared_data, tmp_path, minutes=2)
    out_p, out_m = tmp_path / "profile.json", tmp_path / "mocker.json"
    assert main(_cli(trace, h200_profile_dir, "--policy", "static:1x1", "--json", str(out_p))) == 0
    assert "engines          timed as the profile" in capsys.readouterr().out
    assert main(_cli(trace, h200_profile_dir, "--policy", "static:1x1", "--engine-model", "dynamo_mocker",
                     "--json", str(out_m))) == 0
    assert "engines          timed as Dynamo 1.6.1 mocker" in capsys.readouterr().out
    p, m = json.loads(out_p.read_text()), json.loads(out_m.read_text())
    assert (p["engine_model"], m["engine_model"]) == ("profile", "dynamo_mocker")
    assert p["requests"] == m["requests"]
    # The mocker's fitted prefill line is faster than the profile's curve at these prompt lengths
    # (a 1,000-token prompt: 20.5 vs 37 ms), even with its first token waiting for a decode step.
    assert m["ttft_ms"]["p50"] < p["ttft_ms"]["p50"]
    with pytest.raises(SystemExit):
        main(_cli(trace, h200_profile_dir, "--engine-model", "vllm"))
    assert "invalid choice: 'vllm'" in capsys.readouterr().err


@pytest.mark.parametrize(
    "tried, attainment, cell",
    [
        pytest.param(None, 0.99, "n/a", id="no oracle: not run"),
        pytest.param([(1, 0.95, 1.0), (2, 0.995, 1.2)], 0.99, "hold 2: 99.50% @ 1.20 GPU-h", id="the hold reaching it"),
        pytest.param([(1, 0.95, 1.0), (20, 0.97, 2.0)], 0.99, "none of 2 holds (best, 20: 97.00% @ 2.00 GPU-h)",
                     id="none reaches it: the best tried"),
    ],
)
def test_report_names_the_hindsight_reactive_hold(tried, attainment, cell):
    from sim.whatif.report import _reactive_cell

    assert _reactive_cell(tried, attainment) == cell
