"""The publish probe grid: a candidate's predictions over the feature ranges serving may meet."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from routing.features import FEATURES, ROLE_CODE, TARGETS, Target
from routing.models.validated import document_predictions, parse_model_document
from routing.training.config import TrainingConfig
from routing.training.data import PreparedSamples
from routing.training.split import splits_for


# Features that measure work ahead of a request (tokens, ms): probed together at none, the most
# seen in training and the cap, so the grid stays small (3 levels, not 3^5 combinations).
_WORK_TOKEN_FEATURES = ("prefill_tokens_in_flight", "decode_tokens_in_flight", "prefill_batch_tokens",
                        "prefill_queued_tokens")


@dataclass(frozen=True)
class ProbeResult:
    """One target's model (mean or p90) over the probe grid.

    ceiling_ms: predictions above it are out of range (ceiling_basis: how it
    was set, with its numbers); min_ms / max_ms: the
    extremes of the grid's predictions (inf when one overflowed); bad_rows:
    grid rows out of range (not finite, <= 0 or above the ceiling); first_bad:
    the worst of them, described ("" when none).
    """

    target: Target
    quantile: str
    rows: int
    ceiling_ms: float
    ceiling_basis: str
    min_ms: float
    max_ms: float
    bad_rows: int
    first_bad: str = ""

    @property
    def ok(self) -> bool:
        return self.bad_rows == 0


@dataclass(frozen=True)
class ProbeReport:
    """Every target's and quantile's probe result; `failure` is the first one-line refusal."""

    results: tuple[ProbeResult, ...]

    def failure(self) -> str | None:
        bad = [r for r in self.results if not r.ok]
        if not bad:
            return None
        r = bad[0]
        also = f"; also {', '.join(f'{b.target} {b.quantile}' for b in bad[1:])}" if len(bad) > 1 else ""
        return (f"probe grid: {r.target} {r.quantile} {r.first_bad}; {r.bad_rows} of {r.rows} probe rows out of "
                f"range (ceiling {r.ceiling_ms:.0f} ms: {r.ceiling_basis}){also}")


def probe_grid(target: Target, x_train: np.ndarray, cfg: TrainingConfig) -> np.ndarray:
    """Feature rows (full FEATURES[target] columns) spanning what serving may meet.

    Per feature: none, the most seen in training and a cap: prompts (and
    tokens generated) up to cfg.probe_context_tokens, queue and batch up to
    cfg.probe_max_requests, KV usage 0 / 0.5 / 1, prefix hits 0 / 1, work in
    flight up to context x max requests tokens (together, at one of the three
    levels); crossed with each role. Units as in routing.features.
    """
    names = FEATURES[target]
    seen = {n: float(x_train[:, j].max()) if x_train.size else 0.0 for j, n in enumerate(names)}
    ctx, reqs = float(cfg.probe_context_tokens), float(cfg.probe_max_requests)

    def levels(name: str, cap: float, low: float = 0.0) -> list[dict[str, float]]:
        return [{name: v} for v in sorted({low, min(seen[name], cap), cap})]

    work_cap = ctx * reqs
    elapsed_cap = cfg.max_latency_ms("ttft")
    axes = [
        levels("input_tokens", ctx, low=1.0),
        [{"prefix_cache_hit_frac": 0.0}, {"prefix_cache_hit_frac": 1.0}],
        [{"kv_usage_frac": v} for v in (0.0, 0.5, 1.0)],
        levels("waiting_requests", reqs),
        levels("running_requests", reqs),
        [{**{f: 0.0 for f in _WORK_TOKEN_FEATURES}, "prefill_batch_elapsed_ms": 0.0},
         {**{f: min(seen[f], work_cap) for f in _WORK_TOKEN_FEATURES},
          "prefill_batch_elapsed_ms": min(seen["prefill_batch_elapsed_ms"], elapsed_cap)},
         {**{f: work_cap for f in _WORK_TOKEN_FEATURES}, "prefill_batch_elapsed_ms": elapsed_cap}],
        [{f"role_{r}": 1.0} for r in ROLE_CODE],
    ]
    if target == "tpot":
        axes.append(levels("tokens_generated", ctx))
    rows = []
    for combo in itertools.product(*axes):
        row = dict.fromkeys(names, 0.0)
        for part in combo:
            row.update(part)
        rows.append([row[n] for n in names])
    return np.array(rows, dtype=float)


def describe_row(target: Target, row: np.ndarray) -> str:
    """The probe row's request and load, e.g. 'input_tokens=131072 waiting_requests=1024 role=prefill'."""
    names = FEATURES[target]
    role = next((n[len("role_"):] for n, v in zip(names, row) if n.startswith("role_") and v), "?")
    shown = [f"{n}={v:g}" for n, v in zip(names, row)
             if not n.startswith("role_") and n not in _WORK_TOKEN_FEATURES + ("prefill_batch_elapsed_ms",)]
    work = row[names.index("decode_tokens_in_flight")]
    return " ".join(shown + [f"work_in_flight_tokens={work:g}", f"role={role}"])


def probe_document(document: dict, prepared: PreparedSamples, cfg: TrainingConfig, *, estimate=None) -> ProbeReport:
    """Predict every probe-grid row with the document, as the router would, and check each prediction.

    Out of range: not finite (exp() overflowed), <= 0 ms (a negative raw
    prediction the router clips to 0), or above the ceiling: the smaller of
    cfg.probe_ceiling_factor x the largest latency of the target's training
    rows and cfg.max_<target>_ms (what counts as absurd in a sample), ms. A
    relative model (multiplied by `estimate`, which the router serves without
    a model) may also go up to cfg.probe_ceiling_factor x the estimate of the
    row: a prompt queued behind 10^8 tokens legitimately waits hours.
    """
    relative = parse_model_document(document).relative
    splits = splits_for(prepared, cfg)
    results = []
    for t in TARGETS:
        d = prepared.by_target[t]
        train = splits[t].train
        grid = probe_grid(t, d.x[train], cfg)
        train_max = float(d.y_ms[train].max()) if d.y_ms[train].size else cfg.max_latency_ms(t)
        limit = cfg.max_latency_ms(t)
        ceiling = min(cfg.probe_ceiling_factor * train_max, limit)
        basis = (f"{cfg.probe_ceiling_factor:g} x the largest training {t.upper()} {train_max:.4g} ms"
                 if ceiling < limit else f"max_{t}_ms {limit:g}")
        row_ceiling, may_be_zero = ceiling, False
        if t in relative:
            est = np.asarray(estimate.predict(t, grid), dtype=float)
            row_ceiling = np.maximum(ceiling, cfg.probe_ceiling_factor * est)
            # Where the estimate itself is 0 (TPOT of a prefill endpoint, which the router never asks), so is
            # the relative model, as the estimate serves it.
            may_be_zero = est <= 0
            basis += f", or {cfg.probe_ceiling_factor:g} x the profile estimate of the row"
        with np.errstate(over="ignore", invalid="ignore"):
            mean, p90 = document_predictions(document, t, grid, estimate)
        for quantile, pred in (("mean", mean), ("p90", p90)):
            finite = np.isfinite(pred)
            bad = ~finite | ((pred <= 0) & ~may_be_zero) | (pred > row_ceiling)
            first_bad = ""
            if bad.any():
                # The worst row: an overflow first, then the largest, then a zero.
                key = np.where(~finite, np.inf, np.where(pred <= 0, -1.0, pred))
                i = int(np.argmax(np.where(bad, key, -np.inf)))
                what = ("not finite (overflow)" if not finite[i] else "<= 0" if pred[i] <= 0
                        else "above the ceiling")
                first_bad = f"predicts {pred[i]:.4g} ms, {what}, at {describe_row(t, grid[i])}"
            results.append(ProbeResult(
                target=t, quantile=quantile, rows=int(grid.shape[0]), ceiling_ms=ceiling, ceiling_basis=basis,
                min_ms=float(np.min(pred)), max_ms=float(np.max(pred)), bad_rows=int(bad.sum()),
                first_bad=first_bad))
    return ProbeReport(tuple(results))
