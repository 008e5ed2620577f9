"""The settings of a simulated fleet: engine limits, startup time, placement, KV transfer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from sim.fleet import TransferModel


@dataclass(frozen=True)
class SimConfig:
    """Fleet and engine settings of a simulation.

    prefill_token_budget: most tokens one prefill batch holds (vLLM max_num_batched_tokens).
    decode_max_batch: most running requests per decode worker (vLLM max_num_seqs); None: KV-bound only.
    startup_s: time from adding a worker to it serving, seconds.
    domains: topology domains "zone/rack"; workers of each pool are placed round-robin.
    engine_model: how engines are scheduled and timed. "profile": a prefill batch of whole
        prompts takes the profile's TTFT at its total length, the first token reaches the
        client when decode admits the request. "dynamo_mocker": as Dynamo 1.6.1's mocker
        (sim.mocker_timing): chunked prefill steps under prefill_token_budget, every output
        token from a decode step (the first at the end of the first one), step times from
        the mocker's regression grids.
    """

    prefill_token_budget: int = 8192
    decode_max_batch: int | None = None
    startup_s: float = 60.0
    gpus_per_prefill: int = 1
    gpus_per_decode: int = 1
    transfer: TransferModel = field(default_factory=TransferModel)
    domains: tuple[str, ...] = ("zone-a/rack-1",)
    engine_model: Literal["profile", "dynamo_mocker"] = "profile"

    def __post_init__(self) -> None:
        if self.prefill_token_budget < 1:
            raise ValueError(f"SimConfig: prefill_token_budget must be >= 1, got {self.prefill_token_budget}")
        if self.decode_max_batch is not None and self.decode_max_batch < 1:
            raise ValueError(f"SimConfig: decode_max_batch must be >= 1 or None, got {self.decode_max_batch}")
        if self.startup_s < 0:
            raise ValueError(f"SimConfig: startup_s must be >= 0, got {self.startup_s}")
        if self.engine_model not in ("profile", "dynamo_mocker"):
            raise ValueError(f"SimConfig: engine_model must be 'profile' or 'dynamo_mocker', got {self.engine_model!r}")
        if not self.domains:
            raise ValueError("SimConfig: domains must list at least one 'zone/rack'")
