"""`sla-planner import dgd A B --fleet-out FLEET --budget-gpus N`: a fleet file from several DGDs.

Inputs: Dynamo 1.6.1's example DGD and a DGD its profiler generated (tests/data/migrate). Each becomes its
own run configuration beside the fleet file; the fleet loads through flows.fleet_config; a fleet the loader
would refuse is one line, exit 2, and nothing is written.
"""

from __future__ import annotations

from pathlib import Path

from flows.fleet_config import load_fleet
from planner_cli.main import main

DATA = Path(__file__).resolve().parents[1] / "data" / "migrate"
EXAMPLE = DATA / "dynamo-1.6.1-disagg_8b_planner.yaml"  # DGD vllm-disagg-planner
PROFILER = DATA / "dynamo-1.6.1-profiler-vllm-disagg-planner.v1beta1.yaml"  # DGD vllm-disagg
LOAD = DATA / "dynamo-1.6.1-disagg_planner_load.yaml"  # DGD vllm-disagg-planner again


def run(capsys, *args):
    code = main(["import", "dgd", *map(str, args)])
    return code, [line for line in capsys.readouterr().err.splitlines() if line]


def test_two_dgds_make_a_fleet_that_loads(capsys, tmp_path):
    out = tmp_path / "fleet" / "fleet.yaml"
    code, err = run(capsys, EXAMPLE, PROFILER, "--namespace", "dyn", "--fleet-out", out, "--budget-gpus", 16)
    assert code == 0, err
    assert err[-1].endswith("a fleet of 2 deployments (vllm-disagg-planner, vllm-disagg) under 16 GPUs, each run "
                            "configuration beside it")
    fleet = load_fleet(out)
    assert fleet.budget_gpus == 16
    assert [(m.name, m.priority, m.target) for m in fleet.members] == [
        ("vllm-disagg-planner", 1.0, "DGD dyn/vllm-disagg-planner"), ("vllm-disagg", 1.0, "DGD dyn/vllm-disagg")]
    assert (out.parent / "vllm-disagg.yaml").is_file()


def test_two_dgds_on_one_target_are_refused_and_nothing_written(capsys, tmp_path):
    out = tmp_path / "fleet.yaml"
    code, err = run(capsys, EXAMPLE, LOAD, "--namespace", "dyn", "--fleet-out", out, "--budget-gpus", 16)
    assert code == 2
    assert err[-1] == (f"sla-planner import: error: {out}: deployments 'vllm-disagg-planner' and "
                       f"'vllm-disagg-planner-2' both scale DGD dyn/vllm-disagg-planner; each deployment needs its "
                       f"own target")
    assert list(tmp_path.iterdir()) == []


def test_minimums_above_the_budget_are_refused(capsys, tmp_path):
    out = tmp_path / "fleet.yaml"
    code, err = run(capsys, EXAMPLE, PROFILER, "--namespace", "dyn", "--fleet-out", out, "--budget-gpus", 3)
    assert code == 2
    assert "the deployments' minimums need 7 GPUs" in err[-1] and "more than budget.gpus 3" in err[-1]
    assert list(tmp_path.iterdir()) == []


def test_several_files_need_a_fleet_and_a_budget(capsys, tmp_path):
    code, err = run(capsys, EXAMPLE, PROFILER)
    assert (code, err[-1]) == (2, "sla-planner import: error: several DGD files make a fleet: give --fleet-out "
                                  "FLEET and --budget-gpus N")
    code, err = run(capsys, EXAMPLE, PROFILER, "--fleet-out", tmp_path / "f.yaml")
    assert (code, err[-1]) == (2, "sla-planner import: error: --fleet-out needs --budget-gpus N (an integer >= 1), "
                                  "got None")
