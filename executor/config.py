"""The fleet executor's settings (YAML), validated by pydantic: unknown fields refused.

A role's `command` is a list of arguments with placeholders filled per worker:
`{python}` (the executor's interpreter, i.e. the Dynamo environment's),
`{role}`, `{slot}` (0, 1, ...) and `{system_port}` (system_port_base + slot).
Every worker also gets `DYN_SYSTEM_PORT={system_port}` (Dynamo serves
/metrics, /health there) and `ETCD_ENDPOINTS` in its environment. The same
template starts a mocker, a vLLM or an SGLang worker.

A worker is counted as serving when Dynamo's discovery lists it under the
role's `endpoint`, or, for an engine outside Dynamo (a plain vLLM server),
when its `ready_url` answers HTTP 200. An `aggregated` role (one engine does
prefill and decode) runs as many workers as the larger of a decision's two
counts. With `router` set, each serving worker is registered with the routing
service and a drain first takes it out of routing, then waits for its last
request before SIGTERM.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from planner.strict import StrictModel, error_message

PLACEHOLDERS = ("python", "role", "slot", "system_port")
RoleName = Literal["prefill", "decode", "aggregated"]


def _check_placeholders(text: str, *, what: str) -> None:
    try:
        text.format(**{name: "x" for name in PLACEHOLDERS})
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(
            f"{what} {text!r}: unknown or malformed placeholder ({exc}); "
            f"known: {', '.join('{' + p + '}' for p in PLACEHOLDERS)}"
        ) from None


class RoleConfig(StrictModel):
    """How to start, find and count the workers of one role."""

    command: list[str] = Field(min_length=1, description="argv with {python} {role} {slot} {system_port}")
    endpoint: str | None = Field(
        None, min_length=1,
        description="namespace.component.endpoint the worker registers in Dynamo's discovery (Dynamo's mocker: "
        "dynamo.prefill.generate for prefill, dynamo.backend.generate for decode); None: ready_url counts it",
    )
    ready_url: str | None = Field(
        None, pattern=r"^https?://\S+$",
        description="an engine outside Dynamo's discovery serves once this URL answers 200, e.g. "
        "http://127.0.0.1:{system_port}/health (vLLM); placeholders as in command",
    )
    router_url: str | None = Field(
        None, pattern=r"^https?://\S+$",
        description="the engine's base URL as the routing service reaches it (registration and its /metrics "
        "scrape), e.g. http://127.0.0.1:{system_port}; needed with the executor's router settings",
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
            _check_placeholders(arg, what="command argument")
        return argv

    @field_validator("endpoint")
    @classmethod
    def _three_parts(cls, value: str | None) -> str | None:
        if value is not None and (len(value.split(".")) != 3 or not all(value.split("."))):
            raise ValueError(f"endpoint must be namespace.component.endpoint, got {value!r}")
        return value

    @field_validator("ready_url", "router_url")
    @classmethod
    def _url_placeholders(cls, value: str | None, info) -> str | None:
        if value is not None:
            _check_placeholders(value, what=info.field_name)
        return value

    @model_validator(mode="after")
    def _counted_one_way(self) -> "RoleConfig":
        if (self.endpoint is None) == (self.ready_url is None):
            raise ValueError("give exactly one of endpoint (Dynamo's discovery counts the worker) and ready_url "
                             f"(an HTTP check does), got endpoint={self.endpoint!r} ready_url={self.ready_url!r}")
        return self

    def fill(self, text: str, *, role: str, slot: int, python: str = "") -> str:
        """A template of this role filled in for the worker in `slot`."""
        return text.format(python=python, role=role, slot=slot, system_port=self.system_port_base + slot)


class RouterRegistration(StrictModel):
    """The routing service the executor registers its serving workers with (and drains them from)."""

    url: str = Field(pattern=r"^https?://\S+$", description="routing service base URL, e.g. http://127.0.0.1:8080")
    token_env: str = Field("SLA_ROUTER_TOKEN", min_length=1, description="environment variable holding its admin token")
    data_token_env: str = Field(
        "SLA_ROUTER_DATA_TOKEN", min_length=1,
        description="environment variable holding its data-plane token (reading the endpoints a drain waits on)")
    request_timeout_s: float = Field(5.0, gt=0, description="timeout of one call, s")


class ExecutorConfig(StrictModel):
    """One executor scales one Dynamo namespace's prefill and decode workers."""

    namespace: str = Field("dynamo", min_length=1, description="Dynamo namespace of the planner's decisions")
    etcd_url: str = Field("http://127.0.0.1:2379", description="etcd holding decisions and worker discovery")
    state_dir: str = Field(min_length=1, description="worker table, logs and Prometheus targets live here")
    roles: dict[RoleName, RoleConfig] = Field(
        description="prefill and decode, or aggregated alone (one engine does both; it runs as many workers as the "
        "larger of a decision's prefill and decode counts)")
    initial_workers: dict[RoleName, int] = Field(
        default_factory=lambda: {"prefill": 1, "decode": 1},
        description="workers to run before the planner has made any decision",
    )
    router: RouterRegistration | None = Field(
        None, description="register serving workers with this routing service; None: no registration")
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
        if set(roles) == {"aggregated"}:
            return roles
        if "aggregated" in roles:
            raise ValueError("roles: aggregated runs alone (it serves both stages), got " + ", ".join(sorted(roles)))
        missing = {"prefill", "decode"} - set(roles)
        if missing:
            raise ValueError(f"roles: missing {sorted(missing)}")
        return roles

    @model_validator(mode="after")
    def _workers_of_known_roles(self) -> "ExecutorConfig":
        unknown = set(self.initial_workers) - set(self.roles)
        if unknown:
            raise ValueError(f"initial_workers: {', '.join(sorted(unknown))} is not a configured role "
                             f"(roles: {', '.join(sorted(self.roles))})")
        if self.router is not None:
            missing = [r for r, rc in self.roles.items() if rc.router_url is None]
            if missing:
                raise ValueError(f"roles.{missing[0]}.router_url: needed to register its workers with the router")
        return self

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
        raise ValueError(f"{path}: {where}: {error_message(first)}") from None
