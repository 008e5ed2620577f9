"""The stack's vLLM fleet (`sla-planner stack up --fleet vllm`): real vLLM 0.32 engines on CPU.

The planner sizes with the engine's own profile (data/profiles/cpu_vllm032_tiny, measured by
benchmarks/profile_vllm_cpu.py) against targets that suit it (SLO), not the H200 profile and
targets of configs/planner.yaml.

In place of the simulated fleet, three components:

- `executor`: the fleet executor (`python -m executor`, in Dynamo's environment for
  its VirtualConnectorClient): follows the planner's decisions in the stack's etcd,
  starts and drains real vLLM engines (the CPU build, `.venv-vllm`, installed on
  first use by scripts/install_vllm.sh) in one aggregated pool, as many as the larger
  of a decision's prefill and decode counts; registers each serving engine with the
  routing service and takes a draining one out of routing before its SIGTERM; writes
  their metrics endpoints for Prometheus' file_sd (label role="aggregated");
- `gateway`: the front door (`python -m executor.gateway`): OpenAI requests routed by
  the routing service, proxied to the picked engine, their first tokens and
  completions reported back (the router's training samples);
- `loadgen`: the load generator replaying the trace against the gateway.

The planner reads arrivals from the router's route calls (metrics source vllm-router:
there is no EPP or Dynamo frontend here) and tokens, latencies, KV usage and queue
from the engines' own vllm:* series. The model is a tiny Qwen2 with random weights:
its config.json is read from the llm-d kit (`--vllm-model-config`, default
../shared/llmd/vllm/tiny-model-config.json beside the project), its tokenizer is the
stack's (stack/dynamo/tokenizer). Each engine takes ~3 GB and about half a minute to
two minutes to start on two cores: `--max-workers` (default 2) bounds the pool.
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from planner_cli.stack_dynamo import (
    clamp_pool_limits,
    dynamo_python,
    fresh_worker_targets,
    installed_python,
    write_loadgen_config,
)

PROJECT_ROOT = Path(__file__).resolve().parents[1]
INSTALL_SCRIPT = PROJECT_ROOT / "scripts" / "install_vllm.sh"
DEFAULT_MODEL_CONFIG = PROJECT_ROOT.parent / "shared" / "llmd" / "vllm" / "tiny-model-config.json"
MODEL_NAME = "tiny"
# The engine's own profile (benchmarks/profile_vllm_cpu.py on this 2-core machine) and targets that suit it:
# the tiny model prefills 512 tokens in ~16 ms and decodes at 2-3 ms a token alone, 16-45 ms at 64 requests;
# on a machine shared with other jobs the planner measures ITLs 2-3x the profile's (its correction factor).
PROFILE_DIR = PROJECT_ROOT / "data" / "profiles" / "cpu_vllm032_tiny"
SLO = {"ttft_ms": 1000.0, "itl_ms": 20.0}
# Each engine runs at most this many requests at once (vLLM's --max-num-seqs; its own default is 256): past what
# it batches, requests wait in its queue (vllm:num_requests_waiting) at a load this machine can generate, and
# the saturation guardrail, which reads that gauge, asks for another engine.
MAX_NUM_SEQS = 2
STARTUP_S = 60.0  # an engine serves 30-120 s after it is started on two busy cores
COMPONENTS = ("executor", "gateway", "loadgen")
ENGINE_JOB = "vllm-engines"


def vllm_python(*, timeout_s: float = 1800.0) -> str:
    """The vLLM environment's python, installing it first when missing or stale."""
    return installed_python(INSTALL_SCRIPT, timeout_s=timeout_s)


def planner_overrides(data: dict, *, namespace: str, max_workers: int) -> None:
    """Point a planner config (as a dict) at the vLLM fleet: the router's arrivals, the engines' vllm:* series.

    The source's queries replace the file's (dumped with the Dynamo frontend's defaults); the engines'
    scrape labels them role="aggregated", which counts each engine in both pools.
    """
    metrics = data.setdefault("metrics", {})
    metrics.pop("queries", None)
    metrics.update({
        "source": "vllm-router",
        "frontend_selector": 'job="router"',
        "worker_selector": f'job="{ENGINE_JOB}"',
        "frontend_targets_selector": 'job="router"',
        "pools": {"by": "label", "pool_label": "role", "pod_label": "instance",
                  "aggregated_label_values": ["aggregated"]},
    })
    data["connector"]["namespace"] = namespace
    planner = data["planner"]
    planner["profile"] = {"dir": str(PROFILE_DIR)}
    planner["slo"] = dict(SLO)
    planner.setdefault("sizing", {})["replica_startup_s"] = STARTUP_S
    clamp_pool_limits(planner, max_workers=max_workers)


def write_executor_config(opts, state_dir: Path, *, namespace: str, python: str) -> Path:
    from executor.fleets import tiny_model_dir, vllm_fleet

    model = tiny_model_dir(state_dir / "vllm-model", config_path=opts.vllm_model_config or DEFAULT_MODEL_CONFIG)
    cfg = vllm_fleet(
        namespace=namespace, etcd_url=opts.urls()["etcd"], state_dir=state_dir / "executor", vllm_python=python,
        model_dir=model, model_name=MODEL_NAME, port_base=opts.worker_port_base, router_url=opts.urls()["router"],
        drain_timeout_s=120.0, register_timeout_s=300.0, extra_args=["--max-num-seqs", str(opts.vllm_max_num_seqs)],
    )
    path = state_dir / "executor.yaml"
    path.write_text("# Generated by `sla-planner stack up --fleet vllm`.\n"
                    + yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    return path


def router_overrides(data: dict) -> None:
    """The engines' profile; the router scrapes each engine's /metrics every second (KV usage, waiting and
    running requests)."""
    data["profile_dir"] = str(PROFILE_DIR)
    data.setdefault("scrape", {})["interval_s"] = 1.0


def prometheus_jobs(opts, state_dir: Path) -> str:
    """Scrape job for the engines (file_sd, kept current by the executor) and the gateway."""
    targets = state_dir / "executor" / "targets.json"
    return (
        f"  - job_name: {ENGINE_JOB}\n"
        f"    file_sd_configs: [{{files: ['{targets}'], refresh_interval: 2s}}]\n"
    )


def components(opts, state_dir: Path, *, namespace: str, slo, component_cls) -> list:
    """The executor, gateway and load generator as stack Components."""
    executor_cfg = write_executor_config(opts, state_dir, namespace=namespace, python=vllm_python())
    loadgen_cfg = write_loadgen_config(opts, state_dir, model=MODEL_NAME, context_tokens=4096)
    fresh_worker_targets(state_dir)
    env = {"ETCD_ENDPOINTS": opts.urls()["etcd"], "PYTHONPATH": str(PROJECT_ROOT)}
    return [
        component_cls("executor", [dynamo_python(), "-m", "executor", "--config", str(executor_cfg)], None, env=env,
                      needs_token=True, needs_data_token=True),
        component_cls("gateway", [sys.executable, "-m", "executor.gateway", "--router-url", opts.urls()["router"],
                                  "--port", str(opts.frontend_port), "--ttft-ms", f"{slo.ttft_ms:g}",
                                  "--itl-ms", f"{slo.itl_ms:g}"],
                      f"{opts.urls()['frontend']}/healthz", needs_data_token=True),
        component_cls("loadgen", [sys.executable, "-m", "sim.live.loadgen", "--config", str(loadgen_cfg)], None),
    ]
