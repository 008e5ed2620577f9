"""Layout of the registry's load matrix: one float row per endpoint slot, one column per quantity.

A pick gathers its candidates' rows in a single numpy indexing operation and
reads them as an `EndpointView`.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from routing.features import ENDPOINT_FIELDS, ROLE_FEATURES, ROLES

# Columns of the load matrix.
(ROLE, KV_M, WAIT_M, RUN_M, M_AT, LC_RUN, LC_WAIT, PREFILL_TIF, DECODE_TIF, MAX_KV, MIN_TTFT, MIN_ITL,
 BATCH_TIF, BATCH_AT) = range(14)
N_COLS = 14
# Columns of EndpointView.block: the endpoint's feature columns in feature order.
BLOCK_FIELDS: tuple[str, ...] = ENDPOINT_FIELDS + ROLE_FEATURES
assert BLOCK_FIELDS[:8] == (
    "kv_usage_frac", "waiting_requests", "running_requests", "prefill_tokens_in_flight", "decode_tokens_in_flight",
    "prefill_batch_tokens", "prefill_batch_elapsed_ms", "prefill_queued_tokens",
) and len(BLOCK_FIELDS) == 11, "EndpointView.block columns must follow routing.features.ENDPOINT_FIELDS"
ROLE_CODES = np.arange(len(ROLES), dtype=float)


class EndpointView(NamedTuple):
    """Effective load of some endpoints at one instant (arrays aligned with `idx`)."""

    idx: np.ndarray
    role_code: np.ndarray
    kv_usage_frac: np.ndarray
    waiting_requests: np.ndarray
    running_requests: np.ndarray
    prefill_tokens_in_flight: np.ndarray
    decode_tokens_in_flight: np.ndarray
    prefill_batch_tokens: np.ndarray
    prefill_batch_elapsed_ms: np.ndarray
    prefill_queued_tokens: np.ndarray
    strictest_ttft_ms: np.ndarray  # strictest TTFT SLO in flight, ms; inf when nothing awaits a first token there
    strictest_itl_ms: np.ndarray  # strictest ITL SLO in flight, ms; inf when nothing decodes there
    idle: np.ndarray  # nothing in flight (lifecycle) and no running requests (metrics)
    # (11, n) float: the ENDPOINT_FIELDS arrays above as rows, then the role
    # one-hot (BLOCK_FIELDS); routing.features copies it into a feature
    # matrix in one operation. None in views built by hand.
    block: np.ndarray | None = None
