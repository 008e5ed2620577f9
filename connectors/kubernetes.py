"""The Kubernetes connector: scale a Dynamo DynamoGraphDeployment (nvidia.com/v1alpha1).

Targets go to `spec.services.<name>.replicas` by JSON merge patch. The prefill
and decode services are found by `subComponentType` (then `componentType`),
falling back to the configured service names. Ready replicas come from the
operator's `status.services.<name>` (readyReplicas, else availableReplicas,
else 0, so a missing status leans toward "not done yet").

The last decision and the recommendation history live on the DGD itself as
annotations. A run writes only when something changes, so a steady fleet
causes no events for the operator and no resourceVersion churn: one merge
patch guarded by `metadata.resourceVersion`, carrying the recommendation when
it differs from the one in effect, plus the replicas and decision annotations
when the targets change. The patch either lands whole or gets 409 Conflict;
on 409 the connector reads afresh and retries. Annotations (prefix
configurable, default `sla-planner`):

- `<prefix>/decision-id`: increases by one per applied decision
- `<prefix>/decided-at-s`: Unix time of the decision, seconds
- `<prefix>/targets`: `{"prefill": n, "decode": m}`
- `<prefix>/recent-targets`: JSON list of recent applied decisions
- `<prefix>/recommendations`: JSON list of recommendation changes
  `{"t_s", "prefill", "decode"}`, oldest first, each stamped with the first
  run that recommended it and in effect until the next (stabilization window:
  a recommendation holds scale-downs until the window has passed since it was
  superseded)

Credentials: the in-cluster service account (the official loader, which
re-reads the rotated token file every minute) or a kubeconfig. A 401 makes the
connector load them again and retry once, so a token revoked right after its
rotation costs one request; a second 401 is an error naming the credentials.

A decision is done when both services' ready replicas equal its targets and
the operator has observed the DGD's current generation.
"""

from __future__ import annotations

import json
import os

import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config import incluster_config
from kubernetes.config.config_exception import ConfigException

from connectors.base import (
    ConcurrentWriteError,
    ConnectorError,
    ConnectorUnavailableError,
    ResourceAccessError,
    add_recommendation_change,
    append_targets,
    changes_as_recent_targets,
    parse_recommendations,
    parse_targets_history,
    recommendation_entry,
    recommendation_of,
    targets_entry,
)
from connectors.config import KubernetesConnectorConfig
from planner.types import POOLS, Decision, DecisionRecord, FleetState, Pool, PoolState

GROUP = "nvidia.com"
VERSION = "v1alpha1"
PLURAL = "dynamographdeployments"
MERGE_PATCH = "application/merge-patch+json"


class KubernetesConnector:
    """Connector for one DynamoGraphDeployment; every call reads it afresh."""

    def __init__(
        self,
        config: KubernetesConnectorConfig,
        *,
        default_namespace: str = "default",
        api_client: k8s_client.ApiClient | None = None,
    ):
        self.config = config
        self.namespace = config.namespace or default_namespace
        self.name = config.dgd_name
        self._in_cluster = config.auth == "in_cluster" or (
            config.auth == "auto" and incluster_config.SERVICE_HOST_ENV_NAME in os.environ
        )
        # Credentials we loaded ourselves can be loaded again (a rotated token); an injected client cannot.
        self._reloadable = api_client is None
        self.auth_source = "the given API client" if api_client is not None else self._auth_source()
        self._api = k8s_client.CustomObjectsApi(api_client or self._make_api_client())
        prefix = config.annotation_prefix.rstrip("/")
        self._ann_id = f"{prefix}/decision-id"
        self._ann_at = f"{prefix}/decided-at-s"
        self._ann_targets = f"{prefix}/targets"
        self._ann_history = f"{prefix}/recent-targets"
        self._ann_recommendations = f"{prefix}/recommendations"

    @property
    def resource(self) -> str:
        return f"{PLURAL}.{GROUP}/{self.name} in namespace {self.namespace}"

    # -- Connector interface -------------------------------------------------

    def validate(self) -> None:
        """The DGD exists, is readable, and has a prefill and a decode service."""
        obj = self._get(doing="validating")
        self._service_names(obj)
        self._last_decision(obj)
        self._history(obj)
        self._recommendations(obj)

    def read_fleet(self, *, now_s: float) -> FleetState:
        obj = self._get(doing="reading the fleet")
        names = self._service_names(obj)
        pools = {pool: self._pool_state(obj, names[pool]) for pool in POOLS}
        return FleetState(
            prefill=pools["prefill"],
            decode=pools["decode"],
            last_decision=self._last_decision(obj),
            recent_targets=changes_as_recent_targets(self._recommendations(obj), now_s=now_s),
        )

    def apply(self, decision: Decision, *, now_s: float) -> DecisionRecord | None:
        """Merge-patch a changed recommendation, and changed replicas with the decision annotations, in one write.

        Returns the new decision's record, or None when no replicas were
        written (decision.apply False, or the spec already holds the targets).
        Nothing is sent when neither the recommendation nor the targets
        change. On 409 Conflict re-reads and retries up to
        config.conflict_retries times, then raises ConcurrentWriteError.
        """
        cfg = self.config
        want = {"prefill": decision.prefill_replicas, "decode": decision.decode_replicas}
        recommended = recommendation_of(decision)
        entry = recommendation_entry(t_s=now_s, prefill=recommended[0], decode=recommended[1])
        conflicts = []
        for _ in range(cfg.conflict_retries + 1):
            obj = self._get(doing="reading before apply")
            names = self._service_names(obj)
            services = obj["spec"]["services"]
            changes = decision.apply and any(_spec_replicas(services[names[p]]) != want[p] for p in POOLS)
            recommendations = add_recommendation_change(
                self._recommendations(obj), entry, max_entries=cfg.history_max_entries, max_age_s=cfg.history_max_age_s
            )
            annotations: dict[str, str] = {}
            if recommendations is not None:
                annotations[self._ann_recommendations] = json.dumps(recommendations, separators=(",", ":"))
            patch: dict = {}
            if changes:
                new_id = self._decision_id((obj.get("metadata") or {}).get("annotations") or {}) + 1
                history = append_targets(
                    self._history(obj),
                    targets_entry(decision_id=new_id, decided_at_s=now_s, prefill=want["prefill"], decode=want["decode"]),
                    max_entries=cfg.history_max_entries,
                )
                annotations.update({
                    self._ann_id: str(new_id),
                    self._ann_at: repr(float(now_s)),
                    self._ann_targets: json.dumps(want, separators=(",", ":")),
                    self._ann_history: json.dumps(history, separators=(",", ":")),
                })
                patch["spec"] = {"services": {names[p]: {"replicas": want[p]} for p in POOLS}}
                doing = f"patching replicas to prefill {want['prefill']}, decode {want['decode']}"
            else:
                doing = f"recording the recommendation (prefill {recommended[0]}, decode {recommended[1]})"
            if not annotations:
                return None
            patch["metadata"] = {
                # Optimistic concurrency: the server rejects the patch with 409
                # if anyone wrote since our read.
                "resourceVersion": obj["metadata"]["resourceVersion"],
                "annotations": annotations,
            }
            try:
                patched = self._call(
                    lambda: self._api.patch_namespaced_custom_object(
                        GROUP, VERSION, self.namespace, PLURAL, self.name, patch,
                        _content_type=MERGE_PATCH, _request_timeout=cfg.request_timeout_s,
                    ),
                    verb="patch",
                    doing=doing,
                )
            except ConcurrentWriteError as exc:
                conflicts.append(str(exc))
                continue
            return self._last_decision(patched) if changes else None
        raise ConcurrentWriteError(
            f"{self.resource}: patch kept conflicting with other writers "
            f"({len(conflicts)} attempts, conflict_retries={cfg.conflict_retries}); "
            f"last: {conflicts[-1]}"
        )

    def last_decision_done(self, *, now_s: float | None = None) -> bool:
        record = self._last_decision(self._get(doing="checking the last decision"))
        return record is None or record.done

    # -- reading the object --------------------------------------------------

    def _service_names(self, obj: dict) -> dict[Pool, str]:
        services = (obj.get("spec") or {}).get("services") or {}
        found: dict[Pool, str] = {}
        problems = []
        configured = {"prefill": self.config.prefill_service, "decode": self.config.decode_service}
        for pool in POOLS:
            for field in ("subComponentType", "componentType"):
                matches = sorted(n for n, s in services.items() if isinstance(s, dict) and s.get(field) == pool)
                if len(matches) > 1:
                    problems.append(f"{len(matches)} services have {field} {pool!r}: {matches}")
                    break
                if matches:
                    found[pool] = matches[0]
                    break
            else:
                if configured[pool] in services:
                    found[pool] = configured[pool]
                else:
                    problems.append(
                        f"no {pool} service: none has subComponentType {pool!r} and "
                        f"spec.services has no {configured[pool]!r} key"
                    )
        if problems:
            raise ResourceAccessError(
                f"{self.resource}: {'; '.join(problems)} (services: {sorted(services) or 'none'}; "
                f"set connector.prefill_service / decode_service to the spec.services keys)"
            )
        return found

    def _pool_state(self, obj: dict, service: str) -> PoolState:
        spec = obj["spec"]["services"][service]
        status = ((obj.get("status") or {}).get("services") or {}).get(service) or {}
        ready = status.get("readyReplicas")
        if not isinstance(ready, int):
            ready = status.get("availableReplicas")
        return PoolState(
            current_replicas=_spec_replicas(spec),
            ready_replicas=ready if isinstance(ready, int) else 0,
            gpus_per_replica=_gpus_per_replica(spec, status),
        )

    def _decision_id(self, annotations: dict) -> int:
        text = annotations.get(self._ann_id)
        if text is None:
            return 0
        try:
            value = int(text)
        except ValueError:
            value = -1
        if value < 0:
            raise ConnectorError(
                f"{self.resource}: annotation {self._ann_id} must be a non-negative integer, got {text!r}"
            )
        return value

    def _history(self, obj: dict) -> list[dict]:
        annotations = (obj.get("metadata") or {}).get("annotations") or {}
        return parse_targets_history(
            annotations.get(self._ann_history), source=f"{self.resource}: annotation {self._ann_history}"
        )

    def _recommendations(self, obj: dict) -> list[dict]:
        annotations = (obj.get("metadata") or {}).get("annotations") or {}
        return parse_recommendations(
            annotations.get(self._ann_recommendations),
            source=f"{self.resource}: annotation {self._ann_recommendations}",
        )

    def _last_decision(self, obj: dict) -> DecisionRecord | None:
        annotations = (obj.get("metadata") or {}).get("annotations") or {}
        decision_id = self._decision_id(annotations)
        if decision_id == 0:
            return None
        try:
            targets = json.loads(annotations[self._ann_targets])
            decided_at_s = float(annotations[self._ann_at])
            prefill, decode = int(targets["prefill"]), int(targets["decode"])
        except (KeyError, ValueError, TypeError) as exc:
            raise ConnectorError(
                f"{self.resource}: annotations {self._ann_targets} / {self._ann_at} must accompany "
                f"{self._ann_id}={decision_id} as JSON {{\"prefill\": n, \"decode\": m}} and seconds "
                f"({type(exc).__name__}: {exc})"
            ) from None
        names = self._service_names(obj)
        ready = {p: self._pool_state(obj, names[p]).ready_replicas for p in POOLS}
        status = obj.get("status") or {}
        observed = status.get("observedGeneration")
        generation = (obj.get("metadata") or {}).get("generation")
        caught_up = not (isinstance(observed, int) and isinstance(generation, int) and observed < generation)
        done = caught_up and ready["prefill"] == prefill and ready["decode"] == decode
        return DecisionRecord(decision_id, decided_at_s, prefill, decode, done=done)

    # -- API calls -----------------------------------------------------------

    def _get(self, *, doing: str) -> dict:
        return self._call(
            lambda: self._api.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, self.name,
                _request_timeout=self.config.request_timeout_s,
            ),
            verb="get",
            doing=doing,
        )

    def _call(self, fn, *, verb: str, doing: str):
        try:
            try:
                return fn()
            except ApiException as exc:
                if exc.status != 401 or not self._reloadable:
                    raise
                # A 401 with credentials we loaded: the token may have been rotated (and the old
                # one revoked) since we read it; read them again and retry once.
                self._api = k8s_client.CustomObjectsApi(self._make_api_client())
                return fn()
        except ApiException as exc:
            raise self._api_error(exc, verb=verb, doing=doing) from exc
        except urllib3.exceptions.HTTPError as exc:
            host = self._api.api_client.configuration.host
            reason = getattr(exc, "reason", None)
            if isinstance(exc, urllib3.exceptions.SSLError) or isinstance(reason, urllib3.exceptions.SSLError):
                ca = self._api.api_client.configuration.ssl_ca_cert
                raise ConnectorError(
                    f"{self.resource}: {doing}: TLS with the Kubernetes API server {host} failed "
                    f"(auth from {self.auth_source}; CA file {ca or 'none: the system CAs'}): {reason or exc}"
                ) from exc
            raise ConnectorUnavailableError(
                f"{self.resource}: {doing}: Kubernetes API server {host} unreachable ({exc})"
            ) from exc

    def _api_error(self, exc: ApiException, *, verb: str, doing: str) -> ConnectorError:
        try:
            status = json.loads(exc.body or "{}")
        except ValueError:
            status = {}
        message = status.get("message") if isinstance(status, dict) else None
        message = message or exc.reason or "no message"
        what = f"{verb} {self.resource}"
        if exc.status == 409:
            return ConcurrentWriteError(f"{what}: 409 Conflict: {message}")
        if exc.status == 403:
            return ResourceAccessError(
                f"{what}: 403 Forbidden: {message} (grant the planner's service account the "
                f"{verb!r} verb on {PLURAL}.{GROUP})"
            )
        if exc.status == 404:
            return ResourceAccessError(f"{what}: 404 Not Found: {message} (check connector.dgd_name and namespace)")
        if exc.status == 401:
            fix = (
                "check the service account token is mounted, current and not revoked"
                if self._in_cluster and self._reloadable else "check the credentials"
            )
            again = ", read again after a first 401" if self._reloadable else ""
            return ResourceAccessError(f"{what}: 401 Unauthorized: {message} (auth from {self.auth_source}{again}; {fix})")
        if exc.status in (429, 500, 502, 503, 504):
            return ConnectorUnavailableError(f"{what} while {doing}: HTTP {exc.status}: {message}")
        return ConnectorError(f"{what} while {doing}: HTTP {exc.status}: {message}")

    def _auth_source(self) -> str:
        """The credentials' origin, for error messages: in-cluster token file or kubeconfig (and context)."""
        cfg = self.config
        if self._in_cluster:
            return (
                f"the in-cluster service account (token {incluster_config.SERVICE_TOKEN_FILENAME}, "
                f"CA {incluster_config.SERVICE_CERT_FILENAME})"
            )
        return f"kubeconfig {cfg.kubeconfig_path or os.environ.get('KUBECONFIG') or '~/.kube/config'}" + (
            f" context {cfg.kubeconfig_context!r}" if cfg.kubeconfig_context else ""
        )

    def _make_api_client(self) -> k8s_client.ApiClient:
        cfg = self.config
        try:
            if self._in_cluster:
                configuration = k8s_client.Configuration()
                # The official loader re-reads the (kubelet-rotated) token file at most a minute
                # after it changes, through the refresh hook it sets on this configuration.
                k8s_config.load_incluster_config(client_configuration=configuration, try_refresh_token=True)
                return k8s_client.ApiClient(configuration)
            return k8s_config.new_client_from_config(
                config_file=cfg.kubeconfig_path, context=cfg.kubeconfig_context
            )
        except (ConfigException, OSError) as exc:
            raise ConnectorError(f"Kubernetes auth from {self.auth_source} failed: {exc}") from exc


def _spec_replicas(service_spec: dict) -> int:
    # The operator treats an unset replicas as 1.
    value = service_spec.get("replicas")
    return value if isinstance(value, int) else 1


def _gpus_per_replica(spec: dict, status: dict) -> int:
    """GPUs one replica uses: the operator's status if reported, else the resources."""
    reported = status.get("gpusPerReplica")
    if isinstance(reported, int) and reported > 0:
        return reported
    resources = spec.get("resources") or {}
    gpus = 0
    for section in ("limits", "requests"):
        try:
            gpus = int(str((resources.get(section) or {}).get("gpu", 0)))
        except ValueError:
            gpus = 0
        if gpus:
            break
    nodes = (spec.get("multinode") or {}).get("nodeCount", 1)
    nodes = nodes if isinstance(nodes, int) and nodes > 0 else 1
    return max(gpus, 1) * nodes
