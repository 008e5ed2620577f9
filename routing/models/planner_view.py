"""A published latency model as the planner's TTFT view, used only when fresh and with a TTFT p90.

The planner sizes prefill from single-request TTFT by prompt length
(planner.latency.ttft_view). The router's published model predicts TTFT from feature
rows; on rows of an idle prefill engine (nothing waiting, running or in
flight, no prefix cache hit) it gives exactly that, as a mean and a p90. It is
tabulated at prompt lengths spanning the profiled range (the planner
extrapolates beyond it linearly, as it does the profile), a relative model
multiplied by the router's profile estimate as the router does.

`choose_ttft_view` decides whether the active model may stand in for the
profile: it must be published within `max_age_s`, have a TTFT p90 model, and
predict finite positive TTFTs there; otherwise the profile is used and the
choice says why.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.latency.profile import EngineProfile
from planner.latency.ttft_view import TabulatedTtftView, TtftView
from routing.features import LOAD_FIELDS, feature_matrix
from routing.models.validated import LatencyModel, parse_model_document
from routing.models.predictor import ProfileEstimator

TABLE_POINTS = 64


@dataclass(frozen=True)
class TtftChoice:
    """The TTFT view a planner run uses (None: the profile's), what it is, and why it was chosen."""

    view: TtftView | None
    source: str
    reason: str


def tabulate_ttft(model: LatencyModel, profile: EngineProfile, *, points: int = TABLE_POINTS) -> TabulatedTtftView:
    """The model's mean and p90 TTFT on an idle prefill engine at `points` prompt lengths over the profiled range.

    ValueError (naming the model) when a prediction is not finite and positive,
    or a relative model's estimate is not this profile's.
    """
    lo, hi = profile.prefill.isl_range_tokens
    isl = np.geomspace(lo, hi, points)
    idle = {name: 0.0 for name in LOAD_FIELDS if name != "input_tokens"}
    x = feature_matrix("ttft", role="prefill", input_tokens=isl, **idle)
    estimate = ProfileEstimator(profile) if "ttft" in model.relative else None
    mean = model.predict_ms("ttft", x, quantile="mean", estimate=estimate)
    p90 = model.predict_ms("ttft", x, quantile="p90", estimate=estimate)
    return TabulatedTtftView.from_points(isl, mean, p90, source=f"published model {model.version}")


def choose_ttft_view(
    active: tuple[dict, dict] | None, profile: EngineProfile, *, now_s: float, max_age_s: float
) -> TtftChoice:
    """The published model's view when it is fresh and has a TTFT p90, else the profile with the reason.

    active: (the active version's listing entry with published_at_s, its document),
        as connectors.router_admin.RouterAdminClient.active_model returns; None: none published.
    now_s: the run's clock, Unix seconds. max_age_s: oldest publication accepted, s.
    """
    if active is None:
        return TtftChoice(None, "profile", "no latency model is published")
    entry, document = active
    version = entry.get("version", "?")
    published_at_s = entry.get("published_at_s")
    if not isinstance(published_at_s, (int, float)):
        return TtftChoice(None, "profile", f"published model {version}: no published_at_s in the listing")
    age_s = now_s - float(published_at_s)
    if age_s > max_age_s:
        return TtftChoice(None, "profile", f"published model {version} is stale: published {age_s:.0f} s ago, "
                                           f"more than max_age_s {max_age_s:g}")
    try:
        model = parse_model_document(document)
        if not model.has_quantile("ttft", "p90"):
            return TtftChoice(None, "profile", f"published model {version} has no TTFT p90 model")
        view = tabulate_ttft(model, profile)
    except ValueError as exc:
        return TtftChoice(None, "profile", f"published model {version} not usable: {exc}")
    return TtftChoice(view, view.source, f"published {max(age_s, 0.0):.0f} s ago (max_age_s {max_age_s:g}); "
                                         f"idle-engine TTFT mean {view.mean_ms[0]:.0f}-{view.mean_ms[-1]:.0f} ms, "
                                         f"p90 {view.p90_ms[0]:.0f}-{view.p90_ms[-1]:.0f} ms over "
                                         f"{view.isl_tokens[0]:.0f}-{view.isl_tokens[-1]:.0f} tokens")
