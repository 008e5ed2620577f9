"""The latency predictor's features: one definition for training and serving.

The router computes these when it routes a request (to predict TTFT and TPOT on
each candidate endpoint) and stores the same raw values with each training
sample; the retrain flow turns stored samples into a matrix with
`feature_matrix`, exactly as the router does at serving time. A published model
names its feature list and is refused unless it equals the list below for its
target.

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
- role: endpoint role, one-hot as role_prefill / role_decode / role_aggregated.
- tokens_generated (TPOT only): output tokens the request had produced when the
  TPOT was observed; 0 at routing time and for whole-request samples.

TTFT samples come from the endpoint that produced the first token's prefill
(prefill or aggregated role); TPOT samples from the endpoint that decoded
(decode or aggregated role).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np

Target = Literal["ttft", "tpot"]
TARGETS: tuple[Target, ...] = ("ttft", "tpot")
Role = Literal["prefill", "decode", "aggregated"]
ROLES: tuple[Role, ...] = ("prefill", "decode", "aggregated")

# Request size and endpoint load, in feature-column order.
LOAD_FIELDS: tuple[str, ...] = (
    "input_tokens",
    "prefix_cache_hit_frac",
    "kv_usage_frac",
    "waiting_requests",
    "running_requests",
    "prefill_tokens_in_flight",
    "decode_tokens_in_flight",
)
# Raw quantities a sample stores (besides role).
RAW_FIELDS: tuple[str, ...] = LOAD_FIELDS + ("tokens_generated",)

TTFT_FEATURES: tuple[str, ...] = LOAD_FIELDS + ("role_prefill", "role_decode", "role_aggregated")
TPOT_FEATURES: tuple[str, ...] = TTFT_FEATURES + ("tokens_generated",)
FEATURES: dict[Target, tuple[str, ...]] = {"ttft": TTFT_FEATURES, "tpot": TPOT_FEATURES}
ROLE_CODE: dict[str, int] = {role: i for i, role in enumerate(ROLES)}


def feature_matrix(
    target: Target,
    *,
    input_tokens,
    prefix_cache_hit_frac,
    kv_usage_frac,
    waiting_requests,
    running_requests,
    prefill_tokens_in_flight,
    decode_tokens_in_flight,
    role,
    tokens_generated=0.0,
) -> np.ndarray:
    """Rows of features for `target`, columns in FEATURES[target] order.

    Every argument is a scalar or a 1-D array (broadcast together); `role` is a
    role name, or an integer code from ROLE_CODE (scalar or array). Units as in
    the module docstring. Raises ValueError naming the field for a non-finite or
    negative value, or an unknown role.
    """
    if target not in FEATURES:
        raise ValueError(f"target must be one of {TARGETS}, got {target!r}")
    codes = _role_codes(role)
    values = (
        input_tokens,
        prefix_cache_hit_frac,
        kv_usage_frac,
        waiting_requests,
        running_requests,
        prefill_tokens_in_flight,
        decode_tokens_in_flight,
    )
    n = max([np.size(v) for v in values] + [codes.size, np.size(tokens_generated)])
    out = np.empty((n, len(FEATURES[target])), dtype=float)
    # Column assignment broadcasts scalars: this runs for every routed request.
    for j, v in enumerate(values):
        out[:, j] = v
    out[:, 7] = codes == 0
    out[:, 8] = codes == 1
    out[:, 9] = codes == 2
    if target == "tpot":
        out[:, 10] = tokens_generated
    _check_finite(out, FEATURES[target])
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
