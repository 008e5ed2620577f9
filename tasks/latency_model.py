"""The planner's TTFT source as a task: the routing service's published model when fresh, else the profile.

One call to the routing service (the active model and its document) and the
choice of routing.models.planner_view. Any failure to read the model (the service
down, a refused or missing token) falls back to the profile with the reason,
without retries: the planner must plan this interval either way, and the next
run reads the model again. The token comes from the environment variable
`token_env` names, read inside the task so it never shows in parameters or logs.
"""

from __future__ import annotations

import os

from prefect import task
from prefect.cache_policies import NO_CACHE

from connectors.config import LatencyModelConfig
from connectors.router_admin import RouterAdminClient, RouterRequestError, RouterUnavailableError
from planner.latency.profile import EngineProfile
from routing.models.planner_view import TtftChoice, choose_ttft_view


def read_ttft_view(cfg: LatencyModelConfig, profile: EngineProfile, *, now_s: float) -> TtftChoice:
    """The TTFT view this run sizes with (view None: the profile), what it is and why.

    now_s: the run's clock, Unix seconds (a model's age is measured against it).
    """
    if cfg.source == "profile":
        return TtftChoice(None, "profile", "latency_model.source is profile")
    # An unset variable means no token: an open data plane needs none, a protected one refuses (and we say why).
    token = os.environ.get(cfg.token_env) or None if cfg.token_env else None
    try:
        with RouterAdminClient(cfg.router_url, token=token, timeout_s=cfg.timeout_s) as client:
            active = client.active_model()
    except (RouterUnavailableError, RouterRequestError) as exc:
        unset = f" (environment variable {cfg.token_env} is not set)" if cfg.token_env and token is None else ""
        return TtftChoice(None, "profile", f"published model not read: {exc}{unset}")
    return choose_ttft_view(active, profile, now_s=now_s, max_age_s=cfg.max_age_s)


fetch_ttft_view = task(read_ttft_view, name="fetch_ttft_view", cache_policy=NO_CACHE)
