"""The whole local stack (`sla-planner stack up`) on free ports in a temp folder.

`local_stack(...)` runs the same `planner_cli.stack.up` a user runs, with
short intervals, and always tears it down with `stack_processes.down`, then checks
that no process carrying the stack's marker is left. `RunningStack` reads
what the tests assert on through the components' own APIs: Prefect's REST
API (flow runs, artifacts), etcd's gateway (the planner keys and their
revision history), the routing service, Prometheus and the fleet's /status.
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from planner_cli import stack, stack_components, stack_processes
from tests.support.fixtures_net import free_port


@dataclass
class Decision:
    """One decision as etcd recorded it (all keys are written in one transaction)."""

    decision_id: int
    prefill: int
    decode: int
    decided_at_s: float
    revision: int


class RunningStack:
    def __init__(self, opts: stack_components.StackOptions, state: dict):
        self.opts = opts
        self.state = state
        self.state_dir = opts.state_dir
        self.urls = state["urls"]
        self.namespace = state["namespace"]
        self.token = stack_processes.read_token(opts.state_dir)
        self.data_token = stack_processes.read_data_token(opts.state_dir)

    # -- HTTP ------------------------------------------------------------------

    def http(self, method: str, url: str, body: dict | None = None, *, headers: dict | None = None,
             timeout_s: float = 30.0):
        req = urllib.request.Request(url, method=method, data=None if body is None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", **(headers or {})})
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return json.loads(resp.read() or b"null")

    def prefect(self, method: str, path: str, body: dict | None = None, *, attempts: int = 5):
        """A Prefect API call, retried on 503 (the server's answer while its SQLite database is
        locked by a busy moment), as Prefect's own client does. A POST that creates something
        must carry an idempotency key so a retry cannot create it twice."""
        for attempt in range(attempts):
            try:
                return self.http(method, self.urls["prefect_api"] + path, body)
            except urllib.error.HTTPError as exc:
                if exc.code != 503 or attempt == attempts - 1:
                    raise
                time.sleep(1.0 + attempt)

    def router(self, method: str, path: str, body: dict | None = None, *, admin: bool = False):
        headers = {"Authorization": f"Bearer {self.token if admin else self.data_token}"}
        return self.http(method, self.urls["router"] + path, body, headers=headers)

    def fleet(self) -> dict:
        return self.http("GET", self.urls["fleet"] + "/status")

    def prom(self, promql: str) -> list[dict]:
        from urllib.parse import urlencode

        data = self.http("GET", self.urls["prometheus"] + "/api/v1/query?" + urlencode({"query": promql}))
        return data["data"]["result"]

    # -- Prefect ---------------------------------------------------------------

    def deployment_id(self, name: str) -> str:
        """The id of the prefect.yaml deployment called `name` (whatever its flow is called)."""
        found = self.prefect("POST", "/deployments/filter", {"deployments": {"name": {"any_": [name]}}})
        if len(found) != 1:
            raise LookupError(f"expected one deployment named {name!r}, found {[d['name'] for d in found]}")
        return found[0]["id"]

    def flow_runs(self, deployment: str = "planner") -> list[dict]:
        return self.prefect("POST", "/flow_runs/filter", {
            "limit": 200, "sort": "EXPECTED_START_TIME_ASC",
            "deployments": {"id": {"any_": [self.deployment_id(deployment)]}},
        })

    def runs_in(self, *states: str, deployment: str = "planner") -> list[dict]:
        return [r for r in self.flow_runs(deployment) if r["state_type"] in states]

    def artifacts(self, flow_run_id: str) -> list[dict]:
        return self.prefect("POST", "/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [flow_run_id]}}})

    def decision_table(self, flow_run_id: str) -> dict[str, str] | None:
        """item -> value of the run's decision table artifact (None when it has none)."""
        for a in self.artifacts(flow_run_id):
            if a["key"] == f"sla-planner-decision-{self.namespace}":
                rows = json.loads(a["data"]) if isinstance(a["data"], str) else a["data"]
                return {r["item"]: r["value"] for r in rows}
        return None

    def applied_decision_id(self, flow_run_id: str) -> int | None:
        """The decision id a run's artifact says it wrote (None: nothing written)."""
        table = self.decision_table(flow_run_id)
        match = re.fullmatch(r"decision (\d+)", (table or {}).get("result", ""))
        return int(match.group(1)) if match else None

    # -- etcd ------------------------------------------------------------------

    def _etcd_range(self, key: str, revision: int | None = None) -> dict | None:
        body = {"key": base64.b64encode(key.encode()).decode()}
        if revision is not None:
            body["revision"] = str(revision)
        kvs = self.http("POST", self.urls["etcd"] + "/v3/kv/range", body).get("kvs") or []
        return kvs[0] if kvs else None

    def etcd_history(self, name: str) -> list[tuple[int, str]]:
        """Every value the virtual connector's key <name> has held, oldest first, with its revision
        (decision keys under v1/{namespace}/planner/, the planner's bookkeeping under sla-planner/...)."""
        bookkeeping = name in ("decided_at_s", "recent_targets", "recommendations")
        key = f"{'sla-planner/' if bookkeeping else 'v1/'}{self.namespace}/planner/{name}"
        out = []
        kv = self._etcd_range(key)
        while kv is not None:
            rev = int(kv["mod_revision"])
            out.append((rev, base64.b64decode(kv["value"]).decode()))
            kv = self._etcd_range(key, revision=rev - 1) if rev > 1 else None
        return out[::-1]

    def decisions(self) -> list[Decision]:
        """Every decision written, oldest first, from the keys' revision history."""
        by_rev = {name: dict(self.etcd_history(name))
                  for name in ("decision_id", "num_prefill_workers", "num_decode_workers", "decided_at_s")}
        out = []
        for rev, value in sorted(by_rev["decision_id"].items()):
            out.append(Decision(int(value), int(by_rev["num_prefill_workers"][rev]),
                                int(by_rev["num_decode_workers"][rev]),
                                float(json.loads(by_rev["decided_at_s"][rev])["t_s"]), rev))
        return out

    def confirmations(self) -> list[tuple[int, int]]:
        """(revision, scaled_decision_id) for every confirmation the fleet wrote, oldest first."""
        return [(rev, int(v)) for rev, v in self.etcd_history("scaled_decision_id")]

    # -- components and waiting ------------------------------------------------

    def stop(self, name: str, **kw) -> None:
        stack_processes.stop_component(self.state_dir, name, **kw)

    def start(self, name: str) -> None:
        stack_processes.start_component(self.state_dir, name, timeout_s=self.opts.start_timeout_s)

    def wait_for(self, predicate, *, timeout_s: float, what: str, poll_s: float = 1.0):
        deadline = time.monotonic() + timeout_s
        last = None
        while time.monotonic() < deadline:
            try:
                last = predicate()
            except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
                last = f"{type(exc).__name__}: {exc}"
            else:
                if last:
                    return last
            time.sleep(poll_s)
        raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}; last: {last!r}"
                             f"{self.diagnostics()}")

    def diagnostics(self) -> str:
        """Log tails and the fleet status, for failure messages."""
        parts = []
        for path in sorted((Path(self.state_dir) / "logs").glob("*.log")):
            lines = path.read_text(errors="replace").splitlines()[-25:]
            parts.append(f"\n--- {path.name} ---\n" + "\n".join(lines))
        with contextlib.suppress(Exception):
            parts.append("\n--- fleet /status ---\n" + json.dumps(self.fleet())[:3000])
        return "".join(parts)


def stack_options(base_dir: Path, **overrides) -> stack_components.StackOptions:
    """Options for a test stack: free ports, temp state, fast scrapes; overrides on top."""
    values = dict(
        state_dir=str(base_dir / "stack"),
        prefect_port=free_port(), prometheus_port=free_port(), pushgateway_port=free_port(), etcd_port=free_port(),
        etcd_peer_port=free_port(), router_port=free_port(), fleet_port=free_port(),
        scrape_interval_s=1.0, start_timeout_s=240.0,
    )
    values.update(overrides)
    return stack_components.StackOptions(**values)


class FleetRecords:
    """What an executor-driven fleet (--fleet dynamo or vllm) leaves beside RunningStack: the executor's events
    and the load generator's records."""

    def __init__(self, stack):
        self.stack = stack
        self.dir = Path(stack.state_dir)

    def events(self, kind: str | None = None) -> list[dict]:
        path = self.dir / "executor" / "events.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
        return [r for r in rows if kind is None or r["event"] == kind]

    def loadgen(self) -> dict:
        path = self.dir / "loadgen" / "summary.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def requests(self) -> list[dict]:
        path = self.dir / "loadgen" / "requests.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@contextlib.contextmanager
def local_stack(base_dir: Path, **overrides):
    """`stack up` for a test; `stack down` afterwards, failing if any process is left."""
    opts = stack_options(base_dir, **overrides)
    state = stack.up(opts, log=lambda line: print(line, flush=True))
    running = RunningStack(opts, state)
    try:
        yield running
    finally:
        stack_processes.down(opts.state_dir, log=lambda line: print(line, flush=True))
        left = stack_processes.marked_processes(state["marker"])
        assert not left, f"processes left after `stack down`: {left}"


def assert_rise_and_fall(decisions: list[Decision], *, rise_s: float, fall_s: float, interval_s: float,
                         diagnostics: str = "") -> None:
    """A scale-up above 1+1 workers during the rise (one interval's grace) and a scale-down from the peak after it."""
    assert decisions, f"no decision was written{diagnostics}"
    ups = [d for d in decisions if rise_s < d.decided_at_s <= fall_s + interval_s and d.prefill + d.decode > 2]
    assert ups, f"no scale-up above 1+1 workers in [{rise_s:.0f}, {fall_s + interval_s:.0f}]: {decisions}"
    peak = max(decisions, key=lambda d: d.prefill + d.decode)
    downs = [d for d in decisions if d.decided_at_s > max(fall_s, peak.decided_at_s)
             and d.prefill + d.decode < peak.prefill + peak.decode]
    assert downs, f"no scale-down after the fall at {fall_s:.0f} from the peak {peak}: {decisions}"
