"""The latency predictor's features: one definition for training and serving.

The router computes these when it routes a request (to predict TTFT and TPOT on
each candidate endpoint) and stores the same raw values with each training
sample; the retrain flow turns stored samples into a matrix with
`feature_matrix`, exactly as the router does at serving time. A published model
names its feature set and list (see the end of this docstring).

Raw fields (one value per row; in-flight quantities describe the endpoint at the
moment of dispatch and EXCLUDE the request being routed, whose own size is
`input_tokens`):

- input_tokens: the request's prompt length in real tokenizer tokens (not words).
- prefix_cache_hit_frac: fraction (0-1) of the prompt already in this endpoint's
  prefix cache (0 when the caller does not know).
- kv_usage_frac: endpoint KV-cache usage, 0-1. vLLM's `kv_cache_usage_perc` when
  fresh scraped metrics exist, else the lifecycle estimate: context tokens held on
  the endpoint / its max KV tokens.
- waiting_requests: requests queued on the endpoint. vLLM's `num_requests_waiting`
  when fresh metrics exist, else the requests dispatched there that have not yet
  produced their first token.
- running_requests: requests in flight on the endpoint. vLLM's
  `num_requests_running` when fresh metrics exist, else the requests dispatched
  there and not completed (prefill endpoints release a request at its first token).
- prefill_tokens_in_flight: prompt tokens still to prefill there: the sum of
  input_tokens * (1 - prefix_cache_hit_frac) over requests dispatched to it that
  have no first token yet (always from lifecycle calls).
- decode_tokens_in_flight: context held by requests decoding there: the sum of
  input_tokens + tokens generated so far over its in-flight requests (decode and
  aggregated endpoints; always from lifecycle calls).
- prefill_batch_tokens: uncached prompt tokens of the prefill batch the
  endpoint is estimated to be working on: the requests awaiting their first
  token there when it last released one (a first token ends a batch; the next
  starts at once with what was queued), or, on an endpoint with nothing
  awaiting, the first request dispatched to it (always from lifecycle calls).
- prefill_batch_elapsed_ms: how long that batch has been running, ms (0 when
  nothing awaits a first token there). With prefill_batch_tokens it says how
  far the work ahead of the request has got.
- prefill_queued_tokens: prefill_tokens_in_flight - prefill_batch_tokens: the
  uncached tokens queued behind the running batch, ahead of the new request.
- role: endpoint role, one-hot as role_prefill / role_decode / role_aggregated.
- tokens_generated (TPOT only): output tokens the request had produced when the
  TPOT was observed; 0 at routing time and for whole-request samples.

TTFT samples come from the endpoint that produced the first token's prefill
(prefill or aggregated role); TPOT samples from the endpoint that decoded
(decode or aggregated role).

Feature sets are versioned (FEATURE_SET_VERSION, FEATURE_SETS): a published
model names the set it was trained on, and a model of an older set is served
from the current rows by selecting its columns by name (a field's meaning never
changes within a name). A set this router does not know is refused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np

Target = Literal["ttft", "tpot"]
TARGETS: tuple[Target, ...] = ("ttft", "tpot")
# The quantile the p90 model is fitted, calibrated, served and scored at.
QUANTILE = 0.9
Role = Literal["prefill", "decode", "aggregated"]
ROLES: tuple[Role, ...] = ("prefill", "decode", "aggregated")

# Request size and endpoint load, in feature-column order. The endpoint
# quantities (all but the first two) are EndpointView fields of the same name.
LOAD_FIELDS: tuple[str, ...] = (
    "input_tokens",
    "prefix_cache_hit_frac",
    "kv_usage_frac",
    "waiting_requests",
    "running_requests",
    "prefill_tokens_in_flight",
    "decode_tokens_in_flight",
    "prefill_batch_tokens",
    "prefill_batch_elapsed_ms",
    "prefill_queued_tokens",
)
ENDPOINT_FIELDS: tuple[str, ...] = LOAD_FIELDS[2:]
ROLE_FEATURES: tuple[str, ...] = ("role_prefill", "role_decode", "role_aggregated")
# Raw quantities a sample stores (besides role).
RAW_FIELDS: tuple[str, ...] = LOAD_FIELDS + ("tokens_generated",)

TTFT_FEATURES: tuple[str, ...] = LOAD_FIELDS + ROLE_FEATURES
TPOT_FEATURES: tuple[str, ...] = TTFT_FEATURES + ("tokens_generated",)
FEATURES: dict[Target, tuple[str, ...]] = {"ttft": TTFT_FEATURES, "tpot": TPOT_FEATURES}
ROLE_CODE: dict[str, int] = {role: i for i, role in enumerate(ROLES)}

# Every feature set a published model may name, by version. Set 1 is the
# original seven load fields; set 2 adds the three prefill-progress fields. Older sets must stay subsets of the current one (checked below).
FEATURE_SET_VERSION = 2
_V1_LOAD = LOAD_FIELDS[:7]
FEATURE_SETS: dict[int, dict[Target, tuple[str, ...]]] = {
    1: {"ttft": _V1_LOAD + ROLE_FEATURES, "tpot": _V1_LOAD + ROLE_FEATURES + ("tokens_generated",)},
    FEATURE_SET_VERSION: FEATURES,
}
for _v, _sets in FEATURE_SETS.items():
    for _t, _names in _sets.items():
        assert set(_names) <= set(FEATURES[_t]), f"feature set {_v} {_t} is not a subset of the current set"

_COLUMN = {name: j for j, name in enumerate(TPOT_FEATURES)}
_ROLE_COL = _COLUMN["role_prefill"]
_TOKENS_GENERATED_COL = _COLUMN["tokens_generated"]
# view_feature_matrix copies a registry view's block into columns 2.. in one go.
assert LOAD_FIELDS[:2] == ("input_tokens", "prefix_cache_hit_frac") and _ROLE_COL == 2 + len(ENDPOINT_FIELDS)


def columns_of(names: Sequence[str], target: Target) -> np.ndarray:
    """Column indices of `names` in the current FEATURES[target] rows (ValueError on an unknown name)."""
    current = FEATURES[target]
    unknown = [n for n in names if n not in current]
    if unknown:
        raise ValueError(f"{target} features {unknown} are not computed by this router (knows {list(current)})")
    return np.array([current.index(n) for n in names], dtype=np.int64)


def feature_matrix(target: Target, *, role, tokens_generated=0.0, **fields) -> np.ndarray:
    """Rows of features for `target`, columns in FEATURES[target] order.

    fields: every LOAD_FIELDS name, each a scalar or a 1-D array (broadcast
    together); `role` is a role name, or an integer code from ROLE_CODE
    (scalar or array). Units as in the module docstring. Raises ValueError
    naming the field for a missing, unknown, non-finite or negative value, or
    an unknown role.
    """
    if target not in FEATURES:
        raise ValueError(f"target must be one of {TARGETS}, got {target!r}")
    if fields.keys() != set(LOAD_FIELDS):
        missing = [f for f in LOAD_FIELDS if f not in fields]
        unknown = sorted(set(fields) - set(LOAD_FIELDS))
        raise ValueError(f"feature_matrix: missing fields {missing}, unknown fields {unknown}")
    codes = _role_codes(role)
    values = [fields[f] for f in LOAD_FIELDS]
    n = max([np.size(v) for v in values] + [codes.size, np.size(tokens_generated)])
    out = np.empty((n, len(FEATURES[target])), dtype=float)
    # Column assignment broadcasts scalars: this runs for every routed request.
    for j, v in enumerate(values):
        out[:, j] = v
    out[:, _ROLE_COL] = codes == 0
    out[:, _ROLE_COL + 1] = codes == 1
    out[:, _ROLE_COL + 2] = codes == 2
    if target == "tpot":
        out[:, _TOKENS_GENERATED_COL] = tokens_generated
    _check_finite(out, FEATURES[target])
    return out


def view_feature_matrix(target: Target, view, *, input_tokens, prefix_cache_hit_frac, tokens_generated=0.0) -> np.ndarray:
    """feature_matrix for the endpoints of a registry EndpointView (ENDPOINT_FIELDS read by name).

    The picker and the service call this, so a new endpoint feature needs no
    change at their call sites. A view from the registry carries its endpoint
    and role columns as one block (ENDPOINT_FIELDS + ROLE_FEATURES), copied in
    one operation: this runs twice per routed request. Same values and errors
    as feature_matrix.
    """
    block = getattr(view, "block", None)
    if block is not None and target in FEATURES and np.ndim(input_tokens) == 0 and np.ndim(tokens_generated) == 0:
        n = block.shape[1]
        if np.ndim(prefix_cache_hit_frac) == 0 or np.shape(prefix_cache_hit_frac) == (n,):
            out = np.empty((n, len(FEATURES[target])), dtype=float)
            out[:, 0] = input_tokens
            out[:, 1] = prefix_cache_hit_frac
            out[:, 2 : _ROLE_COL + 3] = block.T
            if target == "tpot":
                out[:, _TOKENS_GENERATED_COL] = tokens_generated
            _check_finite(out, FEATURES[target])
            return out
    return feature_matrix(
        target, role=view.role_code, tokens_generated=tokens_generated, input_tokens=input_tokens,
        prefix_cache_hit_frac=prefix_cache_hit_frac, **{f: getattr(view, f) for f in ENDPOINT_FIELDS},
    )


def view_raw_features(view, pos: int, *, input_tokens, prefix_cache_hit_frac, tokens_generated=0.0) -> dict:
    """RAW_FIELDS (floats) plus `role` of the endpoint at position `pos` of an EndpointView."""
    out = {"input_tokens": float(input_tokens), "prefix_cache_hit_frac": float(prefix_cache_hit_frac)}
    for f in ENDPOINT_FIELDS:
        out[f] = float(getattr(view, f)[pos])
    out["tokens_generated"] = float(tokens_generated)
    out["role"] = ROLES[int(view.role_code[pos])]
    return out


def features_from_samples(target: Target, samples: Sequence[Mapping]) -> np.ndarray:
    """Feature matrix for stored samples (each a mapping with RAW_FIELDS and `role`).

    This is the call the retrain flow makes on samples read from the router, so
    training sees exactly the columns serving computes.
    """
    if not samples:
        return np.empty((0, len(FEATURES[target])), dtype=float)
    missing = [f for f in RAW_FIELDS + ("role",) if f not in samples[0]]
    if missing:
        raise ValueError(f"samples[0]: missing feature fields {missing}")
    cols = {f: [] for f in RAW_FIELDS}
    roles = []
    for i, s in enumerate(samples):
        try:
            for f in RAW_FIELDS:
                cols[f].append(s[f])
            roles.append(s["role"])
        except KeyError as exc:
            raise ValueError(f"samples[{i}]: missing feature field {exc.args[0]!r}") from None
    return feature_matrix(target, role=np.array([_role_code(r) for r in roles]), **cols)


def _role_code(role) -> int:
    if isinstance(role, str):
        if role not in ROLE_CODE:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        return ROLE_CODE[role]
    return int(role)


def _role_codes(role) -> np.ndarray:
    if isinstance(role, str):
        return np.array([_role_code(role)])
    codes = np.asarray(role)
    if codes.dtype.kind in "US":
        return np.array([_role_code(str(r)) for r in codes.ravel()])
    codes = codes.astype(int, copy=False).ravel() if codes.ndim else codes.reshape(1).astype(int)
    if codes.size and (codes.min() < 0 or codes.max() >= len(ROLES)):
        raise ValueError(f"role codes must be 0..{len(ROLES) - 1} ({ROLES}), got {codes.min()}..{codes.max()}")
    return codes


def _check_finite(x: np.ndarray, names: Sequence[str]) -> None:
    # Cheap aggregate checks first: this runs on every routed request.
    if np.isfinite(x).all() and (x >= 0).all():
        return
    for j, name in enumerate(names):
        col = x[:, j]
        bad = ~np.isfinite(col) | (col < 0)
        if bad.any():
            i = int(np.argmax(bad))
            raise ValueError(f"feature {name}: row {i} must be finite and >= 0, got {col[i]}")
