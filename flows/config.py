"""The planner flow's parameters: the whole run configuration and what-if overrides.

Both are pydantic models, so the Prefect UI renders them as forms and a bad
value is rejected, naming the field, before any step runs.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from connectors.config import (
    ConnectorConfig,
    LocalConnectorConfig,
    MetricsConfig,
    PlannerMetricsConfig,
    check_history_covers_window,
)
from planner.config import PlannerConfig, SloTarget, parse_yaml
from planner.types import Observation


class PlannerRunConfig(BaseModel):
    """Everything one planner run needs (configs/planner.yaml)."""

    model_config = ConfigDict(extra="forbid")

    planner: PlannerConfig
    metrics: MetricsConfig = Field(default_factory=MetricsConfig, description="where to read metrics")
    connector: ConnectorConfig = Field(
        default_factory=LocalConnectorConfig, description="where replicas live and decisions go"
    )
    planner_metrics: PlannerMetricsConfig = Field(
        default_factory=lambda: PlannerMetricsConfig(enabled=False),
        description="the planner's own gauges",
    )

    @model_validator(mode="after")
    def _history_covers_stabilization(self) -> "PlannerRunConfig":
        check_history_covers_window(
            self.connector,
            window_s=self.planner.decision.scale_down_stabilization_s,
            interval_s=self.planner.adjustment_interval_s,
        )
        return self


class WhatIfParams(BaseModel):
    """A manual "what would the planner do if..." run: nothing is applied."""

    model_config = ConfigDict(extra="forbid")

    load_multiplier: float = Field(1.0, gt=0, le=1000, description="scale observed load by this factor")
    ttft_ms: float | None = Field(None, gt=0, description="TTFT target to plan for instead of the configured one, ms")
    itl_ms: float | None = Field(None, gt=0, description="ITL target to plan for instead of the configured one, ms")

    def slo(self, base: SloTarget) -> SloTarget | None:
        if self.ttft_ms is None and self.itl_ms is None:
            return None
        return SloTarget(
            ttft_ms=self.ttft_ms if self.ttft_ms is not None else base.ttft_ms,
            itl_ms=self.itl_ms if self.itl_ms is not None else base.itl_ms,
        )


class ReplayInputs(BaseModel):
    """Advanced, for replays, the simulator and tests: what a run reads, given instead of read.

    Leave it empty in a deployment: a scheduled run reads Prometheus and the clock.
    """

    model_config = ConfigDict(extra="forbid", title="Advanced: replay inputs")

    observation: Observation | None = Field(
        None, description="metrics of the interval instead of Prometheus (empty: read Prometheus)"
    )
    now_s: float | None = Field(None, description="the run's clock, Unix seconds (empty: the current time)")


def load_run_config(path: str | Path) -> PlannerRunConfig:
    """Read and validate a run configuration file; errors name the file and field.

    Relative profile paths in the file are resolved against the file's folder.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read planner config: {exc.strerror}") from None
    cfg = parse_yaml(text, PlannerRunConfig, source=str(path))
    return resolve_paths(cfg, base=path.resolve().parent)


def resolve_paths(cfg: PlannerRunConfig, *, base: Path) -> PlannerRunConfig:
    """Make the profile folder and the warm-up trace absolute, relative to `base` (the config file's folder)."""

    def absolute(model: BaseModel, names: tuple[str, ...]) -> BaseModel:
        updates = {name: str((base / getattr(model, name)).resolve()) for name in names
                   if getattr(model, name) is not None and not Path(getattr(model, name)).is_absolute()}
        return model.model_copy(update=updates) if updates else model

    profile = absolute(cfg.planner.profile, ("dir", "pre_swept_dir"))
    predictor = absolute(cfg.planner.predictor, ("warmup_trace_path",))
    if profile is cfg.planner.profile and predictor is cfg.planner.predictor:
        return cfg
    planner = cfg.planner.model_copy(update={"profile": profile, "predictor": predictor})
    return cfg.model_copy(update={"planner": planner})
