"""What the `sla-planner` commands tell a newcomer: what they did, and each problem in one line."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from planner_cli.main import main

ROOT = Path(__file__).resolve().parents[2]
MIGRATE = ROOT / "tests" / "data" / "migrate"
WVA_SATURATION = MIGRATE / "wva-configmap-saturation-scaling.yaml"
WVA_CONTROLLER = MIGRATE / "wva-variantautoscaling-config.yaml"  # PROMETHEUS_BASE_URL, TLS skip "true"


def stderr_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line]


def test_import_wva_over_a_base_says_which_base_values_it_replaced(capsys, tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text((ROOT / "configs" / "planner.yaml").read_text())  # the docs' example: the shipped config
    out = tmp_path / "planner.yaml"
    code = main(["import", "wva", str(WVA_SATURATION), str(WVA_CONTROLLER), "--base", str(base), "-o", str(out)])
    err = stderr_lines(capsys)
    assert code == 0, err
    wva_url = yaml.safe_load(WVA_CONTROLLER.read_text())["data"]["PROMETHEUS_BASE_URL"]
    written = yaml.safe_load(out.read_text())
    assert written["metrics"]["prometheus_url"] == wva_url and written["metrics"]["verify_tls"] is False
    notes = [line for line in err if line.startswith("sla-planner import: note: ")]
    assert any(f"metrics.prometheus_url: 'http://localhost:9090' in {base} replaced by '{wva_url}'" in line
               for line in notes), notes
    assert any("PROMETHEUS_TLS_INSECURE_SKIP_VERIFY='true'" in line and "metrics.verify_tls false" in line
               and "will not verify Prometheus' TLS certificate" in line for line in notes), notes
    # The base's other values stay, and nothing it holds unchanged is reported.
    assert written["planner"]["profile"] == yaml.safe_load(base.read_text())["planner"]["profile"]
    assert not any("replaced by" in line and "metrics.prometheus_url" not in line for line in notes), notes


def test_import_without_a_base_replaces_nothing_but_still_names_tls_off(capsys):
    code = main(["import", "wva", str(WVA_SATURATION), str(WVA_CONTROLLER)])
    err = stderr_lines(capsys)
    assert code == 0, err
    assert not any("replaced by" in line for line in err)
    assert sum("will not verify Prometheus' TLS certificate" in line for line in err) == 1


def test_import_dgd_says_what_it_wrote(capsys, tmp_path):
    out = tmp_path / "planner.yaml"
    source = MIGRATE / "dynamo-1.6.1-disagg_planner_throughput.yaml"
    code = main(["import", "dgd", str(source), "--namespace", "dyn", "-o", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert captured.out == ""
    last = captured.err.splitlines()[-1]
    unmapped = sum("not mapped: " in line for line in captured.err.splitlines())
    assert last == (f"sla-planner import: wrote {out}, the run configuration from {source} "
                    f"({unmapped} setting(s) not mapped, listed above)")
    assert unmapped == 2 and out.is_file()


def _reason(code, pool):
    from planner.types import Reason

    return Reason(code, pool, f"{pool}: {code.value}")


@pytest.mark.parametrize("reasons, expected", [
    pytest.param([("SLA_SIZING", "prefill"), ("SLA_SIZING", "decode"), ("HOLD_MISSING_METRICS", "decode")],
                 "held: saturation metrics missing", id="load sized, a decode replica without saturation metrics"),
    pytest.param([("HOLD_MISSING_METRICS", "prefill"), ("HOLD_MISSING_METRICS", "decode")],
                 "held: no load data", id="no load data: neither pool sized"),
    pytest.param([("HOLD_MISSING_METRICS", "prefill"), ("SLA_SIZING", "decode"), ("HOLD_MISSING_METRICS", "decode")],
                 "held: no load data, saturation metrics missing", id="both"),
])
def test_the_run_message_names_which_metrics_were_missing(reasons, expected):
    """The run's final state names the load data only when the load data was missing."""
    from flows.report import run_message
    from planner.types import Decision, ReasonCode

    decision = Decision(prefill_replicas=2, decode_replicas=2, apply=False,
                        reasons=tuple(_reason(ReasonCode[code], pool) for code, pool in reasons))
    fleet = SimpleNamespace(prefill=SimpleNamespace(current_replicas=2), decode=SimpleNamespace(current_replicas=2))
    assert run_message(SimpleNamespace(decision=decision, fleet=fleet), record=None, applying=True) == expected


def test_an_unreachable_servers_cause_is_a_few_words():
    """A refused connection and a server that never answers, through the HTTP client the connectors use."""
    import socket

    import requests

    from connectors.base import unreachable_cause
    from tests.support.fixtures_net import free_port

    with pytest.raises(requests.exceptions.ConnectionError) as refused:
        requests.get(f"http://127.0.0.1:{free_port()}/api/v1/query", timeout=2)
    assert len(str(refused.value)) > 200  # what the connectors used to print
    assert unreachable_cause(refused.value) == "[Errno 111] Connection refused"
    with socket.socket() as silent:  # accepts (the kernel's backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        with pytest.raises(requests.exceptions.ReadTimeout) as timed_out:
            requests.get(f"http://127.0.0.1:{silent.getsockname()[1]}/", timeout=0.2)
    assert unreachable_cause(timed_out.value) == "Read timed out. (read timeout=0.2)"


def test_a_what_if_error_is_a_line_of_its_own_after_the_progress_bar(tmp_path):
    import subprocess
    import sys

    model = tmp_path / "model.json"
    model.write_text('{"x": 1}\n')  # not a latency-model document: refused once the replay starts
    done = subprocess.run(
        [sys.executable, "-m", "planner_cli.main", "what-if", "--trace", "data/traces/azure2023_conv.csv.gz",
         "--profile", "data/profiles/h200_llama8b_fp8_tp1", "--ttft-ms", "200", "--itl-ms", "10",
         "--latency-model", str(model)],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "planner:" in done.stderr  # the bar was drawn
    errors = [line for line in done.stderr.split("\n") if "sla-planner what-if:" in line]
    assert len(errors) == 1 and errors[0].startswith(f"sla-planner what-if: {model}: "), done.stderr


def test_a_validators_message_reaches_the_user_without_pydantics_prefix(capsys, tmp_path):
    """A cross-field check's ValueError, as `sla-planner run` prints it: no "Value error," from pydantic."""
    path = tmp_path / "planner.yaml"
    path.write_text("planner:\n  profile: {dir: data/profiles/h200_llama8b_fp8_tp1}\n"
                    "latency_model: {source: published}\n")
    assert main(["run", "--config", str(path)]) == 2
    err = stderr_lines(capsys)
    assert len(err) == 1 and "latency_model: router_url is required when source is 'published'" in err[0], err
    assert "Value error" not in err[0]
