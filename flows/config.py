"""The planner flow's typed parameters (the what-if is planner.whatif.WhatIf).

They are pydantic models, so the Prefect UI renders them as forms and a bad
value is rejected, naming the field, before any step runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from connectors.config import (
    AdvisoryConfig,
    ConnectorConfig,
    LatencyModelConfig,
    LocalConnectorConfig,
    MetricsConfig,
    PlannerMetricsConfig,
    check_history_covers_window,
    fit_history_to_window,
)
from planner.config import PlannerConfig, parse_yaml
from planner.strict import StrictModel
from planner.types import Observation

M = TypeVar("M", bound=BaseModel)


class PlannerRunConfig(StrictModel):
    """Everything one planner run needs (configs/planner.yaml)."""

    planner: PlannerConfig
    metrics: MetricsConfig = Field(default_factory=MetricsConfig, description="where to read metrics")
    connector: ConnectorConfig = Field(
        default_factory=LocalConnectorConfig, description="where replicas live and decisions go"
    )
    planner_metrics: PlannerMetricsConfig = Field(
        default_factory=lambda: PlannerMetricsConfig(enabled=False),
        description="the planner's own gauges",
    )
    latency_model: LatencyModelConfig = Field(
        default_factory=LatencyModelConfig,
        description="prefill TTFT from the profile or from the routing service's published latency model",
    )
    advisory: AdvisoryConfig = Field(
        default_factory=AdvisoryConfig,
        description="planner.mode advisory: the autoscaler running the fleet now, whose replicas each run reads back "
        "and compares with its own",
    )

    @model_validator(mode="after")
    def _history_covers_stabilization(self) -> "PlannerRunConfig":
        name, window_s = self.planner.decision.recommendation_window
        self.connector = fit_history_to_window(self.connector, window_s=window_s,
                                               interval_s=self.planner.adjustment_interval_s)
        check_history_covers_window(
            self.connector,
            window_s=window_s,
            interval_s=self.planner.adjustment_interval_s,
            field=f"planner.decision.{name}",
        )
        return self

    @model_validator(mode="after")
    def _advisory_window_holds_a_run(self) -> "PlannerRunConfig":
        if self.planner.mode == "advisory" and not (
                self.planner_metrics.enabled and (self.planner_metrics.pushgateway_url or self.planner_metrics.port)):
            raise ValueError("planner.mode advisory: its own history (the chart's line, the comparison, the "
                             "stabilization window) comes back from its published gauges, so planner_metrics must be "
                             "enabled with a pushgateway_url or a port")
        if self.planner.mode == "advisory" and self.advisory.window_s < self.planner.adjustment_interval_s:
            raise ValueError(f"advisory.window_s ({self.advisory.window_s:g} s) is shorter than "
                             f"planner.adjustment_interval_s ({self.planner.adjustment_interval_s:g} s): the comparison "
                             f"window must hold at least one run")
        return self

    @model_validator(mode="after")
    def _keda_reads_the_gauge(self) -> "PlannerRunConfig":
        if getattr(self.connector, "actuation", None) == "keda" and not (
                self.planner_metrics.enabled and (self.planner_metrics.pushgateway_url or self.planner_metrics.port)):
            raise ValueError("connector.actuation keda: KEDA applies the planner's published gauge, so planner_metrics "
                             "must be enabled with a pushgateway_url or a port")
        return self

    @property
    def llmd_inference_pool(self) -> tuple[str, str] | None:
        """(namespace, name) of the llm-d InferencePool the run scales; None for other connectors."""
        if self.connector.kind != "llmd":
            return None
        return self.connector.namespace or self.planner.namespace, self.connector.inference_pool


class ReplayInputs(StrictModel):
    """Advanced, for replays, the simulator and tests: what a run reads, given instead of read.

    Leave it empty in a deployment: a scheduled run reads Prometheus and the clock.
    """

    model_config = ConfigDict(title="Advanced: replay inputs")

    observation: Observation | None = Field(
        None, description="metrics of the interval instead of Prometheus (empty: read Prometheus)"
    )
    now_s: float | None = Field(None, description="the run's clock, Unix seconds (empty: the current time)")


def load_run_config(path: str | Path) -> PlannerRunConfig:
    """Read and validate a run configuration file; errors name the file and field.

    Relative profile paths in the file are resolved against the file's folder.
    """
    path = Path(path)
    cfg = read_yaml_file(path, PlannerRunConfig, what="planner config")
    return resolve_paths(cfg, base=path.resolve().parent)


def read_yaml_file(path: Path, model: type[M], *, what: str) -> M:
    """The YAML file at path validated as model; errors are one line naming the file (`what` it is when unreadable)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read {what}: {exc.strerror}") from None
    return parse_yaml(text, model, source=str(path))


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
