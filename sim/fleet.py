"""Simulated workers and the network between them.

A worker is one serving replica (one engine, `gpus` GPUs) of the prefill or the
decode pool, placed in a topology domain "zone/rack". Moving a request's KV cache
from its prefill worker to its decode worker costs a latency plus bytes over the
bandwidth of the narrowest link between their domains: same rack, same zone, or
across zones.

Lifecycle: a worker is *starting* (allocated, GPUs billed, serves nothing) until
`ready_at_s`, then *ready*. A removed worker *drains*: the router stops sending it
work, it finishes everything it holds, then it is *retired* (GPUs released).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

# Llama-3.1-8B: 2 (K and V) x 32 layers x 8 KV heads x 128 dims x 2 bytes (fp16 cache).
LLAMA_8B_KV_BYTES_PER_TOKEN = 2 * 32 * 8 * 128 * 2


@dataclass(frozen=True)
class TransferModel:
    """KV-cache transfer cost between a prefill and a decode worker.

    Defaults are assumptions, not measurements: RDMA inside a rack (NVLink/IB,
    ~50 GB/s per transfer), a zone's spine (~25 GB/s) and a cross-zone link (~5 GB/s).
    """

    kv_bytes_per_token: int = LLAMA_8B_KV_BYTES_PER_TOKEN
    same_rack_latency_s: float = 0.0002
    same_rack_bytes_per_s: float = 50e9
    same_zone_latency_s: float = 0.0005
    same_zone_bytes_per_s: float = 25e9
    cross_zone_latency_s: float = 0.002
    cross_zone_bytes_per_s: float = 5e9

    def __post_init__(self) -> None:
        for name in ("same_rack_bytes_per_s", "same_zone_bytes_per_s", "cross_zone_bytes_per_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"TransferModel: {name} must be > 0, got {getattr(self, name)}")
        for name in ("kv_bytes_per_token", "same_rack_latency_s", "same_zone_latency_s", "cross_zone_latency_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"TransferModel: {name} must be >= 0, got {getattr(self, name)}")

    def seconds(self, src_domain: str, dst_domain: str, tokens: int) -> float:
        """Time to move `tokens` tokens of KV cache from src to dst domain, seconds."""
        if src_domain == dst_domain:
            lat, bw = self.same_rack_latency_s, self.same_rack_bytes_per_s
        elif zone_of(src_domain) == zone_of(dst_domain):
            lat, bw = self.same_zone_latency_s, self.same_zone_bytes_per_s
        else:
            lat, bw = self.cross_zone_latency_s, self.cross_zone_bytes_per_s
        return lat + tokens * self.kv_bytes_per_token / bw


FREE_TRANSFER = TransferModel(
    kv_bytes_per_token=0,
    same_rack_latency_s=0.0,
    same_zone_latency_s=0.0,
    cross_zone_latency_s=0.0,
)


def zone_of(domain: str) -> str:
    """The zone part of a "zone/rack" domain (the whole string when it has no rack)."""
    return domain.split("/", 1)[0]


class Replica:
    """A worker's identity and lifecycle: starting until ready_at_s, then ready; draining, then retired."""

    __slots__ = ("wid", "name", "domain", "gpus", "ready", "draining", "retired", "ready_at_s")

    def __init__(self, wid: int, name: str, domain: str, gpus: int, ready_at_s: float):
        self.wid = wid
        self.name = name
        self.domain = domain
        self.gpus = gpus
        self.ready = False
        self.draining = False
        self.retired = False
        self.ready_at_s = ready_at_s


class PrefillWorker(Replica):
    """A prefill replica: FIFO queue, one batch in flight."""

    __slots__ = ("queue", "queued_tokens", "busy", "batch", "batch_tokens", "busy_until_s", "head_done_tokens")

    def __init__(self, wid: int, name: str, domain: str, gpus: int, ready_at_s: float):
        super().__init__(wid, name, domain, gpus, ready_at_s)
        self.queue: deque[int] = deque()
        self.queued_tokens = 0  # waiting + in the running batch
        self.busy = False
        self.batch: list[int] = []
        self.batch_tokens = 0
        self.busy_until_s = 0.0
        self.head_done_tokens = 0  # chunked prefill: prompt tokens of queue[0] already computed

    @property
    def idle(self) -> bool:
        return not self.busy and not self.queue

    def load_tokens(self) -> int:
        return self.queued_tokens


class DecodeWorker(Replica):
    """A decode replica: continuous batching with a KV-cache capacity.

    Every running request emits one token per step; `steps` counts steps since the
    worker started, so a request's context is isl + 1 + (steps - join_step) and the
    KV in use is kv_base + n_running * steps, both O(1) to keep.
    """

    __slots__ = (
        "n", "steps", "kv_base", "reserved_tokens", "incoming", "incoming_tokens",
        "heap", "pending", "seg_t", "step_s", "version", "kv_peak_tokens", "first_due",
    )

    def __init__(self, wid: int, name: str, domain: str, gpus: int, ready_at_s: float):
        super().__init__(wid, name, domain, gpus, ready_at_s)
        self.n = 0  # running requests
        self.steps = 0  # decode steps done since start
        self.kv_base = 0  # sum over running of isl + 1 - join_step
        self.reserved_tokens = 0  # sum over running of isl + osl (admission reservation)
        self.incoming = 0  # KV transfers on their way here
        self.incoming_tokens = 0
        self.heap: list[tuple[int, int]] = []  # (finish step, request id)
        self.pending: deque[int] = deque()  # arrived, waiting for KV space
        self.seg_t = 0.0  # time of the current step boundary
        self.step_s = 0.0  # step time of the current segment
        self.version = 0  # invalidates scheduled segment ends
        self.kv_peak_tokens = 0.0
        self.first_due: list[int] = []  # engine_model "dynamo_mocker": admitted, first token at this step's end

    @property
    def idle(self) -> bool:
        return self.n == 0 and not self.pending and self.incoming == 0

    def load_tokens(self) -> int:
        return self.reserved_tokens + self.incoming_tokens

    def kv_tokens_at(self, t_s: float) -> float:
        """KV tokens in use at time t_s (no state change)."""
        if self.n == 0:
            return 0.0
        done = 0
        if t_s > self.seg_t and self.step_s > 0:
            done = min(int((t_s - self.seg_t) / self.step_s), self.heap[0][0] - self.steps)
        return float(self.kv_base + self.n * (self.steps + done))
