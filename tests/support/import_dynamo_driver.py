"""Run Dynamo 1.6.1's own planner start-up parsing on a batch of planner pods (run in .venv-dynamo).

Reads a JSON list of cases on stdin, writes one JSON result per case on stdout. A case is
a planner container as the kubelet would start it: `argv` (the tokens after
`python3 -m dynamo.planner`), `env` (its whole environment), `files` (container path ->
content: the mounted ConfigMaps; each is written under a temp root and the argv token
naming it is pointed there) and, for GPU counts, `deployment` (the DGD as the planner
reads it, v1beta1 with the operator's status).

For each case this calls `dynamo.planner.__main__._parse_config()` (argparse `--config`,
then `PlannerConfig.from_config_arg`) under that argv and environment, without starting
the runtime, then the GPU-count path of start-up: the Kubernetes connector's
`_get_gpu_shapes_from_deployment` and the environment's `_fallback_gpu_shape` for a
worker that has none (a virtual environment reads none), and the budget check start-up
runs on those counts (`_validate_min_endpoint_budgets_at_startup`). A refusal is reported as
`{"refused": "<what Dynamo said>"}`.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import sys
import tempfile
from pathlib import Path
from types import ModuleType, SimpleNamespace

logging.disable(logging.WARNING)

# The planner's core imports its diagnostics report, which draws with plotly; .venv-dynamo does not install
# plotly (scripts/install_dynamo.sh) and nothing here draws, so empty modules satisfy that import only.
try:
    import plotly.graph_objects  # noqa: F401
except ImportError:
    for _name in ("plotly", "plotly.graph_objects", "plotly.subplots"):
        sys.modules[_name] = ModuleType(_name)
    sys.modules["plotly.subplots"].make_subplots = None

import dynamo.planner.__main__ as entry  # noqa: E402
from dynamo.planner.connectors.kubernetes import KubernetesConnector  # noqa: E402
from dynamo.planner.environment.base import PlannerEnvironmentImpl  # noqa: E402
from dynamo.planner.core.base import NativePlannerBase  # noqa: E402
from dynamo.planner.environment.state import ComponentState, DeploymentState  # noqa: E402


def _config(case: dict, root: Path) -> dict:
    argv = []
    for token in case["argv"]:
        if token in case.get("files", {}):
            token = str(root / token.lstrip("/"))
        argv.append(token)
    for path, content in case.get("files", {}).items():
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
    os.environ.clear()
    os.environ.update(case["env"])
    sys.argv = ["dynamo.planner", *argv]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            config = entry._parse_config()
    except SystemExit as exc:
        return {"refused": f"argparse exit {exc.code}: {err.getvalue().strip().splitlines()[-1]}"}
    except Exception as exc:  # noqa: BLE001 - any exception stops the planner; report it
        errors = getattr(exc, "errors", None)
        if callable(errors):  # pydantic: the field and the message
            first = errors()[0]
            return {"refused": f"{type(exc).__name__}: {'.'.join(map(str, first['loc']))}: {first['msg']}"}
        return {"refused": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"}
    settings = {name: getattr(config, name) for name in type(config).model_fields}
    settings = json.loads(json.dumps(settings, default=lambda v: getattr(v, "value", None) or v.model_dump()))
    gpus = {}
    if case.get("deployment") is not None and config.environment == "kubernetes":
        conn = object.__new__(KubernetesConnector)
        try:
            shapes = conn._get_gpu_shapes_from_deployment(case["deployment"])
        except Exception as exc:  # noqa: BLE001
            return {"refused": f"{type(exc).__name__}: {exc}"}
    else:
        shapes = (None, None)
    state = DeploymentState()
    for pool, shape in zip(("prefill", "decode"), shapes):
        configured = getattr(config, f"{pool}_engine_num_gpu")
        shape = shape or PlannerEnvironmentImpl._fallback_gpu_shape(ComponentState(), configured)
        if shape is None:
            return {"refused": f"DeploymentValidationError: Missing {pool}_engine_num_gpu in config"}
        gpus[pool] = shape.gpus_per_engine
        setattr(state, pool, ComponentState(num_gpus=shape.gpus_per_engine, gpus_per_replica=shape.gpus_per_replica))
    planner = object.__new__(NativePlannerBase)  # start-up's budget check, on the GPU counts just read
    planner.config, planner.environment = config, SimpleNamespace(deployment_state=lambda: state)
    try:
        planner._validate_min_endpoint_budgets_at_startup()
    except Exception as exc:  # noqa: BLE001
        return {"refused": f"{type(exc).__name__}: {exc}"}
    return {"settings": settings, "gpus_per_engine": gpus}


def _defaults(env: dict) -> dict:
    """Every PlannerConfig field's default under this environment (before any cross-field rule)."""
    os.environ.clear()
    os.environ.update(env)
    fields = entry.PlannerConfig.model_fields
    values = {name: f.get_default(call_default_factory=True) for name, f in fields.items()}
    return json.loads(json.dumps(values, default=lambda v: getattr(v, "value", None) or v.model_dump()))


def main() -> None:
    cases = json.load(sys.stdin)
    results = {"__defaults__": _defaults(cases[0]["env"] if cases else {})}
    for case in cases:
        with tempfile.TemporaryDirectory() as root:
            results[case["id"]] = _config(case, Path(root))
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
