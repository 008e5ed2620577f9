"""Shared helpers for the routing tests: real profile, hand-checkable models, a live server.

`linear_document` builds a real published-model document (linear kind) whose
predictions are easy to compute by hand, so picker tests can state expected
headrooms next to each case. `RunningServer` runs the FastAPI app under
uvicorn on 127.0.0.1 on a free port in a background thread.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import uvicorn

from connectors.profiles import load_profile_dir
from routing.config import PickerConfig
from routing.features import FEATURES
from routing.fleet.requests import InFlight
from routing.training.export import model_document
from routing.models.store import ModelStore
from routing.picking.picker import Picker
from routing.models.predictor import LatencyPredictor, ProfileEstimator
from routing.fleet.registry import Endpoint, EndpointRegistry

PROJECT_ROOT = Path(__file__).resolve().parents[2]
PROFILE_DIR = PROJECT_ROOT.parent / "shared" / "data" / "profiles" / "dynamo" / "profiler" / "H200_TP1P_TP1D"
TOKEN = "test-admin-token-0123456789"


def h200_profile():
    if not (PROFILE_DIR / "selected_prefill_interpolation" / "raw_data.npz").is_file():
        pytest.fail(f"profile data not found at {PROFILE_DIR}: tests need ../shared/data beside the project")
    return load_profile_dir(PROFILE_DIR)


def linear(target: str, intercept: float, **coefs: float) -> dict:
    """A linear REG dict: intercept + sum(coef * feature) over named features."""
    names = FEATURES[target]
    unknown = set(coefs) - set(names)
    assert not unknown, unknown
    return {"kind": "linear", "link": "identity", "intercept": intercept,
            "coef": [float(coefs.get(n, 0.0)) for n in names]}


def linear_document(version: str = "lin-1", *, ttft: dict | None = None, tpot: dict | None = None) -> dict:
    """Default: TTFT = 50 + 0.01*prefill_tokens_in_flight + 0.01*input_tokens ms;
    TPOT = 5 + 1*running_requests ms."""
    ttft = ttft or linear("ttft", 50.0, prefill_tokens_in_flight=0.01, input_tokens=0.01)
    tpot = tpot or linear("tpot", 5.0, running_requests=1.0)
    return model_document(version=version, ttft_mean=ttft, tpot_mean=tpot, metrics={"ttft_mape": 0.05})


def predictor_with(document: dict | None, profile=None) -> LatencyPredictor:
    store = ModelStore()
    if document is not None:
        store.publish(document, now_s=0.0)
    return LatencyPredictor(estimate=ProfileEstimator(profile or h200_profile()), models=store, quantile="mean")


def picker(config: dict | None = None, *, document: dict | None = None, seed: int = 0, profile=None) -> Picker:
    cfg = PickerConfig.model_validate(config or {})
    doc = linear_document() if document is None else document
    return Picker(cfg, predictor_with(doc, profile), rng=seed)


def fleet(*specs: tuple, levels=("zone", "rack", "host"), max_kv_tokens: int = 100_000) -> EndpointRegistry:
    """Registry from (id, role[, {level: value}]) tuples."""
    reg = EndpointRegistry(default_max_kv_tokens=max_kv_tokens, levels=levels)
    for spec in specs:
        eid, role = spec[0], spec[1]
        domains = spec[2] if len(spec) > 2 else {}
        reg.register(Endpoint(id=eid, role=role, domains=domains))
    return reg


def occupy(reg: EndpointRegistry, endpoint_id: str, *, request_id: str, input_tokens: int = 1000,
           ttft_ms: float = np.inf, itl_ms: float = np.inf, now_s: float = 0.0) -> None:
    """Put an in-flight request on one endpoint (through the registry's real lifecycle path)."""
    role = reg.get(endpoint_id).role
    reg.dispatched(InFlight(
        request_id=request_id,
        prefill_id=endpoint_id if role == "prefill" else None,
        decode_id=endpoint_id if role != "prefill" else None,
        input_tokens=input_tokens, uncached_tokens=float(input_tokens),
        ttft_ms=ttft_ms, itl_ms=itl_ms, critical=False, dispatched_s=now_s,
    ))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RunningServer:
    """uvicorn serving `app` on 127.0.0.1:<free port> in a daemon thread."""

    def __init__(self, app):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", access_log=False,
                                lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> "RunningServer":
        self.thread.start()
        deadline = time.monotonic() + 15
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"uvicorn did not start on port {self.port}")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def trained_document(version: str, *, seed: int = 0, scale: float = 1.0, n: int = 1500) -> dict:
    """A small real HistGradientBoosting model pair exported to the safe format.

    Trained on synthetic rows where TTFT grows with prefill tokens in flight and
    TPOT with running requests; `scale` multiplies the targets so two versions
    predict observably different latencies.
    """
    from sklearn.ensemble import HistGradientBoostingRegressor
    from threadpoolctl import threadpool_limits

    from routing.training.export import export_hist_gradient_boosting

    rng = np.random.default_rng(seed)
    x = np.zeros((n, len(FEATURES["tpot"])))
    x[:, 0] = rng.uniform(10, 8000, n)  # input_tokens
    x[:, 2] = rng.uniform(0, 1, n)  # kv_usage_frac
    x[:, 4] = rng.integers(0, 64, n)  # running_requests
    x[:, 5] = rng.uniform(0, 50_000, n)  # prefill_tokens_in_flight
    x[rng.random(n) < 0.5, 7] = 1.0
    x[x[:, 7] == 0, 8] = 1.0
    ttft = scale * (20 + 0.02 * x[:, 0] + 0.004 * x[:, 5]) + rng.normal(0, 1, n)
    tpot = scale * (4 + 0.2 * x[:, 4] + 10 * x[:, 2]) + rng.normal(0, 0.1, n)
    kw = dict(max_iter=20, max_depth=5, random_state=seed)
    with threadpool_limits(1):  # the machine is shared: no OpenMP oversubscription
        m_ttft = HistGradientBoostingRegressor(**kw).fit(x[:, :10], ttft)
        m_tpot = HistGradientBoostingRegressor(**kw).fit(x, tpot)
        q_ttft = HistGradientBoostingRegressor(loss="quantile", quantile=0.9, **kw).fit(x[:, :10], ttft)
    return model_document(
        version=version,
        ttft_mean=export_hist_gradient_boosting(m_ttft),
        ttft_p90=export_hist_gradient_boosting(q_ttft),
        tpot_mean=export_hist_gradient_boosting(m_tpot),
        metrics={"ttft_mape": 0.03, "tpot_mape": 0.02},
        created_at_s=1.7e9,
    )
