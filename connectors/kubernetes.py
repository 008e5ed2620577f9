"""The Kubernetes connector: scale a Dynamo DynamoGraphDeployment the way the cluster's operator expects.

Three write paths, picked from what the cluster serves (API discovery of
`dynamographdeployments.nvidia.com`; `connector.api` overrides), logged once:

- **v1beta1, scaling adapters** (Dynamo 1.3-1.6.1, and what Dynamo's profiler sets up
  for prefill and decode workers): `PATCH .../dynamographdeploymentscalingadapters/
  <dgd>-<component>/scale` with `{"spec": {"replicas": n}}`. The adapter is the
  source of truth; the operator puts back any direct edit of the component's
  replicas, so the connector never writes them when an adapter exists.
- **v1beta1 without an adapter** (the adapter's /scale answers 404): an RFC 6902
  JSON patch on the DGD, `test` the component's name at `/spec/components/<i>/name`,
  then `add` its `replicas`, as Dynamo's own planner falls back.
- **v1alpha1** (operators before 1.3): JSON merge patch of `spec.services.<name>.replicas`.

The prefill and decode workers are found as Dynamo's planner finds them
(connectors.kube.dgd). Ready replicas and readiness come from the operator's status
(`status.components.<name>` in v1beta1, `status.services.<name>` in v1alpha1:
availableReplicas, else readyReplicas) and `observedGeneration`; GPUs per replica
from the operator's `gpusPerReplica`, else the component's `nvidia.com/gpu`.

The last decision and the recommendation history live on the DGD as annotations
(connectors.kube.annotation_ledger; the operator does not revert metadata). A run writes
only when something changes: one write guarded by `metadata.resourceVersion` (a
merge patch in v1alpha1, a JSON patch with a `test` of it in v1beta1, carrying the
replicas of components without an adapter) with the recommendation when it differs
from the one in effect, plus the decision annotations when the targets change;
then, with adapters, their /scale. A conflict (409, or 422 from the resourceVersion
test) makes the connector read afresh and retry.

Credentials and API errors are connectors.kube.session's (in-cluster service
account or kubeconfig; a 401 reloads them once).

A decision is done when both pools' ready replicas equal its targets and the
operator has observed the DGD's current generation.
"""

from __future__ import annotations

import logging

from kubernetes import client as k8s_client

from connectors.kube import dgd
from connectors.base import (
    ConcurrentWriteError,
    ConnectorError,
    ResourceAccessError,
    as_applied_targets,
    changes_as_recent_targets,
    recommendation_entry,
    refuse_stale,
    recommendation_of,
)
from connectors.kube.annotation_ledger import AnnotationLedger
from connectors.config import KubernetesConnectorConfig
from connectors.kube.session import KubeSession
from planner.types import POOLS, Decision, DecisionRecord, FleetState, Pool, PoolState

log = logging.getLogger(__name__)

GROUP = "nvidia.com"
PLURAL = "dynamographdeployments"
ADAPTERS = "dynamographdeploymentscalingadapters"
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


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
        self._session = KubeSession(
            auth=config.auth, kubeconfig_path=config.kubeconfig_path, kubeconfig_context=config.kubeconfig_context,
            resource=self.resource, not_found_hint="check connector.dgd_name and namespace", api_client=api_client,
        )
        self.auth_source = self._session.auth_source
        self._version: str | None = None if config.api == "auto" else config.api
        self._ledger = AnnotationLedger(prefix=config.annotation_prefix, resource=self.resource)

    @property
    def _api(self) -> k8s_client.CustomObjectsApi:
        return k8s_client.CustomObjectsApi(self._session.api_client)

    @property
    def resource(self) -> str:
        return f"{PLURAL}.{GROUP}/{self.name} in namespace {self.namespace}"

    @property
    def version(self) -> str:
        """The DGD API version this connector speaks (discovered once when `api: auto`)."""
        if self._version is None:
            self._version = self._discover_version(doing="discovering the served DynamoGraphDeployment versions")
        return self._version

    def read_dgd(self) -> dict:
        """The DGD as the cluster serves it, in the discovered version (`sla-planner import dgd --live`)."""
        return self._get(doing="reading it")

    def read_config_map(self, name: str) -> dict:
        """A ConfigMap in this namespace as a plain object (a planner's --config file, WVA's settings)."""
        core = k8s_client.CoreV1Api(self._api.api_client)
        obj = self._call(
            lambda: core.read_namespaced_config_map(name, self.namespace, _request_timeout=self.config.request_timeout_s),
            verb="get", doing="reading it", resource=f"configmaps/{name} in namespace {self.namespace}",
        )
        return self._api.api_client.sanitize_for_serialization(obj)

    # -- Connector interface -------------------------------------------------

    def validate(self) -> None:
        """The DGD exists, is readable, and has a prefill and a decode component."""
        obj = self._get(doing="validating")
        self._workers(obj)
        self._ledger.validate(obj)
        self._last_decision(obj)

    def read_fleet(self, *, now_s: float) -> FleetState:
        obj = self._get(doing="reading the fleet")
        workers = self._workers(obj)
        current = self._current_replicas(workers)
        pools = {p: PoolState(current[p][0], dgd.ready_replicas(workers[p]), workers[p].gpus_per_replica)
                 for p in POOLS}
        return FleetState(
            prefill=pools["prefill"],
            decode=pools["decode"],
            last_decision=self._last_decision(obj),
            recent_targets=changes_as_recent_targets(self._ledger.recommendations(obj), now_s=now_s),
            applied_targets=as_applied_targets(self._ledger.history(obj)),
        )

    def apply(self, decision: Decision, *, now_s: float) -> DecisionRecord | None:
        """Record a changed recommendation and write changed replicas with the decision annotations.

        Returns the new decision's record, or None when no replicas were
        written (decision.apply False, or the fleet already holds the targets).
        Nothing is sent when neither the recommendation nor the targets
        change. On a conflict re-reads and retries up to config.conflict_retries
        times, then raises ConcurrentWriteError.
        """
        cfg = self.config
        want = {"prefill": decision.prefill_replicas, "decode": decision.decode_replicas}
        recommended = recommendation_of(decision)
        entry = recommendation_entry(t_s=now_s, prefill=recommended[0], decode=recommended[1])
        conflicts = []
        for _ in range(cfg.conflict_retries + 1):
            obj = self._get(doing="reading before apply")
            workers = self._workers(obj)
            current = self._current_replicas(workers)
            refuse_stale(decision, (current["prefill"][0], current["decode"][0]), resource=self.resource)
            changed = [p for p in POOLS if decision.apply and current[p][0] != want[p]]
            annotations = self._ledger.updates(
                obj, entry=entry, want=want if changed else None, now_s=now_s,
                max_entries=cfg.history_max_entries, max_age_s=cfg.history_max_age_s,
            )
            if not annotations:
                return None
            try:
                patched = self._write(obj, workers, current, annotations, {p: want[p] for p in changed})
            except ConcurrentWriteError as exc:
                conflicts.append(str(exc))
                continue
            return self._last_decision(patched) if changed else None
        raise ConcurrentWriteError(
            f"{self.resource}: patch kept conflicting with other writers "
            f"({len(conflicts)} attempts, conflict_retries={cfg.conflict_retries}); "
            f"last: {conflicts[-1]}"
        )

    def last_decision_done(self, *, now_s: float | None = None) -> bool:
        record = self._last_decision(self._get(doing="checking the last decision"))
        return record is None or record.done

    # -- writing -------------------------------------------------------------

    def _write(self, obj: dict, workers: dict, current: dict, annotations: dict[str, str],
               replicas: dict[Pool, int]) -> dict:
        """One guarded write of the annotations (and of replicas not owned by an adapter), then the adapters."""
        rv = obj["metadata"]["resourceVersion"]
        what = ", ".join(f"{p} {n}" for p, n in replicas.items())
        doing = f"patching replicas to {what}" if replicas else "recording the recommendation"
        via_adapter = {p: n for p, n in replicas.items() if current[p][1]}
        direct = {p: n for p, n in replicas.items() if not current[p][1]}
        if self.version == "v1alpha1":
            patch: dict = {"metadata": {"resourceVersion": rv, "annotations": annotations}}
            if direct:
                patch["spec"] = {"services": {workers[p].name: {"replicas": n} for p, n in direct.items()}}
            patched = self._patch_dgd(patch, MERGE_PATCH, doing=doing)
        else:
            ops = dgd.annotations_json_patch(obj, rv, annotations)
            ops += dgd.replicas_json_patch([(workers[p], n) for p, n in direct.items()])
            patched = self._patch_dgd(ops, JSON_PATCH, doing=doing)
        for pool, n in via_adapter.items():
            adapter = dgd.adapter_name(self.name, workers[pool].name)
            try:
                self._scale(adapter, n)
            except ResourceAccessError as exc:
                if "404" not in str(exc):
                    raise
                # The adapter went away between our read and this write: Dynamo's fallback.
                log.warning("%s: adapter %s is gone; writing %s replicas on the DGD", self.resource, adapter, pool)
                fresh = self._get(doing="reading after a missing adapter")
                ops = dgd.annotations_json_patch(fresh, fresh["metadata"]["resourceVersion"], {})
                patched = self._patch_dgd(ops + dgd.replicas_json_patch([(self._workers(fresh)[pool], n)]),
                                          JSON_PATCH, doing=f"patching {pool} replicas to {n} (no adapter)")
        return patched

    def _patch_dgd(self, body, content_type: str, *, doing: str) -> dict:
        try:
            return self._call(
                lambda: self._api.patch_namespaced_custom_object(
                    GROUP, self.version, self.namespace, PLURAL, self.name, body,
                    _content_type=content_type, _request_timeout=self.config.request_timeout_s,
                ),
                verb="patch", doing=doing,
            )
        except ConnectorError as exc:
            if "HTTP 422" in str(exc) and "/metadata/resourceVersion" in str(exc) or "test" in str(exc).lower():
                # A JSON patch's test failed: someone wrote since our read (or moved a component).
                raise ConcurrentWriteError(f"patch {self.resource}: {exc}") from exc
            raise

    def _scale(self, adapter: str, replicas: int) -> dict:
        return self._call(
            lambda: self._api.patch_namespaced_custom_object_scale(
                GROUP, "v1beta1", self.namespace, ADAPTERS, adapter, {"spec": {"replicas": replicas}},
                _content_type=MERGE_PATCH, _request_timeout=self.config.request_timeout_s,
            ),
            verb="patch", doing=f"scaling adapter {adapter} to {replicas}",
            resource=f"{ADAPTERS}.{GROUP}/{adapter} (scale) in namespace {self.namespace}",
        )

    # -- reading the object --------------------------------------------------

    def _workers(self, obj: dict) -> dict[Pool, dgd.Worker]:
        configured = {"prefill": self.config.prefill_service, "decode": self.config.decode_service}
        try:
            return dgd.workers(obj, self.version, configured=configured)
        except dgd.DgdShapeError as exc:
            raise ResourceAccessError(f"{self.resource} ({self.version}): {exc}") from None

    def _current_replicas(self, workers: dict[Pool, dgd.Worker]) -> dict[Pool, tuple[int, bool]]:
        """(replicas, owned by an adapter) per pool: an adapter's spec.replicas when it exists, as Dynamo reads it."""
        out = {}
        for pool, worker in workers.items():
            if not worker.adapter:
                out[pool] = (worker.replicas, False)
                continue
            adapter = dgd.adapter_name(self.name, worker.name)
            try:
                scale = self._call(
                    lambda: self._api.get_namespaced_custom_object_scale(
                        GROUP, "v1beta1", self.namespace, ADAPTERS, adapter,
                        _request_timeout=self.config.request_timeout_s,
                    ),
                    verb="get", doing=f"reading adapter {adapter}",
                    resource=f"{ADAPTERS}.{GROUP}/{adapter} (scale) in namespace {self.namespace}",
                )
            except ResourceAccessError as exc:
                if "404" not in str(exc):
                    raise
                out[pool] = (worker.replicas, False)  # opted in, but no adapter (yet): write the DGD
                continue
            replicas = (scale.get("spec") or {}).get("replicas")
            out[pool] = (replicas if isinstance(replicas, int) else worker.replicas, True)
        return out

    def _last_decision(self, obj: dict) -> DecisionRecord | None:
        last = self._ledger.last_targets(obj)
        if last is None:
            return None
        decision_id, decided_at_s, prefill, decode = last
        workers = self._workers(obj)
        ready = {p: dgd.ready_replicas(workers[p]) for p in POOLS}
        done = dgd.caught_up(obj) and ready["prefill"] == prefill and ready["decode"] == decode
        return DecisionRecord(decision_id, decided_at_s, prefill, decode, done=done)

    # -- API calls -----------------------------------------------------------

    def _get(self, *, doing: str) -> dict:
        if self._version is None:
            self._version = self._discover_version(doing=f"{doing}: discovering the served DynamoGraphDeployment versions")
        return self._call(
            lambda: self._api.get_namespaced_custom_object(
                GROUP, self.version, self.namespace, PLURAL, self.name,
                _request_timeout=self.config.request_timeout_s,
            ),
            verb="get",
            doing=doing,
        )

    def _discover_version(self, *, doing: str) -> str:
        """The newest DGD version the cluster serves (GET /apis/nvidia.com and its version's resources)."""
        api_client = self._api.api_client

        def get(path: str) -> dict:
            def call() -> dict:
                params = api_client.param_serialize(
                    method="GET", resource_path=path, header_params={"Accept": "application/json"},
                    auth_settings=["BearerToken"])
                response = api_client.call_api(*params, _request_timeout=self.config.request_timeout_s)
                response.read()
                return api_client.response_deserialize(response, {"200": "object"}).data

            return self._call(call, verb="get", doing=doing, resource=f"API discovery {path}")

        try:
            group = get(f"/apis/{GROUP}")
        except ResourceAccessError as exc:
            if "404" not in str(exc):
                raise
            group = {"versions": []}
        served = [v.get("version") for v in group.get("versions") or []]
        for version in dgd.VERSIONS:
            if version in served and any(r.get("name") == PLURAL for r in
                                         get(f"/apis/{GROUP}/{version}").get("resources") or []):
                log.info("%s: the cluster serves DynamoGraphDeployment %s: scaling %s", self.resource, version,
                         "through scaling adapters' /scale where they exist, else a JSON patch of "
                         "spec.components[].replicas" if version == "v1beta1" else
                         "by merge patch of spec.services.<name>.replicas")
                return version
        raise ResourceAccessError(
            f"{self.resource}: the cluster serves none of the known {PLURAL}.{GROUP} versions "
            f"({', '.join(dgd.VERSIONS)}); it serves {GROUP} {served or 'not at all'} (is Dynamo's operator installed?)"
        )

    def _call(self, fn, *, verb: str, doing: str, resource: str | None = None):
        return self._session.call(fn, verb=verb, doing=doing, resource=resource, default_grant=f"{PLURAL}.{GROUP}")
