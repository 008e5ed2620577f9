"""Scraping vLLM's Prometheus endpoint for per-engine load.

vLLM exposes `vllm:kv_cache_usage_perc` (a 0-1 fraction despite the name;
`vllm:gpu_cache_usage_perc` in older releases), `vllm:num_requests_waiting`
and `vllm:num_requests_running`, one series per served model. Names are
matched with ':' or '_' (exporters and Prometheus may rewrite the colon). With
several series, queue lengths are summed and KV usage takes the maximum.
"""

from __future__ import annotations

import asyncio
import logging

import httpx
from prometheus_client.parser import text_string_to_metric_families

log = logging.getLogger("sla_planner.routing.fleet.scrape")

_KV = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
_WAITING = ("vllm:num_requests_waiting",)
_RUNNING = ("vllm:num_requests_running",)


def _names(names: tuple[str, ...]) -> set[str]:
    return set(names) | {n.replace(":", "_") for n in names}


_KV_NAMES, _WAITING_NAMES, _RUNNING_NAMES = _names(_KV), _names(_WAITING), _names(_RUNNING)


def parse_vllm_metrics(text: str, *, source: str) -> dict[str, float]:
    """kv_usage_frac, waiting_requests, running_requests from Prometheus text.

    source: where the text came from (URL), for errors. Raises ValueError when
    the text does not parse or a metric is absent.
    """
    kv: list[float] = []
    waiting: list[float] = []
    running: list[float] = []
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in _KV_NAMES:
                    kv.append(sample.value)
                elif sample.name in _WAITING_NAMES:
                    waiting.append(sample.value)
                elif sample.name in _RUNNING_NAMES:
                    running.append(sample.value)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{source}: not Prometheus text format: {exc}") from None
    missing = [n for n, v in (("vllm:kv_cache_usage_perc", kv), ("vllm:num_requests_waiting", waiting),
                              ("vllm:num_requests_running", running)) if not v]
    if missing:
        raise ValueError(f"{source}: missing metrics {missing}")
    return {
        "kv_usage_frac": min(max(max(kv), 0.0), 1.0),
        "waiting_requests": max(sum(waiting), 0.0),
        "running_requests": max(sum(running), 0.0),
    }


async def scrape_forever(service, *, interval_s: float, timeout_s: float) -> None:
    """Scrape every endpoint with a url each interval and feed the registry (until cancelled).

    A failed scrape is logged and skipped: the endpoint's metrics age out and
    the lifecycle estimate takes over after metrics_max_age_s.
    """
    async with httpx.AsyncClient(timeout=timeout_s) as client:
        while True:
            endpoints = [e for e in service.registry.endpoints() if e.url]
            results = await asyncio.gather(*(_scrape_one(client, e.url) for e in endpoints), return_exceptions=True)
            for ep, result in zip(endpoints, results):
                if isinstance(result, Exception):
                    log.warning("scraping %s for endpoint %s: %s", ep.url, ep.id, result)
                    continue
                try:
                    service.observe_metrics(ep.id, **result)
                except (KeyError, ValueError) as exc:  # deregistered meanwhile, or bad values
                    log.warning("metrics of endpoint %s not recorded: %s", ep.id, exc)
            await asyncio.sleep(interval_s)


async def _scrape_one(client: httpx.AsyncClient, base_url: str) -> dict[str, float]:
    url = base_url.rstrip("/") + "/metrics"
    resp = await client.get(url)
    resp.raise_for_status()
    return parse_vllm_metrics(resp.text, source=url)
