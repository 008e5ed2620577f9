"""The fleet file: several deployments, each its own planner run configuration, under one GPU budget.

    budget: {gpus: 16}
    guaranteed_share_frac: 1   # optional: each keeps its wants up to its priority share first
    deployments:
      - name: model-a
        priority: 2            # a number: weight of this deployment's expected SLA loss (higher: protected first)
        config: model-a.yaml   # a PlannerRunConfig file, relative to the fleet file
        overrides:             # optional: merged into that file's mapping before it is validated
          planner: {decision: {decode: {min_replicas: 2}}}

Everything is checked before any run, each problem one line naming the file and what is wrong: a
priority that is not a number, two deployments with one name, two deployments naming the same connector
target (namespace / DGD / InferencePool / etcd prefix / state file), and minimums (min_replicas x GPUs per
replica, summed over pools and deployments) exceeding budget.gpus. The arbitration itself is
planner.fleet.arbitrate; this module only reads and checks files.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, field_validator

from connectors.profiles import read_engine_gpus
from flows.config import PlannerRunConfig, read_yaml_file, resolve_paths
from planner.config import format_validation_error, parse_yaml
from planner.fleet.arbitrate import DEFAULT_GUARANTEED_SHARE_FRAC
from planner.strict import StrictModel
from planner.types import POOLS, Pool

NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"


class FleetBudget(StrictModel):
    gpus: int = Field(ge=1, le=1_000_000, description="GPUs every deployment of the fleet may use together")


class FleetDeployment(StrictModel):
    """One deployment of the fleet: its name, priority and planner run configuration."""

    name: str = Field(min_length=1, max_length=63, pattern=NAME_PATTERN,
                      description="the deployment's name in runs, reasons and results (DNS label style)")
    priority: float = Field(1.0, ge=0, le=1e6, description="weight of this deployment's expected SLA loss when the "
                            "budget is short (a number; 2 counts each missed request twice; 0: best effort)")
    config: str = Field(min_length=1, description="its PlannerRunConfig YAML file, relative to the fleet file")
    overrides: dict[str, Any] = Field(default_factory=dict, description="merged into the config file's mapping "
                                      "(nested mappings merge key by key, other values replace) before validation")

    @field_validator("priority", mode="before")
    @classmethod
    def _number(cls, value: object) -> object:
        # YAML's "high" or "1" (quoted) would otherwise be coerced or reported as pydantic's float error.
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError("must be a number")
        return value


class FleetConfig(StrictModel):
    """The fleet file (configs/fleet.yaml): a GPU budget and the deployments sharing it."""

    budget: FleetBudget
    guaranteed_share_frac: float = Field(
        DEFAULT_GUARANTEED_SHARE_FRAC, ge=0, le=1,
        description="each deployment first keeps its wants up to this share of its priority share of the budget "
        "(budget x priority / sum of priorities); the rest goes by expected SLA loss (0: all of it)")
    deployments: list[FleetDeployment] = Field(min_length=1, description="the deployments sharing the budget "
                                               "(names unique: load_fleet checks)")


@dataclass(frozen=True)
class FleetMember:
    """One deployment as loaded: its run configuration, what it runs against and what its replicas cost.

    target: the connector target it scales, e.g. "DGD dynamo/llama-a" (two deployments never share one);
        None: a local connector kept in memory.
    gpus_per_replica: GPUs one replica of each pool uses (sizing.gpus_per_*_engine, else the profile's
        meta.json, else the connector's gpus_per_*_replica, else 1).
    """

    name: str
    priority: float
    run: PlannerRunConfig
    config_path: Path
    target: str | None
    gpus_per_replica: dict[Pool, int]

    @property
    def min_replicas(self) -> dict[Pool, int]:
        return {p: getattr(self.run.planner.decision, p).min_replicas for p in POOLS}

    @property
    def min_gpus(self) -> int:
        return sum(self.min_replicas[p] * self.gpus_per_replica[p] for p in POOLS)


@dataclass(frozen=True)
class Fleet:
    """A checked fleet file: the budget and its deployments, in file order."""

    path: Path
    budget_gpus: int
    members: tuple[FleetMember, ...]
    guaranteed_share_frac: float = DEFAULT_GUARANTEED_SHARE_FRAC

    def member(self, name: str) -> FleetMember:
        for m in self.members:
            if m.name == name:
                return m
        raise ValueError(f"{self.path}: no deployment named {name!r}; have {', '.join(m.name for m in self.members)}")


def load_fleet(path: str | Path) -> Fleet:
    """Read, validate and check a fleet file and every run configuration it names; ValueError on any problem.

    Each message is one line naming the fleet file (or the deployment's config file) and the problem.
    """
    path = Path(path)
    fleet_cfg = read_yaml_file(path, FleetConfig, what="fleet file")
    names = [d.name for d in fleet_cfg.deployments]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"{path}: deployment name {twice[0]!r} is used twice; names must be unique")
    base = path.resolve().parent
    members = tuple(_member(d, base=base, fleet_path=path) for d in fleet_cfg.deployments)
    check_fleet(members, budget_gpus=fleet_cfg.budget.gpus, source=str(path))
    return Fleet(path=path, budget_gpus=fleet_cfg.budget.gpus, members=members,
                 guaranteed_share_frac=fleet_cfg.guaranteed_share_frac)


def check_fleet(members: tuple[FleetMember, ...], *, budget_gpus: int, source: str) -> None:
    """Two deployments on one target, minimums above the budget, or a recommend-only deployment: ValueError,
    one line naming them."""
    advisory = [m.name for m in members if m.run.planner.mode == "advisory"]
    if advisory:
        # The fleet run applies every grant; a deployment meant to recommend only would be written.
        raise ValueError(f"{source}: deployment {advisory[0]!r} has planner.mode advisory, which a fleet run does "
                         f"not honour (it applies every grant); run it as its own planner deployment")
    by_target: dict[str, str] = {}
    for m in members:
        if m.target is None:
            continue
        if m.target in by_target:
            raise ValueError(f"{source}: deployments {by_target[m.target]!r} and {m.name!r} both scale {m.target}; "
                             f"each deployment needs its own target")
        by_target[m.target] = m.name
    floor = sum(m.min_gpus for m in members)
    if floor > budget_gpus:
        parts = ", ".join(f"{m.name} {m.min_gpus}" for m in members)
        raise ValueError(f"{source}: the deployments' minimums need {floor} GPUs ({parts}: min_replicas x GPUs per "
                         f"replica), more than budget.gpus {budget_gpus}")


def merge_overrides(data: dict, overrides: dict) -> dict:
    """`data` with `overrides` merged in: nested mappings key by key, any other value replaces."""
    out = copy.deepcopy(data)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_overrides(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _member(d: FleetDeployment, *, base: Path, fleet_path: Path) -> FleetMember:
    config_path = Path(d.config) if Path(d.config).is_absolute() else base / d.config
    where = f"{fleet_path}: deployment {d.name!r}"
    try:
        text = config_path.read_text()
    except OSError as exc:
        raise ValueError(f"{where}: cannot read config {d.config}: {exc.strerror}") from None
    if not d.overrides:
        run = parse_yaml(text, PlannerRunConfig, source=str(config_path))
    else:
        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise ValueError(f"{config_path}: not valid YAML: {' '.join(str(exc).split())}") from None
        if not isinstance(data, dict):
            raise ValueError(f"{config_path}: expected a mapping at the top level, got {type(data).__name__}")
        try:
            run = PlannerRunConfig.model_validate(merge_overrides(data, d.overrides))
        except ValidationError as exc:
            raise ValueError(format_validation_error(exc, source=f"{config_path} with the overrides of deployment {d.name!r} in {fleet_path}")) from None
    run = resolve_paths(run, base=config_path.resolve().parent)
    return FleetMember(name=d.name, priority=float(d.priority), run=run, config_path=config_path,
                       target=connector_target(run), gpus_per_replica=replica_gpus(run))


def connector_target(run: PlannerRunConfig) -> str | None:
    """What a run configuration scales, as one comparable string (its connector's kind and object); None for a
    local connector kept in memory."""
    c, ns = run.connector, run.planner.namespace
    if c.kind == "kubernetes":
        return f"DGD {c.namespace or ns}/{c.dgd_name}"
    if c.kind == "llmd":
        return f"InferencePool {c.namespace or ns}/{c.inference_pool}"
    if c.kind == "virtual":
        return f"etcd {c.etcd_url} {c.key_prefix.format(namespace=c.namespace or ns)}"
    if c.state_path is None:
        return None  # in memory: a local connector's fleet lives in its own process, shared with no one
    return f"local state file {Path(c.state_path).resolve()}"


def replica_gpus(run: PlannerRunConfig) -> dict[Pool, int]:
    """GPUs per replica of each pool: the sizing setting, else the profile's (meta.json, or the pre-swept row's
    TP), else the connector's, else 1."""
    sizing, profile = run.planner.sizing, run.planner.profile
    if profile.dir:
        from_profile = read_engine_gpus(Path(profile.dir) / "meta.json")
    else:
        from_profile = {"prefill": profile.prefill_tp, "decode": profile.decode_tp}
    out: dict[Pool, int] = {}
    for pool in POOLS:
        configured = getattr(sizing, f"gpus_per_{pool}_engine")
        connector = getattr(run.connector, f"gpus_per_{pool}_replica", None)
        out[pool] = next(v for v in (configured, from_profile[pool], connector, 1) if v is not None)
    return out
