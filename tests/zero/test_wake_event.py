"""prefect.yaml's wake deployment: the watcher's `sla-planner.wake.requested` event starts a run of it.

The trigger as an automation on Prefect's test server, as the fast path's is tested
(tests/flows/test_fast_path_flow.py); the run itself is left unscheduled on no worker.
"""

from __future__ import annotations

import time
import uuid

import yaml

from connectors.prefect_events import NAMESPACE_LABEL, WAKE_EVENT, emit_wake
from planner.decision.wake import WakeSignal
from tests.conftest import PROJECT_ROOT
from tests.flows.test_fast_path_flow import _wait, events_to_this_harness  # noqa: F401


def _wake_deployment() -> dict:
    deployments = yaml.safe_load((PROJECT_ROOT / "prefect.yaml").read_text())["deployments"]
    return next(d for d in deployments if d["name"] == "wake")


def test_the_wake_event_starts_a_run_of_the_wake_deployment(events_to_this_harness):  # noqa: F811
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId, FlowRunFilter
    from prefect.events.schemas.deployment_triggers import DeploymentTriggerTypes
    from prefect.utilities.callables import parameter_schema
    from pydantic import TypeAdapter

    from flows.wake_flow import wake_flow

    spec = _wake_deployment()
    assert spec["entrypoint"] == "flows/wake_flow.py:wake_flow"
    (trigger_spec,) = spec["triggers"]
    assert trigger_spec["expect"] == [WAKE_EVENT]
    namespace = trigger_spec["match"][NAMESPACE_LABEL]
    trigger = TypeAdapter(DeploymentTriggerTypes).validate_python(trigger_spec)
    with get_client(sync_client=True) as client:
        flow_id = client.create_flow(wake_flow)
        deployment_id = client.create_deployment(
            flow_id=flow_id, name=f"wake-{uuid.uuid4().hex[:6]}", entrypoint=spec["entrypoint"],
            parameters=spec["parameters"],
            parameter_openapi_schema=parameter_schema(wake_flow).model_dump_for_openapi(),
            enforce_parameter_schema=True,
        )
        trigger.set_deployment_id(deployment_id)
        automation_id = client.create_automation(trigger.as_automation())
        try:
            signal = WakeSignal(fire=True, at_zero=("prefill", "decode"), message="2 requests waiting",
                                numbers={"waiting_requests": 2.0})
            time.sleep(1.0)  # the automation service loads the new automation before the event arrives
            assert emit_wake(signal, namespace=namespace, model_id="tok", now_s=time.time()) is not None

            def runs():
                return client.read_flow_runs(deployment_filter=DeploymentFilter(
                    id=DeploymentFilterId(any_=[deployment_id])), flow_run_filter=FlowRunFilter())

            (run,) = _wait("the wake deployment's run", runs, timeout_s=25.0)
            assert run.parameters == {"config_path": "configs/planner.yaml"}
            # Another namespace's event starts nothing here.
            emit_wake(signal, namespace=f"{namespace}-other", model_id="tok", now_s=time.time())
            time.sleep(3.0)
            assert len(runs()) == 1
        finally:
            client.delete_automation(automation_id)
