"""Commands the docs give a newcomer, run as written against the real components they name."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import httpx
import yaml
from etcd3gw.client import Etcd3Client

from connectors.config import VirtualConnectorConfig
from connectors.virtual import VirtualConnector
from planner.types import Decision

ROOT = Path(__file__).resolve().parents[2]
T0_S = 1_700_000_000.0


def test_the_stack_docs_etcd_query_reads_the_keys_the_planner_writes(etcd):
    """docs/stack.md's etcd query (JSON gateway and etcdctl) covers the virtual connector's decision keys."""
    text = (ROOT / "docs" / "stack.md").read_text()
    body = re.search(r"/v3/kv/range -d '(\{[^']*\})'", text).group(1)
    etcdctl_prefix = re.search(r"etcdctl get --prefix (\S+?)`", text).group(1)
    # The stack's planner runs in the shipped config's namespace.
    namespace = yaml.safe_load((ROOT / "configs" / "planner.yaml").read_text())["planner"]["namespace"]
    conn = VirtualConnector(VirtualConnectorConfig(etcd_url=etcd.url, namespace=namespace))
    conn.apply(Decision(prefill_replicas=2, decode_replicas=3, apply=True, reasons=()), now_s=T0_S)
    try:
        answer = httpx.post(f"{etcd.url}/v3/kv/range", content=body, timeout=5).json()
        keys = {base64.b64decode(kv["key"]).decode(): base64.b64decode(kv["value"]).decode()
                for kv in answer.get("kvs", [])}
        assert {k.rsplit("/", 1)[1]: v for k, v in keys.items()} == {
            "num_prefill_workers": "2", "num_decode_workers": "3", "decision_id": "0"}, keys
        assert all(k.startswith(etcdctl_prefix) for k in keys), (etcdctl_prefix, keys)
    finally:
        client = Etcd3Client(host="127.0.0.1", port=etcd.client_port, timeout=5)
        for prefix in (f"v1/{namespace}/planner/", f"sla-planner/{namespace}/planner/"):
            client.delete_prefix(prefix)


def test_the_shipped_routing_config_routes_endpoints_registered_without_a_zone():
    """configs/routing.yaml as shipped, engines registered as docs/routing.md shows them: the route answers 200."""
    from planner_cli.router import load_router_config
    from routing.http.app import create_app
    from tests.support.fixtures_routing import RunningServer

    shipped = ROOT / "configs" / "routing.yaml"
    profile_dir = ROOT / yaml.safe_load(shipped.read_text())["profile_dir"]  # relative to the project root
    cfg = load_router_config(str(shipped), profile_dir=str(profile_dir))
    app = create_app(cfg, token="admin-token-for-the-test", data_token="data-token-for-the-test")
    admin = {"Authorization": "Bearer admin-token-for-the-test"}
    data = {"Authorization": "Bearer data-token-for-the-test"}
    with RunningServer(app) as server, httpx.Client(base_url=server.url, timeout=10) as client:
        for endpoint_id, role in (("p0", "prefill"), ("d0", "decode")):
            answer = client.put(f"/v1/endpoints/{endpoint_id}", headers=admin,
                                json={"role": role, "url": "http://10.0.0.5:8000"})
            assert answer.status_code in (200, 201), answer.text
        answer = client.post("/v1/route", headers=data, json={
            "request_id": "r1", "input_tokens": 500, "slo": {"ttft_ms": 200, "itl_ms": 10}, "critical": True})
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert (body["outcome"], body["prefill"]["endpoint_id"], body["decode"]["endpoint_id"]) == ("routed", "p0", "d0")


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors for a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    out = set()
    in_code = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and (m := re.match(r"#{1,6} (.+)", line)):
            out.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return out


def test_every_link_in_the_readme_and_docs_resolves():
    """Each relative link names a file of the clone and, with #anchor, a heading of that file."""
    broken = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for n, line in enumerate(page.read_text().splitlines(), 1):
            for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]+))?\)", line):
                if "://" in target:
                    continue
                path = (page.parent / target).resolve() if target else page
                if not path.exists() or (anchor and path.suffix == ".md" and anchor not in _anchors(path)):
                    broken.append(f"{page.relative_to(ROOT)}:{n}: {target}#{anchor}")
    assert broken == []


def test_the_readme_is_a_front_door():
    """Short, the tests' command exactly as CI runs it, and a way to every page of docs/."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    ci = (ROOT / ".ci" / "run").read_text().splitlines()[-1]
    assert ci == "exec bash scripts/test.sh" and "\nbash scripts/test.sh\n" in readme
    unlinked = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if f"](docs/{p.name}" not in readme]
    assert unlinked == [], "docs pages the README does not link"
