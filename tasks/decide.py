"""The decide step as its Prefect task: bounds, GPU budget, stabilization and transitions."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from planner import pipeline

decide_targets = task(pipeline.decide_targets, cache_policy=NO_CACHE)
