"""The PromQL the collect step reads each signal with (QueryTemplates, part of MetricsConfig).

PromQL queries are `string.Template` texts so PromQL's own braces stay as they
are; the placeholders are:

- `${frontend_selector}`: label matchers for the arrival source's metrics
  (MetricsConfig.frontend_selector): the Dynamo frontend's, e.g.
  `model="llama-8b",namespace="dyn"`, the llm-d endpoint picker's or the
  routing service's (MetricsConfig.source picks which)
- `${worker_selector}`: label matchers for the vLLM worker metrics
- `${interval}`: the adjustment interval as a PromQL duration (`60s`, `1500ms`)
- `${pod_group_by}`: the labels a per-pod query groups by (pod label, plus the
  pool and variant labels when configured)
- `${peak_window}` / `${peak_step}`: MetricsConfig.peak_window_s / peak_step_s as
  PromQL durations (the sub-interval peak-rate query)
- `${frontend_targets_selector}`: label matchers for the frontends' scrape
  targets, i.e. their `up` series (MetricsConfig.frontend_targets_selector)
- `${targets_lookback}`: MetricsConfig.frontend_targets_lookback_s as a PromQL duration
- `${length_window}`: MetricsConfig.length_window_s as a PromQL duration (the
  length histograms sizing measures the length spread from)
- `${slo_window}`: MetricsConfig.slo_window_s as a PromQL duration (the target
  shares over a trailing window)
"""

from __future__ import annotations

import string

from pydantic import Field, model_validator

from planner.strict import StrictModel

PLACEHOLDERS = frozenset({"frontend_selector", "worker_selector", "interval", "pod_group_by", "peak_window", "peak_step",
                          "frontend_targets_selector", "targets_lookback", "length_window", "slo_window"})


def _frontend_avg(metric: str) -> str:
    """Mean of a histogram over the interval: increase(_sum) / increase(_count)."""
    return (
        f"sum(increase({metric}_sum{{${{frontend_selector}}}}[${{interval}}]))"
        f" / sum(increase({metric}_count{{${{frontend_selector}}}}[${{interval}}]))"
    )


def _frontend_buckets(metric: str, window: str = "length_window") -> str:
    """A histogram's buckets over a window placeholder (length_window, interval, slo_window), summed over frontends,
    one series per `le`."""
    return f"sum by (le) (increase({metric}_bucket{{${{frontend_selector}}}}[${{{window}}}]))"


def _frontend_window_sum(metric: str) -> str:
    return f"sum(increase({metric}_sum{{${{frontend_selector}}}}[${{length_window}}]))"


def _worker_avg(metric: str) -> str:
    """Mean of a vLLM histogram over the interval, summed over engines: increase(_sum) / increase(_count)."""
    return (
        f"sum(increase({metric}_sum{{${{worker_selector}}}}[${{interval}}]))"
        f" / sum(increase({metric}_count{{${{worker_selector}}}}[${{interval}}]))"
    )


def _worker_buckets(metric: str, window: str = "length_window") -> str:
    return f"sum by (le) (increase({metric}_bucket{{${{worker_selector}}}}[${{{window}}}]))"


def _worker_window_sum(metric: str) -> str:
    return f"sum(increase({metric}_sum{{${{worker_selector}}}}[${{length_window}}]))"


# Where each source's arrivals, tokens and latencies come from (metrics.source). vLLM has no arrival
# counter (it counts a request when it finishes), so an llm-d fleet's arrivals are the endpoint
# picker's (EPP): llm_d_epp_request_total moves only once a request passed admission and scheduling,
# and a request refused there is counted in llm_d_epp_request_error_total instead, so both are
# arrivals. Without an EPP, arrivals are our routing service's route calls (router_requests_total,
# every outcome: routed, shed, error). Tokens and latencies are vLLM's own per-request histograms,
# observed when a request finishes (vllm:request_prompt_tokens and vllm:request_generation_tokens:
# their _sum equals vllm:prompt_tokens_total and vllm:generation_tokens_total once nothing is in
# flight, but they are counted at the same moment as their _count).
SOURCES = ("dynamo", "llm-d", "vllm-router")
_VLLM_QUERIES = {
    "num_requests_fallback": "sum(increase(vllm:request_success_total{${worker_selector}}[${interval}]))",
    "avg_ttft_s": _worker_avg("vllm:time_to_first_token_seconds"),
    "avg_itl_s": _worker_avg("vllm:inter_token_latency_seconds"),
    "avg_isl_tokens": _worker_avg("vllm:request_prompt_tokens"),
    "avg_osl_tokens": _worker_avg("vllm:request_generation_tokens"),
    "isl_buckets": _worker_buckets("vllm:request_prompt_tokens"),
    "isl_window_sum": _worker_window_sum("vllm:request_prompt_tokens"),
    "osl_buckets": _worker_buckets("vllm:request_generation_tokens"),
    "osl_window_sum": _worker_window_sum("vllm:request_generation_tokens"),
    "ttft_buckets": _worker_buckets("vllm:time_to_first_token_seconds", "interval"),
    "itl_buckets": _worker_buckets("vllm:inter_token_latency_seconds", "interval"),
    "ttft_window_buckets": _worker_buckets("vllm:time_to_first_token_seconds", "slo_window"),
    "itl_window_buckets": _worker_buckets("vllm:inter_token_latency_seconds", "slo_window"),
}
_EPP_DISPATCHED = "llm_d_epp_request_total{${frontend_selector}}"
_EPP_ERRORS = "llm_d_epp_request_error_total{${frontend_selector}}"
_ROUTER_CALLS = "router_requests_total{${frontend_selector}}"
SOURCE_QUERIES: dict[str, dict[str, str]] = {
    "dynamo": {},
    "llm-d": {
        **_VLLM_QUERIES,
        # An EPP that never refused a request has no error series: count it as 0, not as no data.
        "num_requests": f"sum(increase({_EPP_DISPATCHED}[${{interval}}]))"
                        f" + (sum(increase({_EPP_ERRORS}[${{interval}}])) or vector(0))",
        "peak_rps": f"max_over_time((sum(rate({_EPP_DISPATCHED}[${{peak_window}}]))"
                    f" + (sum(rate({_EPP_ERRORS}[${{peak_window}}])) or vector(0)))[${{interval}}:${{peak_step}}])",
        "newest_sample_s": f"max(timestamp({_EPP_DISPATCHED}))",
    },
    "vllm-router": {
        **_VLLM_QUERIES,
        "num_requests": f"sum(increase({_ROUTER_CALLS}[${{interval}}]))",
        "peak_rps": f"max_over_time(sum(rate({_ROUTER_CALLS}[${{peak_window}}]))[${{interval}}:${{peak_step}}])",
        "newest_sample_s": f"max(timestamp({_ROUTER_CALLS}))",
    },
}
SOURCE_SUMMARY = {
    "dynamo": "arrivals, tokens and latencies from the Dynamo frontend (dynamo_frontend_*); KV usage and queue "
              "from the workers' vllm:kv_cache_usage_perc and vllm:num_requests_waiting",
    "llm-d": "arrivals from the llm-d endpoint picker (llm_d_epp_request_total + llm_d_epp_request_error_total); "
             "tokens and latencies from vLLM (vllm:request_prompt_tokens, vllm:request_generation_tokens, "
             "vllm:time_to_first_token_seconds, vllm:inter_token_latency_seconds); KV usage and queue from "
             "vllm:kv_cache_usage_perc and vllm:num_requests_waiting",
    "vllm-router": "arrivals from the routing service's route calls (router_requests_total, every outcome); "
                   "tokens and latencies from vLLM (vllm:request_prompt_tokens, vllm:request_generation_tokens, "
                   "vllm:time_to_first_token_seconds, vllm:inter_token_latency_seconds); KV usage and queue from "
                   "vllm:kv_cache_usage_perc and vllm:num_requests_waiting",
}


class QueryTemplates(StrictModel):
    """PromQL for each signal the collect step reads; override any of them.

    Frontend queries must return one series (or none); per-pod queries one
    series per pod carrying the labels in `${pod_group_by}`.
    """

    num_requests: str = Field(
        "sum(increase(dynamo_frontend_requests_started_total{${frontend_selector}}[${interval}]))",
        description="requests that arrived in the interval (count): Dynamo's frontend counts a request as "
        "started when its handler accepts it (what Dynamo 1.6.1's planner reads)",
    )
    num_requests_fallback: str = Field(
        "sum(increase(dynamo_frontend_requests_total{${frontend_selector}}[${interval}]))",
        description="used, with a note in the run, when num_requests returns no series (a frontend without "
        "requests_started_total): requests that finished in the interval, errors included, which lags arrivals "
        "while requests queue; empty: no fallback",
    )
    avg_ttft_s: str = Field(
        _frontend_avg("dynamo_frontend_time_to_first_token_seconds"),
        description="mean time to first token over the interval, seconds",
    )
    avg_itl_s: str = Field(
        _frontend_avg("dynamo_frontend_inter_token_latency_seconds"),
        description="mean inter-token latency over the interval, seconds",
    )
    avg_isl_tokens: str = Field(
        _frontend_avg("dynamo_frontend_input_sequence_tokens"),
        description="mean input sequence length over the interval, tokens",
    )
    avg_osl_tokens: str = Field(
        _frontend_avg("dynamo_frontend_output_sequence_tokens"),
        description="mean output sequence length over the interval, tokens",
    )
    peak_rps: str = Field(
        "max_over_time(sum(rate(dynamo_frontend_requests_started_total{${frontend_selector}}[${peak_window}]))"
        "[${interval}:${peak_step}])"
        " or max_over_time(sum(rate(dynamo_frontend_requests_total{${frontend_selector}}[${peak_window}]))"
        "[${interval}:${peak_step}])",
        description="highest arrival rate over a peak_window_s sub-window of the interval, requests/s "
        "(sub-interval bursts, planner.signals.burst); optional: no series or an empty query means flat arrivals",
    )
    isl_buckets: str = Field(
        _frontend_buckets("dynamo_frontend_input_sequence_tokens"),
        description="prompt-length histogram over the length window, one series per `le` bucket bound "
        "(planner.signals.length_shape measures the spread sizing uses); optional: empty or no series means the "
        "configured sizing.isl_cv / decode_context_cv",
    )
    isl_window_sum: str = Field(
        _frontend_window_sum("dynamo_frontend_input_sequence_tokens"),
        description="prompt tokens over the length window (the histogram's _sum): places the +Inf bucket; "
        "empty: it sits at its lower bound",
    )
    osl_buckets: str = Field(
        _frontend_buckets("dynamo_frontend_output_sequence_tokens"),
        description="output-length histogram over the length window, one series per `le` (the decode context "
        "spread); optional: empty or no series means the context CV is taken as the prompts'",
    )
    osl_window_sum: str = Field(
        _frontend_window_sum("dynamo_frontend_output_sequence_tokens"),
        description="output tokens over the length window (the histogram's _sum); empty: not read",
    )
    ttft_buckets: str = Field(
        _frontend_buckets("dynamo_frontend_time_to_first_token_seconds", "interval"),
        description="TTFT histogram over the interval, one series per `le` (the run reports the share of requests "
        "that met the TTFT target, planner.signals.slo_attainment); optional: empty or no series means not reported",
    )
    itl_buckets: str = Field(
        _frontend_buckets("dynamo_frontend_inter_token_latency_seconds", "interval"),
        description="inter-token latency histogram over the interval, one observation per token gap (the run "
        "reports the share of gaps within the ITL target); optional: empty or no series means not reported",
    )
    ttft_window_buckets: str = Field(
        _frontend_buckets("dynamo_frontend_time_to_first_token_seconds", "slo_window"),
        description="TTFT histogram over the trailing SLO window (metrics.slo_window_s): the run also reports the "
        "share within the target over that window; optional, as ttft_buckets",
    )
    itl_window_buckets: str = Field(
        _frontend_buckets("dynamo_frontend_inter_token_latency_seconds", "slo_window"),
        description="inter-token latency histogram over the trailing SLO window; optional, as itl_buckets",
    )
    newest_sample_s: str = Field(
        "max(timestamp(dynamo_frontend_requests_started_total{${frontend_selector}}))"
        " or max(timestamp(dynamo_frontend_requests_total{${frontend_selector}}))",
        description="Unix time of the newest frontend sample, seconds (staleness check)",
    )
    frontend_targets: str = Field(
        "up{${frontend_targets_selector}}",
        description="one series per frontend scrape target, 1 when its last scrape succeeded (Prometheus' up); "
        "empty: partial frontend scrapes are not checked",
    )
    frontend_targets_seen: str = Field(
        "max_over_time(count(up{${frontend_targets_selector}})[${targets_lookback}:])",
        description="the most frontend scrape targets Prometheus knew at once within the lookback: a frontend whose "
        "target vanished from service discovery still counts as expected; empty: only the targets known now",
    )
    kv_usage_frac: str = Field(
        'max by (${pod_group_by}) (max_over_time({__name__=~"vllm[:_]kv_cache_usage_perc",${worker_selector}}[1m]))',
        description="per pod: KV-cache usage 0..1, max over the last minute (both vllm: and vllm_ spellings)",
    )
    queue_length: str = Field(
        'max by (${pod_group_by}) ({__name__=~"vllm[:_]num_requests_waiting",${worker_selector}})',
        description="per pod: requests waiting (both vllm: and vllm_ spellings)",
    )
    shed_requests: str = Field(
        'sum(increase(router_requests_total{outcome="shed"}[1m]))',
        description="requests the routing service shed over the last minute, read by the fast path's watcher "
        "(planner.fast_path.shed_min_requests); no series (no routing service) never fires; empty: not read",
    )
    ready_workers: str = Field(
        "max by (${pod_group_by}) (up{${worker_selector}}) == 1",
        description="per pod: its metrics endpoint answers (Prometheus' up of the worker scrape targets), the ready "
        "count each pool's startup time is measured from with scale to zero (a worker's engine series can be "
        "absent until it has served a request: Dynamo 1.6.1's mocker exports no vllm:* series before one); "
        "empty: not read (startup from sizing.replica_startup_s)",
    )
    wake_requests: str = Field(
        "(sum(sla_planner_waker_held_requests) or vector(0))"
        " + (sum(dynamo_frontend_queued_requests{${frontend_selector}}) or vector(0))",
        description="requests waiting for a pool at zero, read by the watcher to wake it "
        "(decision.scale_to_zero.wake_min_requests): held by the waker in front of the frontend, and queued at "
        "the frontend (Dynamo 1.6.1's frontend answers a model without workers 404 and counts it nowhere, "
        "docs/scale-to-zero.md). Gauges, not a recent increase: a held request stays held until the wake serves "
        "it, and a served one must not wake the fleet again when it next goes to zero; empty: not read",
    )

    @classmethod
    def for_source(cls, source: str, overrides: dict | None = None) -> "QueryTemplates":
        """The source's queries (SOURCE_QUERIES) with `overrides` (field: PromQL) on top."""
        if source not in SOURCE_QUERIES:
            raise ValueError(f"metrics.source: expected one of {', '.join(SOURCES)}, got {source!r}")
        return cls.model_validate({**SOURCE_QUERIES[source], **(overrides or {})})

    def overridden(self, source: str) -> list[str]:
        """Fields whose query differs from the source's default."""
        default = type(self).for_source(source)
        return [name for name in type(self).model_fields if getattr(self, name) != getattr(default, name)]

    @model_validator(mode="after")
    def _known_placeholders(self) -> "QueryTemplates":
        for name in type(self).model_fields:
            text = getattr(self, name)
            template = string.Template(text)
            if not template.is_valid():
                raise ValueError(f"queries.{name}: invalid ${{...}} placeholder syntax in {text!r}")
            unknown = set(template.get_identifiers()) - PLACEHOLDERS
            if unknown:
                raise ValueError(
                    f"queries.{name}: unknown placeholder(s) {sorted(unknown)} in {text!r}; "
                    f"known: {sorted(PLACEHOLDERS)}"
                )
        return self


# Advisory mode (planner.mode advisory): the replicas the running autoscaler set, per pool, read back over the
# comparison window (connectors.autoscaler_history). One series per query (aggregate it); placeholders:
# ${namespace} (advisory.namespace, else the planner's), ${prefill_object} / ${decode_object} (the objects the
# autoscaler scales or is), ${selector} (advisory.selector: label matchers, no braces).
AUTOSCALER_PLACEHOLDERS = frozenset({"namespace", "prefill_object", "decode_object", "selector"})
AUTOSCALER_QUERIES: dict[str, dict[str, str]] = {
    # Dynamo 1.6.1's planner publishes, every tick, the workers it counts ready (dynamo_planner_num_{prefill,
    # decode}_replicas, no labels of their own: ${selector} matches the scrape's, e.g. namespace="dynamo"); its
    # targets, dynamo_planner_predicted_num_*_replicas, only when it scales.
    "dynamo-planner": {
        "prefill": "max(dynamo_planner_num_prefill_replicas{${selector}})",
        "decode": "max(dynamo_planner_num_decode_replicas{${selector}})",
    },
    # An HPA, or KEDA's (a ScaledObject's HPA is keda-hpa-<name>), on a DGD scaling adapter, Deployment or
    # LeaderWorkerSet: the replicas it decided, as kube-state-metrics exports them.
    "hpa": {
        "prefill": 'max(kube_horizontalpodautoscaler_status_desired_replicas{namespace="${namespace}",'
                   'horizontalpodautoscaler="${prefill_object}",${selector}})',
        "decode": 'max(kube_horizontalpodautoscaler_status_desired_replicas{namespace="${namespace}",'
                  'horizontalpodautoscaler="${decode_object}",${selector}})',
    },
    # Whatever scales a Deployment (llm-d's model servers): its spec.replicas from kube-state-metrics.
    "deployment": {
        "prefill": 'max(kube_deployment_spec_replicas{namespace="${namespace}",deployment="${prefill_object}",'
                   '${selector}})',
        "decode": 'max(kube_deployment_spec_replicas{namespace="${namespace}",deployment="${decode_object}",'
                  '${selector}})',
    },
    # A LeaderWorkerSet's groups are its leader StatefulSet's replicas (named as the LeaderWorkerSet).
    "leaderworkerset": {
        "prefill": 'max(kube_statefulset_replicas{namespace="${namespace}",statefulset="${prefill_object}",'
                   '${selector}})',
        "decode": 'max(kube_statefulset_replicas{namespace="${namespace}",statefulset="${decode_object}",'
                  '${selector}})',
    },
}
# The advisory's own history, from the gauges each advisory run publishes (connectors.planner_metrics):
# its targets (the chart's line and the comparison) and its recommendations (the stabilization window's).
ADVISORY_OWN_QUERIES = {
    "advisory_replicas": 'max(sla_planner_advisory_replicas{namespace="${namespace}",model="${model}",'
                         'pool="${pool}"})',
    "recommended_replicas": 'max(sla_planner_recommended_replicas{namespace="${namespace}",model="${model}",'
                            'pool="${pool}"})',
}
