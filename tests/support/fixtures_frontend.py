"""Steady synthetic Dynamo-frontend and vLLM traffic, served live for Prometheus to scrape.

For tests of the scheduled planner: the metric names and types are the ones a
Dynamo frontend and vLLM workers export, with values the test chooses.
"""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class FrontendFeeder:
    """Adds `rps` requests per second with fixed ISL/OSL/TTFT/ITL until stopped."""

    def __init__(self, registry: CollectorRegistry, *, rps: float, isl_tokens: float, osl_tokens: float,
                 ttft_s: float, itl_s: float, prefill_pods: int = 1, decode_pods: int = 1,
                 kv_usage_frac: float = 0.3, queue_length: float = 0.0, tick_s: float = 0.25):
        self.rps, self.isl, self.osl, self.ttft, self.itl = rps, isl_tokens, osl_tokens, ttft_s, itl_s
        self.tick_s = tick_s
        # Dynamo 1.6.1's two counters: accepted (arrivals) and processed (completions), with its labels.
        self.started = Counter("dynamo_frontend_requests_started", "accepted", ["endpoint", "model", "request_type"],
                               registry=registry).labels("chat_completions", "feeder", "stream")
        self.requests = Counter("dynamo_frontend_requests", "processed",
                                ["endpoint", "error_type", "model", "request_type", "status"],
                                registry=registry).labels("chat_completions", "", "feeder", "stream", "success")
        buckets = (0.005, 0.01, 0.05, 0.1, 0.5, 1, 5)
        self.h_ttft = Histogram("dynamo_frontend_time_to_first_token_seconds", "ttft", buckets=buckets, registry=registry)
        self.h_itl = Histogram("dynamo_frontend_inter_token_latency_seconds", "itl", buckets=buckets, registry=registry)
        tok = (100, 1000, 10000, 100000)
        self.h_isl = Histogram("dynamo_frontend_input_sequence_tokens", "isl", buckets=tok, registry=registry)
        self.h_osl = Histogram("dynamo_frontend_output_sequence_tokens", "osl", buckets=tok, registry=registry)
        kv = Gauge("vllm:kv_cache_usage_perc", "kv usage", ["pod"], registry=registry)
        waiting = Gauge("vllm:num_requests_waiting", "waiting", ["pod"], registry=registry)
        pods = [f"worker-prefill-{i}" for i in range(prefill_pods)] + [f"worker-decode-{i}" for i in range(decode_pods)]
        for pod in pods:
            kv.labels(pod=pod).set(kv_usage_frac)
            waiting.labels(pod=pod).set(queue_length)
        self._carry = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="frontend-feeder", daemon=True)

    def start(self) -> "FrontendFeeder":
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.tick_s):
            self._carry += self.rps * self.tick_s
            n = int(self._carry)
            self._carry -= n
            for _ in range(n):
                self.started.inc()
                self.requests.inc()
                self.h_ttft.observe(self.ttft)
                self.h_itl.observe(self.itl)
                self.h_isl.observe(self.isl)
                self.h_osl.observe(self.osl)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
