"""The correct step as its Prefect task: observed / expected latency factors."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from planner import pipeline

correct_latency = task(pipeline.correct_latency, cache_policy=NO_CACHE)
