"""The request stream a replay sends: a window or shape of a trace, its load multiplied, its time scaled."""

from __future__ import annotations

import numpy as np
from pydantic import Field, model_validator

from planner.strict import StrictModel
from workloads.traces import Trace, load_trace, multiply_load, scale_time, time_window


class TraceSegment(StrictModel):
    """One window of the source trace, replayed with its load multiplied."""

    duration_s: float = Field(gt=0, description="window length in trace time, s")
    load_multiplier: float = Field(1.0, gt=0, le=1000, description="copies of the window's requests superposed")


class TraceReplayConfig(StrictModel):
    """Which requests to replay: a window or shape of a trace, its load multiplied, its time scaled."""

    trace_path: str = Field(description="Azure CSV or Mooncake JSONL trace, plain or gzip")
    trace_start_s: float = Field(0.0, ge=0, description="replay the trace from this offset, s")
    trace_duration_s: float | None = Field(None, gt=0, description="replay only this much of it, s; None: to the end")
    shape: list[TraceSegment] | None = Field(
        None, description="consecutive windows from trace_start_s, each with its own load multiplier "
        "(replaces trace_duration_s and load_multiplier)",
    )
    load_multiplier: float = Field(1.0, gt=0, le=1000, description="superpose this many copies of the trace")
    jitter_s: float = Field(
        1.0, ge=0, le=3600,
        description="each copy's requests shift by up to ± this, s: ~30 models independent tenants, "
        "1 synchronised copies (a stress case: every burst arrives k times at once)",
    )
    time_scale: float = Field(1.0, gt=0, description="stretch (>1) or compress (<1) the trace's time axis")
    seed: int = Field(0, description="seed of the load multiplier's offsets")

    @model_validator(mode="after")
    def _check(self) -> "TraceReplayConfig":
        if self.shape is not None and (self.trace_duration_s is not None or self.load_multiplier != 1.0):
            raise ValueError("shape replaces trace_duration_s and load_multiplier: set one or the other")
        return self



def build_trace(cfg: TraceReplayConfig) -> Trace:
    """The request stream to replay: the configured window(s) of the trace, transformed."""
    source = load_trace(cfg.trace_path)
    if cfg.shape is not None:
        trace = shaped_trace(source, cfg.shape, start_s=cfg.trace_start_s, seed=cfg.seed, jitter_s=cfg.jitter_s)
    else:
        end_s = source.duration_s + 1.0 if cfg.trace_duration_s is None else cfg.trace_start_s + cfg.trace_duration_s
        trace = source if cfg.trace_start_s == 0 and cfg.trace_duration_s is None else time_window(
            source, cfg.trace_start_s, end_s)
        if cfg.load_multiplier != 1.0:
            trace = multiply_load(trace, cfg.load_multiplier, seed=cfg.seed, jitter_s=cfg.jitter_s)
    if cfg.time_scale != 1.0:
        trace = scale_time(trace, cfg.time_scale)
    if not len(trace):
        raise ValueError(f"{cfg.trace_path}: the configured window holds no requests")
    return trace


def shaped_trace(source: Trace, segments: list[TraceSegment], *, start_s: float, seed: int,
                 jitter_s: float = 1.0) -> Trace:
    """Consecutive windows of `source` from start_s, each with its load multiplied.

    Real requests keep their lengths and relative times; a multiplier of 4
    superposes four copies of that window, each request shifted by up to ±jitter_s, so a shape like
    [60 s x1, 90 s x4, 90 s x1] is a clear rise and fall of real traffic.
    Copies jittered past a window's end are dropped so segments do not overlap.
    """
    if not segments:
        raise ValueError("shape: give at least one segment")
    arrival, isl, osl = [], [], []
    offset_s = 0.0
    for i, seg in enumerate(segments):
        lo = start_s + offset_s
        window = time_window(source, lo, lo + seg.duration_s)
        if not len(window):
            raise ValueError(
                f"shape[{i}]: trace {source.name} has no requests in [{lo:g}, {lo + seg.duration_s:g}) s "
                f"(it lasts {source.duration_s:.0f} s)"
            )
        if seg.load_multiplier != 1.0:
            window = multiply_load(window, seg.load_multiplier, seed=seed + i, jitter_s=jitter_s)
        keep = window.arrival_s < seg.duration_s
        arrival.append(window.arrival_s[keep] + offset_s)
        isl.append(window.isl_tokens[keep])
        osl.append(window.osl_tokens[keep])
        offset_s += seg.duration_s
    desc = ",".join(f"{s.duration_s:g}sx{s.load_multiplier:g}" for s in segments)
    return Trace(
        name=f"{source.name}[{start_s:g}+shape {desc}]",
        arrival_s=np.concatenate(arrival),
        isl_tokens=np.concatenate(isl),
        osl_tokens=np.concatenate(osl),
    )
