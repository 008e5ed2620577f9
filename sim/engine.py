"""Discrete-event simulation of a disaggregated prefill/decode fleet in virtual time.

Request path: arrival -> a prefill worker's FIFO queue -> batched prefill (requests
taken in order while the batch stays within `prefill_token_budget` tokens; a longer
request runs alone) taking the profile's TTFT at the batch's total token count ->
KV transfer to a decode worker (latency + bytes / bandwidth of the link between
their domains) -> admission when the worker's KV cache can hold isl + osl tokens
(else it waits there, FIFO) -> continuous batching until its last token.

The first token is produced by prefill and reaches the client when the decode
worker admits the request: TTFT = admission - arrival. A single request on an idle
fleet with a free transfer therefore sees exactly the profile's prefill TTFT. The
other osl - 1 tokens come from decode steps; ITL = (finish - first token) / (osl - 1).
A request with osl <= 1 finishes at the end of its prefill.

Decode runs per step, not per token, and jumps between events: every running
request emits one token per step, so between joins and completions a worker's
state is one counter. A segment lasts until the next completion; its step time is
the profile's ITL at the KV usage and mean context halfway through it. A request
arriving mid-segment joins at the next step boundary.

Nothing is ever dropped: with no ready worker, arrivals and finished prefills wait
at the frontend until one is ready.
SimConfig.engine_model "dynamo_mocker" runs engines as Dynamo's mocker (sim.mocker_timing):
chunked prefill steps; all osl tokens come from decode steps, TTFT ends with the first.
"""

from __future__ import annotations

import heapq
import math
from array import array
from collections import deque

import numpy as np

from planner.types import PodMetrics, Pool
from sim.config import SimConfig
from sim.fleet import DecodeWorker, PrefillWorker
from sim.lookup import ProfileTables
from sim.mocker_timing import chunked_prefill_step, mocker_tables
from sim.observation import IntervalStats
from sim.results import RequestResults
from sim.routing import LeastLoadedRouter, Router
from workloads.traces import Trace


def _typed(code: str, values: np.ndarray) -> array:
    """A flat typed array ("d": float64, "q": int64; 8 bytes an item, no per-item objects) holding values."""
    a = array(code)
    a.frombytes(np.ascontiguousarray(values, dtype=np.float64 if code == "d" else np.int64).tobytes())
    return a


def _np(a: array) -> np.ndarray:
    """A numpy copy of a typed array."""
    return np.frombuffer(a, dtype=np.float64 if a.typecode == "d" else np.int64).copy()


_PREFILL_DONE, _KV_DONE, _DECODE_SEG, _READY = 0, 1, 2, 3


class FleetSim:
    """The fleet, its event queue and every request's timestamps."""

    def __init__(
        self,
        trace: Trace,
        tables: ProfileTables,
        *,
        config: SimConfig | None = None,
        router: Router | None = None,
        initial_prefill: int = 1,
        initial_decode: int = 1,
    ):
        self.cfg = config or SimConfig()
        self._mocker = self.cfg.engine_model == "dynamo_mocker"  # as 0/1: decode steps before the first token
        self.tables = tables = mocker_tables(tables) if self._mocker else tables
        self._itl_ms = tables.itl_ms
        self._inv_max_kv = 1.0 / tables.max_kv_tokens
        self.router = router or LeastLoadedRouter()
        self.event_t_s = 0.0  # time of the event being handled (routers that need a clock read it)
        if hasattr(self.router, "bind"):
            self.router.bind(self)
        self.trace = trace
        # Flat typed arrays (8 bytes a request, no per-item objects): a day of ServeGen
        # traffic is millions of requests.
        self.arrival_s = _typed("d", trace.arrival_s)
        self.isl = _typed("q", trace.isl_tokens)
        self.osl = _typed("q", trace.osl_tokens)
        n = len(self.arrival_s)
        self.first_token_s = _typed("d", np.full(n, np.nan))
        self.finish_s = _typed("d", np.full(n, np.nan))
        self.prefill_done_s = _typed("d", np.full(n, np.nan))
        self._join_step = _typed("q", np.zeros(n, dtype=np.int64))
        # At decode admission: how long until the step in progress ends (the request's first gap waits
        # for it) and that step's length; 0 on an idle worker.
        self.join_wait_s = _typed("d", np.full(n, np.nan))
        self.join_step_s = _typed("d", np.full(n, np.nan))
        self.next_arrival = 0
        self.completed = 0
        self.now_s = 0.0
        self._events: list = []
        self._seq = 0
        self.prefill_workers: list[PrefillWorker] = []
        self.decode_workers: list[DecodeWorker] = []
        self.prefill_serving: list[PrefillWorker] = []
        self.decode_serving: list[DecodeWorker] = []
        self._frontend_prefill: deque[int] = deque()
        self._frontend_decode: deque[tuple[int, PrefillWorker]] = deque()
        self.stats = IntervalStats()
        self._alloc = {"prefill": 0, "decode": 0}
        self._gpu_s = {"prefill": 0.0, "decode": 0.0}
        self._alloc_t = 0.0
        self.scale_log: list[tuple[float, Pool, int, int]] = []  # (t, pool, from, to)
        # (t, prefill ready, decode ready) after every change of the serving sets: what a connector's ready
        # counts would show, for the planner's measured startup time (planner.signals.startup_time).
        self.ready_log: list[tuple[float, int, int]] = []
        for _ in range(initial_prefill):
            self._add_worker("prefill", 0.0, ready_at_s=0.0)
        for _ in range(initial_decode):
            self._add_worker("decode", 0.0, ready_at_s=0.0)

    # ------------------------------------------------------------------ fleet

    def _push(self, t: float, kind: int, a, b=None) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t, self._seq, kind, a, b))

    def _bill(self, t: float) -> None:
        dt = t - self._alloc_t
        if dt > 0:
            self._gpu_s["prefill"] += dt * self._alloc["prefill"] * self.cfg.gpus_per_prefill
            self._gpu_s["decode"] += dt * self._alloc["decode"] * self.cfg.gpus_per_decode
            self._alloc_t = t

    def gpu_seconds(self, until_s: float | None = None) -> dict[str, float]:
        """GPU-seconds billed per pool up to until_s (default: now): starting, ready and draining workers."""
        self._bill(self.now_s if until_s is None else until_s)
        return dict(self._gpu_s)

    def _add_worker(self, pool: Pool, t: float, *, ready_at_s: float):
        self._bill(t)
        self._alloc[pool] += 1
        workers = self.prefill_workers if pool == "prefill" else self.decode_workers
        idx = len(workers)
        domain = self.cfg.domains[idx % len(self.cfg.domains)]
        cls = PrefillWorker if pool == "prefill" else DecodeWorker
        gpus = self.cfg.gpus_per_prefill if pool == "prefill" else self.cfg.gpus_per_decode
        w = cls(idx, f"{pool}-{idx}", domain, gpus, ready_at_s)
        workers.append(w)
        if ready_at_s <= t:
            self._make_ready(w, t)
        else:
            self._push(ready_at_s, _READY, w)
        return w

    def _retire(self, w, t: float) -> None:
        if w.retired:
            return
        self._bill(t)
        w.retired = True
        self._alloc["prefill" if isinstance(w, PrefillWorker) else "decode"] -= 1

    def _make_ready(self, w, t: float) -> None:
        if w.retired:
            return
        w.ready = True
        if isinstance(w, PrefillWorker):
            self.prefill_serving.append(w)
            self._log_ready(t)
            while self._frontend_prefill:
                self._route_prefill(self._frontend_prefill.popleft(), t)
        else:
            w.seg_t = t
            self.decode_serving.append(w)
            self._log_ready(t)
            held = list(self._frontend_decode)
            self._frontend_decode.clear()
            for rid, src in held:
                self._route_decode(rid, src, t)

    def _log_ready(self, t: float) -> None:
        self.ready_log.append((t, len(self.prefill_serving), len(self.decode_serving)))

    def frontend_waiting(self) -> int:
        """Requests the frontend holds for want of a serving worker (a pool at zero, or all starting)."""
        return len(self._frontend_prefill) + len(self._frontend_decode)

    def live_workers(self, pool: Pool) -> list:
        """Starting and ready workers that are not draining (what the target counts)."""
        workers = self.prefill_workers if pool == "prefill" else self.decode_workers
        return [w for w in workers if not w.draining and not w.retired]

    def ready_count(self, pool: Pool) -> int:
        return len(self.prefill_serving if pool == "prefill" else self.decode_serving)

    def allocated_count(self, pool: Pool) -> int:
        """Workers holding GPUs: starting, ready and draining."""
        return self._alloc[pool]

    def set_target(self, pool: Pool, target: int, t_s: float | None = None) -> None:
        """Scale a pool to `target` live workers at time t_s (default: now).

        Up: new workers serve after `startup_s`. Down: starting workers are cancelled
        first (newest first), then the least-loaded ready workers drain.
        """
        if target < 0:
            raise ValueError(f"set_target: {pool} target must be >= 0, got {target}")
        t = self.now_s if t_s is None else t_s
        self.event_t_s = t
        live = self.live_workers(pool)
        if target == len(live):
            return
        self.scale_log.append((t, pool, len(live), target))
        if target > len(live):
            for _ in range(target - len(live)):
                self._add_worker(pool, t, ready_at_s=t + self.cfg.startup_s)
            return
        excess = len(live) - target
        starting = [w for w in live if not w.ready]
        for w in reversed(starting):
            if excess == 0:
                return
            self._retire(w, t)
            excess -= 1
        ready = sorted((w for w in live if w.ready), key=lambda w: (w.load_tokens(), -w.wid))
        for w in ready[:excess]:
            w.draining = True
            serving = self.prefill_serving if pool == "prefill" else self.decode_serving
            serving.remove(w)
            self._log_ready(t)
            if w.idle:
                self._retire(w, t)

    # ------------------------------------------------------------------ requests

    def _route_prefill(self, rid: int, t: float) -> None:
        if not self.prefill_serving:
            self._frontend_prefill.append(rid)
            return
        w = self.router.pick_prefill(rid, self.isl[rid], self.prefill_serving)
        w.queue.append(rid)
        w.queued_tokens += self.isl[rid]
        if not w.busy:
            self._start_prefill(w, t)

    def _start_prefill(self, w: PrefillWorker, t: float) -> None:
        q = w.queue
        isl = self.isl
        budget = self.cfg.prefill_token_budget
        if self._mocker:
            batch, tokens, w.head_done_tokens = chunked_prefill_step(q, isl, w.head_done_tokens, budget)
        else:
            rid = q.popleft()
            batch = [rid]
            tokens = isl[rid]
            while q and tokens + isl[q[0]] <= budget:
                rid = q.popleft()
                batch.append(rid)
                tokens += isl[rid]
        w.busy = True
        w.batch = batch
        w.batch_tokens = tokens
        w.busy_until_s = t + self.tables.prefill_ms(tokens) * 1e-3
        self._push(w.busy_until_s, _PREFILL_DONE, w)

    def _on_prefill_done(self, w: PrefillWorker, t: float) -> None:
        osl = self.osl
        for rid in w.batch:
            self.prefill_done_s[rid] = t
            if osl[rid] <= 1 and not self._mocker:
                self._first_token(rid, t)
                self._finish(rid, t)
            else:
                self._route_decode(rid, w, t)
        w.queued_tokens -= w.batch_tokens
        w.batch = []
        w.batch_tokens = 0
        w.busy = False
        if w.queue:
            self._start_prefill(w, t)
        elif w.draining:
            self._retire(w, t)

    def _route_decode(self, rid: int, src: PrefillWorker, t: float) -> None:
        d = None
        if self.decode_serving:
            d = self.router.pick_decode(rid, self.isl[rid], self.osl[rid], src, self.decode_serving)
        if d is None:
            self._frontend_decode.append((rid, src))
            return
        tokens = self.isl[rid] + self.osl[rid]
        d.incoming += 1
        d.incoming_tokens += tokens
        self._push(t + self.cfg.transfer.seconds(src.domain, d.domain, self.isl[rid]), _KV_DONE, rid, d)

    def _first_token(self, rid: int, t: float) -> None:
        self.first_token_s[rid] = t
        self.stats.first_token(t - self.arrival_s[rid])

    def _finish(self, rid: int, t: float) -> None:
        self.finish_s[rid] = t
        self.completed += 1
        st = self.stats
        st.completions += 1
        o = self.osl[rid]
        st.osl_sum += o
        if o > 1:
            st.itl_count += 1
            st.itl_sum_s += (t - self.first_token_s[rid]) / (o - 1)

    def _fits(self, d: DecodeWorker, rid: int) -> bool:
        if d.n == 0:
            return True  # a request larger than the cache still runs alone
        mb = self.cfg.decode_max_batch
        if mb is not None and d.n >= mb:
            return False
        return d.reserved_tokens + self.isl[rid] + self.osl[rid] <= self.tables.max_kv_tokens

    def _admit(self, d: DecodeWorker, rid: int, t: float) -> None:
        isl = self.isl[rid]
        self.join_wait_s[rid] = d.seg_t - t if d.n and d.seg_t > t else 0.0
        self.join_step_s[rid] = d.step_s if d.n else 0.0
        d.n += 1
        d.kv_base += isl + 1 - d.steps
        d.reserved_tokens += isl + self.osl[rid]
        self._join_step[rid] = d.steps
        heapq.heappush(d.heap, (d.steps + self.osl[rid] - 1 + self._mocker, rid))
        if self._mocker:
            d.first_due.append(rid)
        else:
            self._first_token(rid, t)

    def _advance(self, d: DecodeWorker, t: float) -> None:
        """Bring a decode worker's step counter to the first step boundary at or after t."""
        if d.n == 0:
            if d.seg_t < t:
                d.seg_t = t
            return
        if t <= d.seg_t:
            return
        firsts = len(d.first_due)  # the mocker's: their first token ends this step, not a gap
        if firsts:
            self._first_tokens_due(d)
        k = math.ceil((t - d.seg_t) / d.step_s - 1e-9)
        n_min = d.heap[0][0] - d.steps
        if k > n_min:
            k = n_min
        d.steps += k
        d.seg_t += k * d.step_s
        self.stats.token_gaps(d.step_s, max(0, k * d.n - firsts))
        self._complete_due(d, d.seg_t)

    def _complete_due(self, d: DecodeWorker, t: float) -> None:
        heap = d.heap
        steps = d.steps
        while heap and heap[0][0] <= steps:
            _, rid = heapq.heappop(heap)
            d.n -= 1
            d.kv_base -= self.isl[rid] + 1 - self._join_step[rid]
            d.reserved_tokens -= self.isl[rid] + self.osl[rid]
            self._finish(rid, t)
        while d.pending and self._fits(d, d.pending[0]):
            self._admit(d, d.pending.popleft(), t)

    def _first_tokens_due(self, d: DecodeWorker) -> None:
        """The mocker's first tokens: the end of the step the requests joined, now that it is fixed."""
        for rid in d.first_due:
            self._first_token(rid, d.seg_t + d.step_s)
        d.first_due.clear()

    def _reschedule(self, d: DecodeWorker) -> None:
        d.version += 1
        n = d.n
        if n == 0:
            return
        n_min = d.heap[0][0] - d.steps
        kv_now = d.kv_base + n * d.steps
        if kv_now > d.kv_peak_tokens:
            d.kv_peak_tokens = kv_now
        if self._mocker:  # its steps count the prompt and the tokens so far, not the next one
            step = self.tables.segment_step_ms(kv_now - n, n, n_min) * 1e-3
        else:
            kv_mid = kv_now + n * n_min * 0.5
            step = self._itl_ms(kv_mid * self._inv_max_kv, kv_mid / n) * 1e-3
        d.step_s = step
        self._seq += 1
        heapq.heappush(self._events, (d.seg_t + n_min * step, self._seq, _DECODE_SEG, d, d.version))

    def _on_kv_done(self, rid: int, d: DecodeWorker, t: float) -> None:
        isl = self.isl[rid]
        osl = self.osl[rid]
        d.incoming -= 1
        d.incoming_tokens -= isl + osl
        if d.n:
            self._advance(d, t)
        elif d.seg_t < t:
            d.seg_t = t
        if self._mocker and not d.pending and self._fits(d, rid):
            self._admit(d, rid, t)
        elif not d.pending and self._fits(d, rid):
            # admit (inlined _admit: the hottest path)
            steps = d.steps
            self.join_wait_s[rid] = d.seg_t - t if d.n else 0.0
            self.join_step_s[rid] = d.step_s if d.n else 0.0
            d.n += 1
            d.kv_base += isl + 1 - steps
            d.reserved_tokens += isl + osl
            self._join_step[rid] = steps
            heapq.heappush(d.heap, (steps + osl - 1, rid))
            self.first_token_s[rid] = t
            self.stats.first_token(t - self.arrival_s[rid])
        else:
            d.pending.append(rid)
        self._reschedule(d)

    def _on_decode_segment(self, d: DecodeWorker, version: int, t: float) -> None:
        if version != d.version or d.n == 0:
            return
        firsts = len(d.first_due)
        if firsts:
            self._first_tokens_due(d)
        self.stats.token_gaps(d.step_s, max(0, (d.heap[0][0] - d.steps) * d.n - firsts))
        d.steps = d.heap[0][0]
        d.seg_t = t
        self._complete_due(d, t)
        self._reschedule(d)
        if d.draining and d.idle:
            self._retire(d, t)

    # ------------------------------------------------------------------ main loop

    @property
    def done(self) -> bool:
        return self.completed == len(self.arrival_s)

    def run_until(self, t_end: float) -> None:
        """Process arrivals before t_end and events up to t_end inclusive; then now = t_end.

        Events at exactly t_end (a worker ready at the boundary) count as done, so a
        planner running at t_end sees them, as it would see a pod that just became ready.
        """
        events = self._events
        arrivals = self.arrival_s
        n_arr = len(arrivals)
        i = self.next_arrival
        pop = heapq.heappop
        while True:
            t_ev = events[0][0] if events else math.inf
            t_arr = arrivals[i] if i < n_arr else math.inf
            if t_arr <= t_ev:
                if t_arr >= t_end:
                    break
                st = self.stats
                st.arrivals += 1
                st.isl_sum += self.isl[i]
                self.event_t_s = t_arr
                self._route_prefill(i, t_arr)
                i += 1
                continue
            if t_ev > t_end:
                break
            t, _, kind, a, b = pop(events)
            self.event_t_s = t
            if kind == _DECODE_SEG:
                self._on_decode_segment(a, b, t)
            elif kind == _KV_DONE:
                self._on_kv_done(a, b, t)
            elif kind == _PREFILL_DONE:
                self._on_prefill_done(a, t)
            else:
                self._make_ready(a, t)
        self.next_arrival = i
        if t_end > self.now_s and t_end != math.inf:
            self.now_s = t_end

    def run_to_completion(self) -> None:
        """Run until every request has finished (the fleet must be able to serve)."""
        self.run_until(math.inf)
        if not self.done:
            raise RuntimeError(
                f"simulation stalled with {len(self.arrival_s) - self.completed} requests unfinished: "
                "a pool has no live workers"
            )
        last = float(np.max(_np(self.finish_s))) if len(self.finish_s) else 0.0
        self.now_s = max(self.now_s, last)

    # ------------------------------------------------------------------ metrics

    def take_interval_stats(self) -> IntervalStats:
        """The counters since the last call, then reset (one planner interval)."""
        st, self.stats = self.stats, IntervalStats()
        return st

    def pod_metrics(self, t_s: float, *, reset_peaks: bool = True) -> tuple[PodMetrics, ...]:
        """Per-ready-worker saturation signals, as vLLM exports them; resets KV peaks.

        kv_usage_frac: the highest KV usage since the last reset (decode) or the running
        batch's share of the cache (prefill); queue_length: requests waiting.
        reset_peaks: False reads without starting a new peak window (the fast path's
        polls between planner intervals).
        """
        pods = []
        cap = float(self.tables.max_kv_tokens)
        for w in self.prefill_serving:
            pods.append(PodMetrics(w.name, "prefill", min(w.batch_tokens / cap, 1.0), float(len(w.queue))))
        for d in self.decode_serving:
            now_kv = d.kv_tokens_at(t_s)
            peak = max(d.kv_peak_tokens, now_kv)
            d.kv_peak_tokens = now_kv if reset_peaks else peak
            pods.append(PodMetrics(d.name, "decode", min(peak / cap, 1.0), float(len(d.pending))))
        return tuple(pods)

    def results(self) -> RequestResults:
        return RequestResults(
            arrival_s=_np(self.arrival_s),
            first_token_s=_np(self.first_token_s),
            finish_s=_np(self.finish_s),
            isl_tokens=self.trace.isl_tokens,
            osl_tokens=self.trace.osl_tokens,
            prefill_done_s=_np(self.prefill_done_s),
            join_wait_s=_np(self.join_wait_s),
            join_step_s=_np(self.join_step_s),
        )
