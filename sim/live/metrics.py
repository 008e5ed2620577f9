"""The live fleet's Prometheus series: what a Dynamo 1.6.1 deployment exports to the planner."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily

# A Dynamo 1.6.1 frontend's histogram boundaries (its /metrics; tests check them against a real scrape).
TTFT_BUCKETS_S = (0, 0.0022, 0.0047, 0.01, 0.022, 0.047, 0.1, 0.22, 0.47, 1, 2.2, 4.7, 10, 22, 48, 100, 220, 480)
ITL_BUCKETS_S = (0, 0.0018, 0.0033, 0.0059, 0.011, 0.02, 0.035, 0.064, 0.12, 0.21, 0.38, 0.69, 1.2, 2.3, 4.1,
                 7.4, 13, 24, 44, 80)
ISL_BUCKETS = (0, 100, 210, 430, 870, 1800, 3600, 7400, 15000, 31000, 63000, 130000)
OSL_BUCKETS = (0, 100, 210, 430, 880, 1800, 3700, 7600, 16000, 32000)
# The label values a real frontend gives a streamed chat completion.
REQUEST_LABELS = {"endpoint": "chat_completions", "request_type": "stream"}


class LiveSeries:
    """The series the live fleet exports into `registry`: a frontend's, the simulator's own, each pod's.

    The frontend's names, label sets and buckets are a Dynamo 1.6.1 frontend's (for the
    planner); the gauges read `fleet` (a LiveFleet) at scrape time.
    """

    def __init__(self, registry: CollectorRegistry, fleet):
        labels = {"model": fleet.cfg.model}
        reg = registry
        started = {**REQUEST_LABELS, **labels}
        self.started = Counter("dynamo_frontend_requests_started", "Total number of LLM requests accepted by the "
                               "frontend handler", sorted(started), registry=reg).labels(**started)
        finished = {**started, "status": "success", "error_type": ""}
        self.finished = Counter("dynamo_frontend_requests", "Total number of LLM requests processed",
                                sorted(finished), registry=reg).labels(**finished)
        self.ttft = Histogram("dynamo_frontend_time_to_first_token_seconds", "Time to first token, s",
                              list(labels), buckets=TTFT_BUCKETS_S, registry=reg).labels(**labels)
        # One observation per request: its mean inter-token latency (what the simulator measures).
        self.itl = Histogram("dynamo_frontend_inter_token_latency_seconds", "Inter-token latency, s",
                             list(labels), buckets=ITL_BUCKETS_S, registry=reg).labels(**labels)
        self.isl = Histogram("dynamo_frontend_input_sequence_tokens", "Input sequence length, tokens",
                             list(labels), buckets=ISL_BUCKETS, registry=reg).labels(**labels)
        self.osl = Histogram("dynamo_frontend_output_sequence_tokens", "Output sequence length, tokens",
                             list(labels), buckets=OSL_BUCKETS, registry=reg).labels(**labels)
        self.completed = Counter("sla_sim_requests_completed", "Requests finished by the simulated fleet",
                                 registry=reg)
        Gauge("sla_sim_time_seconds", "Simulated clock, s", registry=reg).set_function(lambda: fleet.sim.now_s)
        Gauge("sla_sim_requests_in_flight", "Requests arrived and not finished", registry=reg).set_function(
            lambda: len(fleet.in_flight))
        Gauge("sla_sim_decision_id_applied", "Newest decision the fleet follows (-1: none)", registry=reg
              ).set_function(lambda: -1 if fleet.applied_id is None else fleet.applied_id)
        Gauge("sla_sim_decision_id_confirmed", "Newest decision written as scaled_decision_id (-1: none)",
              registry=reg).set_function(lambda: -1 if fleet.confirmed_id is None else fleet.confirmed_id)
        registry.register(PodCollector(fleet))


class PodCollector:
    """Per-pod vLLM gauges, read from the fleet at scrape time."""

    def __init__(self, fleet):
        self.fleet = fleet

    def describe(self):
        return []

    def collect(self):
        fleet = self.fleet
        labels = ["pod", "model_name"]
        kv = GaugeMetricFamily("vllm:kv_cache_usage_perc", "KV-cache usage, 0-1 (peak since the last scrape)",
                               labels=labels)
        waiting = GaugeMetricFamily("vllm:num_requests_waiting", "Requests waiting", labels=labels)
        running = GaugeMetricFamily("vllm:num_requests_running", "Requests running", labels=labels)
        with fleet.lock:
            sim = fleet.sim
            running_by_name = {w.name: len(w.batch) for w in sim.prefill_serving}
            running_by_name.update({d.name: d.n for d in sim.decode_serving})
            # Prometheus is the one scraper: each scrape reports the peak since the previous one.
            for pod in sim.pod_metrics(sim.now_s):
                values = [fleet.cfg.pod_prefix + pod.pod, fleet.cfg.model]
                kv.add_metric(values, pod.kv_usage_frac)
                waiting.add_metric(values, pod.queue_length)
                running.add_metric(values, float(running_by_name.get(pod.pod, 0)))
        yield kv
        yield waiting
        yield running
