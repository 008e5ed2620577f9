"""The fleet flow's own path: a bad fleet file fails the run in one line before any decide step; a grant cuts
a plan's targets and carries the budget's reasons after the planner's."""

from __future__ import annotations

import yaml

from planner.types import Decision, Reason, ReasonCode


def test_bad_fleet_file_fails_the_run_before_any_decision(prefect_harness, tmp_path, h200_profile_dir):
    from flows.fleet_flow import fleet_flow

    for name in ("a", "b"):
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump({
            "planner": {"namespace": name, "profile": {"dir": str(h200_profile_dir)}},
            "connector": {"kind": "local", "state_path": str(tmp_path / "shared.json")},
        }))
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(yaml.safe_dump({"budget": {"gpus": 8}, "deployments": [
        {"name": "a", "config": "a.yaml"}, {"name": "b", "config": "b.yaml"}]}))

    state = fleet_flow(fleet_path=str(fleet), return_state=True)
    assert state.is_failed()
    assert "deployments 'a' and 'b' both scale local state file" in state.message, state.message
    assert "\n" not in state.message
    assert not (tmp_path / "shared.json").exists(), "nothing may be applied"


def test_a_grant_cuts_the_targets_and_adds_the_budget_reasons():
    """Wanted prefill 4 decode 2, granted 3 and 2: the decision carries 3 and 2, the planner's reason first."""
    import dataclasses

    from planner.fleet.arbitrate import Grant
    from tasks.fleet import DeploymentPlan, granted_plan

    own = Reason(ReasonCode.SLA_SIZING, "prefill", "TTFT forecast needs 4")
    budget = Reason(ReasonCode.FLEET_BUDGET, "prefill", "prefill held at 3 (wanted 4): budget given to chat")
    decision = Decision(prefill_replicas=4, decode_replicas=2, apply=True, reasons=(own,), based_on=(1, 1))

    result = dataclasses.make_dataclass("R", [("decision", Decision)])(decision)
    plan = DeploymentPlan(name="batch", result=result, ttft=None, connector=None, started_s=0.0)
    grant = Grant("batch", {"prefill": 3, "decode": 2}, {"prefill": 4, "decode": 2}, (budget,))
    cut = granted_plan(plan, grant).result.decision
    assert (cut.prefill_replicas, cut.decode_replicas, cut.apply, cut.based_on) == (3, 2, True, (1, 1))
    assert cut.reasons == (own, budget)
    assert plan.result.decision.prefill_replicas == 4, "the plan itself is not changed"
