"""Typed settings for the outside systems: Prometheus metrics and the connectors.

One pydantic model per concern, unknown fields forbidden, units in field names.
The PromQL each signal is read with is in connectors.queries (QueryTemplates,
re-exported here).
"""

from __future__ import annotations

import math
import re
import string
from typing import Annotated, Literal, TypeVar, Union

from pydantic import Field, field_validator, model_validator

from connectors.queries import (  # QueryTemplates re-exported: configs and tests import it
    AUTOSCALER_PLACEHOLDERS,
    AUTOSCALER_QUERIES,
    SOURCE_SUMMARY,
    SOURCES,
    QueryTemplates,
)
from planner.signals.length_shape import DEFAULT_LENGTH_WINDOW_S
from planner.signals.slo_attainment import DEFAULT_SLO_WINDOW_S
from planner.strict import StrictModel


class PoolMapping(StrictModel):
    """How a worker pod's metrics are attributed to the prefill or decode pool."""

    by: Literal["pod_regex", "label"] = Field(
        "pod_regex",
        description="pod_regex: match the pod name; label: read a label's value (e.g. dynamo_component)",
    )
    pod_label: str = Field("pod", min_length=1, description="label holding the pod name")
    prefill_pod_regex: str = Field("(?i)prefill", description="pod names of prefill workers (re.search)")
    decode_pod_regex: str = Field("(?i)decode", description="pod names of decode workers (re.search)")
    pool_label: str = Field(
        "dynamo_component", min_length=1, description="by=label: label whose value names the pool"
    )
    prefill_label_values: list[str] = Field(
        default_factory=lambda: ["prefill"], description="by=label: values meaning prefill"
    )
    decode_label_values: list[str] = Field(
        default_factory=lambda: ["decode", "backend"], description="by=label: values meaning decode"
    )
    aggregated_label_values: list[str] = Field(
        default_factory=list,
        description="by=label: values meaning an aggregated engine (prefill and decode in one): its KV usage and "
        "queue count in both pools, so its saturation holds either pool's scale-down",
    )
    variant_label: str | None = Field(
        None, description="label naming the model variant (accelerator/config); None: 'default'"
    )

    @field_validator("prefill_pod_regex", "decode_pod_regex")
    @classmethod
    def _compiles(cls, value: str, info) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"pools.{info.field_name}: not a valid regular expression {value!r}: {exc}")
        return value

    def group_by_labels(self) -> list[str]:
        labels = [self.pod_label]
        if self.by == "label":
            labels.append(self.pool_label)
        if self.variant_label:
            labels.append(self.variant_label)
        return list(dict.fromkeys(labels))


_MATCHERS_RE = re.compile(r"^\s*$|^[^{}]+$")


class MetricsConfig(StrictModel):
    """Where and how the collect step reads metrics from Prometheus."""

    source: Literal["dynamo", "llm-d", "vllm-router"] = Field(
        "dynamo",
        description="where arrivals, tokens and latencies come from, i.e. the default of every query: dynamo: the "
        "Dynamo frontend (dynamo_frontend_*); llm-d: arrivals from the endpoint picker (llm_d_epp_request_total "
        "+ llm_d_epp_request_error_total), tokens and latencies from vLLM's histograms; vllm-router: arrivals "
        "from the routing service's route calls (router_requests_total), the rest from vLLM. KV usage and queue "
        "are vLLM's gauges in all three. A query set in `queries` replaces the source's",
    )
    prometheus_url: str = Field(
        "http://localhost:9090", min_length=1, description="Prometheus base URL (http or https)"
    )
    frontend_selector: str = Field(
        "",
        description='PromQL label matchers for frontend metrics, no braces: model="llama-8b" works on a raw '
        "scrape (a Dynamo frontend labels its series by model only); add dynamo_namespace=\"...\" only where the "
        "scrape configuration adds that label (Dynamo's operator PodMonitor does)",
    )
    worker_selector: str = Field(
        "", description='PromQL label matchers for vLLM worker metrics, no braces, e.g. namespace="dyn"'
    )
    frontend_targets_selector: str = Field(
        'job=~"(.+/)?dynamo-frontend.*"',
        description="PromQL label matchers, no braces, for the frontends' scrape targets (their up series carry the "
        "scrape's target labels, not the metrics' own): the default matches a job named dynamo-frontend on a raw "
        "scrape and a Prometheus-operator PodMonitor's <namespace>/dynamo-frontend... job; narrow it, e.g. with "
        'namespace="dynamo"; empty: partial frontend scrapes are not checked',
    )
    frontend_targets_lookback_s: float = Field(
        600.0, gt=0, le=86_400,
        description="a frontend target seen within this long still counts as expected after service discovery "
        "drops it, s (a rolling restart that surges past the usual count holds scale-down this long)",
    )
    expect_worker_metrics: bool = Field(
        True,
        description="every ready worker exports the worker queries' series: fewer reporting pods than the fleet's "
        "ready replicas in a pool mark the metrics partial; false for fleets whose workers export none",
    )
    queries: QueryTemplates = Field(default_factory=QueryTemplates)
    pools: PoolMapping = Field(default_factory=PoolMapping)
    stale_after_s: float = Field(
        180.0, gt=0, description="newest frontend sample older than this marks the observation stale, s"
    )
    peak_window_s: float = Field(
        15.0, gt=0, le=3600,
        description="window of the rate inside queries.peak_rps, s; at least twice the scrape interval "
        "(rate() needs two samples), shorter than the adjustment interval",
    )
    peak_step_s: float = Field(5.0, gt=0, le=3600, description="subquery step of queries.peak_rps, s")
    length_window_s: float = Field(
        DEFAULT_LENGTH_WINDOW_S, gt=0, le=7 * 86_400,
        description="trailing window of the length histograms (queries.isl_buckets / osl_buckets), s: long enough "
        "to count a few hundred prompts, short enough to follow a changing workload mix",
    )
    slo_window_s: float = Field(
        DEFAULT_SLO_WINDOW_S, gt=0, le=7 * 86_400,
        description="trailing window over which each run also reports the TTFT and ITL target shares "
        "(queries.ttft_window_buckets / itl_window_buckets), s: the SLO's view beside the interval's",
    )
    request_timeout_s: float = Field(10.0, gt=0, description="timeout of one Prometheus HTTP request, s")
    verify_tls: bool = Field(True, description="verify the server certificate for https URLs")
    bearer_token_file: str | None = Field(
        None, description="file holding a bearer token sent as Authorization header; None: no auth"
    )

    @model_validator(mode="before")
    @classmethod
    def _source_queries(cls, data):
        """The source's queries under those the file sets (a QueryTemplates object is taken as given)."""
        if isinstance(data, dict) and not isinstance(data.get("queries"), QueryTemplates):
            source = data.get("source", "dynamo")
            if source in SOURCES:
                data = {**data, "queries": QueryTemplates.for_source(source, data.get("queries") or {})}
        return data

    def source_note(self) -> str:
        """What the run reads from where: the source's summary and any query set apart from it."""
        own = self.queries.overridden(self.source)
        return (f"metrics source {self.source}: {SOURCE_SUMMARY[self.source]}"
                + (f"; queries set in the config: {', '.join(own)}" if own else ""))

    @field_validator("prometheus_url")
    @classmethod
    def _url(cls, value: str) -> str:
        if not re.match(r"^https?://[^/\s]+", value):
            raise ValueError(f"metrics.prometheus_url must start with http:// or https://, got {value!r}")
        return value.rstrip("/")

    @field_validator("frontend_selector", "worker_selector", "frontend_targets_selector")
    @classmethod
    def _matchers(cls, value: str, info) -> str:
        if not _MATCHERS_RE.match(value):
            raise ValueError(
                f"metrics.{info.field_name}: give label matchers without braces, "
                f'e.g. model="llama-8b", got {value!r}'
            )
        return value.strip()


class KubeApiSettings(StrictModel):
    """How a Kubernetes connector reaches the API server and keeps its decisions (fields both kinds share)."""

    namespace: str | None = Field(None, description="Kubernetes namespace; None: the planner's namespace")
    auth: Literal["auto", "in_cluster", "kubeconfig"] = Field(
        "auto", description="auto: in-cluster when KUBERNETES_SERVICE_HOST is set, else kubeconfig"
    )
    kubeconfig_path: str | None = Field(None, description="kubeconfig file; None: $KUBECONFIG or ~/.kube/config")
    kubeconfig_context: str | None = Field(None, description="kubeconfig context; None: current-context")
    conflict_retries: int = Field(5, ge=0, le=50, description="re-read and retry this many times on HTTP 409")
    request_timeout_s: float = Field(10.0, gt=0, description="timeout of one API request, s")
    annotation_prefix: str = Field(
        "sla-planner", min_length=1, description="prefix of the annotations holding the last decision"
    )
    history_max_entries: int = Field(
        32, ge=1, le=500,
        description="entries kept in each history (applied decisions; run recommendations for stabilization); "
        "left unset, a run configuration raises it to what its longest scale-down window holds",
    )
    history_max_age_s: float = Field(
        3600.0, gt=0,
        description="recommendations replaced longer ago than this are dropped (the one in effect is always kept), s "
        "(keep >= the stabilization window)",
    )


class KubernetesConnectorConfig(KubeApiSettings):
    """Scale a Dynamo DynamoGraphDeployment: scaling adapters (v1beta1), else the DGD itself (v1beta1, v1alpha1)."""

    kind: Literal["kubernetes"] = "kubernetes"
    dgd_name: str = Field(min_length=1, description="DynamoGraphDeployment metadata.name")
    api: Literal["auto", "v1beta1", "v1alpha1"] = Field(
        "auto",
        description="DGD API version: auto picks the newest the cluster serves (v1beta1 from Dynamo 1.3: scaling "
        "adapters' /scale, else a JSON patch of spec.components; v1alpha1: merge patch of spec.services)",
    )
    prefill_service: str = Field(
        "prefill", min_length=1,
        description="component (v1beta1) or spec.services key (v1alpha1) of the prefill workers when none has type "
        "(subComponentType) prefill",
    )
    decode_service: str = Field(
        "decode", min_length=1,
        description="component (v1beta1) or spec.services key (v1alpha1) of the decode workers when none has type "
        "(subComponentType) decode",
    )


class LlmdConnectorConfig(KubeApiSettings):
    """Scale llm-d's model servers: the prefill and decode Deployments, LeaderWorkerSets or DisaggregatedSet
    role scalers an InferencePool selects, through their /scale (or, actuation keda, through KEDA)."""

    kind: Literal["llmd"] = "llmd"
    inference_pool: str = Field(min_length=1, description="InferencePool metadata.name (inference.networking.k8s.io/v1)")
    role_label: str = Field(
        "llm-d.ai/role", min_length=1,
        description="pod label naming the role: prefill, decode; prefill-decode (or the deprecated both) serve both "
        "and count as one combined target",
    )
    actuation: Literal["scale", "keda"] = Field(
        "scale",
        description="scale: write each target's /scale; keda: write nothing there, a KEDA ScaledObject per role "
        "applies the planner's published gauge (planner_metrics must publish it)",
    )
    on_autoscaler: Literal["refuse", "pause"] = Field(
        "refuse",
        description="actuation scale, a KEDA ScaledObject targets the same object: refuse (one line naming it), or "
        "pause it with the annotation autoscaling.keda.sh/paused-replicas set to the planner's target; a plain "
        "HPA is always refused",
    )

    @field_validator("role_label")
    @classmethod
    def _label_key(cls, value: str) -> str:
        if not re.fullmatch(r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?", value):
            raise ValueError(f"connector.role_label: not a Kubernetes label key, got {value!r}")
        return value


class VirtualConnectorConfig(StrictModel):
    """Dynamo's "virtual" key protocol in etcd: the environment does the scaling."""

    kind: Literal["virtual"] = "virtual"
    etcd_url: str = Field("http://127.0.0.1:2379", description="etcd client URL (grpc-gateway /v3 API)")
    namespace: str | None = Field(
        None, description="Dynamo namespace: fills {namespace} in the prefixes; None: the planner's namespace"
    )
    key_prefix: str = Field(
        "v1/{namespace}/planner/",
        description="decision keys (num_*_workers, decision_id, scaled_decision_id): Dynamo 1.6.1's "
        "VirtualConnectorCoordinator/Client use v1/{namespace}/planner/; /{namespace}/planner/ is the layout "
        "Dynamo's planner docs describe",
    )
    bookkeeping_prefix: str = Field(
        "sla-planner/{namespace}/planner/",
        description="the planner's own keys (decision times, histories), kept out of the prefix Dynamo's client watches",
    )
    done_timeout_s: float = Field(
        1800.0, gt=0,
        description="wait at most this long for the environment to acknowledge a decision (scaled_decision_id), "
        "counted from when it was written or first seen, s (Dynamo's planner: 1800)",
    )
    initial_prefill_replicas: int = Field(1, ge=0, description="prefill replicas before any decision")
    initial_decode_replicas: int = Field(1, ge=0, description="decode replicas before any decision")
    gpus_per_prefill_replica: int = Field(1, ge=1, description="GPUs one prefill replica uses")
    gpus_per_decode_replica: int = Field(1, ge=1, description="GPUs one decode replica uses")
    request_timeout_s: float = Field(5.0, gt=0, description="timeout of one etcd request, s")
    conflict_retries: int = Field(
        5, ge=0, le=50, description="re-read and retry this many times when another run recorded in between"
    )
    history_max_entries: int = Field(
        32, ge=1, le=500,
        description="entries kept in each history (applied decisions; run recommendations for stabilization); "
        "left unset, a run configuration raises it to what its longest scale-down window holds",
    )
    history_max_age_s: float = Field(
        3600.0, gt=0, description="recommendations older than this are dropped, s (keep >= the stabilization window)"
    )

    @field_validator("etcd_url")
    @classmethod
    def _url(cls, value: str) -> str:
        if not re.match(r"^https?://[^/:\s]+(:\d+)?/?$", value):
            raise ValueError(f"connector.etcd_url must look like http://host:port, got {value!r}")
        return value.rstrip("/")

    @field_validator("key_prefix", "bookkeeping_prefix")
    @classmethod
    def _prefix(cls, value: str, info) -> str:
        try:
            filled = value.format(namespace="ns")
        except (KeyError, IndexError, ValueError):
            raise ValueError(f"connector.{info.field_name}: only {{namespace}} may be filled in, got {value!r}") from None
        if not filled.endswith("/") or len(filled) < 2:
            raise ValueError(f"connector.{info.field_name} must end with '/', got {value!r}")
        return value

    @model_validator(mode="after")
    def _prefixes_apart(self) -> "VirtualConnectorConfig":
        keys, book = self.key_prefix.format(namespace="ns"), self.bookkeeping_prefix.format(namespace="ns")
        if keys != book and (keys.startswith(book) or book.startswith(keys)):
            raise ValueError(
                f"connector.bookkeeping_prefix {self.bookkeeping_prefix!r} and key_prefix {self.key_prefix!r} nest: "
                f"use the same prefix or two apart"
            )
        return self


class LocalConnectorConfig(StrictModel):
    """No cluster: replicas live in memory or a JSON file and follow targets after a delay."""

    kind: Literal["local"] = "local"
    state_path: str | None = Field(None, description="JSON state file; None: in memory (lost with the process)")
    apply_delay_s: float = Field(0.0, ge=0, description="ready replicas reach the targets this long after apply, s")
    initial_prefill_replicas: int = Field(1, ge=0, description="prefill replicas before any decision")
    initial_decode_replicas: int = Field(1, ge=0, description="decode replicas before any decision")
    gpus_per_prefill_replica: int = Field(1, ge=1, description="GPUs one prefill replica uses")
    gpus_per_decode_replica: int = Field(1, ge=1, description="GPUs one decode replica uses")
    history_max_entries: int = Field(
        32, ge=1, le=500,
        description="entries kept in each history (applied decisions; run recommendations for stabilization); "
        "left unset, a run configuration raises it to what its longest scale-down window holds",
    )
    history_max_age_s: float = Field(
        3600.0, gt=0, description="recommendations older than this are dropped, s (keep >= the stabilization window)"
    )


C = TypeVar("C", KubernetesConnectorConfig, LlmdConnectorConfig, VirtualConnectorConfig, LocalConnectorConfig)


def _entries_for_window(window_s: float, interval_s: float) -> int:
    """Recommendations a window holds: ceil(window_s / interval_s) runs, and one more for a run starting early."""
    return math.ceil(window_s / interval_s) + 1


def fit_history_to_window(connector: C, *, window_s: float, interval_s: float) -> C:
    """The connector with its history raised to hold the window where the configuration left it unset.

    A window holds ceil(window_s / interval_s) + 1 runs (_entries_for_window) and needs
    history_max_age_s >= window_s: an hour's scale-down floor at one run every 10 s keeps 361 entries
    instead of the default 32. A field set explicitly is kept (the check then names it when too short).
    """
    if window_s <= 0:
        return connector
    update: dict[str, float] = {}
    needed = _entries_for_window(window_s, interval_s)
    if "history_max_entries" not in connector.model_fields_set and connector.history_max_entries < needed:
        update["history_max_entries"] = needed
    if "history_max_age_s" not in connector.model_fields_set and connector.history_max_age_s < window_s:
        update["history_max_age_s"] = window_s
    return connector.model_copy(update=update) if update else connector


def check_history_covers_window(
    connector: "KubernetesConnectorConfig | LlmdConnectorConfig | VirtualConnectorConfig | LocalConnectorConfig",
    *,
    window_s: float,
    interval_s: float,
    field: str = "planner.decision.scale_down_stabilization_s",
) -> None:
    """Raise ValueError when the recommendation history cannot hold a whole stabilization window.

    window_s: the scale-down stabilization window, s. interval_s: seconds
    between planner runs. A window holds ceil(window_s / interval_s) runs; one
    more covers a run that starts a little early.
    """
    if window_s <= 0:
        return
    if connector.history_max_age_s < window_s:
        raise ValueError(
            f"connector.history_max_age_s ({connector.history_max_age_s:g} s) is shorter than "
            f"{field} ({window_s:g} s): recommendations would be "
            f"dropped while still in the window"
        )
    needed = _entries_for_window(window_s, interval_s)
    if connector.history_max_entries < needed:
        raise ValueError(
            f"connector.history_max_entries ({connector.history_max_entries}) keeps fewer than the {needed} "
            f"recommendations {field} ({window_s:g} s) holds at one run every {interval_s:g} s "
            f"(ceil({window_s:g} / {interval_s:g}) + 1); raise it or shorten the window"
        )


ConnectorConfig = Annotated[
    Union[KubernetesConnectorConfig, LlmdConnectorConfig, VirtualConnectorConfig, LocalConnectorConfig],
    Field(discriminator="kind"),
]


class PlannerMetricsConfig(StrictModel):
    """The planner's own gauges: served for scraping and/or pushed."""

    enabled: bool = Field(True, description="publish the planner's gauges")
    port: int | None = Field(None, ge=1, le=65535, description="serve /metrics on this port; None: don't serve")
    addr: str = Field("0.0.0.0", description="address to serve /metrics on")
    pushgateway_url: str | None = Field(None, description="push to this Pushgateway after each run; None: don't push")
    push_job: str = Field("sla-planner", min_length=1, description="Pushgateway job label")


class LatencyModelConfig(StrictModel):
    """Where the planner's prefill TTFT comes from: the profile, or the routing service's published model.

    With `published`, each run reads the active model from the routing service
    and uses its TTFT (mean and p90 on an idle prefill engine) when it is fresh;
    otherwise the run uses the profile and says why in its artifact.
    """

    source: Literal["profile", "published"] = Field(
        "profile", description="profile: the pre-deployment profile; published: the model the router routes with"
    )
    router_url: str | None = Field(
        None, description="the routing service's base URL, e.g. http://router:8080 (needed with source published)"
    )
    max_age_s: float = Field(
        10_800.0, gt=0, description="a model published longer ago than this is not used, s (the retrain flow runs hourly)"
    )
    token_env: str | None = Field(
        None, min_length=1, description="environment variable holding the routing service's bearer token; None: none"
    )
    timeout_s: float = Field(10.0, gt=0, le=300, description="HTTP timeout of each call to the routing service, s")

    @model_validator(mode="after")
    def _url_when_published(self) -> "LatencyModelConfig":
        if self.source == "published" and not self.router_url:
            raise ValueError("router_url is required when source is 'published'")
        if self.router_url is not None and not self.router_url.startswith(("http://", "https://")):
            raise ValueError(f"router_url must start with http:// or https://, got {self.router_url!r}")
        return self


class AdvisoryConfig(StrictModel):
    """Advisory mode (planner.mode advisory): which autoscaler runs the fleet now and how its replicas are read back.

    Each advisory run reads, over window_s, the replicas that autoscaler set (one PromQL query per pool,
    connectors.queries.AUTOSCALER_QUERIES by `autoscaler`, or prefill_query / decode_query) and the advisory's own
    published targets, and compares them; the replicas the connector reads now are the last point.
    """

    autoscaler: Literal["dynamo-planner", "hpa", "deployment", "leaderworkerset", "custom"] = Field(
        "dynamo-planner",
        description="what sets the replicas now: dynamo-planner (Dynamo's planner gauges "
        "dynamo_planner_num_{prefill,decode}_replicas), hpa (an HPA's or KEDA's desired replicas, "
        "kube-state-metrics), deployment (a Deployment's spec.replicas), leaderworkerset (its leader StatefulSet's "
        "replicas); custom: prefill_query and decode_query",
    )
    label: str | None = Field(None, min_length=1, max_length=60,
                              description="the autoscaler's name on the chart and in the summary; None: `autoscaler`")
    namespace: str | None = Field(None, description="fills ${namespace} in the queries; None: the planner's namespace")
    prefill_object: str | None = Field(None, min_length=1, description="fills ${prefill_object}: the prefill pool's "
                                       "HPA, Deployment or LeaderWorkerSet (hpa, deployment, leaderworkerset)")
    decode_object: str | None = Field(None, min_length=1, description="fills ${decode_object}: the decode pool's "
                                      "HPA, Deployment or LeaderWorkerSet (hpa, deployment, leaderworkerset)")
    selector: str = Field("", description='more PromQL label matchers, no braces, fills ${selector}, e.g. '
                          'dynamo_namespace="dyn" for dynamo-planner')
    prefill_query: str | None = Field(None, min_length=1, description="PromQL of the prefill replicas the autoscaler "
                                      "set, one series; None: the autoscaler's preset")
    decode_query: str | None = Field(None, min_length=1, description="PromQL of the decode replicas the autoscaler "
                                     "set, one series; None: the autoscaler's preset")
    window_s: float = Field(3 * 3600.0, ge=600, le=7 * 86_400,
                            description="the chart's and the comparison's window, ending at the run, s (up to a week)")

    @field_validator("selector")
    @classmethod
    def _matchers(cls, value: str) -> str:
        if not _MATCHERS_RE.match(value):
            raise ValueError(f"give label matchers without braces, e.g. dynamo_namespace=\"dyn\", got {value!r}")
        return value.strip()

    @model_validator(mode="after")
    def _queries(self) -> "AdvisoryConfig":
        for pool in ("prefill", "decode"):
            text = self.query_template(pool)
            if text is None:
                raise ValueError(f"{pool}_query: the custom autoscaler needs both prefill_query and "
                                 f"decode_query")
            template = string.Template(text)
            unknown = set(template.get_identifiers()) - AUTOSCALER_PLACEHOLDERS if template.is_valid() else {"?"}
            if unknown:
                raise ValueError(f"{pool}_query: unknown or invalid placeholder(s) in {text!r}; known: "
                                 f"{sorted(AUTOSCALER_PLACEHOLDERS)}")
            if f"${{{pool}_object}}" in text and getattr(self, f"{pool}_object") is None:
                raise ValueError(f"{pool}_object: the {self.autoscaler} autoscaler's query names the "
                                 f"{pool} pool's object; set it (e.g. the HPA's or the Deployment's name)")
        return self

    def query_template(self, pool: str) -> str | None:
        """The pool's PromQL template: the query set here, else the autoscaler's preset (None for custom)."""
        own = getattr(self, f"{pool}_query")
        return own if own is not None else AUTOSCALER_QUERIES.get(self.autoscaler, {}).get(pool)

    def query(self, pool: str, *, namespace: str) -> str:
        """The pool's PromQL with its placeholders filled (namespace: the planner's, unless advisory.namespace)."""
        return string.Template(self.query_template(pool)).substitute(
            namespace=self.namespace or namespace, selector=self.selector,
            prefill_object=self.prefill_object or "", decode_object=self.decode_object or "")

    @property
    def name(self) -> str:
        """The autoscaler as the chart and the summary name it."""
        return self.label or self.autoscaler
