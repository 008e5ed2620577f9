"""What a retrain run offers to publish: the candidate scored and gated, a target worse than the estimate kept on it.

The gate never publishes a model worse than the profile estimate on either
target. When only one target's trees are worse on the held-out rows (they
learned a load the newest rows no longer show), refusing the whole model would
also throw away the other target's gain; instead that target is published as
the estimate itself (a relative model with no trees: a ratio of 1 for the
point, which the router serves exactly as it serves the estimate, and the
estimate times the calibration slice's conformal factor for the p90), and the
document is scored and gated again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from routing.features import TARGETS, Target
from routing.training.export import to_document
from routing.training.calibration import calibration_offsets
from routing.training.config import TrainingConfig
from routing.training.data import PreparedSamples, TargetData
from routing.training.evaluation import Evaluation, evaluate_all
from routing.training.fit import FlatModel, TargetModels, log_estimate
from routing.training.split import Split, splits_for
from routing.training.gate import GATE_METRICS, METRIC_LABELS, GateDecision, decide_publish, worse_than_estimate


@dataclass(frozen=True)
class Candidate:
    """The document to publish (or not), its evaluation and decision, and the targets kept on the estimate."""

    document: dict
    evaluation: Evaluation
    decision: GateDecision
    models: dict[Target, TargetModels]
    kept_estimate: tuple[Target, ...] = ()


def estimate_models(models: TargetModels, data: TargetData, split: Split, cfg: TrainingConfig, *,
                    calibrated: bool = True) -> TargetModels:
    """A target's models replaced by the estimate: ratio 1 for the point; for the p90 the estimate times
    the calibration slice's conformal factor (per load bucket where cfg says so), or with calibrated
    False the estimate itself (as the router serves it without a model); no trees."""
    cal = split.calibration
    log_ratio = np.log(data.y_ms[cal]) - log_estimate(data.estimate_ms[cal])
    offset, by_bucket = 0.0, None
    if calibrated and cfg.calibrate_p90 and log_ratio.size:
        offset, by_bucket = calibration_offsets(data.target, data.x[cal], log_ratio, cfg)
    return replace(models, mean=FlatModel(0.0), p90=FlatModel(0.0), p90_log_offset=offset,
                   p90_bucket_offsets=by_bucket, base=data.estimate_name, mean_kind="flat", p90_kind="flat",
                   iterations={"mean": 0, "p90": 0}, p90_selection={}, point_selection={})


def decide_candidate(
    models: Mapping[Target, TargetModels],
    prepared: PreparedSamples,
    cfg: TrainingConfig,
    *,
    version: str,
    created_at_s: float | None,
    current_document: dict | None,
    current_version: str | None,
    estimate,
    force: bool,
) -> Candidate:
    """Score the candidate's document, gate it, and when one target alone is worse than the estimate,
    keep that target on the estimate and decide again (the reason names it and its figures): with a
    calibrated p90 first, and if that p90 is still worse than the estimate's, the estimate's own."""
    trained = dict(models)
    args = (prepared, cfg, version, created_at_s, current_document, current_version, estimate, force)
    document, evaluation, decision = _decide(trained, *args)
    worse = worse_than_estimate(evaluation.candidate, evaluation.estimate)
    if (decision.code != "refused_estimate" or not 0 < len(worse) < len(TARGETS)
            or any(prepared.by_target[t].estimate_name is None for t in worse)):
        return Candidate(document, evaluation, decision, trained)
    note = "; ".join(
        f"{t} keeps the profile estimate (trained: " + ", ".join(
            f"{METRIC_LABELS[k]} {evaluation.candidate[t][k]:.2%} vs the estimate's {evaluation.estimate[t][k]:.2%}"
            for k in GATE_METRICS) + ")" for t in worse)
    splits = splits_for(prepared, cfg)
    for calibrated in (True, False):
        models = trained | {t: estimate_models(trained[t], prepared.by_target[t], splits[t], cfg,
                                               calibrated=calibrated) for t in worse}
        document, evaluation, decision = _decide(models, *args)
        if not set(worse) & set(worse_than_estimate(evaluation.candidate, evaluation.estimate)):
            break
    if not calibrated:
        note += " with the estimate as its p90 (a calibrated factor was worse)"
    decision = replace(decision, reason=f"{note}; {decision.reason}")
    document = dict(document, notes=decision.reason[:4096])
    return Candidate(document, evaluation, decision, models, kept_estimate=tuple(worse))



def _decide(models, prepared, cfg, version, created_at_s, current_document, current_version, estimate, force):
    draft = to_document(models, version=version, metrics={}, created_at_s=created_at_s)
    evaluation = evaluate_all(prepared, cfg, candidate_document=draft, current_document=current_document,
                              estimate=estimate)
    decision, evaluation = decide_publish(draft, evaluation, prepared, cfg, current_version=current_version,
                                          force=force, estimate=estimate)
    return dict(draft, metrics=evaluation.metrics(), notes=decision.reason[:4096]), evaluation, decision
