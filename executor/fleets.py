"""Ready-made executor settings: a Dynamo 1.6.1 mocker fleet (CPU, no GPU, no model weights).

The mocker serves OpenAI-compatible requests with Dynamo's real request path
and metrics, timing them from a planner profile (`--planner-profile-data`, the
profiler's output folder) or its built-in model, `speedup_ratio` times faster
than the profiled engine. Workers of one fleet share a Dynamo namespace, etcd
discovery, the TCP request plane and the ZMQ event plane (no NATS). The
prefill mocker registers `<ns>.prefill.generate`, the decode one
`<ns>.backend.generate` (Dynamo's name for the decode component).
"""

from __future__ import annotations

from pathlib import Path

from executor.config import ExecutorConfig, RoleConfig

TOKENIZER_DIR = Path(__file__).resolve().parents[1] / "stack" / "dynamo" / "tokenizer"
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
