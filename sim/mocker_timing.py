"""Engine timing as Dynamo 1.6.1's mocker computes it from a planner profile.

`python -m dynamo.mocker --planner-profile-data DIR` does not interpolate the
profile. It fits two least-squares lines to the profiler's raw points
(dynamo.planner.core.perf_model: prefill wall time on scheduled prefill tokens;
decode wall time on [requests in the batch, KV tokens]), samples them on a grid
(perf_data.npz: 100 prefill lengths; 100 x 100 KV tokens x context lengths) and
looks the grid up per engine step (dynamo_mocker::common::perf_model):

* prefill step: linear interpolation in the batch's new tokens, extrapolated
  linearly, at least 0 ms;
* decode step: bilinear interpolation in (sum of the batch's context lengths,
  that sum / batch size), extrapolated linearly, at least 1 ms.

Both are divided by the mocker's --speedup-ratio (and decode by its
--decode-speedup-ratio too). The scheduler around them (chunked prefill under
max_num_batched_tokens, the first token after the first decode step) is in
sim.engine; docs/simulator.md, "Against Dynamo's mocker", has the references
and the hand-checked cases.
"""

from __future__ import annotations

import bisect
from collections import deque

import numpy as np

from planner.latency.profile import EngineProfile

GRID_POINTS = 100  # the converter's default resolution
MOCKER_GPU_BLOCKS = 16384  # the mocker's KV blocks without --num-gpu-blocks-override
MOCKER_BLOCK_SIZE = 64  # vLLM engine type's default block size
MOCKER_MAX_NUM_SEQS = 256  # the mocker's --max-num-seqs default: requests per step
MIN_DECODE_STEP_MS = 1.0  # "token-emitting decode steps should not collapse onto the same timestamp"


def _least_squares(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Intercept and slopes of y on the columns of x (sklearn LinearRegression's fit)."""
    design = np.column_stack([np.ones(len(x)), x])
    return np.linalg.lstsq(design, y, rcond=None)[0]


def mocker_perf_grids(profile: EngineProfile, resolution: int = GRID_POINTS) -> dict[str, np.ndarray]:
    """The arrays the mocker's converter writes to perf_data.npz for this profile, ms.

    Prefill: wall time (s) = a + b * isl over the profiled points. Decode: each point
    becomes (batch = max(1, round(kv_tokens / context)), kv_tokens = round(kv_usage *
    max_kv_tokens)), wall time = c + d * batch + e * kv_tokens; a negative d is set to 0
    (Dynamo's relaxable feature), a negative b or e means Dynamo's mocker refuses the
    profile and so does this.
    """
    if resolution < 2:
        raise ValueError(f"mocker_perf_grids: resolution must be >= 2, got {resolution}")
    pre, dec = profile.prefill, profile.decode
    isl = np.asarray(pre.isl_tokens, dtype=float).round()
    a, b = _least_squares(isl, np.asarray(pre.ttft_ms, dtype=float) / 1e3)
    kv = np.round(np.asarray(dec.kv_usage_frac, dtype=float) * dec.max_kv_tokens)
    ctx = np.asarray(dec.context_tokens, dtype=float)
    batch = np.maximum(1.0, np.round(kv / np.where(ctx > 0, ctx, 1.0)))
    batch = np.where(ctx > 0, batch, 1.0)
    c, d, e = _least_squares(np.column_stack([batch, kv]), np.asarray(dec.itl_ms, dtype=float) / 1e3)
    if b < 0 or e < 0:
        raise ValueError(
            f"profile {profile.name}: the mocker's regression has a negative slope (prefill {b:g} s/token, "
            f"decode {e:g} s/KV token); Dynamo's mocker rejects such a profile"
        )
    d = 0.0 if d < -1e-6 else d
    grid_isl = np.linspace(isl.min(), isl.max(), resolution)
    grid_kv = np.linspace(0.0, kv.max(), resolution)
    grid_ctx = np.linspace(1.0, ctx.max() if len(ctx) else 8192.0, resolution)
    kk, cc = np.meshgrid(grid_kv, grid_ctx, indexing="ij")
    bs = np.maximum(1.0, kk / cc)
    return {
        "prefill_isl": grid_isl,
        "prefill_ttft_ms": np.maximum(1e-6, a + b * grid_isl) * 1e3,
        "decode_active_kv_tokens": grid_kv,
        "decode_context_length": grid_ctx,
        "decode_itl": np.maximum(1e-6, c + d * bs + e * kk) * 1e3,
    }


def _cell(axis: list[float], x: float) -> tuple[int, float]:
    """Left index of the grid cell holding x (the edge cell outside) and x's fraction in it."""
    i = min(max(bisect.bisect_right(axis, x) - 1, 0), len(axis) - 2)
    return i, (x - axis[i]) / (axis[i + 1] - axis[i])


class MockerTables:
    """Prefill-batch and decode-step times as the mocker looks them up; same interface as ProfileTables.

    speedup_ratio / decode_speedup_ratio: the mocker's flags of those names (times are divided).
    max_kv_tokens: the mocker's KV capacity, num_gpu_blocks x block_size tokens.
    """

    def __init__(self, profile: EngineProfile, *, speedup_ratio: float = 1.0, decode_speedup_ratio: float = 1.0,
                 num_gpu_blocks: int = MOCKER_GPU_BLOCKS, block_size: int = MOCKER_BLOCK_SIZE):
        if not speedup_ratio > 0 or not decode_speedup_ratio > 0:
            raise ValueError(f"MockerTables: speedup ratios must be > 0, got {speedup_ratio}, {decode_speedup_ratio}")
        if num_gpu_blocks < 1 or block_size < 1:
            raise ValueError(f"MockerTables: num_gpu_blocks and block_size must be >= 1, got {num_gpu_blocks}, "
                             f"{block_size}")
        self.name = f"{profile.name} (Dynamo mocker timing)"
        grids = mocker_perf_grids(profile)
        self.grids = grids
        self._isl: list[float] = grids["prefill_isl"].tolist()
        self._ttft: list[float] = grids["prefill_ttft_ms"].tolist()
        self._kv: list[float] = grids["decode_active_kv_tokens"].tolist()
        self._ctx: list[float] = grids["decode_context_length"].tolist()
        self._itl: list[list[float]] = grids["decode_itl"].tolist()
        self._prefill_scale = 1.0 / speedup_ratio
        self._decode_scale = 1.0 / (speedup_ratio * decode_speedup_ratio)
        self.max_kv_tokens = num_gpu_blocks * block_size

    def prefill_ms(self, tokens: int) -> float:
        """One prefill step over `tokens` new tokens (all requests of the step), ms."""
        if tokens <= 0:
            return 0.0
        i, f = _cell(self._isl, float(tokens))
        t = self._ttft
        return max(t[i] + f * (t[i + 1] - t[i]), 0.0) * self._prefill_scale

    def decode_step_ms(self, kv_tokens: float, context_tokens: float) -> float:
        """One decode step of a batch holding kv_tokens context tokens in all, context_tokens each on average, ms."""
        i, fx = _cell(self._kv, kv_tokens)
        j, fy = _cell(self._ctx, context_tokens)
        z = self._itl
        lo = z[i][j] + fy * (z[i][j + 1] - z[i][j])
        hi = z[i + 1][j] + fy * (z[i + 1][j + 1] - z[i + 1][j])
        return max(lo + fx * (hi - lo), MIN_DECODE_STEP_MS) * self._decode_scale

    def segment_step_ms(self, kv_tokens: float, n_requests: int, n_steps: int) -> float:
        """Mean step time over n_steps decode steps of n_requests requests from kv_tokens, ms.

        Each step adds one token per request. Simpson's rule over the first, middle and
        last step: exact for one or two steps, close elsewhere (the grid is bilinear).
        """
        last = kv_tokens + n_requests * (n_steps - 1)
        first = self.decode_step_ms(kv_tokens, kv_tokens / n_requests)
        if n_steps <= 1:
            return first
        end = self.decode_step_ms(last, last / n_requests)
        if n_steps == 2:
            return 0.5 * (first + end)
        mid = 0.5 * (kv_tokens + last)
        return (first + 4.0 * self.decode_step_ms(mid, mid / n_requests) + end) / 6.0

    def itl_ms(self, kv_frac: float, context_tokens: float) -> float:
        """The decode step at a KV usage (fraction of max_kv_tokens) and mean context, ms (the engine's call)."""
        return self.decode_step_ms(kv_frac * self.max_kv_tokens, context_tokens)


def mocker_tables(tables) -> MockerTables:
    """The mocker's timing for the profile behind `tables` (a DriftedTables' scales become speedup ratios)."""
    if isinstance(tables, MockerTables):
        return tables
    profile = getattr(tables, "profile", None)
    if not isinstance(profile, EngineProfile):
        raise ValueError(f"engine_model 'dynamo_mocker': needs MockerTables or profile tables, got {type(tables).__name__}")
    prefill_scale = getattr(tables, "prefill_scale", 1.0)
    decode_scale = getattr(tables, "decode_scale", 1.0)
    return MockerTables(profile, speedup_ratio=1.0 / prefill_scale, decode_speedup_ratio=prefill_scale / decode_scale)


def chunked_prefill_step(queue: deque, isl, head_done_tokens: int, budget_tokens: int,
                         max_requests: int = MOCKER_MAX_NUM_SEQS) -> tuple[list[int], int, int]:
    """One prefill step as the mocker's vLLM scheduler fills it: (finished requests, tokens, head progress).

    The queue's head may be part-way through its prompt (head_done_tokens computed):
    it goes first, then waiting requests in order, each taking what is left of the
    budget; the last one may get only a chunk and stays at the head. Finished
    requests are popped from the queue. At most max_requests requests per step.
    """
    finished: list[int] = []
    tokens = 0
    done = head_done_tokens
    scheduled = 0
    while queue and tokens < budget_tokens and scheduled < max_requests:
        rid = queue[0]
        chunk = min(isl[rid] - done, budget_tokens - tokens)
        tokens += chunk
        scheduled += 1
        if done + chunk < isl[rid]:
            return finished, tokens, done + chunk
        finished.append(queue.popleft())
        done = 0
    return finished, tokens, 0
