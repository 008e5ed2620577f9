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

ROOT = Path(__file__).resolve().parents[1]
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
