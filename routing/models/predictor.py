"""Latency prediction for routing: the published model if any, else a profile-derived estimate.

`ProfileEstimator` turns the same feature rows a published model sees into TTFT
and TPOT from pre-deployment profiling data (no training needed):

* TTFT on a prefill or aggregated endpoint = the profiled prefill time of all
  the uncached prompt work that will be done when this request's prefill is:
  the tokens awaiting a first token there (prefill_tokens_in_flight, the
  router's lifecycle count, which includes the running batch) plus the
  request's own uncached tokens, as if prefilled in batches of at most the
  engines' prefill token budget (vLLM's max_num_batched_tokens, 8192 by
  default; a prompt longer than the budget runs alone, at its own profiled
  time, after the work queued ahead of it, and so does queued work whose
  prompts average more than the budget: prefill_tokens_in_flight /
  waiting_requests). Engines batch queued prompts
  (vLLM's chunked prefill), so queued work runs at the throughput of a full
  batch, not of each prompt alone, and the running
  batch is on average half done while the request itself is not yet in a
  batch: measured against the simulator's batching engine on Azure and
  Mooncake traces this is unbiased within ~10 ms, where "own prefill time +
  queued tokens / throughput at the own length" over-predicted short prompts
  behind a queue by 30-60 ms (benchmarks/bench_routing_sim.py, estimate
  error section). Without the budget, a backlog of 1M tokens was estimated
  as one 1M-token prompt at the throughput measured at the longest profiled
  one: 11% above the batches of 8192 an engine runs, so a loaded fleet's
  TTFT ratio to the estimate drifted with the queue's depth (docs/retrain.md,
  benchmarks). Without lifecycle counts (prefill_tokens_in_flight 0 but
  requests waiting, e.g. metrics pushed for traffic routed elsewhere) the
  waiting requests count as this prompt's length each. Beyond the longest
  profiled prompt the time grows linearly at the throughput measured there
  (a clamp would predict a 64k prompt as fast as a 16k one). Aggregated
  endpoints add one decode step (running decodes share the engine). On a
  decode endpoint, TTFT is its first decode step.
* TPOT on a decode or aggregated endpoint = the profiled ITL at the KV usage
  after adding this prompt and at the mean context per running request
  (KV tokens / (running + 1)). The KV usage is the larger of the scraped one
  and the router's own count of context it sent there
  (decode_tokens_in_flight): scrapes lag, and without that every pick between
  two scrapes would see the same endpoint as the least loaded. Prefill
  endpoints have no TPOT (0).

Profile curves are tabulated once at construction (the profile classes warn on
each clamp; the tables clamp silently to the profiled range, which is what a
router wants on every request), so an estimate is a few vectorised lookups.
The estimate assumes one GPU per engine, like the profile's per-GPU figures.

`LatencyPredictor.snapshot()` pins one model for a whole pick, so a model swap
in the middle of a pick cannot mix two versions. A relative published model
(routing.models.validated: a target marked relative, the estimate named in `base`)
predicts ratios to this estimate: the pinned model multiplies them by the
estimate on the same rows.
"""

from __future__ import annotations

import dataclasses
import threading
import warnings
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

from routing.features import TARGETS, TPOT_FEATURES, TTFT_FEATURES, Target, features_from_samples
from routing.models.online_calibration import OnlineCalibration, served_factor

_COL = {name: j for j, name in enumerate(TPOT_FEATURES)}
# Running-batch features (tokens, elapsed time, tokens queued behind it), when
# this router's feature set has them.
_BATCH_PROGRESS = {"prefill_batch_tokens", "prefill_batch_elapsed_ms", "prefill_queued_tokens"} <= set(_COL)
_ISL_POINTS = 256
_KV_POINTS = 129
_CTX_POINTS = 64


class LatencyModelLike(Protocol):
    def predict(self, target: Target, x: np.ndarray, *, quantile: Literal["mean", "p90"] = "mean") -> np.ndarray: ...


DEFAULT_PREFILL_TOKEN_BUDGET = 8192


class ProfileEstimator:
    """TTFT/TPOT (ms) from an EngineProfile (planner.latency.profile), on feature rows."""

    version = None

    def __init__(self, profile, *, prefill_token_budget: int | None = DEFAULT_PREFILL_TOKEN_BUDGET):
        """profile: planner.latency.profile.EngineProfile (prefill and decode profiles, name).

        prefill_token_budget: the engines' max_num_batched_tokens (queued prompt work drains in batches of at
        most this many tokens); None: all of it as one batch (the estimate before the budget). The name (a
        relative model's `base`) carries it, so a model fitted on one estimate is never served on the other.
        """
        if prefill_token_budget is not None and prefill_token_budget < 1:
            raise ValueError(f"prefill_token_budget must be >= 1 or None, got {prefill_token_budget}")
        self.prefill_token_budget = prefill_token_budget
        self.name = profile.name if prefill_token_budget is None else f"{profile.name};budget={prefill_token_budget}"
        self.max_kv_tokens = float(profile.decode.max_kv_tokens)
        lo, hi = profile.prefill.isl_range_tokens
        self._isl = np.geomspace(lo, hi, _ISL_POINTS)
        self._ttft_ms = np.asarray(profile.prefill.ttft_ms_many(self._isl), dtype=float)
        self._isl_max = float(hi)
        self._ms_per_token_beyond = float(self._ttft_ms[-1]) / float(hi)
        clo, chi = profile.decode.context_range_tokens
        self._ctx = np.geomspace(clo, chi, _CTX_POINTS) if chi > clo else np.array([clo, clo * (1 + 1e-9)])
        self._inv_ctx = 1.0 / self._ctx
        kv = np.linspace(0.0, 1.0, _KV_POINTS)
        with warnings.catch_warnings():
            # KV usage above what was measured at a context is clamped: the
            # table then holds the highest measured ITL there, on purpose.
            warnings.simplefilter("ignore")
            self._itl = np.array([profile.decode.itl_ms_many(kv, c) for c in self._ctx])
        self._budget_ms = None if prefill_token_budget is None else float(self.prefill_ms(prefill_token_budget))
        if not (np.isfinite(self._ttft_ms).all() and np.isfinite(self._itl).all()):
            raise ValueError(f"profile {profile.name}: tabulated curves are not finite")

    def predict(self, target: Target, x: np.ndarray, *, quantile: str = "mean") -> np.ndarray:
        """Predicted latency, ms, per feature row (columns FEATURES[target]); quantile is ignored."""
        is_prefill = x[:, _COL["role_prefill"]] == 1.0
        is_decode = x[:, _COL["role_decode"]] == 1.0
        if target == "tpot":
            return np.where(is_prefill, 0.0, self._tpot(x))
        input_tokens = x[:, _COL["input_tokens"]]
        uncached = np.maximum(input_tokens * (1.0 - x[:, _COL["prefix_cache_hit_frac"]]), 1.0)
        in_flight = x[:, _COL["prefill_tokens_in_flight"]]
        waiting = x[:, _COL["waiting_requests"]]
        ahead = np.where(in_flight > 0, in_flight, waiting * uncached)
        # Tokens per request awaiting there: prompts over the budget run alone, at their own time.
        each = np.where(in_flight > 0, in_flight / np.maximum(waiting, 1.0), uncached)
        if _BATCH_PROGRESS:
            # Known running batch: the queue behind it and this prompt as the next
            # batch, after what is left of it (computed for those rows only: every pick runs this).
            batch = x[:, _COL["prefill_batch_tokens"]]
            running = (in_flight > 0) & (batch > 0)
            if running.any():
                prefill_ms = self._behind_ms(np.where(running, x[:, _COL["prefill_queued_tokens"]], ahead),
                                             uncached, each)
                left_ms = self.drain_ms(batch[running], each[running]) - x[running, _COL["prefill_batch_elapsed_ms"]]
                prefill_ms[running] += np.maximum(left_ms, 0.0)
            else:
                prefill_ms = self._behind_ms(ahead, uncached, each)
        else:
            prefill_ms = self._behind_ms(ahead, uncached, each)
        if is_prefill.all():
            return prefill_ms
        step_ms = self._tpot(x)
        return np.where(is_prefill, prefill_ms, np.where(is_decode, step_ms, prefill_ms + step_ms))

    def prefill_ms(self, tokens: np.ndarray) -> np.ndarray:
        """Profiled time to prefill `tokens` uncached tokens in one batch, ms.

        Below the shortest profiled prompt: its TTFT (fixed per-batch cost);
        beyond the longest: linear at the throughput measured there.
        """
        tokens = np.asarray(tokens, dtype=float)
        return np.where(
            tokens <= self._isl_max, np.interp(tokens, self._isl, self._ttft_ms), tokens * self._ms_per_token_beyond
        )

    def drain_ms(self, tokens: np.ndarray, each: np.ndarray | float = 1.0) -> np.ndarray:
        """Time to prefill `tokens` of queued prompt work, ms, made of prompts of `each` tokens on average: full
        batches of the token budget, then the rest as one batch; prompts over the budget one at a time, at
        their own profiled time (without a budget, prefill_ms of all of it). Up to the budget: prefill_ms."""
        tokens = np.asarray(tokens, dtype=float)
        out = self.prefill_ms(tokens)
        budget = self.prefill_token_budget
        over = tokens > (np.inf if budget is None else budget)
        if over.any():  # only these rows pay for the batches (this is on every pick)
            t = tokens[over]
            e = np.broadcast_to(np.maximum(np.asarray(each, dtype=float), 1.0), tokens.shape)[over]
            full = np.floor(t / budget)
            rest = t - full * budget
            batched = full * self._budget_ms + np.where(rest > 0, self.prefill_ms(np.maximum(rest, 1.0)), 0.0)
            out[over] = np.where(e > budget, t * self.prefill_ms(e) / e, batched)
        return out

    def _behind_ms(self, ahead: np.ndarray, uncached: np.ndarray, each: np.ndarray) -> np.ndarray:
        """A prompt of `uncached` tokens behind `ahead` queued tokens (prompts of `each` on average): drained
        together, or, when the prompt or the queued ones are over the budget, the queue and then the prompt."""
        out = self.drain_ms(ahead + uncached, each)
        budget = self.prefill_token_budget
        if budget is None:
            return out
        after = (uncached > budget) | (each > budget)
        if after.any():
            a = ahead[after]
            out[after] = self.drain_ms(a, each[after]) * (a > 0) + self.prefill_ms(uncached[after])
        return out

    def _tpot(self, x: np.ndarray) -> np.ndarray:
        # Scraped KV usage can be seconds old; the router's own count of context
        # it has sent there moves at once, so picks between scrapes see each other.
        held = np.maximum(x[:, _COL["kv_usage_frac"]], x[:, _COL["decode_tokens_in_flight"]] / self.max_kv_tokens)
        kv = np.minimum(held + x[:, _COL["input_tokens"]] / self.max_kv_tokens, 1.0)
        running = x[:, _COL["running_requests"]] + 1.0
        ctx = np.maximum(kv * self.max_kv_tokens / running, 1.0)
        return self._itl_at(kv, ctx)

    def _itl_at(self, kv: np.ndarray, ctx: np.ndarray) -> np.ndarray:
        kf = np.minimum(np.maximum(kv, 0.0), 1.0) * (_KV_POINTS - 1)
        k0 = np.minimum(kf.astype(np.int64), _KV_POINTS - 2)
        wk = kf - k0
        c = np.minimum(np.maximum(ctx, self._ctx[0]), self._ctx[-1])
        j = np.minimum(np.maximum(np.searchsorted(self._ctx, c), 1), self._ctx.size - 1)
        i = j - 1
        # Linear in 1/context between rows, as the profile interpolates.
        w = (self._inv_ctx[i] - 1.0 / c) / (self._inv_ctx[i] - self._inv_ctx[j])
        t = self._itl
        a = t[i, k0] * (1 - wk) + t[i, k0 + 1] * wk
        b = t[j, k0] * (1 - wk) + t[j, k0 + 1] * wk
        return a + w * (b - a)


@dataclass(frozen=True)
class PinnedModel:
    """The model one pick uses: `version` None means the profile estimate.

    online / shifts: the online p90 calibration and its shifts when the pick began (None: none).
    """

    model: LatencyModelLike
    version: str | None
    quantile: Literal["mean", "p90"]
    base: ProfileEstimator | None = None
    online: OnlineCalibration | None = None
    shifts: dict | None = None

    def predict(self, target: Target, x: np.ndarray) -> np.ndarray:
        pred = self.model.predict(target, x, quantile=self.quantile)
        if self.base is not None and target in self.model.relative:
            pred = pred * self.base.predict(target, x)
        if self.shifts is not None:
            pred = pred * served_factor(self.shifts, self.online, target, x)
        return pred


class LatencyPredictor:
    """Serves the active published model (from a ModelStore), else the profile estimate."""

    def __init__(self, *, estimate: ProfileEstimator, models=None, quantile: Literal["mean", "p90"] = "p90",
                 online: OnlineCalibration | None = None):
        """models: routing.models.store.ModelStore or None (estimate only); online: the online p90
        calibration of published models (used only with quantile p90)."""
        self.estimate = estimate
        self.models = models
        self.quantile = quantile
        self.online = online if quantile == "p90" else None
        self._pending: list = []  # samples waiting to be scored for the online calibration
        self._pending_lock = threading.Lock()

    def observe(self, sample) -> int:
        """Feed a recorded sample (routing.fleet.requests.Sample) to the online calibration: samples predicted by
        a published model wait until `batch` of them are scored together against the active model's p90.
        Returns how many outcomes were counted by this call (0 while they wait)."""
        if self.online is None or sample.model_version is None or sample.predicted_ms is None:
            return 0
        with self._pending_lock:
            self._pending.append(sample)
            if len(self._pending) < self.online.batch:
                return 0
            batch, self._pending = self._pending, []
        return self._count(batch)

    def _count(self, samples: list) -> int:
        """Score samples against the active model's p90 (no shift) and hand the log ratios to the calibration."""
        # The model picks use now, without its online shifts (online is only set for p90 predictions).
        pinned = self.snapshot()
        if pinned.version is None:
            return 0
        model = dataclasses.replace(pinned, shifts=None)
        counted = 0
        for target in TARGETS:
            mine = [s for s in samples if s.target == target and s.model_version == model.version]
            if mine:
                x = features_from_samples(target, [{**s.features, "role": s.role} for s in mine])
                observed = np.array([s.observed_ms for s in mine], dtype=float)
                with np.errstate(divide="ignore", invalid="ignore"):
                    ratios = np.log(observed / model.predict(target, x))
                counted += self.online.add(target, self.online.cells(x), ratios, version=model.version)
        return counted

    def _pinned(self, active, base: ProfileEstimator | None) -> PinnedModel:
        if self.online is None:
            return PinnedModel(active, active.version, self.quantile, base)
        return PinnedModel(active, active.version, self.quantile, base, self.online,
                           self.online.shifts(active.version))

    def snapshot(self) -> PinnedModel:
        active = self.models.active if self.models is not None else None
        if active is None:
            return PinnedModel(self.estimate, None, self.quantile)
        base = getattr(active, "base", None)
        if base is None:
            return self._pinned(active, None)
        # The service refuses on publish a relative model of another estimate; one retained from before a
        # restart on another profile cannot be served (its ratios mean nothing here): the estimate serves.
        if base != f"profile:{self.estimate.name}":
            return PinnedModel(self.estimate, None, self.quantile)
        return self._pinned(active, self.estimate)


# The column lists are re-exported for callers building rows by hand.
__all__ = ["LatencyPredictor", "PinnedModel", "ProfileEstimator", "TPOT_FEATURES", "TTFT_FEATURES"]
