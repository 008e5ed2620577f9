"""deploy/kubernetes, the Dockerfile and prefect.yaml's Kubernetes work-pool deployments.

The example overlay is built with kustomize (`kubectl kustomize`, as `kubectl apply -k`
builds it). Every manifest must load into the official client's models with no field
the model lacks; names, labels and selectors must agree; the work pool's job template,
filled in by prefect-kubernetes with prefect.yaml's job variables, must be a valid Job
that refers only to objects the manifests define. The planner's Role is then enforced
by the fake Dynamo cluster: the Kubernetes connector's whole cycle passes under it, and
fails when any verb of any rule is taken away.
"""

from __future__ import annotations

import asyncio
import copy
import importlib.metadata
import json
import re
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
import yaml
from kubernetes import client as k8s_client

from connectors.base import ConnectorError
from connectors.config import KubernetesConnectorConfig
from connectors.kubernetes import KubernetesConnector
from flows.config import load_run_config
from planner.types import Decision
from routing.config import RouterConfig
from tests.support.fixtures_prefect import prefect_harness  # noqa: F401  (fixture)
from tests.support.k8s_dynamo_fake import CRD_DIR, DGD, DynamoCluster
from tests.support.k8s_fake_server import TEST_TOKEN, kube_api_client, load_manifest

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "kubernetes"
OVERLAY = "overlays/example"
T0_S = 1_700_000_000.0

# Built-in kinds the manifests may use, by apiVersion/kind.
MODELS = {
    ("v1", "ServiceAccount"): "V1ServiceAccount", ("v1", "ConfigMap"): "V1ConfigMap", ("v1", "Secret"): "V1Secret",
    ("v1", "Service"): "V1Service", ("v1", "PersistentVolumeClaim"): "V1PersistentVolumeClaim",
    ("apps/v1", "Deployment"): "V1Deployment", ("batch/v1", "Job"): "V1Job",
    ("policy/v1", "PodDisruptionBudget"): "V1PodDisruptionBudget",
    ("rbac.authorization.k8s.io/v1", "Role"): "V1Role",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "V1RoleBinding",
}
PRIMITIVES = {"str", "int", "float", "bool", "bytes", "object", "datetime", "date"}


def strict_load(data, type_name: str, path: str = ""):
    """Check `data` against the client's model `type_name` field by field (an unknown field fails,
    naming its path), then deserialize it with the client (its required-field checks run)."""
    if data is None or type_name in PRIMITIVES:
        return
    if match := re.fullmatch(r"[Ll]ist\[(.+)\]", type_name):
        assert isinstance(data, list), f"{path}: expected a list"
        for i, item in enumerate(data):
            strict_load(item, match[1], f"{path}[{i}]")
        return
    if match := re.fullmatch(r"(?:dict\(|Dict\[)\w+, (.+)[)\]]", type_name):
        assert isinstance(data, dict), f"{path}: expected a mapping"
        for key, value in data.items():
            strict_load(value, match[1], f"{path}.{key}")
        return
    model = getattr(k8s_client.models, type_name)
    assert isinstance(data, dict), f"{path}: expected a {type_name} object, got {data!r:.60}"
    unknown = set(data) - set(model.attribute_map.values())
    assert not unknown, f"{path or type_name}: fields {sorted(unknown)} are not in {type_name}"
    for attr, key in model.attribute_map.items():
        if key in data:
            strict_load(data[key], model.openapi_types[attr], f"{path}.{key}")


def deserialize(doc: dict):
    name = MODELS[(doc["apiVersion"], doc["kind"])]
    strict_load(doc, name, f"{doc['kind']}/{doc['metadata'].get('name') or doc['metadata'].get('generateName')}")
    return k8s_client.ApiClient()._ApiClient__deserialize(doc, name)  # the client's own loader


def kustomize(folder: Path) -> list[dict]:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl (with its kustomize) is not installed: the overlay cannot be built as `kubectl apply -k` would")
    out = subprocess.run(["kubectl", "kustomize", str(folder)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@pytest.fixture(scope="module")
def manifests(tmp_path_factory, prefect_harness) -> list[dict]:  # noqa: F811  (prefect-kubernetes resolves templates through the API)
    """The example overlay as `kubectl apply -k` would send it (with a tokens.env, as the docs write one)."""
    tree = tmp_path_factory.mktemp("deploy") / "kubernetes"
    shutil.copytree(DEPLOY, tree, ignore=shutil.ignore_patterns("tokens.env", "data-token.env"))
    (tree / OVERLAY / "tokens.env").write_text("SLA_ROUTER_TOKEN=not-a-secret-test-token\n")
    (tree / OVERLAY / "data-token.env").write_text("SLA_ROUTER_DATA_TOKEN=not-a-secret-data-token\n")
    return kustomize(tree / OVERLAY)


def by_kind(manifests: list[dict], kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in manifests if d["kind"] == kind}


def k8s_deployments() -> list[dict]:
    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    return [d for d in spec["deployments"] if d["work_pool"]["name"] == "sla-planner-k8s"]


def flow_run_jobs() -> list[tuple[str, dict]]:
    """Each Kubernetes deployment's flow-run Job, as the prefect-kubernetes worker builds it."""
    from prefect_kubernetes.worker import KubernetesWorkerJobConfiguration

    from prefect.client.schemas.objects import FlowRun

    template = json.loads((DEPLOY / "base" / "work-pool.json").read_text())
    jobs = []
    for dep in k8s_deployments():
        config = asyncio.run(KubernetesWorkerJobConfiguration.from_template_and_values(
            template, dep["work_pool"]["job_variables"]))
        config.prepare_for_flow_run(FlowRun(flow_id=uuid.uuid4(), name="brave-otter"))
        jobs.append((dep["name"], copy.deepcopy(config.job_manifest)))
    return jobs


def pod_specs(manifests: list[dict]):
    for doc in manifests:
        if doc["kind"] in ("Deployment", "Job"):
            yield f"{doc['kind']}/{doc['metadata']['name']}", doc["spec"]["template"]
    for name, job in flow_run_jobs():
        yield f"flow-run Job of {name}", job["spec"]["template"]


# -- manifests ------------------------------------------------------------------------------


def test_every_manifest_loads_into_the_clients_models_without_unknown_fields(manifests):
    kinds = sorted({(d["apiVersion"], d["kind"]) for d in manifests})
    assert set(kinds) <= set(MODELS), f"kinds with no client model: {set(kinds) - set(MODELS)}"
    for doc in manifests:
        assert doc["metadata"]["namespace"] == "dynamo", doc["metadata"]
        deserialize(doc)
    for name, job in flow_run_jobs():
        deserialize(job)
    # The check itself can fail: a misspelt field is refused with its path.
    bad = copy.deepcopy(by_kind(manifests, "Deployment")["sla-planner-router"])
    bad["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(AssertionError, match=r"containers\[0\]: fields \['readinesProbe'\]"):
        deserialize(bad)


def test_services_and_budgets_select_their_deployments_pods(manifests):
    deployments = by_kind(manifests, "Deployment")
    for name, dep in deployments.items():
        selector = dep["spec"]["selector"]["matchLabels"]
        labels = dep["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= labels.items(), f"Deployment {name} does not select its own pods"
    for kind in ("Service", "PodDisruptionBudget"):
        for name, obj in by_kind(manifests, kind).items():
            selector = obj["spec"]["selector"].get("matchLabels", obj["spec"]["selector"])
            selected = [d for d, dep in deployments.items()
                        if selector.items() <= dep["spec"]["template"]["metadata"]["labels"].items()]
            assert selected == [name], f"{kind} {name} selects {selected}"
    for name, svc in by_kind(manifests, "Service").items():
        ports = {p["name"] for c in deployments[name]["spec"]["template"]["spec"]["containers"]
                 for p in c.get("ports", [])}
        assert {p["targetPort"] for p in svc["spec"]["ports"]} <= ports, name
    # prometheus-operator's ServiceMonitor (a component, outside the overlay) picks the router's Service and port.
    (monitor,) = yaml.safe_load_all((DEPLOY / "components" / "servicemonitor" / "servicemonitor.yaml").read_text())
    router = by_kind(manifests, "Service")["sla-planner-router"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= router["metadata"]["labels"].items()
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= {p["name"] for p in router["spec"]["ports"]}


def test_every_referenced_configmap_secret_account_and_claim_is_defined(manifests):
    defined = {kind: by_kind(manifests, kind) for kind in
               ("ConfigMap", "Secret", "ServiceAccount", "PersistentVolumeClaim", "Role")}
    checked = 0
    for where, template in pod_specs(manifests):
        spec = template["spec"]
        account = spec.get("serviceAccountName")
        if account is None:  # the namespace's default account, with no API token
            assert spec.get("automountServiceAccountToken") is False, f"{where}: the default account's token is mounted"
        else:
            assert account in defined["ServiceAccount"], f"{where}: service account {account!r} is not defined"
        refs = []
        for volume in spec.get("volumes", []):
            if "configMap" in volume:
                refs.append(("ConfigMap", volume["configMap"]["name"], None))
            if "secret" in volume:
                refs.append(("Secret", volume["secret"]["secretName"], None))
            if "persistentVolumeClaim" in volume:
                refs.append(("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"], None))
        for container in spec["containers"]:
            for source in container.get("envFrom", []):
                if "configMapRef" in source:
                    refs.append(("ConfigMap", source["configMapRef"]["name"], None))
                if "secretRef" in source:
                    refs.append(("Secret", source["secretRef"]["name"], None))
            for env in container.get("env", []):
                ref = env.get("valueFrom") or {}
                if "configMapKeyRef" in ref:
                    refs.append(("ConfigMap", ref["configMapKeyRef"]["name"], ref["configMapKeyRef"]["key"]))
                if "secretKeyRef" in ref:
                    refs.append(("Secret", ref["secretKeyRef"]["name"], ref["secretKeyRef"]["key"]))
        for kind, name, key in refs:
            assert name in defined[kind], f"{where}: {kind} {name!r} is not defined"
            if key is not None:
                assert key in (defined[kind][name].get("data") or {}), f"{where}: {kind} {name} has no key {key!r}"
            checked += 1
    assert checked >= 8
    for name, binding in by_kind(manifests, "RoleBinding").items():
        assert binding["roleRef"]["name"] in defined["Role"], name
        for subject in binding["subjects"]:
            assert subject["name"] in defined["ServiceAccount"] and subject["namespace"] == "dynamo", name
    # The router's token is the retrain flow's: both read SLA_ROUTER_TOKEN from the one Secret.
    secret = defined["Secret"]["sla-planner-tokens"]
    assert set(secret["data"]) == {"SLA_ROUTER_TOKEN"}
    # The data-plane token is the router's alone (and its gateways'), in a Secret no flow run reads.
    assert set(defined["Secret"]["sla-planner-data-token"]["data"]) == {"SLA_ROUTER_DATA_TOKEN"}
    router_env = by_kind(manifests, "Deployment")["sla-planner-router"]["spec"]["template"]["spec"]["containers"][0]
    assert {r["secretRef"]["name"] for r in router_env["envFrom"] if "secretRef" in r} == {
        "sla-planner-tokens", "sla-planner-data-token"}
    for name, job in flow_run_jobs():
        (c,) = job["spec"]["template"]["spec"]["containers"]
        assert "sla-planner-data-token" not in json.dumps(c), f"flow run {name} gets the data-plane token"


def test_nothing_is_granted_cluster_wide_and_the_planner_role_is_the_connectors(manifests):
    assert not [d for d in manifests if d["kind"] in ("ClusterRole", "ClusterRoleBinding", "Namespace")]
    roles = by_kind(manifests, "Role")
    for role in roles.values():
        for rule in role["rules"]:
            assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"], rule
    planner = roles["sla-planner"]["rules"]
    assert {(g, r, v) for rule in planner for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]} == {
        ("nvidia.com", "dynamographdeployments", "get"), ("nvidia.com", "dynamographdeployments", "patch"),
        ("nvidia.com", "dynamographdeploymentscalingadapters/scale", "get"),
        ("nvidia.com", "dynamographdeploymentscalingadapters/scale", "patch")}
    # Only the planner's flow runs hold that Role; the router and the retrain runs get no API token.
    bound = {s["name"] for b in by_kind(manifests, "RoleBinding").values() if b["roleRef"]["name"] == "sla-planner"
             for s in b["subjects"]}
    assert bound == {"sla-planner"}
    accounts = by_kind(manifests, "ServiceAccount")
    assert accounts["sla-planner-router"]["automountServiceAccountToken"] is False
    assert accounts["sla-planner-retrain"]["automountServiceAccountToken"] is False


# -- the work pool and prefect.yaml ------------------------------------------------------------


def test_the_work_pool_template_is_prefects_default_plus_what_the_flows_need(manifests):
    from prefect_kubernetes.worker import KubernetesWorker

    ours = json.loads((DEPLOY / "base" / "work-pool.json").read_text())
    default = KubernetesWorker.get_default_base_job_template()
    added = set(ours["variables"]["properties"]) - set(default["variables"]["properties"])
    assert added == {"config_map", "secret_name"}
    assert {k: v for k, v in ours["job_configuration"].items() if k != "job_manifest"} == {
        k: v for k, v in default["job_configuration"].items() if k != "job_manifest"}
    job, base_job = (t["job_configuration"]["job_manifest"]["spec"] for t in (ours, default))
    pod, base_pod = job["template"]["spec"], copy.deepcopy(base_job["template"]["spec"])
    # One fix: Prefect's default puts the Job's completions and parallelism in the pod spec, where the
    # API server drops them as unknown fields; ours has them in the Job spec.
    assert (job["completions"], job["parallelism"]) == (base_pod.pop("completions"), base_pod.pop("parallelism"))
    assert {k: v for k, v in pod.items() if k not in ("securityContext", "volumes", "containers")} == {
        k: v for k, v in base_pod.items() if k != "containers"}
    container, base_container = pod["containers"][0], base_pod["containers"][0]
    assert {k: v for k, v in container.items() if k not in ("envFrom", "volumeMounts", "securityContext")} == base_container
    # Every flow run: the config at /etc/sla-planner, the tokens in its environment, a writable /tmp only.
    for name, job in flow_run_jobs():
        dep = next(d for d in k8s_deployments() if d["name"] == name)
        spec = job["spec"]["template"]["spec"]
        (c,) = spec["containers"]
        assert c["securityContext"]["readOnlyRootFilesystem"] is True and spec["securityContext"]["runAsNonRoot"]
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        assert set(mounts) == {"/etc/sla-planner", "/tmp"}
        config_path = dep["parameters"].get("config_path")
        if config_path:
            assert config_path.startswith("/etc/sla-planner/")
            key = config_path.rsplit("/", 1)[1]
            assert key in by_kind(manifests, "ConfigMap")["sla-planner-config"]["data"], key


def test_kubernetes_deployments_match_the_overlay_and_the_image(manifests):
    overlay = yaml.safe_load((DEPLOY / OVERLAY / "kustomization.yaml").read_text())
    (image,) = overlay["images"]
    want_image = f"{image['newName']}:{image['newTag']}"
    deployments = k8s_deployments()
    assert {d["name"] for d in deployments} == {"planner-k8s", "retrain-k8s"}
    for dep in deployments:
        variables = dep["work_pool"]["job_variables"]
        assert variables["image"] == want_image, dep["name"]
        assert variables["namespace"] == overlay["namespace"], dep["name"]
        (pull,) = dep["pull"]
        assert pull["prefect.deployments.steps.set_working_directory"]["directory"] == "/app"
        entry = dep["entrypoint"].split(":")[0]
        assert (ROOT / entry).is_file() and f"COPY {entry.split('/')[0]} " in (ROOT / "Dockerfile").read_text()
    planner = next(d for d in deployments if d["name"] == "planner-k8s")
    retrain = next(d for d in deployments if d["name"] == "retrain-k8s")
    assert planner["work_pool"]["job_variables"]["service_account_name"] == "sla-planner"
    assert retrain["work_pool"]["job_variables"]["service_account_name"] == "sla-planner-retrain"
    router = by_kind(manifests, "Service")["sla-planner-router"]
    assert retrain["parameters"]["router_url"] == f"http://{router['metadata']['name']}:{router['spec']['ports'][0]['port']}"
    for doc in by_kind(manifests, "Deployment").values():
        for c in doc["spec"]["template"]["spec"]["containers"]:
            assert c["image"] == want_image or doc["metadata"]["name"] == "prefect-server", c["image"]
    # The schedule is the planner's adjustment interval.
    config = yaml.safe_load(by_kind(manifests, "ConfigMap")["sla-planner-config"]["data"]["planner.yaml"])
    assert planner["schedules"] == [{"interval": config["planner"]["adjustment_interval_s"]}]


def test_the_configmaps_configs_validate_and_name_files_the_image_holds(manifests, tmp_path):
    data = by_kind(manifests, "ConfigMap")["sla-planner-config"]["data"]
    planner_path = tmp_path / "planner.yaml"
    planner_path.write_text(data["planner.yaml"])
    config = load_run_config(planner_path)
    assert config.connector.kind == "kubernetes" and config.connector.auth == "in_cluster"
    router = RouterConfig.model_validate(yaml.safe_load(data["routing.yaml"]))
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "COPY data/profiles ./data/profiles" in dockerfile and "WORKDIR /app" in dockerfile
    for path in (str(config.planner.profile.dir), router.profile_dir):
        assert path.startswith("/app/data/profiles/"), path
        assert (ROOT / path.removeprefix("/app/")).is_dir(), path
    for path in (router.samples.path, router.models.dir):
        assert path.startswith("/var/lib/sla-planner/")  # the router's volume
    assert str(config.planner.predictor.cache_dir).startswith("/tmp/")  # the only writable place in a flow run


# -- the image ------------------------------------------------------------------------------


def test_the_dockerfile_copies_what_exists_and_runs_installed_commands(manifests):
    text = (ROOT / "Dockerfile").read_text()
    assert text.count("\nFROM ") + text.startswith("FROM ") >= 2, "multi-stage"
    final = text.rsplit("\nFROM ", 1)[1]
    assert re.search(r"^USER 10001", final, re.M) and "uv.lock" in text and "--frozen" in text
    assert not re.search(r"\buv\b|pip install|apt-get|gcc|build-essential", final), "a build tool in the final stage"
    ignored = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    copies = 0
    for line in text.splitlines():
        if line.startswith("COPY ") and "--from=" not in line:
            for source in line.split()[1:-1]:
                assert (ROOT / source).exists(), f"Dockerfile copies {source}, which does not exist"
                assert not any(source == i or source.startswith(i.rstrip("/") + "/") for i in ignored), (
                    f".dockerignore drops {source}, which the Dockerfile copies")
                copies += 1
    assert copies >= 12
    scripts = {ep.name for ep in importlib.metadata.entry_points(group="console_scripts")}
    commands = {c["command"][0] for _, t in pod_specs(manifests) for c in t["spec"]["containers"] if c.get("command")}
    commands.add(re.search(r'^CMD \["([^"]+)"', final, re.M)[1])
    assert "sla-planner" in commands and "prefect" in commands
    assert commands <= scripts, f"not installed console scripts: {commands - scripts}"


# -- RBAC, enforced --------------------------------------------------------------------------

NS, NAME = "dynamo", "vllm-disagg"


def decide(prefill: int, decode: int) -> Decision:
    return Decision(prefill_replicas=prefill, decode_replicas=decode, apply=True, reasons=())


def cycle(setup: str, role: dict) -> None:
    """The connector's whole cycle against a fresh cluster enforcing `role`: validate, read,
    scale up, the operator reconciles, read again, scale down after the stabilization window."""
    cluster = DynamoCluster(operator="v1alpha1" if setup == "v1alpha1" else "current", token=TEST_TOKEN).start()
    try:
        if setup == "v1alpha1":
            manifest = load_manifest(ROOT / "data" / "profiles" / "h200_llama8b_fp8_tp1" / "disagg.yaml")
            manifest["metadata"]["name"] = NAME
            cluster.create(manifest, namespace=NS)
        else:
            dgd = yaml.safe_load((CRD_DIR / "example-dgd-vllm-disagg-planner.v1beta1.yaml").read_text())
            dgd["metadata"]["name"] = NAME
            if setup == "no adapters":
                for comp in dgd["spec"]["components"]:
                    comp.pop("scalingAdapter", None)
            cluster.create_dgd(dgd, namespace=NS)
        cluster.reconcile(NS, NAME)
        cluster.enforce_role(role)
        conn = KubernetesConnector(KubernetesConnectorConfig(dgd_name=NAME, namespace=NS),
                                   api_client=kube_api_client(cluster))
        conn.validate()
        conn.read_fleet(now_s=T0_S)
        assert conn.apply(decide(3, 3), now_s=T0_S) is not None
        cluster.reconcile(NS, NAME)
        fleet = conn.read_fleet(now_s=T0_S + 60)
        assert (fleet.prefill.current_replicas, fleet.decode.current_replicas) == (3, 3)
        assert conn.last_decision_done(now_s=T0_S + 60)
        assert conn.apply(decide(1, 2), now_s=T0_S + 1000) is not None
        cluster.reconcile(NS, NAME)
        fleet = conn.read_fleet(now_s=T0_S + 1060)
        assert (fleet.prefill.current_replicas, fleet.decode.current_replicas) == (1, 2)
        if setup != "v1alpha1":
            assert {c["name"]: c.get("replicas") for c in cluster.stored(DGD, NS, NAME)["spec"]["components"]
                    if c["name"] in ("prefill", "decode")} == {"prefill": 1, "decode": 2}
    finally:
        cluster.stop()


SETUPS = ("adapters", "no adapters", "v1alpha1")


def passes_only_in_its_namespace(run_cycle, setups, role: dict) -> None:
    """Every setup's cycle passes under `role`; the enforcement is real: the same Role in another
    namespace refuses the first setup's cycle (403)."""
    for setup in setups:
        run_cycle(setup, role)
    elsewhere = copy.deepcopy(role)
    elsewhere["metadata"]["namespace"] = "other"
    with pytest.raises(ConnectorError, match="403"):
        run_cycle(setups[0], elsewhere)


@pytest.mark.integration
def test_the_connectors_whole_cycle_passes_under_the_shipped_role(manifests):
    passes_only_in_its_namespace(cycle, SETUPS, by_kind(manifests, "Role")["sla-planner"])


def roles_one_verb_short(role: dict):
    """(verb, its rule, the Role without that verb) for every verb the Role grants."""
    for i, rule in enumerate(role["rules"]):
        for verb in rule["verbs"]:
            smaller = copy.deepcopy(role)
            smaller["rules"][i]["verbs"].remove(verb)
            smaller["rules"] = [r for r in smaller["rules"] if r["verbs"]]
            yield verb, rule, smaller


def refused_setups(run_cycle, setups, role: dict, verb: str, *, first_only: bool = False) -> list[str]:
    """The setups whose cycle `role` refuses with a 403 naming `verb` (stop at the first with first_only)."""
    refused = []
    for setup in setups:
        try:
            run_cycle(setup, role)
        except ConnectorError as exc:
            assert "403" in str(exc) and verb in str(exc), exc
            refused.append(setup)
            if first_only:
                break
    return refused


@pytest.mark.integration
def test_taking_any_verb_away_from_the_role_breaks_the_cycle(manifests):
    for verb, rule, smaller in roles_one_verb_short(by_kind(manifests, "Role")["sla-planner"]):
        assert refused_setups(cycle, SETUPS, smaller, verb), \
            f"the cycle passed without {verb} on {rule['resources']}: the Role grants more than it uses"
