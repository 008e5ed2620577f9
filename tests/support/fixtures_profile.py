"""Profiles for the profile/correction/sizing tests: the real ones and tiny hand-made ones.

The hand-made profiles are linear where it matters, so every expectation in the
tests can be worked out on paper (PCHIP reproduces linear data exactly).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from planner.latency.decode_profile import DecodeProfile
from planner.latency.profile import EngineProfile, PrefillProfile

PROFILER_DIRS = {
    "dynamo-H200-measured": ("dynamo", "profiler", "H200_TP1P_TP1D"),
    "aic-Llama8B-H100": ("aiconfigurator", "Llama-3.1-8B_H100_vllm_TP1P_TP1D"),
    "aic-Qwen32B-H100-TP4": ("aiconfigurator", "Qwen3-32B_H100_sglang_TP4P_TP4D"),
}

# (folder under profiles/dynamo/pre_swept, prefill tp, decode tp, gpu_type)
PRE_SWEPT = {
    "pre-swept-H200-8B-TP1": ("h200_sxm/vllm/nvidia/Llama-3.1-8B-Instruct-FP8", 1, 1, "h200_sxm"),
    "pre-swept-H100-70B-TP8": ("h100_sxm/vllm/nvidia/Llama-3.3-70B-Instruct-FP8", 8, 8, None),
    "pre-swept-H100-70B-TP4": ("h100_sxm/vllm/nvidia/Llama-3.3-70B-Instruct-FP8", 4, 4, "H100_SXM"),
    "pre-swept-H100-70B-TP2": ("h100_sxm/vllm/nvidia/Llama-3.3-70B-Instruct-FP8", 2, 2, None),
}


def profiler_dir(shared_data: Path, key: str) -> Path:
    return shared_data.joinpath("profiles", *PROFILER_DIRS[key])


def pre_swept_dir(shared_data: Path, key: str) -> Path:
    return shared_data / "profiles" / "dynamo" / "pre_swept" / PRE_SWEPT[key][0]


def linear_prefill(out_of_range: str = "clip") -> PrefillProfile:
    """TTFT = 0.1 ms/token (100 ms at 1000 tokens); throughput 10,000 tokens/s/GPU everywhere."""
    return PrefillProfile.from_arrays(
        {
            "prefill_isl": np.array([500, 1000, 2000, 4000]),
            "prefill_ttft": np.array([50.0, 100.0, 200.0, 400.0]),
            "prefill_thpt_per_gpu": np.array([10_000.0] * 4),
        },
        source="hand-prefill",
        out_of_range=out_of_range,
    )


def linear_decode(*, max_kv_tokens: int = 100_000, out_of_range: str = "clip") -> DecodeProfile:
    """Two context rows, 1000 and 2000 tokens, KV usage 0.1/0.5/0.9.

    Row 1000: ITL = 7.5 + 25*kv ms (10, 20, 30); throughput = 10,000*kv (1000, 5000, 9000).
    Row 2000: ITL = 17.5 + 25*kv ms (20, 30, 40); throughput = 5,000*kv (500, 2500, 4500),
    so throughput*context is the same in both rows.
    """
    kv = [0.1, 0.5, 0.9]
    return DecodeProfile.from_arrays(
        {
            "x_kv_usage": np.array(kv + kv),
            "y_context_length": np.array([1000.0] * 3 + [2000.0] * 3),
            "z_itl": np.array([10.0, 20.0, 30.0, 20.0, 30.0, 40.0]),
            "z_thpt_per_gpu": np.array([1000.0, 5000.0, 9000.0, 500.0, 2500.0, 4500.0]),
            "max_kv_tokens": np.array([max_kv_tokens]),
        },
        source="hand-decode",
        out_of_range=out_of_range,
    )


def linear_engine(**kw) -> EngineProfile:
    return EngineProfile(prefill=linear_prefill(), decode=linear_decode(**kw), name="hand")
