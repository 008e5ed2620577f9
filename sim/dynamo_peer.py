"""NVIDIA Dynamo's own classic SLA planner, driven by the simulator: a benchmark-only peer.

Needs the optional extra, never a runtime dependency:

    uv pip install --no-deps --target /some/dir ai-dynamo==1.0.2 ai-dynamo-runtime==1.0.2
    PYTHONPATH=/some/dir sla-planner what-if ... --policy dynamo-peer

(pmdarima, filterpy, prophet, scikit-learn, scipy and pandas are already ours.)

Each interval does what Dynamo's throughput loop does in dry-run mode: feed the
interval's request count and mean ISL/OSL to its load predictors, predict the next
interval, size each pool with `PrefillPlanner._compute_replica_requirements` /
`DecodePlanner._compute_replica_requirements`, and apply its global GPU budget.
Dynamo's own defaults are kept (ARIMA predictor, no correction factors, min 1
endpoint); the budget is set to the what-if's max replicas per pool so it never binds
differently from ours.
"""

from __future__ import annotations

import logging
import math

from planner.config import PlannerConfig
from planner.latency.profile import EngineProfile
from planner.sizing.pools import engine_gpus, resolve_engine_gpus
from planner.types import Observation
from sim.replay import PolicyInput, PolicyOutput
from sim.warm_start import warm_start_fleet


class DynamoPeerPolicy:
    """Dynamo 1.0.2's PrefillPlanner/DecodePlanner (dryrun) as a simulator policy."""

    def __init__(self, cfg: PlannerConfig, profile: EngineProfile, *, load_predictor: str = "arima"):
        from dynamo.planner.utils.decode_planner import DecodePlanner
        from dynamo.planner.utils.planner_config import PlannerConfig as DynamoPlannerConfig
        from dynamo.planner.utils.planner_core import PlannerSharedState, _apply_global_gpu_budget
        from dynamo.planner.utils.prefill_planner import PrefillPlanner

        if cfg.profile.dir is None:
            raise ValueError("dynamo-peer: needs a profiler output folder (profile.dir), not a pre-swept row")
        # Dynamo logs every prediction at INFO; the simulator calls it thousands of times.
        logging.getLogger("dynamo").setLevel(logging.WARNING)
        self.name = "dynamo-peer"
        self.cfg = cfg
        self.profile = profile
        self.stabilization_window_s = 0.0
        b = cfg.decision
        sizing = resolve_engine_gpus(cfg.sizing, prefill=profile.gpus_per_prefill_engine,
                                     decode=profile.gpus_per_decode_engine)
        gpus_p, gpus_d = engine_gpus(sizing, "prefill"), engine_gpus(sizing, "decode")
        self._dcfg = DynamoPlannerConfig(
            environment="virtual",
            mode="disagg",
            no_operation=True,
            throughput_adjustment_interval=int(round(cfg.adjustment_interval_s)),
            profile_results_dir=str(cfg.profile.dir),
            ttft=cfg.slo.ttft_ms,
            itl=cfg.slo.itl_ms,
            load_predictor=load_predictor,
            prefill_engine_num_gpu=gpus_p,
            decode_engine_num_gpu=gpus_d,
            max_gpu_budget=b.prefill.max_replicas * gpus_p + b.decode.max_replicas * gpus_d,
            min_endpoint=1,
            metric_reporting_prometheus_port=0,
        )
        shared = PlannerSharedState()
        self._prefill = PrefillPlanner(None, self._dcfg, dryrun=True, shared_state=shared, start_prometheus_server=False)
        self._decode = DecodePlanner(None, self._dcfg, dryrun=True, shared_state=shared, start_prometheus_server=False)
        self._budget = _apply_global_gpu_budget
        self._last_osl: float | None = None

    def initial_fleet(self, first: Observation) -> tuple[int, int]:
        return warm_start_fleet(self.cfg, self.profile, first)

    def decide(self, step: PolicyInput) -> PolicyOutput:
        obs = step.observation
        osl = obs.avg_osl_tokens if obs.avg_osl_tokens is not None else self._last_osl
        if obs.num_requests is None or obs.avg_isl_tokens is None or osl is None:
            return PolicyOutput(None, None, "dynamo-peer: no traffic this interval, no adjustment")
        self._last_osl = osl
        for planner in (self._prefill, self._decode):
            planner.dryrun_observe_traffic_stats(obs.num_requests, obs.avg_isl_tokens, osl)
        req, isl, out = self._prefill.predict_load()
        if req is None or not all(math.isfinite(x) for x in (req, isl, out)):
            return PolicyOutput(None, None, "dynamo-peer: load predictor failed, no adjustment")
        p = self._prefill._compute_replica_requirements(req, isl, out)
        d = self._decode._compute_replica_requirements(req, isl, out)
        p, d = self._budget(p, d, self._dcfg)
        if p < 1 or d < 1:
            return PolicyOutput(None, None, f"dynamo-peer: budget gave {p}x{d}, no adjustment")
        return PolicyOutput(p, d, f"dynamo-peer: predicted {req:.0f} requests, ISL {isl:.0f}, OSL {out:.0f} -> {p}x{d}")
