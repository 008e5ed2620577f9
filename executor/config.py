"""The fleet executor's settings (YAML), validated by pydantic: unknown fields refused.

A role's `command` is a list of arguments with placeholders filled per worker:
`{python}` (the executor's interpreter, i.e. the Dynamo environment's),
`{role}`, `{slot}` (0, 1, ...) and `{system_port}` (system_port_base + slot).
Every worker also gets `DYN_SYSTEM_PORT={system_port}` (Dynamo serves
/metrics, /health there) and `ETCD_ENDPOINTS` in its environment. The same
template starts a mocker, a vLLM or an SGLang worker.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import Field, ValidationError, field_validator

from planner.strict import StrictModel

PLACEHOLDERS = ("python", "role", "slot", "system_port")


class RoleConfig(StrictModel):
    """How to start, find and count the workers of one role."""

    command: list[str] = Field(min_length=1, description="argv with {python} {role} {slot} {system_port}")
    endpoint: str = Field(
        min_length=1,
        description="namespace.component.endpoint the worker registers (Dynamo's mocker: "
        "dynamo.prefill.generate for prefill, dynamo.backend.generate for decode)",
    )
    system_port_base: int = Field(
        ge=1024, le=32700,
        description="worker slot k serves /metrics on this + k (Dynamo 1.6.1 reads DYN_SYSTEM_PORT as an i16: "
        "ports above 32767 make the worker exit at start)",
    )
    env: dict[str, str] = Field(default_factory=dict, description="extra environment variables")

    @field_validator("command")
    @classmethod
    def _placeholders(cls, argv: list[str]) -> list[str]:
        for arg in argv:
            try:
                arg.format(**{name: "x" for name in PLACEHOLDERS})
            except (KeyError, IndexError, ValueError) as exc:
                raise ValueError(
                    f"command argument {arg!r}: unknown or malformed placeholder ({exc}); "
                    f"known: {', '.join('{' + p + '}' for p in PLACEHOLDERS)}"
                ) from None
        return argv

    @field_validator("endpoint")
    @classmethod
    def _three_parts(cls, value: str) -> str:
        if len(value.split(".")) != 3 or not all(value.split(".")):
            raise ValueError(f"endpoint must be namespace.component.endpoint, got {value!r}")
        return value


class ExecutorConfig(StrictModel):
    """One executor scales one Dynamo namespace's prefill and decode workers."""

    namespace: str = Field("dynamo", min_length=1, description="Dynamo namespace of the planner's decisions")
    etcd_url: str = Field("http://127.0.0.1:2379", description="etcd holding decisions and worker discovery")
    state_dir: str = Field(min_length=1, description="worker table, logs and Prometheus targets live here")
    roles: dict[Literal["prefill", "decode"], RoleConfig]
    initial_workers: dict[Literal["prefill", "decode"], int] = Field(
        default_factory=lambda: {"prefill": 1, "decode": 1},
        description="workers to run before the planner has made any decision",
    )
    register_timeout_s: float = Field(
        120.0, gt=0, description="warn (log and event) when a decision is not carried out after this, s"
    )
    drain_timeout_s: float = Field(
        120.0, gt=0, description="a draining worker still running after this gets SIGKILL, s"
    )
    poll_s: float = Field(0.5, gt=0, le=10, description="supervision period, s")
    restart_backoff_s: float = Field(2.0, ge=0, description="first wait before restarting a worker that died, s (doubles)")

    @field_validator("roles")
    @classmethod
    def _both_roles(cls, roles: dict) -> dict:
        missing = {"prefill", "decode"} - set(roles)
        if missing:
            raise ValueError(f"roles: missing {sorted(missing)}")
        return roles

    @property
    def state_path(self) -> Path:
        return Path(self.state_dir)


def load_executor_config(path: str | Path) -> ExecutorConfig:
    """Read and validate a YAML config; ValueError in one line naming the file and the field."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"{path}: cannot read executor config: {exc}".replace("\n", " ")) from None
    try:
        return ExecutorConfig.model_validate(data or {})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise ValueError(f"{path}: {where}: {first['msg']}") from None
