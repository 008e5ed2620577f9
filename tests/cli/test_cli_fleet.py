"""`sla-planner fleet run` refuses a bad fleet file in one line before any run, and applies nothing."""

from __future__ import annotations

import pytest
import yaml

from planner_cli.main import main


def _deployment(tmp_path, name: str, profile_dir, *, state: str | None = None, priority=1, min_decode: int = 1) -> dict:
    config = tmp_path / f"{name}.yaml"
    config.write_text(yaml.safe_dump({
        "planner": {"namespace": name, "profile": {"dir": str(profile_dir)},
                    "decision": {"decode": {"min_replicas": min_decode, "max_replicas": 16}}},
        "connector": {"kind": "local", "state_path": str(tmp_path / (state or f"{name}.json"))},
    }))
    return {"name": name, "priority": priority, "config": config.name}


@pytest.mark.parametrize("case, expected", [
    pytest.param("minimums", "the deployments' minimums need 7 GPUs (a 2, b 5: min_replicas x GPUs per replica), "
                 "more than budget.gpus 6", id="minimums over budget: 1+1 and 1+4 = 7 > 6"),
    pytest.param("same target", "deployments 'a' and 'b' both scale local state file", id="same target twice"),
    pytest.param("priority", "priority", id="priority that is not a number"),
])
def test_bad_fleet_file_is_one_line_before_any_run(tmp_path, capsys, h200_profile_dir, case, expected):
    a = _deployment(tmp_path, "a", h200_profile_dir)
    b = _deployment(tmp_path, "b", h200_profile_dir, min_decode=4 if case == "minimums" else 1,
                    state="a.json" if case == "same target" else None, priority="high" if case == "priority" else 1)
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(yaml.safe_dump({"budget": {"gpus": 6}, "deployments": [a, b]}))

    assert main(["fleet", "run", "--fleet", str(fleet)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("sla-planner fleet run: ") and str(fleet) in err, err
    assert expected in err, err
    if case == "priority":
        assert "'b'" in err or "deployments.1" in err, err
    assert not list(tmp_path.glob("*.json")), "nothing may be applied"
