"""Profile a running vLLM engine the way Dynamo's profiler lays its output out, for the planner's sizing.

Writes `<out>/selected_prefill_interpolation/raw_data.npz` (prefill_isl, prefill_ttft in ms,
prefill_thpt_per_gpu in tokens/s) and `<out>/selected_decode_interpolation/raw_data.npz`
(x_kv_usage, y_context_length, z_itl in ms, z_thpt_per_gpu in tokens/s, max_kv_tokens), the
layout planner.profile reads. Measured against the engine over its OpenAI API:

- prefill: a request of exactly ISL prompt tokens (token ids, so no tokenizer guesses) and one
  output token, alone on the engine; TTFT is its end-to-end time, the best of `--repeats`;
- decode: `n` concurrent streaming requests of a context length each, 64 output tokens with
  ignore_eos; ITL is the median gap between a request's streamed tokens after its first quarter
  (while the others still prefill), throughput n / ITL; KV usage n * (context + 64) / the engine's KV capacity (vllm:cache_config_info num_gpu_blocks
  x block_size), Dynamo's profiler's own definition.

Run it with nothing else on the machine (the engine's speed is the profile):
  .venv/bin/python benchmarks/profile_vllm_cpu.py --url http://127.0.0.1:PORT --model tiny \
      --out data/profiles/cpu_vllm032_tiny
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

ISLS = (64, 128, 256, 512, 768, 1024, 1536, 2048, 3072)
CONTEXTS = (128, 512, 1024, 2048)
CONCURRENCY = (1, 2, 4, 8, 16, 32, 64)
DECODE_TOKENS = 128
RNG = np.random.default_rng()  # prompts of random token ids: no two share a prefix-cache block, run after run
VOCAB = 400  # ids below the tiny model's vocabulary (469); content does not matter to dummy weights


def random_prompt(n: int) -> list[int]:
    return RNG.integers(10, VOCAB, size=n).tolist()


async def kv_capacity_tokens(client: httpx.AsyncClient, url: str) -> int:
    text = (await client.get(f"{url}/metrics")).text
    for fam in text_string_to_metric_families(text):
        if fam.name == "vllm:cache_config_info":
            labels = fam.samples[0].labels
            return int(labels["num_gpu_blocks"]) * int(labels["block_size"])
    raise RuntimeError(f"{url}/metrics: no vllm:cache_config_info")


async def prefill_ms(client: httpx.AsyncClient, url: str, model: str, isl: int, *, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        prompt = random_prompt(isl)
        t0 = time.perf_counter()
        resp = await client.post(f"{url}/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": 1})
        resp.raise_for_status()
        best = min(best, 1000.0 * (time.perf_counter() - t0))
    return best


async def stream_gaps(client: httpx.AsyncClient, url: str, model: str, context: int) -> list[float]:
    prompt = random_prompt(context)
    body = {"model": model, "prompt": prompt, "max_tokens": DECODE_TOKENS, "ignore_eos": True, "stream": True}
    times = []
    buffer = b""
    async with client.stream("POST", f"{url}/v1/completions", json=body) as resp:
        # Split on newlines only: a token's text may hold U+2028, which str.splitlines (aiter_lines) also splits on.
        async for chunk in resp.aiter_bytes():
            *lines, buffer = (buffer + chunk).split(b"\n")
            for line in lines:
                if line.startswith(b"data: ") and line != b"data: [DONE]" and json.loads(line[6:]).get("choices"):
                    times.append(time.perf_counter())
    gaps = np.diff(times)
    return list(gaps[len(gaps) // 4:]) if len(gaps) > 4 else []  # the first gaps hold the others' prefills


async def decode_point(client, url: str, model: str, context: int, n: int) -> float:
    gaps = await asyncio.gather(*(stream_gaps(client, url, model, context) for _ in range(n)))
    return 1000.0 * float(np.median([g for gs in gaps for g in gs]))


async def main(args) -> None:
    async with httpx.AsyncClient(timeout=600) as client:
        max_kv = await kv_capacity_tokens(client, args.url)
        await prefill_ms(client, args.url, args.model, 64, repeats=2)  # warm-up
        isl, ttft = [], []
        for n in ISLS:
            ms = await prefill_ms(client, args.url, args.model, n, repeats=args.repeats)
            isl.append(n)
            ttft.append(ms)
            print(f"prefill isl {n}: {ms:.1f} ms", flush=True)
        x, y, z_itl, z_thpt = [], [], [], []
        for context in CONTEXTS:
            for n in CONCURRENCY:
                itl = await decode_point(client, args.url, args.model, context, n)
                x.append(n * (context + DECODE_TOKENS / 2) / max_kv)
                y.append(float(context))
                z_itl.append(itl)
                z_thpt.append(1000.0 * n / itl)
                print(f"decode context {context} x{n}: itl {itl:.2f} ms, {z_thpt[-1]:.0f} tok/s", flush=True)
    out = Path(args.out)
    (out / "selected_prefill_interpolation").mkdir(parents=True, exist_ok=True)
    (out / "selected_decode_interpolation").mkdir(parents=True, exist_ok=True)
    isl_a, ttft_a = np.array(isl, float), np.array(ttft, float)
    np.savez(out / "selected_prefill_interpolation" / "raw_data.npz", prefill_isl=isl_a, prefill_ttft=ttft_a,
             prefill_thpt_per_gpu=isl_a / ttft_a * 1000.0)
    np.savez(out / "selected_decode_interpolation" / "raw_data.npz", x_kv_usage=np.array(x), y_context_length=np.array(y),
             z_itl=np.array(z_itl), z_thpt_per_gpu=np.array(z_thpt), max_kv_tokens=np.array([max_kv]))
    print(f"wrote {out} (KV capacity {max_kv} tokens)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--repeats", type=int, default=3)
    asyncio.run(main(parser.parse_args()))
