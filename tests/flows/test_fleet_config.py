"""The fleet file (flows.fleet_config): the shipped example loads; each bad input is one line before any run."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.fleet_config import load_fleet

ROOT = Path(__file__).resolve().parents[2]

RUN = """
planner:
  profile: {dir: prof}
  decision: {prefill: {min_replicas: %d}, decode: {min_replicas: 1}}
connector: {kind: kubernetes, dgd_name: %s, namespace: dynamo}
"""


def test_the_shipped_fleet_file_loads():
    fleet = load_fleet(ROOT / "configs" / "fleet.yaml")
    assert fleet.budget_gpus == 16
    assert [(m.name, m.priority) for m in fleet.members] == [("chat", 2.0), ("code", 1.0), ("batch", 0.5)]
    code = fleet.member("code")
    assert (code.run.planner.slo.ttft_ms, code.run.planner.slo.itl_ms) == (300.0, 15.0)  # its overrides
    assert fleet.member("batch").run.planner.decision.decode.max_replicas == 8
    assert len({m.target for m in fleet.members}) == 3
    # Each config's relative profile folder resolves against planner.yaml's folder, not the working directory.
    assert Path(code.run.planner.profile.dir) == (ROOT / "data" / "profiles" / "h200_llama8b_fp8_tp1").resolve()


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "a.yaml").write_text(RUN % (2, "llama-a"))
    (tmp_path / "b.yaml").write_text(RUN % (1, "llama-b"))
    (tmp_path / "same.yaml").write_text(RUN % (1, "llama-a"))
    return tmp_path


def _write(folder, text):
    path = folder / "fleet.yaml"
    path.write_text(text)
    return path


def test_gpus_and_minimums(folder):
    fleet = load_fleet(_write(folder, "budget: {gpus: 6}\ndeployments:\n"
                                      "  - {name: a, priority: 2, config: a.yaml}\n"
                                      "  - {name: b, priority: 1, config: b.yaml,"
                                      " overrides: {planner: {sizing: {gpus_per_decode_engine: 2}}}}\n"))
    # a: 2 prefill x 1 + 1 decode x 1 = 3; b: 1 x 1 + 1 x 2 = 3.
    assert [m.min_gpus for m in fleet.members] == [3, 3]
    assert fleet.member("b").gpus_per_replica == {"prefill": 1, "decode": 2}
    assert fleet.member("a").target == "DGD dynamo/llama-a"


@pytest.mark.parametrize("text, message", [
    pytest.param("budget: {gpus: 4}\ndeployments:\n  - {name: a, priority: 1, config: a.yaml}\n"
                 "  - {name: b, priority: 1, config: b.yaml}\n",
                 "fleet.yaml: the deployments' minimums need 5 GPUs (a 3, b 2: min_replicas x GPUs per replica), "
                 "more than budget.gpus 4", id="minimums above the budget"),
    pytest.param("budget: {gpus: 40}\ndeployments:\n  - {name: a, priority: 1, config: a.yaml}\n"
                 "  - {name: b, priority: 1, config: same.yaml}\n",
                 "fleet.yaml: deployments 'a' and 'b' both scale DGD dynamo/llama-a; each deployment needs its own "
                 "target", id="two deployments, one DGD"),
    pytest.param("budget: {gpus: 40}\ndeployments:\n  - {name: a, priority: high, config: a.yaml}\n",
                 "fleet.yaml: deployments.0.priority: must be a number (got 'high')", id="priority not a number"),
    pytest.param("budget: {gpus: 40}\ndeployments:\n  - {name: a, priority: '1', config: a.yaml}\n",
                 "fleet.yaml: deployments.0.priority: must be a number (got '1')", id="priority a quoted string"),
    pytest.param("budget: {gpus: 40}\ndeployments:\n  - {name: a, config: a.yaml}\n  - {name: a, config: b.yaml}\n",
                 "fleet.yaml: deployment name 'a' is used twice; names must be unique", id="duplicate names"),
    pytest.param("budget: {gpus: 40}\ndeployments:\n  - {name: a, config: missing.yaml}\n",
                 "fleet.yaml: deployment 'a': cannot read config missing.yaml: No such file or directory",
                 id="config file missing"),
    pytest.param("budget: {gpus: 40}\ndeployments:\n  - {name: a, config: a.yaml, overrides: {planner: {slo: "
                 "{ttft_ms: -5}}}}\n",
                 "a.yaml with the overrides of deployment 'a' in ", id="bad override"),
    pytest.param("budget: {gpus: 0}\ndeployments:\n  - {name: a, config: a.yaml}\n",
                 "fleet.yaml: budget.gpus: Input should be greater than or equal to 1 (got 0)", id="no GPUs"),
])
def test_bad_fleet_file_is_one_line(folder, text, message):
    with pytest.raises(ValueError) as err:
        load_fleet(_write(folder, text))
    assert message in str(err.value)
    assert "\n" not in str(err.value)
