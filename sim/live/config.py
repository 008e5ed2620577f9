"""The live fleet's configuration: one YAML file (`LiveConfig`)."""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field

from sim.lookup import DriftedTables, ProfileTables
from workloads.trace_shaping import TraceReplayConfig


class LiveConfig(TraceReplayConfig):
    """Everything `python -m sim.live` needs (one YAML file)."""

    speed: float = Field(1.0, gt=0, le=1000, description="simulated seconds per wall second")
    profile_dir: str = Field(description="Dynamo profiler folder the simulated engines follow")
    startup_s: float = Field(60.0, ge=0, description="a new worker serves this long after it is added, simulated s")
    prefill_latency_scale: float = Field(
        1.0, gt=0, le=10, description="engines take this many times the profile's prefill time (drift from profiling)")
    decode_latency_scale: float = Field(
        1.0, gt=0, le=10, description="engines take this many times the profile's decode step time")
    initial_prefill: int = Field(1, ge=1, description="prefill workers before any decision")
    initial_decode: int = Field(1, ge=1, description="decode workers before any decision")
    host: str = Field("127.0.0.1", description="address of /metrics and /status")
    port: int = Field(8090, ge=1, le=65535, description="port of /metrics and /status")
    model: str = Field("llama-3.1-8b-instruct-fp8", min_length=1, description="`model` label of frontend metrics")
    pod_prefix: str = Field("sim-", description="prefix of pod names and router endpoint ids")
    namespace: str = Field("dynamo", min_length=1, description="Dynamo namespace of the virtual connector's keys")
    key_prefix: str = Field("v1/{namespace}/planner/", description="the decision keys' prefix (Dynamo 1.6.1's)")
    etcd_url: str | None = Field(None, description="follow the virtual connector's keys here; None: fixed fleet")
    etcd_poll_s: float = Field(0.5, gt=0, description="how often the etcd keys are read, wall s")
    router_url: str | None = Field(None, description="routing service base URL; None: route in-process")
    router_token_env: str = Field("SLA_ROUTER_TOKEN", min_length=1, description="env var with the router's admin token")
    router_data_token_env: str = Field(
        "SLA_ROUTER_DATA_TOKEN", min_length=1,
        description="env var with the router's data-plane token (routes, events, load pushes); unset: the admin token")
    router_timeout_s: float = Field(1.0, gt=0, description="timeout of one router call, wall s")
    router_retry_after_s: float = Field(1.0, gt=0, description="after a failed router call, route locally this long")
    metrics_push_s: float = Field(1.0, gt=0, description="push worker load to the router this often, wall s")
    # slo_ttft_ms / slo_tpot_ms: the spellings before ttft_ms / itl_ms, accepted for one release.
    ttft_ms: float = Field(200.0, gt=0, validation_alias=AliasChoices("ttft_ms", "slo_ttft_ms"),
                           description="TTFT SLO sent with every request, ms (deprecated spelling: slo_ttft_ms)")
    itl_ms: float = Field(10.0, gt=0, validation_alias=AliasChoices("itl_ms", "slo_tpot_ms"),
                          description="ITL SLO sent with every request, ms (deprecated spelling: slo_tpot_ms)")
    tick_s: float = Field(0.02, gt=0, le=1, description="wall time between simulation steps, s")
    status_path: str | None = Field(None, description="write the final /status JSON here on exit")


def load_config(path: str | Path) -> LiveConfig:
    """The LiveConfig in a YAML file; ValueError naming the file and field when it is not one."""
    from planner.config import parse_yaml

    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read live config: {exc.strerror}") from None
    return parse_yaml(text, LiveConfig, source=str(path))


def make_tables(cfg: LiveConfig) -> ProfileTables:
    """The engines' latency tables: the configured profile, drifted by the latency scales."""
    from connectors.profiles import load_profile_dir

    profile = load_profile_dir(cfg.profile_dir)
    if cfg.prefill_latency_scale == 1.0 and cfg.decode_latency_scale == 1.0:
        return ProfileTables(profile)
    return DriftedTables(profile, prefill_scale=cfg.prefill_latency_scale, decode_scale=cfg.decode_latency_scale)
