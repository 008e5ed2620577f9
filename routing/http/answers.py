"""What the HTTP API answers: the response models its OpenAPI document declares."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


class FieldError(BaseModel):
    field: str
    message: str


class ErrorBody(BaseModel):
    error: str = Field(description="machine-readable code")
    message: str
    fields: list[FieldError] = Field(default_factory=list)


class ChoiceOut(BaseModel):
    endpoint_id: str
    role: str
    url: str | None
    predicted_ttft_ms: float | None
    predicted_tpot_ms: float | None
    headroom_ttft_ms: float | None
    headroom_tpot_ms: float | None
    transfer_cost_ms: float
    shared_level: str | None


class RouteOut(BaseModel):
    request_id: str
    outcome: Literal["routed"]
    mode: Literal["disaggregated", "aggregated"]
    prefill: ChoiceOut | None
    decode: ChoiceOut | None
    tier: str
    reason: str
    topology_fallback: bool
    model_version: str | None


class ShedOut(BaseModel):
    error: Literal["shed"]
    message: str
    request_id: str
    fields: list[FieldError] = Field(default_factory=list)


class PredictionOut(BaseModel):
    endpoint_id: str
    role: str
    predicted_ttft_ms: float | None
    predicted_tpot_ms: float | None


class PredictOut(BaseModel):
    model_version: str | None
    estimate: str
    predictions: list[PredictionOut]


class EventOut(BaseModel):
    request_id: str
    samples_recorded: int


class EventResult(BaseModel):
    request_id: str
    status: int = Field(description="what the single-event call would answer: 200, 404 or 422")
    samples_recorded: int
    error: str | None = None


class EventBatchOut(BaseModel):
    results: list[EventResult]


class EndpointOut(BaseModel):
    id: str
    role: str
    url: str | None
    domains: dict[str, str]
    max_kv_tokens: int | None
    gpus: int
    draining: bool = False  # not picked any more; removed after its last request in flight
    load: dict[str, Any]


class RegisteredOut(BaseModel):
    id: str
    created: bool


class RemovedOut(BaseModel):
    id: str
    detached_requests: int  # removed at once: its requests in flight, no longer counted anywhere
    draining_requests: int = 0  # drain: requests still in flight there; removed after the last completes


class OkOut(BaseModel):
    ok: bool = True


class PublishedOut(BaseModel):
    version: str
    active: bool


class RollbackOut(BaseModel):
    active: str | None = Field(description="active version; null: the profile estimate serves")
    estimate: str


class ModelVersionOut(BaseModel):
    version: str
    published_at_s: float
    created_at_s: float | None
    metrics: dict[str, float]
    active: bool


class OnlineTargetOut(BaseModel):
    factor: list[float]  # per cell: what the active model's p90 is multiplied by now
    samples: list[int]  # per cell: outcomes counted since the model became active


class OnlineCalibrationOut(BaseModel):
    version: str | None  # the model being calibrated
    window: int
    min_samples: int
    batch: int
    max_shift: float
    queue_edges: list[float]
    prompt_edges: list[float]  # cell = queue cell x (len(prompt_edges) + 1) + prompt cell
    targets: dict[str, OnlineTargetOut]


class ModelListOut(BaseModel):
    active: str | None
    estimate: str
    prediction: str
    online_calibration: OnlineCalibrationOut | None = None  # None: off, or mean predictions
    versions: list[ModelVersionOut]


class SampleOut(BaseModel):
    seq: int
    target: Literal["ttft", "tpot"]
    request_id: str
    endpoint_id: str
    role: str
    features: dict[str, float]
    observed_ms: float
    predicted_ms: float | None
    model_version: str | None
    recorded_at_s: float


class SamplesOut(BaseModel):
    feature_names: dict[str, list[str]]
    samples: list[SampleOut]
    next_after_seq: int
    has_more: bool
    stats: dict[str, int]


class HealthOut(BaseModel):
    status: str
    endpoints: int
    requests_in_flight: int
    model_version: str | None
    estimate: str
    samples_stored: int
