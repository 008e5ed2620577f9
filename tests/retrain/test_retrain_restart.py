"""Training samples survive a routing-service restart, and the retrain flow trains on them.

A real `sla-planner router` process with `samples.path` set records the
simulated fleet's requests (lifecycle calls over HTTP); it is stopped
(SIGTERM, as Kubernetes stops a pod) and a new process starts on the same
config. The new one serves the same samples, with the same sequence numbers,
and the retrain flow (Prefect test harness) fetches and trains on them.
"""

from __future__ import annotations

import os

import pytest

from flows.retrain import retrain_flow
from routing.training.config import TrainingConfig
from tests.support.fixtures_prefect import prefect_harness  # noqa: F401 - session fixture
from tests.support.fixtures_retrain import (
    ROUTER_PROFILE,
    TOKEN,
    TOKEN_ENV,
    feed_simulated_requests,
    router_process,
    simulated_requests,
)

pytestmark = [pytest.mark.integration]

# 60 s of the Azure conversation trace x2 from minute 5: ~500 requests, ~1000 samples.
SIM = dict(window_s=60.0, start_s=300.0, load_multiplier=2.0)
TRAINING = TrainingConfig(min_train_samples=200, min_holdout_samples=50, max_iter=40, n_iter_no_change=10)


def all_samples(router) -> list[dict]:
    out, after = [], 0
    with router.client() as c:
        while True:
            page = c.get("/v1/samples", params={"after_seq": after, "limit": 1000}).json()
            out += page["samples"]
            after = page["next_after_seq"]
            if not page["has_more"]:
                return out


@pytest.fixture
def token_env(monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    return TOKEN_ENV


def test_samples_survive_a_restart_and_the_retrain_flow_reads_them(tmp_path, token_env, prefect_harness):  # noqa: F811
    samples_file = tmp_path / "data" / "samples.sqlite3"
    extra = f"samples: {{capacity: 100000, path: {samples_file}}}\n"
    with router_process(tmp_path, extra_yaml=extra) as first:
        n = feed_simulated_requests(first, simulated_requests(**SIM))
        assert n > 400, f"only {n} simulated requests"
        before = all_samples(first)
        stats_before = _stats(first)
    # router_process stopped the first service with SIGTERM; its last batch is in the file.
    assert samples_file.exists() and len(before) >= 2 * n - 50  # a TTFT and (mostly) a TPOT per request
    with router_process(tmp_path, extra_yaml=extra) as second:
        after = all_samples(second)
        assert after == before  # same seqs, features, latencies, timestamps
        stats_after = _stats(second)
        assert {k: stats_after[k] for k in ("stored", "added_total", "last_seq")} == \
               {k: stats_before[k] for k in ("stored", "added_total", "last_seq")}
        result = retrain_flow(router_url=second.url, profile_dir=str(ROUTER_PROFILE), token_env=TOKEN_ENV,
                              training=TRAINING)
        assert result["decision"] == "publish", result["reason"]
        ttft = sum(1 for s in before if s["target"] == "ttft")
        tpot = len(before) - ttft
        assert result["samples"] == {"ttft": ttft, "tpot": tpot}  # every pre-restart sample was usable
        # New samples continue the sequence after the restart (endpoints register again: they are not persisted).
        with second.client() as admin:
            for eid, role in (("prefill-0", "prefill"), ("decode-0", "decode")):
                admin.put(f"/v1/endpoints/{eid}", json={"role": role}).raise_for_status()
        with second.client(admin=False) as c:
            c.post("/v1/requests/post-restart/dispatched", json={
                "prefill_endpoint_id": "prefill-0", "decode_endpoint_id": "decode-0", "input_tokens": 500,
            }).raise_for_status()
            c.post("/v1/requests/post-restart/first_token", json={"observed_ttft_ms": 40.0}).raise_for_status()
        newest = all_samples(second)[-1]
        assert newest["request_id"] == "post-restart" and newest["seq"] == stats_before["last_seq"] + 1
    assert os.path.getsize(samples_file) > 0


def _stats(router) -> dict:
    with router.client() as c:
        return c.get("/v1/samples", params={"limit": 1}).json()["stats"]
