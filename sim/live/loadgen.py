"""A load generator: replays a real trace against an OpenAI-compatible frontend over HTTP.

Each trace request becomes one streaming `/v1/chat/completions` call at its
arrival time (open loop: a slow server does not slow the arrivals), with a
prompt of the request's input length and `max_tokens` = its output length, so
the frontend's own TTFT / ITL / ISL / OSL histograms record real traffic.
Each prompt is its own random word sequence (seeded by the request's index), so
prompts share no prefix and an engine's prefix cache finds nothing to reuse,
as for the independent conversations of a trace without prefix hashes (with
one repeated filler word every prompt was a prefix of the next: the Dynamo
mocker's prefix cache then served 4 concurrent 4000-token prompts in 56 ms,
below one alone, 140 ms). Prompt length is calibrated against the server at
start: requests tell how many prompt tokens the chat template adds and a word
costs on average, so `usage.prompt_tokens` matches the trace's input length. Inputs longer than the
model's context (less the output and the template) are clipped, and counted.

Every request's outcome is a line of `<out_dir>/requests.jsonl`: arrival,
HTTP status, whether the stream ended in an error event (a Dynamo frontend
reports a worker lost mid-stream that way, under HTTP 200), client-side TTFT
and end-to-end time, token counts. `summary.json` is rewritten every few
seconds and at the end. The trace is built as the simulated fleet builds it
(workloads.trace_shaping.build_trace: window, shape of load multipliers, time scale).

Run: `python -m sim.live.loadgen --config loadgen.yaml` (a `LoadGenConfig` file).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import yaml
from pydantic import Field, ValidationError

from planner.strict import error_message
from workloads.trace_shaping import TraceReplayConfig, build_trace
from workloads.traces import Trace

log = logging.getLogger("sla_planner.sim.loadgen")
# Words of the stack's tokenizer vocabulary (stack/dynamo/tokenizer): about one token each; calibrated anyway.
WORDS = ("the a of to and in is for on that with as by it this from be are at or an was model token request "
         "latency prefill decode worker planner scale cluster gpu kv cache time first output input length "
         "throughput queue load sla replica fleet").split()


class LoadGenConfig(TraceReplayConfig):
    """What `python -m sim.live.loadgen` replays (the trace fields of the live fleet), and where (one YAML file)."""

    url: str = Field(description="frontend base URL, e.g. http://127.0.0.1:8000")
    model: str = Field(min_length=1, description="model name the frontend serves")
    out_dir: str = Field(description="requests.jsonl and summary.json go here")
    jitter_s: float = Field(
        30.0, ge=0, le=3600,
        description="each copy's requests shift by up to ± this, s: 30 models independent tenants (default), "
        "1 synchronised copies (a stress case)",
    )
    context_tokens: int = Field(8192, ge=64, description="the model's context length (inputs are clipped to fit)")
    max_output_tokens: int = Field(4096, ge=1, description="output lengths are capped here")
    start_delay_s: float = Field(0.0, ge=0, description="wait this long after calibration before the first request")
    request_timeout_s: float = Field(300.0, gt=0, description="give up on one request after this long, s")
    max_in_flight: int | None = Field(
        None, ge=1,
        description="at most this many requests outstanding, as a client pool of this many connections: an arrival "
        "that finds them all busy is shed (counted in the summary, never sent), so an overload builds no backlog "
        "that outlasts it; None: open loop, every arrival is sent",
    )
    summary_every_s: float = Field(5.0, gt=0, description="rewrite summary.json this often, s")


def random_words(n: int, *, seed: int) -> str:
    """n words of WORDS in a random order fixed by seed (distinct seeds share no prefix beyond chance)."""
    rng = np.random.default_rng(seed)
    return " ".join(WORDS[i] for i in rng.integers(0, len(WORDS), size=n))


class PromptBuilder:
    """Prompts of a wanted token count: tokens = overhead + per_word * words (measured)."""

    def __init__(self, overhead: int, per_word: float):
        if per_word <= 0:
            raise ValueError(f"calibration: a word costs {per_word} tokens; the tokenizer does not fit")
        self.overhead = overhead
        self.per_word = per_word

    def words_for(self, tokens: int) -> int:
        return max(0, round((tokens - self.overhead) / self.per_word))

    def prompt(self, tokens: int, *, seed: int) -> str:
        return random_words(self.words_for(tokens), seed=seed)


async def calibrate(client: httpx.AsyncClient, cfg: LoadGenConfig) -> PromptBuilder:
    counts = []
    for words in (0, 2000):
        body = {"model": cfg.model, "messages": [{"role": "user", "content": random_words(words, seed=1_000_000_007 + words)}],
                "max_tokens": 1}
        resp = await client.post(f"{cfg.url}/v1/chat/completions", json=body)
        if resp.status_code != 200:
            raise RuntimeError(f"{cfg.url}: calibration request answered HTTP {resp.status_code}: {resp.text[:200]}")
        counts.append(int(resp.json()["usage"]["prompt_tokens"]))
    return PromptBuilder(overhead=counts[0], per_word=(counts[1] - counts[0]) / 2000)


class Recorder:
    """Outcomes as they finish: requests.jsonl, and a summary of them."""

    def __init__(self, out_dir: Path, *, total: int, trace_name: str):
        self.out_dir = out_dir
        out_dir.mkdir(parents=True, exist_ok=True)
        self._file = (out_dir / "requests.jsonl").open("a")
        self.rows: list[dict] = []
        self.total, self.trace_name, self.clipped, self.shed = total, trace_name, 0, 0
        self.started_unix_s = time.time()

    def add(self, row: dict) -> None:
        self.rows.append(row)
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()

    def summary(self, *, done: bool) -> dict:
        ok = [r for r in self.rows if r["ok"]]
        ttft = np.array([r["ttft_s"] for r in ok if r["ttft_s"] is not None])
        e2e = np.array([r["e2e_s"] for r in ok])

        def pct(values, q):
            return float(np.percentile(values, q)) if len(values) else None

        return {
            "trace": self.trace_name, "planned": self.total, "sent": len(self.rows), "ok": len(ok),
            "failed": len(self.rows) - len(ok), "clipped_inputs": self.clipped, "shed": self.shed,
            "done": done,
            "failures": [r for r in self.rows if not r["ok"]][:20],
            "client_ttft_s": {"p50": pct(ttft, 50), "p90": pct(ttft, 90), "p99": pct(ttft, 99)},
            "client_e2e_s": {"p50": pct(e2e, 50), "p90": pct(e2e, 90), "p99": pct(e2e, 99)},
            "started_unix_s": self.started_unix_s, "updated_unix_s": time.time(),
        }

    def write_summary(self, *, done: bool) -> None:
        tmp = self.out_dir / "summary.tmp"
        tmp.write_text(json.dumps(self.summary(done=done), indent=1))
        tmp.replace(self.out_dir / "summary.json")

    def close(self) -> None:
        self._file.close()


async def sse_lines(resp: httpx.Response):
    """The answer's lines, split on newlines only: a token's text may hold U+2028 or U+0085, which
    str.splitlines (and so httpx's aiter_lines) also splits on, cutting an event's JSON in two."""
    buffer = ""
    async for text in resp.aiter_text():
        *lines, buffer = (buffer + text).split("\n")
        for line in lines:
            yield line.rstrip("\r")
    if buffer:
        yield buffer


async def one_request(client: httpx.AsyncClient, cfg: LoadGenConfig, *, rid: int, arrival_s: float,
                      prompt: str, max_tokens: int) -> dict:
    body = {"model": cfg.model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "stream": True, "stream_options": {"include_usage": True}}
    row = {"rid": rid, "arrival_s": arrival_s, "sent_unix_s": time.time(), "status": None, "ok": False,
           "error": None, "ttft_s": None, "e2e_s": None, "prompt_tokens": None, "completion_tokens": None}
    t0 = time.monotonic()
    try:
        async with client.stream("POST", f"{cfg.url}/v1/chat/completions", json=body) as resp:
            row["status"] = resp.status_code
            if resp.status_code != 200:
                row["error"] = (await resp.aread()).decode(errors="replace")[:300]
                return row
            async for line in sse_lines(resp):
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                event = json.loads(data)
                if "error" in event:
                    row["error"] = json.dumps(event["error"])[:300]
                    return row
                if row["ttft_s"] is None and event.get("choices"):
                    row["ttft_s"] = time.monotonic() - t0
                if event.get("usage"):
                    row["prompt_tokens"] = event["usage"].get("prompt_tokens")
                    row["completion_tokens"] = event["usage"].get("completion_tokens")
        row["ok"] = row["completion_tokens"] is not None
        if not row["ok"]:
            row["error"] = "stream ended without usage"
    except (httpx.HTTPError, ValueError) as exc:
        row["error"] = f"{type(exc).__name__}: {exc}"[:300]
    finally:
        row["e2e_s"] = time.monotonic() - t0
    return row


async def replay(cfg: LoadGenConfig, trace: Trace, *, stop: asyncio.Event) -> dict:
    limits = httpx.Limits(max_connections=4096, max_keepalive_connections=256)
    timeout = httpx.Timeout(cfg.request_timeout_s, connect=10.0)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        builder = await calibrate(client, cfg)
        log.info("calibrated: %d template tokens, %.3f tokens per filler word", builder.overhead, builder.per_word)
        recorder = Recorder(Path(cfg.out_dir), total=len(trace), trace_name=trace.name)
        tasks: set[asyncio.Task] = set()

        async def run_one(i: int, prompt: str, max_tokens: int) -> None:
            recorder.add(await one_request(client, cfg, rid=i, arrival_s=float(trace.arrival_s[i]),
                                           prompt=prompt, max_tokens=max_tokens))

        await asyncio.sleep(cfg.start_delay_s)
        start = time.monotonic()
        last_summary = start
        for i in range(len(trace)):
            max_tokens = int(min(max(1, trace.osl_tokens[i]), cfg.max_output_tokens))
            room = cfg.context_tokens - max_tokens - builder.overhead - 8
            isl = int(trace.isl_tokens[i])
            if isl > room:
                recorder.clipped += 1
                isl = room
            prompt = builder.prompt(isl, seed=cfg.seed * 10_000_019 + i)
            delay = start + float(trace.arrival_s[i]) - time.monotonic()
            if delay > 0:
                try:
                    await asyncio.wait_for(stop.wait(), timeout=delay)
                except asyncio.TimeoutError:
                    pass
            if stop.is_set():
                break
            if cfg.max_in_flight is not None and len(tasks) >= cfg.max_in_flight:
                recorder.shed += 1
                continue
            task = asyncio.create_task(run_one(i, prompt, max_tokens))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            if time.monotonic() - last_summary > cfg.summary_every_s:
                recorder.write_summary(done=False)
                last_summary = time.monotonic()
        while tasks and not stop.is_set():
            await asyncio.wait(set(tasks), timeout=cfg.summary_every_s)
            recorder.write_summary(done=False)
        for task in tasks:
            task.cancel()
        recorder.write_summary(done=not stop.is_set())
        recorder.close()
        return recorder.summary(done=not stop.is_set())


def load_config(path: str | Path) -> LoadGenConfig:
    path = Path(path)
    try:
        return LoadGenConfig.model_validate(yaml.safe_load(path.read_text()) or {})
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"{path}: cannot read load generator config: {exc}".replace("\n", " ")) from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(map(str, first["loc"])) or "(top level)"
        raise ValueError(f"{path}: {where}: {error_message(first)}") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.live.loadgen", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="LoadGenConfig YAML")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s loadgen: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    try:
        cfg = load_config(args.config)
        trace = build_trace(cfg)  # the same windows, shapes and scaling as the simulated fleet
    except ValueError as exc:
        print(f"loadgen: {exc}", file=sys.stderr)
        return 2

    async def run() -> dict:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        return await replay(cfg, trace, stop=stop)

    summary = asyncio.run(run())
    log.info("done: %d sent, %d ok, %d failed", summary["sent"], summary["ok"], summary["failed"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
