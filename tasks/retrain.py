"""Retrain tasks: fetch samples, prepare, train, evaluate, publish or roll back; one call each.

The tasks that talk to the routing service retry transient failures (the
service down, a timeout, a 5xx) with the collect step's backoff and fail at
once on a refusal (bad token, invalid model). The admin token is read from the
environment variable named by `token_env` inside each task, so it never shows
up in task parameters or logs.
"""

from __future__ import annotations

import os

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from connectors.router_admin import RouterAdminClient
from routing.features import TARGETS
from routing.training.config import TrainingConfig
from routing.training.data import PreparedSamples, prepare_samples
from routing.training.evaluation import Evaluation
from routing.training.fit import TargetModels, fit_all
from routing.training.gate import GateDecision
from routing.training.publish import decide_candidate
from tasks.retry import network_task


def router_client(router_url: str, *, token_env: str) -> RouterAdminClient:
    """A client for the routing service's admin API with the token from $token_env."""
    token = os.environ.get(token_env)
    if not token:
        raise ValueError(f"routing service admin token: environment variable {token_env} is not set")
    return RouterAdminClient(router_url, token=token)


@task(**network_task)
def fetch_samples(router_url: str, *, token_env: str, max_samples: int) -> list[dict]:
    """Every stored training sample, oldest first, keeping the newest max_samples."""
    samples: list[dict] = []
    with router_client(router_url, token_env=token_env) as client:
        for page in client.iter_sample_pages():
            samples.extend(page["samples"])
            if len(samples) > 2 * max_samples:
                del samples[: len(samples) - max_samples]
    return samples[-max_samples:]


@task(**network_task)
def fetch_current_model(router_url: str, *, token_env: str) -> tuple[str | None, dict | None, str]:
    """(active version, its document, the service's estimate name); (None, None, name) when none is published."""
    with router_client(router_url, token_env=token_env) as client:
        listing = client.models()
        active = listing.get("active")
        return active, client.model(active) if active else None, listing.get("estimate", "")


@task(cache_policy=NO_CACHE)
def prepare_features(samples: list[dict], cfg: TrainingConfig, *, estimate=None) -> PreparedSamples:
    """Usable samples per target as feature matrices, with the dropped counts by reason (and the profile
    estimate of each row, for relative models)."""
    prepared = prepare_samples(samples, cfg, estimate=estimate)
    logger = get_run_logger()
    for t in TARGETS:
        d = prepared.by_target[t]
        logger.info("%s: %d usable samples, dropped %s", t, d.n, {k: v for k, v in d.dropped.items() if v} or "none")
    return prepared


@task(cache_policy=NO_CACHE)
def train_models(prepared: PreparedSamples, cfg: TrainingConfig) -> dict[str, TargetModels]:
    """Mean and p90 models per target on the time-ordered training rows."""
    return fit_all(prepared, cfg)


@task(cache_policy=NO_CACHE)
def evaluate_models(
    prepared: PreparedSamples,
    models: dict[str, TargetModels],
    *,
    cfg: TrainingConfig,
    version: str,
    created_at_s: float,
    current_document: dict | None,
    current_version: str | None,
    estimate,
    force: bool,
) -> tuple[dict, Evaluation, GateDecision, dict[str, TargetModels]]:
    """The candidate document, its held-out comparison with the current model and the estimate (with the
    probe-grid report), the decision, and the models the document holds (a target whose trees were worse
    than the estimate kept on the estimate: routing.training.publish)."""
    candidate = decide_candidate(models, prepared, cfg, version=version, created_at_s=created_at_s,
                                 current_document=current_document, current_version=current_version,
                                 estimate=estimate, force=force)
    if candidate.kept_estimate:
        get_run_logger().warning("keeping the profile estimate for %s: %s", ", ".join(candidate.kept_estimate),
                                 candidate.decision.reason)
    return candidate.document, candidate.evaluation, candidate.decision, candidate.models


@task(**network_task)
def publish_model(router_url: str, document: dict, *, token_env: str) -> dict:
    """Publish the document (safe JSON format) and make it active: {"version", "active"}."""
    with router_client(router_url, token_env=token_env) as client:
        return client.publish(document)


@task(**network_task)
def rollback_model(router_url: str, *, token_env: str, to_version: str | None) -> dict:
    """Reactivate to_version (None: the previously active one): {"active", "estimate"}."""
    with router_client(router_url, token_env=token_env) as client:
        return client.rollback(to_version=to_version)
