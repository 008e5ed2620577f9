"""llm-d's latency-predictor rows: the bodies an EPP posts, validated as llm-d's sidecars do, mapped onto our features.

An EPP (llm-d-router's predicted-latency producer) sends one stateless row per candidate pod when it
predicts, and one row per finished request when it posts training data. Field bounds follow llm-d's
sidecars (llm-d-latency-predictor @ 04e44cd8, `PredictionRequest` and `TrainingEntry`): a row missing a
required field or out of bounds fails the body's validation (422) on every route, the lenient bulk route
included, exactly as theirs does.

How a row becomes our features (routing.features, feature set 1: the seven load fields and the role):

| llm-d field | our field | what differs |
|---|---|---|
| `input_token_length` | `input_tokens` | current EPPs send tokenizer counts; older ones (llm-d-inference-scheduler before the tokenizer plugin) sent prompt word counts, which a model trained on tokens under-predicts |
| `prefix_cache_score` | `prefix_cache_hit_frac` | the EPP's approximate prefix match for that pod |
| `kv_cache_percentage` | `kv_usage_frac` | the EPP's last scrape of `vllm:kv_cache_usage_perc` (0-1) |
| `num_request_waiting` | `waiting_requests` | the EPP's last scrape of `vllm:num_requests_waiting` |
| `num_request_running` | `running_requests` | the EPP's own in-flight count for the pod, not vLLM's gauge |
| `prefill_tokens_in_flight`, `decode_tokens_in_flight` | same names | the EPP's in-flight token counters (0 when its in-flight load producer is off) |
| `num_tokens_generated` | `tokens_generated` (TPOT) | 1 at scheduling time; the tokens produced when a TPOT sample is posted |
| `pod_type` | role | `prefill` / `encode-prefill` -> prefill, `decode` -> decode, `""` / `prefill-decode` / `both` / `encode-prefill-decode` -> aggregated; `""` is also what an EPP without `endpointRoleLabel` sends for every pod |

The EPP sends no running-batch fields (`prefill_batch_*`, `prefill_queued_tokens`): they are 0 in every
row, and a model that uses them is not served here (routing.llmd.sidecar). `encoder_*` sizes (multimodal)
are accepted and not used.
"""

from __future__ import annotations

from datetime import datetime, timezone

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from routing.features import ROLE_CODE

# pod_type (the value of the pod's `llm-d.ai/role` label, as the EPP sends it) -> our role.
ROLE_OF_POD_TYPE: dict[str, str] = {
    "": "aggregated",
    "prefill": "prefill",
    "encode-prefill": "prefill",
    "decode": "decode",
    "prefill-decode": "aggregated",
    "both": "aggregated",
    "encode-prefill-decode": "aggregated",
}
# The most rows one bulk call may carry (llm-d's sidecars: 10000).
MAX_BULK_ROWS = 10_000


class PredictionRow(BaseModel):
    """One candidate pod's state and the request's size, as the EPP sends it (llm-d's PredictionRequest)."""

    model_config = ConfigDict(extra="ignore")

    kv_cache_percentage: float = Field(ge=0.0, le=1.0, description="vllm:kv_cache_usage_perc of the pod, 0-1")
    input_token_length: int = Field(ge=0, description="prompt length, tokens")
    num_request_waiting: int = Field(ge=0, description="vllm:num_requests_waiting of the pod")
    num_request_running: int = Field(ge=0, description="the EPP's in-flight request count for the pod")
    num_tokens_generated: int = Field(ge=0, description="1 at scheduling; tokens produced for a TPOT sample")
    prefix_cache_score: float = Field(ge=0.0, le=1.0, description="approximate prefix-cache match, 0-1")
    pod_type: str | None = Field("", description="the pod's llm-d.ai/role label value, or '' (monolithic)")
    prefill_tokens_in_flight: int = Field(0, ge=0)
    decode_tokens_in_flight: int = Field(0, ge=0)
    encoder_matched_size: int = Field(0, ge=0, description="multimodal encoder cache match (not used)")
    encoder_input_size: int = Field(0, ge=0, description="multimodal encoder input (not used)")


class TrainingEntry(PredictionRow):
    """A finished request's row at dispatch and what was observed (llm-d's TrainingEntry): the EPP posts one
    target per entry, the other 0."""

    actual_ttft_ms: float = Field(ge=0.0, description="observed TTFT, ms (0: not this entry's target)")
    actual_tpot_ms: float = Field(ge=0.0, description="observed TPOT, ms (0: not this entry's target)")
    timestamp: datetime | None = Field(None, description="when it was observed (RFC 3339); default: now")


class BulkPrediction(BaseModel):
    requests: list[PredictionRow] = Field(min_length=1, max_length=MAX_BULK_ROWS)


class BulkTraining(BaseModel):
    entries: list[TrainingEntry] = Field(max_length=MAX_BULK_ROWS)


class FlushRequest(BaseModel):
    """llm-d's /flush body: which stores to empty (each defaults to yes)."""

    model_config = ConfigDict(extra="forbid")

    flush_training_data: bool = True
    flush_test_data: bool = True
    flush_metrics: bool = True
    reason: str | None = Field(None, max_length=1000)


class RowError(ValueError):
    """A row valid by schema that has no meaning here; `index` is its position in the call."""

    def __init__(self, index: int, field: str, message: str):
        super().__init__(f"requests[{index}].{field}: {message}")
        self.index = index
        self.field = field


def role_code(pod_type: str | None, index: int) -> int:
    """Our role code for a row's pod_type (RowError naming the row for one we cannot serve, e.g. `encode`)."""
    role = ROLE_OF_POD_TYPE.get(pod_type or "")
    if role is None:
        known = ", ".join(repr(k) for k in ROLE_OF_POD_TYPE)
        raise RowError(index, "pod_type", f"{pod_type!r} is not a role this predictor serves (one of {known})")
    return ROLE_CODE[role]


def row_fields(rows: list[PredictionRow], roles: np.ndarray) -> dict:
    """routing.features.feature_matrix keyword arguments for `rows` (roles: their codes, from role_code)."""
    n = len(rows)
    zeros = np.zeros(n)

    def col(name: str) -> np.ndarray:
        return np.fromiter((getattr(r, name) for r in rows), dtype=float, count=n)

    return {
        "role": roles,
        "input_tokens": col("input_token_length"),
        "prefix_cache_hit_frac": col("prefix_cache_score"),
        "kv_usage_frac": col("kv_cache_percentage"),
        "waiting_requests": col("num_request_waiting"),
        "running_requests": col("num_request_running"),
        "prefill_tokens_in_flight": col("prefill_tokens_in_flight"),
        "decode_tokens_in_flight": col("decode_tokens_in_flight"),
        "prefill_batch_tokens": zeros,
        "prefill_batch_elapsed_ms": zeros,
        "prefill_queued_tokens": zeros,
        "tokens_generated": col("num_tokens_generated"),
    }


def observed_at_s(entry: TrainingEntry, now_s: float) -> float:
    """The entry's timestamp as Unix seconds (now when it has none; a naive time is read as UTC)."""
    if entry.timestamp is None:
        return now_s
    ts = entry.timestamp if entry.timestamp.tzinfo else entry.timestamp.replace(tzinfo=timezone.utc)
    return ts.timestamp()
