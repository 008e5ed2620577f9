"""The retrain flow: fetch samples → prepare features → train → evaluate → publish the latency predictor.

Scheduled hourly (prefect.yaml) and runnable by hand. It reads the training
samples the routing service recorded, fits mean and p90 models of TTFT and
TPOT on a time-ordered split, scores them, the currently published model and
the profile-derived estimate on the same most recent held-out samples, and
publishes to the routing service only when the gate allows it. Every run
leaves a model card artifact (samples, drops, metrics per load bucket, the
comparison, the decision, a predicted-vs-observed plot). `rollback=True`
reactivates the previous (or a named) version instead of training.

A run starts from what the routing service holds; nothing is kept between runs.
"""

from __future__ import annotations

import base64
import io
import time

import numpy as np
from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact

from planner.config import ProfileConfig
from routing.features import FEATURE_SETS, TARGETS
from routing.models.predictor import DEFAULT_PREFILL_TOKEN_BUDGET, ProfileEstimator
from routing.training.buckets import bucket_labels
from routing.training.config import TrainingConfig
from routing.training.data import PreparedSamples
from routing.training.evaluation import STRATA, Evaluation
from routing.training.gate import GateDecision
from routing.training.probe import ProbeReport
from routing.training.split import check_sample_counts, splits_for
from tasks.steps import load_profiling_data
from tasks.retrain import (
    evaluate_models,
    fetch_current_model,
    fetch_samples,
    prepare_features,
    publish_model,
    rollback_model,
    train_models,
)

ARTIFACT_KEY = "retrain-model-card"


@flow(name="sla-planner-retrain", log_prints=False)
def retrain_flow(
    router_url: str = "http://127.0.0.1:8080",
    profile_dir: str | None = None,
    prefill_token_budget: int | None = DEFAULT_PREFILL_TOKEN_BUDGET,
    token_env: str = "SLA_ROUTER_TOKEN",
    training: TrainingConfig | None = None,
    force: bool = False,
    rollback: bool = False,
    rollback_to_version: str | None = None,
    max_samples: int = 200_000,
    version: str | None = None,
    now_s: float | None = None,
) -> dict:
    """Train, evaluate and (if the gate allows) publish the TTFT/TPOT predictor.

    Args:
        router_url: the routing service's base URL; its admin token is read from $token_env.
        profile_dir: the profile folder the routing service's estimate uses (the gate's floor).
        prefill_token_budget: the routing service's prefill_token_budget (its estimate's batches; None: one).
        token_env: environment variable holding the routing service's admin bearer token.
        training: hyperparameters, sample minimums and gate margins (default: TrainingConfig()).
        force: publish even when not better than the current model (never when worse than the estimate).
        rollback: reactivate the previously active version instead of training.
        rollback_to_version: reactivate this retained version instead of training.
        max_samples: train on at most the newest this many samples (>= 1).
        version: the new model's version id (default: UTC time of the run + flow-run id).
        now_s: the run's clock, Unix seconds (default: now).
    """
    logger = get_run_logger()
    now = time.time() if now_s is None else now_s
    if rollback or rollback_to_version is not None:
        return _rollback(router_url, token_env=token_env, to_version=rollback_to_version)
    if profile_dir is None:
        raise ValueError("retrain flow: profile_dir is required (the routing service's profile: the gate's floor)")
    if max_samples < 1:
        raise ValueError(f"retrain flow: max_samples must be >= 1, got {max_samples}")
    cfg = training or TrainingConfig()
    version = version or _default_version(now)

    profile = load_profiling_data(ProfileConfig(dir=profile_dir))
    samples = fetch_samples(router_url, token_env=token_env, max_samples=max_samples)
    # The published model is read after the samples, as close to publishing as possible.
    current_version, current_document, estimate_name = fetch_current_model(router_url, token_env=token_env)
    estimate = ProfileEstimator(profile, prefill_token_budget=prefill_token_budget)
    context = {"router_url": router_url, "version": version, "current_version": current_version,
               "estimate": f"profile:{estimate.name}", "force": force}
    if estimate_name and estimate_name != context["estimate"]:
        logger.warning("router estimate %s is not %s: relative models are refused", estimate_name, context["estimate"])
    prepared = prepare_features(samples, cfg, estimate=estimate)

    shortage = check_sample_counts(prepared, cfg)
    if shortage is not None:
        decision = GateDecision(False, "skipped", shortage)
        logger.warning("skipped: %s", shortage)
        _card(model_card(context, prepared, cfg, decision), version)
        return _result(decision, version, current_version, prepared, published=None)

    models = train_models(prepared, cfg)
    document, evaluation, decision, models = evaluate_models(
        prepared, models, cfg=cfg, version=version, created_at_s=now, current_document=current_document,
        current_version=current_version, estimate=estimate, force=force,
    )
    logger.info("decision %s: %s", decision.code, decision.reason)
    png = predicted_vs_observed_png(evaluation)
    card = model_card(context, prepared, cfg, decision, evaluation=evaluation, models=models, png=png)
    # The card is written before publishing, so every model the router may serve is explained
    # by a card (a failed publish replaces it with one that says so).
    _card(card, version)
    published = None
    if decision.publish:
        try:
            published = publish_model(router_url, document, token_env=token_env)
        except Exception as exc:
            failed = GateDecision(False, "publish_failed",
                                  f"{decision.reason}; publishing failed: {exc}. The served model is unchanged "
                                  f"({current_version or 'profile estimate'}).")
            _card(model_card(context, prepared, cfg, failed, evaluation=evaluation, models=models, png=png), version)
            raise
        logger.info("published %s (active: %s)", published["version"], published["active"])
    return _result(decision, version, current_version, prepared, published=published, evaluation=evaluation)


def _rollback(router_url: str, *, token_env: str, to_version: str | None) -> dict:
    """Reactivate to_version (None: the previously active one) and leave a card saying so."""
    result = rollback_model(router_url, token_env=token_env, to_version=to_version)
    get_run_logger().info("rollback: active model is now %s", result["active"] or result["estimate"])
    _card(_rollback_card(router_url, to_version, result), "rollback")
    return {"decision": "rollback", "active": result["active"], "estimate": result["estimate"]}


def _default_version(now_s: float) -> str:
    from prefect.runtime import flow_run

    run_id = str(flow_run.id or "local").replace("-", "")[:8]
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now_s)) + f"-{run_id}"


def _result(decision: GateDecision, version: str, current_version: str | None, prepared: PreparedSamples, *,
            published: dict | None, evaluation: Evaluation | None = None) -> dict:
    return {
        "samples": {t: prepared.by_target[t].n for t in TARGETS},
        "dropped": prepared.dropped(),
        "decision": decision.code,
        "reason": decision.reason,
        "version": version,
        "published": published is not None,
        "active_before": current_version,
        "active_after": published["version"] if published else current_version,
        "metrics": evaluation.metrics() if evaluation is not None else {},
    }


def _card(markdown: str, version: str) -> None:
    create_markdown_artifact(key=ARTIFACT_KEY, markdown=markdown, description=f"latency model card {version}")


# -- the model card ---------------------------------------------------------------


def _pct(x: float | None, digits: int = 2) -> str:
    return "—" if x is None else f"{x * 100:.{digits}f}%"


def model_card(
    context: dict,
    prepared: PreparedSamples,
    cfg: TrainingConfig,
    decision: GateDecision,
    *,
    evaluation: Evaluation | None = None,
    models: dict | None = None,
    png: bytes | None = None,
) -> str:
    """The run's model card (Markdown; the PNG plot inlined as a data: URI so the Prefect UI shows it)."""
    verdict = {"publish": "PUBLISHED", "publish_forced": "PUBLISHED (forced)", "skipped": "SKIPPED",
               "publish_failed": "PUBLISH FAILED"}.get(decision.code, "REFUSED")
    lines = [
        f"# Latency model {context['version']}: {verdict}",
        "",
        f"**Decision** `{decision.code}`: {decision.reason}",
        "",
        f"Routing service {context['router_url']}; published model before this run: "
        f"`{context['current_version'] or 'none (profile estimate serves)'}`; estimate `{context['estimate']}`"
        + ("; forced" if context.get("force") else ""),
        "",
        "## Samples",
        "",
        "| target | usable | train | calibration | held out | dropped |",
        "|---|---|---|---|---|---|",
    ]
    splits = splits_for(prepared, cfg)
    for t in TARGETS:
        d = prepared.by_target[t]
        n_tr, n_cal, n_hold = splits[t].sizes()
        dropped = ", ".join(f"{k} {v}" for k, v in d.dropped.items() if v) or "none"
        lines.append(f"| {t} | {d.n} | {n_tr} | {n_cal} | {n_hold} | {dropped} |")
    lines += ["", f"{prepared.fetched} samples fetched"
              + (f"; {prepared.dropped_unknown_target} with an unknown target dropped" if prepared.dropped_unknown_target else "")
              + "."]
    if evaluation is not None:
        lines += _metrics_section(evaluation)
        lines += _strata_section(evaluation, cfg)
        lines += _bucket_section(evaluation)
        if evaluation.probe is not None:
            lines += _probe_section(evaluation.probe)
    if models is not None:
        lines += ["", "## Training", "", "| target | model | iterations | fit s | p90 calibration factor |",
                  "|---|---|---|---|---|"]
        for t in TARGETS:
            m = models[t]
            kind = f"point, relative to {m.base}" if m.base else "point, absolute (ms)"
            if m.relative_selection:
                kind += (" (calibration MAPE " + ", ".join(f"{k} {_pct(v)}" for k, v in m.relative_selection.items())
                         + ")")
            if m.mean_kind == "flat":
                kind += f": flat, the estimate x{np.exp(m.mean.log_factor):.3f} (no trees)"
            if m.point_selection:
                kind += ("; chosen on the newer half of the calibration slice, MAPE "
                         + ", ".join(f"{k} {_pct(v)}" for k, v in m.point_selection.items()))
            lines.append(f"| {t} | {kind} | {m.iterations['mean']} | {m.fit_s:.2f} | |")
            factor = f"x{np.exp(m.p90_log_offset):.3f}"
            if m.p90_bucket_offsets is not None:
                per = ", ".join(f"{label}: x{np.exp(o):.3f}"
                                for label, o in zip(bucket_labels(t), m.p90_bucket_offsets))
                factor = f"per load bucket ({per}; global {factor})"
            if m.p90_kind == "flat":
                factor += " on the profile estimate (no trees)"
            if m.p90_selection:
                factor += ("; chosen on the newer half of the calibration slice, p90 loss "
                           + ", ".join(f"{k} {_pct(v, 3)}" for k, v in m.p90_selection.items()))
            lines.append(f"| {t} | p90 | {m.iterations['p90']} | | {factor} |")
        base = models["ttft"].base
        lines += ["", f"Feature set {cfg.feature_set} (routing.features; the router serves sets "
                  f"{sorted(FEATURE_SETS)}). "
                  + (f"Relative model: predictions are ratios to the estimate `{base}`, which the router "
                     f"multiplies back." if base else "Absolute model: predictions are ms."),
                  "", "Config: `" + cfg.model_dump_json() + "`"]
    if png is not None:
        lines += ["", "## Predicted vs observed (held out)", "",
                  f"![predicted vs observed](data:image/png;base64,{base64.b64encode(png).decode('ascii')})"]
    return "\n".join(lines) + "\n"


def _metrics_section(ev: Evaluation) -> list[str]:
    lines = ["", "## Held-out comparison (same most recent samples)", "",
             "| target | model | MAPE | p90 coverage | p90 loss | samples | window (s) |", "|---|---|---|---|---|---|---|"]
    for t in TARGETS:
        h = ev.holdout[t]
        window = f"{h['from_s']:.0f}–{h['to_s']:.0f}" if h["n"] else "—"
        rows = [("candidate", ev.candidate[t])]
        if ev.current is not None:
            rows.append(("current", ev.current[t]))
        rows.append(("profile estimate", ev.estimate[t]))
        for name, m in rows:
            lines.append(f"| {t} | {name} | {_pct(m['mape'])} | {_pct(m['p90_coverage'], 1)} | {_pct(m['p90_loss'])} "
                         f"| {m['n']} | {window} |")
    lines += ["", "MAPE: mean |predicted - observed| / observed of the point model. p90 loss: pinball loss at 0.9 "
              "relative to the observed latency (lower is better; the estimate's p90 is its single value, as the "
              "router uses it). Score: the mean of the four MAPE and p90-loss figures."]
    capped = {t: ev.holdout[t].get("left_out_by_source_cap", 0) for t in TARGETS}
    if any(capped.values()):
        lines += ["", "Held out but not scored, so that no endpoint holds more than holdout_max_source_frac of "
                  "the scored rows: " + ", ".join(f"{t} {n}" for t, n in capped.items()) + "."]
    return lines


def _strata_section(ev: Evaluation, cfg: TrainingConfig) -> list[str]:
    lines = _comparison_head(ev, "## Per stratum (held out)",
                             ["stratum", "target", "samples", "MAPE", "p90 coverage", "p90 coverage as served",
                              "p90 loss"],
                             ["current MAPE", "current p90 loss"])
    for stratum in STRATA:
        for t in TARGETS:
            c = _stratum(ev.candidate[t], stratum.name)
            row = (f"| {stratum.name} | {t} | {c['n']} | {_pct(c['mape'])} | {_pct(c['p90_coverage'], 1)} "
                   f"| {_pct((c.get('served') or {}).get('p90_coverage'), 1)} | {_pct(c['p90_loss'])} |")
            if ev.current is not None:
                k = _stratum(ev.current[t], stratum.name)
                row += f" {_pct(k['mape'])} | {_pct(k['p90_loss'])} |"
            lines.append(row + f" {_pct(_stratum(ev.estimate[t], stratum.name)['mape'])} |")
    lines += ["", f"Strata: queue depth (`waiting_requests`), KV-cache use (`kv_usage_frac`) and prompt length "
              f"(`input_tokens`) of the endpoint at dispatch. The gate refuses a candidate whose MAPE or p90 loss "
              f"in a stratum with at least {cfg.stratum_min_samples} held-out rows is more than "
              f"{cfg.stratum_max_regression_frac:.0%} above the current model's. As served: the p90 the router "
              f"serves with its online calibration (routing.models.online_calibration), the held-out rows replayed in "
              f"time order from a fresh start."]
    return lines


def _comparison_head(ev: Evaluation, title: str, columns: list[str], current_columns: list[str]) -> list[str]:
    """A section title and table header: columns, the current model's (when there is one), the estimate's MAPE."""
    names = columns + (current_columns if ev.current is not None else []) + ["estimate MAPE"]
    return ["", title, "", "| " + " | ".join(names) + " |", "|" + "---|" * len(names)]


def _stratum(metrics: dict, name: str) -> dict:
    return next(s for s in metrics["strata"] if s["name"] == name)


def _bucket_section(ev: Evaluation) -> list[str]:
    lines = _comparison_head(ev, "## Per load bucket",
                             ["target", "load bucket", "samples", "candidate MAPE", "candidate p90 coverage"],
                             ["current MAPE"])
    for t in TARGETS:
        for k, b in enumerate(ev.candidate[t]["buckets"]):
            row = f"| {t} | {b['bucket']} | {b['n']} | {_pct(b['mape'])} | {_pct(b['p90_coverage'], 1)} |"
            if ev.current is not None:
                row += f" {_pct(ev.current[t]['buckets'][k]['mape'])} |"
            lines.append(row + f" {_pct(ev.estimate[t]['buckets'][k]['mape'])} |")
    return lines


def _probe_section(report: ProbeReport) -> list[str]:
    lines = ["", "## Probe grid", "", "| target | model | rows | min ms | max ms | ceiling ms | out of range | worst |",
             "|---|---|---|---|---|---|---|---|"]
    for r in report.results:
        lines.append(f"| {r.target} | {r.quantile} | {r.rows} | {r.min_ms:.4g} | {r.max_ms:.4g} | {r.ceiling_ms:.0f} "
                     f"| {r.bad_rows} | {r.first_bad or '—'} |")
    lines += ["", "Every prediction on a grid of prompts up to the context length, queues and batches up to the "
              "probe maximum, KV usage 0–1 and each role must be finite, above 0 and below the ceiling "
              "(" + "; ".join(sorted({f"{r.target}: {r.ceiling_basis}" for r in report.results})) + ")."]
    return lines


def predicted_vs_observed_png(ev: Evaluation, *, max_points: int = 1500, seed: int = 0) -> bytes:
    """PNG: per target, predicted (candidate point and p90, estimate) vs observed latency, log-log."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rng = np.random.default_rng(seed)
    fig, axes = plt.subplots(1, len(TARGETS), figsize=(10, 4.2), dpi=90)
    try:
        for ax, t in zip(axes, TARGETS):
            y, mean, p90, est = ev.points[t]
            idx = np.arange(y.size)
            if y.size > max_points:
                idx = np.sort(rng.choice(y.size, size=max_points, replace=False))
            ax.scatter(y[idx], est[idx], s=4, alpha=0.3, color="0.6", label="profile estimate")
            if p90 is not None:
                ax.scatter(y[idx], p90[idx], s=4, alpha=0.3, color="tab:orange", label="candidate p90")
            ax.scatter(y[idx], mean[idx], s=4, alpha=0.5, color="tab:blue", label="candidate point (median)")
            if y.size:
                positive = np.concatenate([y, mean, est])
                positive = positive[positive > 0]
                lo, hi = positive.min(), positive.max()
                ax.plot([lo, hi], [lo, hi], color="black", lw=1, label="predicted = observed")
                ax.set_xscale("log")
                ax.set_yscale("log")
            ax.set_title(f"{t.upper()} (held out, n={y.size})")
            ax.set_xlabel("observed, ms")
            ax.set_ylabel("predicted, ms")
            ax.legend(loc="upper left", fontsize=7, markerscale=3)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        return buf.getvalue()
    finally:
        plt.close(fig)


def _rollback_card(router_url: str, to_version: str | None, result: dict) -> str:
    target = f"version `{to_version}`" if to_version else "the previously active version"
    active = f"`{result['active']}`" if result["active"] else f"none: the profile estimate (`{result['estimate']}`) serves"
    return (f"# Latency model rollback\n\nRouting service {router_url}: rolled back to {target}.\n\n"
            f"Active model now: {active}.\n")
