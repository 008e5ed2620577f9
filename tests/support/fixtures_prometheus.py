"""A real Prometheus (Debian `prometheus`, /usr/bin/prometheus) on 127.0.0.1 for tests.

Two ways to get data in:

- history, fast: build OpenMetrics text (`OpenMetricsWriter`, with
  `write_frontend_intervals` for Dynamo-frontend-style counters/histograms
  with known per-interval values and `write_gauge` for per-pod vLLM gauges),
  then `PrometheusServer.backfill(text)`: `promtool tsdb create-blocks-from
  openmetrics` into the data dir, restarting Prometheus if it was running;
- live: `LiveExporter` serves a prometheus-client registry on a free port and
  `PrometheusServer.add_scrape_target` makes Prometheus scrape it every second
  (file-based service discovery, picked up without a restart; Prometheus
  applies discovered targets every 5 s, so the first live sample takes ~5 s).

`prometheus_server` is session-scoped (one Prometheus for the run, temp data
dir, free port, killed at teardown). Tests keep their series apart by labels
(e.g. a unique `namespace` value), so they can share it.
"""

from __future__ import annotations

import functools
import json
import math
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.parser import text_string_to_metric_families

from tests.support.fixtures_net import free_port, stop_process, wait_http_ok

PROMETHEUS_BIN = Path("/usr/bin/prometheus")
PROMTOOL_BIN = Path("/usr/bin/promtool")
# A fixed, 2 h-aligned start for backfilled data (2023-11-15T00:00:00Z), so
# expected values never depend on the wall clock.
ANCHOR_S = 1_700_006_400.0


# What a real Dynamo 1.6.1 frontend exported after 51 chat completions (the kit beside the project).
KIT_FRONTEND_METRICS = Path(__file__).resolve().parents[3] / "shared" / "dynamo" / "frontend-metrics.txt"


@functools.lru_cache(maxsize=1)
def kit_frontend_families() -> tuple:
    """The kit's frontend scrape as prometheus_client metric families (fails loudly if the kit is absent)."""
    if not KIT_FRONTEND_METRICS.is_file():
        pytest.fail(f"{KIT_FRONTEND_METRICS} not found: tests need ../shared/dynamo beside the project")
    return tuple(text_string_to_metric_families(KIT_FRONTEND_METRICS.read_text()))


def kit_series(name: str) -> list[tuple[dict, float]]:
    """(labels, value) of every sample called `name` in the kit's frontend scrape."""
    return [(dict(s.labels), s.value) for fam in kit_frontend_families() for s in fam.samples if s.name == name]


def write_requests(writer: "OpenMetricsWriter", *, labels: dict, value: float, t_s: float) -> None:
    """Dynamo 1.6.1's two request counters, at `value` in total, with a real frontend's label sets.

    `dynamo_frontend_requests_started_total` (endpoint, model, request_type) and
    `dynamo_frontend_requests_total` (endpoint, error_type, model, request_type,
    status): one series per label combination the kit's scrape holds, `value`
    split in the kit's proportions; `labels` (a test's selector, e.g. a
    namespace) are added and may replace `model`.
    """
    for name in ("dynamo_frontend_requests_started_total", "dynamo_frontend_requests_total"):
        series = kit_series(name)
        total = sum(v for _, v in series)
        for kit_labels, kit_value in series:
            writer.sample(family=name[: -len("_total")], kind="counter", name=name,
                          labels={**kit_labels, **labels}, value=value * kit_value / total, t_s=t_s)


def write_kit_scrape(writer: "OpenMetricsWriter", *, labels: dict, start_s: float, end_s: float,
                     steps: int = 4) -> None:
    """Every frontend counter and histogram of the kit's scrape, from 0 at start_s rising linearly to its
    recorded value at end_s (steps + 1 samples), so increase() over [start_s, end_s] is the recorded value."""
    for fam in kit_frontend_families():
        if fam.type not in ("counter", "histogram"):
            continue
        for sample in fam.samples:
            if fam.type == "counter" and not sample.name.endswith("_total"):
                continue  # _created
            for j in range(steps + 1):
                writer.sample(family=fam.name, kind=fam.type, name=sample.name,
                              labels={**sample.labels, **labels}, value=sample.value * j / steps,
                              t_s=start_s + (end_s - start_s) * j / steps)


# -- OpenMetrics text for backfill ---------------------------------------------

def _labels_text(labels: dict) -> str:
    if not labels:
        return ""
    escaped = ",".join(
        f'{k}="{str(v).replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
        for k, v in sorted(labels.items())
    )
    return "{" + escaped + "}"


def _value_text(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


class OpenMetricsWriter:
    """Collects samples per metric family and renders OpenMetrics text for promtool."""

    def __init__(self):
        self._families: dict[str, tuple[str, list[tuple[float, str]]]] = {}

    def sample(self, *, family: str, kind: str, name: str, labels: dict, value: float, t_s: float) -> None:
        """One sample. family: the metric family (counter family drops _total);
        kind: counter, gauge, histogram; name: the sample's full name."""
        known_kind, samples = self._families.setdefault(family, (kind, []))
        if known_kind != kind:
            raise ValueError(f"metric family {family!r} is a {known_kind}, not a {kind}")
        samples.append((t_s, f"{name}{_labels_text(labels)} {_value_text(value)} {t_s:.3f}"))

    def render(self) -> str:
        lines = []
        for family, (kind, samples) in self._families.items():
            lines.append(f"# TYPE {family} {kind}")
            lines.extend(line for _, line in sorted(samples, key=lambda s: s[0]))
        lines.append("# EOF")
        return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class FrontendInterval:
    """One adjustment interval of frontend traffic, with the averages the collector should see."""

    requests: float
    avg_ttft_s: float
    avg_itl_s: float
    avg_isl_tokens: float
    avg_osl_tokens: float
    itl_observations_per_request: float = 10.0


def write_frontend_intervals(
    writer: OpenMetricsWriter,
    *,
    labels: dict,
    start_s: float,
    interval_s: float,
    intervals: list[FrontendInterval],
    scrape_s: float = 15.0,
) -> float:
    """Dynamo frontend counters/histograms whose interval increases are exactly `intervals`.

    Interval k spans (start_s + k*interval_s, start_s + (k+1)*interval_s]. Counters
    start at 0 at start_s and grow linearly within each interval, sampled every
    scrape_s, so increase() over any interval-aligned window equals the values
    given (with or without Prometheus' boundary extrapolation). Returns the time
    of the last sample, seconds.
    """
    steps = round(interval_s / scrape_s)
    if steps < 1 or not math.isclose(steps * scrape_s, interval_s):
        raise ValueError(f"interval_s {interval_s} must be a whole multiple of scrape_s {scrape_s}")
    histograms = {
        "dynamo_frontend_time_to_first_token_seconds": lambda iv: (iv.requests, iv.avg_ttft_s),
        "dynamo_frontend_inter_token_latency_seconds": lambda iv: (
            iv.requests * iv.itl_observations_per_request, iv.avg_itl_s),
        "dynamo_frontend_input_sequence_tokens": lambda iv: (iv.requests, iv.avg_isl_tokens),
        "dynamo_frontend_output_sequence_tokens": lambda iv: (iv.requests, iv.avg_osl_tokens),
    }
    totals = {"requests": 0.0, **{f"{h}_count": 0.0 for h in histograms}, **{f"{h}_sum": 0.0 for h in histograms}}

    def emit(t_s: float) -> None:
        write_requests(writer, labels=labels, value=totals["requests"], t_s=t_s)
        for h in histograms:
            count, total = totals[f"{h}_count"], totals[f"{h}_sum"]
            writer.sample(family=h, kind="histogram", name=f"{h}_bucket", labels={**labels, "le": "+Inf"},
                          value=count, t_s=t_s)
            writer.sample(family=h, kind="histogram", name=f"{h}_sum", labels=labels, value=total, t_s=t_s)
            writer.sample(family=h, kind="histogram", name=f"{h}_count", labels=labels, value=count, t_s=t_s)

    emit(start_s)
    t_s = start_s
    for k, iv in enumerate(intervals):
        for j in range(1, steps + 1):
            t_s = start_s + k * interval_s + j * scrape_s
            totals["requests"] += iv.requests / steps
            for h, parts in histograms.items():
                count, mean = parts(iv)
                totals[f"{h}_count"] += count / steps
                totals[f"{h}_sum"] += count * mean / steps
            emit(t_s)
    return t_s


def write_gauge(writer: OpenMetricsWriter, *, name: str, labels: dict, points: list[tuple[float, float]]) -> None:
    """A gauge series: points are (t_s, value). Works for `vllm:` and `vllm_` names alike."""
    for t_s, value in points:
        writer.sample(family=name, kind="gauge", name=name, labels=labels, value=value, t_s=t_s)


def write_up(writer: OpenMetricsWriter, *, labels: dict, points: list[tuple[float, float]],
             job: str = "dynamo-frontend") -> None:
    """Prometheus' own `up` series of one scrape target (1: the scrape worked, 0: it failed)."""
    write_gauge(writer, name="up", labels={"job": job, **labels}, points=points)


# -- the server --------------------------------------------------------------

class PrometheusServer:
    """One Prometheus process with a temp data dir; start/stop/backfill keep its data."""

    def __init__(self, *, base_dir: Path, scrape_interval_s: float = 1.0):
        self.base_dir = base_dir
        self.data_dir = base_dir / "data"
        self.config_path = base_dir / "prometheus.yml"
        self.targets_path = base_dir / "targets.json"
        self.log_path = base_dir / "prometheus.log"
        self.port = free_port()
        self.scrape_interval_s = scrape_interval_s
        self._targets: list[dict] = []
        self._proc: subprocess.Popen | None = None
        self._backfills = 0
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._write_targets()
        interval = f"{round(scrape_interval_s * 1000)}ms"
        self.config_path.write_text(
            "global:\n"
            f"  scrape_interval: {interval}\n"
            f"  evaluation_interval: {interval}\n"
            "scrape_configs:\n"
            "  - job_name: test\n"
            "    file_sd_configs:\n"
            f"      - files: [{json.dumps(str(self.targets_path))}]\n"
            "        refresh_interval: 1s\n"
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, *, timeout_s: float = 30.0) -> None:
        if self.running:
            return
        for binary in (PROMETHEUS_BIN, PROMTOOL_BIN):
            if not binary.is_file():
                pytest.fail(f"{binary} not found: install the Debian package prometheus")
        cmd = [
            str(PROMETHEUS_BIN),
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.data_dir}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            # Backfilled data sits at a fixed date years back; keep it.
            "--storage.tsdb.retention.time=100y",
            "--log.level=warn",
        ]
        log = self.log_path.open("ab")
        self._proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        wait_http_ok(f"{self.url}/-/ready", timeout_s=timeout_s, proc=self._proc,
                     log_path=self.log_path, what="prometheus")

    def stop(self) -> None:
        if self._proc is not None:
            stop_process(self._proc, timeout_s=10.0)
            self._proc = None

    def backfill(self, openmetrics_text: str) -> None:
        """Write the samples as TSDB blocks (promtool); restarts Prometheus if it runs."""
        was_running = self.running
        self.stop()
        self._backfills += 1
        source = self.base_dir / f"backfill-{self._backfills}.om"
        source.write_text(openmetrics_text)
        done = subprocess.run(
            [str(PROMTOOL_BIN), "tsdb", "create-blocks-from", "openmetrics", "--quiet", str(source), str(self.data_dir)],
            capture_output=True, text=True, timeout=120,
        )
        if done.returncode != 0:
            raise RuntimeError(f"promtool backfill of {source} failed ({done.returncode}): {done.stderr or done.stdout}")
        if was_running:
            self.start()

    def add_scrape_target(self, address: str, *, labels: dict | None = None) -> None:
        """Scrape host:port every scrape_interval_s from now on (no restart needed)."""
        self._targets.append({"targets": [address], "labels": dict(labels or {})})
        self._write_targets()

    def remove_scrape_target(self, address: str) -> None:
        self._targets = [t for t in self._targets if address not in t["targets"]]
        self._write_targets()

    def query(self, promql: str, *, time_s: float | None = None) -> list[dict]:
        """Instant query result (test helper; the product code uses PrometheusCollector)."""
        params = {"query": promql}
        if time_s is not None:
            params["time"] = repr(float(time_s))
        resp = requests.get(f"{self.url}/api/v1/query", params=params, timeout=10)
        resp.raise_for_status()
        return resp.json()["data"]["result"]

    def wait_for_series(self, promql: str, *, timeout_s: float = 20.0) -> list[dict]:
        """Poll until promql returns at least one series (e.g. the first live scrape)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            result = self.query(promql)
            if result:
                return result
            time.sleep(0.2)
        raise AssertionError(f"prometheus {self.url}: {promql!r} still empty after {timeout_s} s")

    def _write_targets(self) -> None:
        tmp = self.targets_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._targets))
        tmp.replace(self.targets_path)


class LiveExporter:
    """A prometheus-client registry served on 127.0.0.1 (free port) for live scraping."""

    def __init__(self):
        self.registry = CollectorRegistry()
        self.port = free_port()
        self._server, self._thread = start_http_server(self.port, addr="127.0.0.1", registry=self.registry)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


@pytest.fixture(scope="session")
def prometheus_server(tmp_path_factory) -> PrometheusServer:
    """A running Prometheus for the session; `backfill` restarts it with more data."""
    base = tmp_path_factory.mktemp("prometheus")
    server = PrometheusServer(base_dir=base)
    server.start()
    yield server
    server.stop()
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def live_exporter(prometheus_server: PrometheusServer) -> LiveExporter:
    """An exporter Prometheus scrapes every second; its target is removed afterwards."""
    exporter = LiveExporter()
    prometheus_server.add_scrape_target(exporter.address)
    yield exporter
    prometheus_server.remove_scrape_target(exporter.address)
    exporter.close()
