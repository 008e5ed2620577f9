"""What each simulated request experienced: its timestamps, latencies, SLA attainment."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RequestResults:
    """Per-request outcome arrays (seconds; NaN for requests not finished)."""

    arrival_s: np.ndarray
    first_token_s: np.ndarray
    finish_s: np.ndarray
    isl_tokens: np.ndarray
    osl_tokens: np.ndarray
    prefill_done_s: np.ndarray | None = None  # when each request's prefill returned (None: not recorded)
    # At decode admission: the wait for the step in progress to end, and that step's length, s (0 on an
    # idle worker; NaN: not admitted; None: not recorded).
    join_wait_s: np.ndarray | None = None
    join_step_s: np.ndarray | None = None

    @property
    def ttft_ms(self) -> np.ndarray:
        return (self.first_token_s - self.arrival_s) * 1e3

    @property
    def itl_ms(self) -> np.ndarray:
        """Mean inter-token latency per request, ms; NaN when osl <= 1 (no second token)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(
                self.osl_tokens > 1,
                (self.finish_s - self.first_token_s) * 1e3 / np.maximum(self.osl_tokens - 1, 1),
                np.nan,
            )

    @property
    def e2e_ms(self) -> np.ndarray:
        return (self.finish_s - self.arrival_s) * 1e3

    def arriving_from(self, t_s: float) -> RequestResults:
        """The requests arriving at or after t_s, on a clock that starts there (waits and steps unchanged)."""
        keep = self.arrival_s >= t_s
        clock = ("arrival_s", "first_token_s", "finish_s", "prefill_done_s")
        return RequestResults(**{name: None if value is None else value[keep] - (t_s if name in clock else 0.0)
                                 for name, value in vars(self).items()})

    def sla_met(self, *, ttft_ms: float, itl_ms: float) -> np.ndarray:
        """Both targets met (ITL counts as met for single-token outputs)."""
        itl = self.itl_ms
        return (self.ttft_ms <= ttft_ms) & (np.isnan(itl) | (itl <= itl_ms)) & ~np.isnan(self.finish_s)
