"""The publish gate: publish, refuse or skip a candidate model, with the numbers behind it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from routing.features import TARGETS, Target
from routing.training.config import TrainingConfig
from routing.training.data import PreparedSamples
from routing.training.evaluation import Evaluation
from routing.training.probe import probe_document


@dataclass(frozen=True)
class GateDecision:
    """publish: whether to publish; code: publish, publish_forced, refused_probe, refused_estimate,
    refused_current, skipped; reason: the numbers behind it."""

    publish: bool
    code: str
    reason: str


GATE_METRICS = ("mape", "p90_loss")


def score(metrics: Mapping[Target, Mapping]) -> float:
    """One number to rank models: the mean of MAPE and relative p90 loss over both targets."""
    return float(np.mean([metrics[t][k] for t in TARGETS for k in GATE_METRICS]))


def gate(
    candidate: Mapping[Target, Mapping],
    *,
    estimate: Mapping[Target, Mapping],
    current: Mapping[Target, Mapping] | None,
    current_version: str | None,
    force: bool,
    cfg: TrainingConfig,
) -> GateDecision:
    """Decide whether the candidate replaces the published model.

    Each mapping holds a target's held-out metrics (`mape`, `p90_loss`), all
    on the same rows; the estimate's p90 is its point estimate, which is what
    the router uses when no model is published. Checked in order:
    1. never worse than the profile estimate, on either metric of either
       target, even when forced;
    2. unless forced, better than the current model (when there is one): the
       score (mean of the four metrics) lower by min_improvement_frac, and none
       of the four above the current one's by more than max_regression_frac;
    3. unless forced, in every stratum (`strata` of each target's metrics, see
       STRATA) with at least stratum_min_samples rows, neither metric above the
       current one's by more than stratum_max_regression_frac: a model better
       on average, because idle requests dominate, may be worse where the
       queue is deep.
    """
    for t in worse_than_estimate(candidate, estimate):
        for k in GATE_METRICS:
            c, e = candidate[t][k], estimate[t][k]
            if _worse(c, e):
                return GateDecision(False, "refused_estimate",
                                    f"{t} {METRIC_LABELS[k]} {c:.2%} is worse than the profile estimate's {e:.2%}")
    summary = _summary(candidate)
    if current is None:
        return GateDecision(True, "publish", f"no model published yet; candidate ({summary}) beats the profile estimate")
    if force:
        return GateDecision(True, "publish_forced",
                            f"forced: candidate ({summary}); current {current_version} ({_summary(current)})")
    cand, cur = score(candidate), score(current)
    needed = cur * (1 - cfg.min_improvement_frac)
    if not cand < needed:
        return GateDecision(False, "refused_current",
                            f"score {cand:.2%} is not below the current model {current_version}'s {cur:.2%}"
                            + (f" minus {cfg.min_improvement_frac:.0%}" if cfg.min_improvement_frac else "")
                            + f" (candidate {summary}; current {_summary(current)})")
    for t in TARGETS:
        for k in GATE_METRICS:
            limit = current[t][k] * (1 + cfg.max_regression_frac)
            if candidate[t][k] > limit:
                return GateDecision(False, "refused_current",
                                    f"{t} {METRIC_LABELS[k]} {candidate[t][k]:.2%} regresses past the current model "
                                    f"{current_version}'s {current[t][k]:.2%} (+{cfg.max_regression_frac:.0%} allowed)")
    regression = stratum_regression(candidate, current, cfg)
    if regression is not None:
        return GateDecision(False, "refused_current", f"{regression} (current model {current_version}; score "
                                                      f"{cand:.2%} vs {cur:.2%} on average)")
    return GateDecision(True, "publish",
                        f"score {cand:.2%} beats current {current_version}'s {cur:.2%} "
                        f"(candidate {summary}; current {_summary(current)})")


# How each gate metric is named in reasons and model cards.
METRIC_LABELS = {"mape": "MAPE", "p90_loss": "p90 loss"}


def worse_than_estimate(candidate: Mapping[Target, Mapping], estimate: Mapping[Target, Mapping]) -> list[Target]:
    """The targets where the candidate's MAPE or p90 loss is above the estimate's, in TARGETS order."""
    return [t for t in TARGETS if any(_worse(candidate[t][k], estimate[t][k]) for k in GATE_METRICS)]


def _worse(candidate: float, estimate: float) -> bool:
    # A relative model with ratio 1 serves the estimate itself; its scores differ from the
    # estimate's only by rounding (exp of a log), which must not count as worse.
    return candidate > estimate * (1 + 1e-9)


def stratum_regression(candidate: Mapping[Target, Mapping], current: Mapping[Target, Mapping],
                       cfg: TrainingConfig) -> str | None:
    """The first stratum where the candidate is worse than the current model past the margin (None: none).

    Only strata where both were scored on at least cfg.stratum_min_samples
    rows count (fewer rows: too noisy to refuse on). Metrics of a stratum
    missing from either side are skipped.
    """
    for t in TARGETS:
        current_strata = {s["name"]: s for s in current[t].get("strata", ())}
        for c in candidate[t].get("strata", ()):
            k_ = current_strata.get(c["name"])
            if k_ is None or min(c["n"], k_["n"]) < cfg.stratum_min_samples:
                continue
            for k in GATE_METRICS:
                if c[k] is None or k_[k] is None:
                    continue
                limit = k_[k] * (1 + cfg.stratum_max_regression_frac)
                if c[k] > limit:
                    return (f"{t} stratum {c['name']} (n={c['n']}): {METRIC_LABELS[k]} {c[k]:.2%} regresses past the "
                            f"current model's {k_[k]:.2%} (+{cfg.stratum_max_regression_frac:.0%} allowed)")
    return None


def _summary(metrics: Mapping[Target, Mapping]) -> str:
    return ", ".join(f"{t} MAPE {metrics[t]['mape']:.2%} p90 loss {metrics[t]['p90_loss']:.2%}" for t in TARGETS)


def decide_publish(
    document: dict,
    evaluation: Evaluation,
    prepared: PreparedSamples,
    cfg: TrainingConfig,
    *,
    current_version: str | None,
    force: bool,
    estimate=None,
) -> tuple[GateDecision, Evaluation]:
    """The publish decision for a candidate document: the probe grid first (never forced past), then `gate`.

    estimate: the profile estimate a relative document is multiplied by.
    Returns the decision and the evaluation with its probe report.
    """
    report = probe_document(document, prepared, cfg, estimate=estimate)
    evaluation = replace(evaluation, probe=report)
    failure = report.failure()
    if failure is not None:
        return GateDecision(False, "refused_probe", failure), evaluation
    decision = gate(evaluation.candidate, estimate=evaluation.estimate, current=evaluation.current,
                    current_version=current_version, force=force, cfg=cfg)
    return decision, evaluation
