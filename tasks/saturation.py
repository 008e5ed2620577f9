"""The analyze-saturation step as its Prefect task: the per-replica KV-cache / queue guardrail."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from planner import pipeline

analyze_fleet_saturation = task(pipeline.analyze_fleet_saturation, cache_policy=NO_CACHE)
